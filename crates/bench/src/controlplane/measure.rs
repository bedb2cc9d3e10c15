//! What the control-plane benchmark measures: a process's CPU time and peak RSS (from /proc), API requests by
//! verb (from the API server's audit log), and reconcile counts and latency (from the controller's /metrics).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use anyhow::{Context, Result};

/// CPU seconds (user + system) a live process has used.
pub fn cpu_seconds(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which may hold spaces: state is the 1st, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("a /proc stat line")?
        .1
        .split_whitespace()
        .collect();
    let ticks = |i: usize| -> Result<f64> {
        Ok(fields.get(i).context("a short /proc stat line")?.parse()?)
    };
    Ok((ticks(11)? + ticks(12)?) / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Peak resident set size of a live process, in MiB (VmHWM).
pub fn peak_rss_mib(pid: i32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .context("no VmHWM in /proc status")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}

/// Requests by verb and resource (`get jobs`, `patch virtualmachinemigrations/status`) that `user` made in
/// namespace `ns`, from every audit log file in `dir`.
pub fn requests_by_verb(dir: &Path, user: &str, ns: &str) -> Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    for_each_request(dir, user, ns, |event| {
        let verb = event["verb"].as_str().unwrap_or("?");
        let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
        let key = match event["objectRef"]["subresource"].as_str() {
            Some(sub) => format!("{verb} {resource}/{sub}"),
            None => format!("{verb} {resource}"),
        };
        *counts.entry(key).or_default() += 1;
        if event["responseStatus"]["code"] == 409 {
            *counts.entry(CONFLICTS.to_string()).or_default() += 1;
        }
    })?;
    Ok(counts)
}

/// What `user`'s Event and status writes in `ns` carried: Events by reason, and status writes by the reason they
/// recorded and the fields they changed against the same migration's previous write (the audit policy keeps
/// these bodies). Tells a write that records progress from one that repeats what was on record.
pub fn writes_by_content(dir: &Path, user: &str, ns: &str) -> Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    let mut last_status: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for_each_request(dir, user, ns, |event| {
        let body = &event["requestObject"];
        let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
        let key = match (resource, event["objectRef"]["subresource"].as_str()) {
            ("events", _) => match body["reason"].as_str() {
                Some(reason) => format!("Event {reason}"),
                None => "Event (series count)".to_string(),
            },
            ("virtualmachinemigrations", Some("status")) => {
                let name = event["objectRef"]["name"].as_str().unwrap_or("?");
                let status = body["status"].clone();
                let before = last_status.insert(name.to_string(), status.clone());
                let reason = status["reason"].as_str().unwrap_or("-");
                let changed =
                    changed_fields(before.as_ref().unwrap_or(&serde_json::Value::Null), &status);
                format!("status {reason}: {}", changed.join(","))
            }
            _ => return,
        };
        *counts.entry(key).or_default() += 1;
    })?;
    Ok(counts)
}

/// The status fields that differ between two writes, conditions by type; phase, reason and message are left
/// out (the key names the reason).
fn changed_fields(before: &serde_json::Value, after: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (b, a) = (
        before.as_object().unwrap_or(&empty),
        after.as_object().unwrap_or(&empty),
    );
    let mut changed = Vec::new();
    let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    for key in keys {
        if matches!(key.as_str(), "phase" | "reason" | "message") || b.get(key) == a.get(key) {
            continue;
        }
        if key == "conditions" {
            let by_type = |v: Option<&serde_json::Value>| -> BTreeMap<String, serde_json::Value> {
                v.and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .map(|c| (c["type"].as_str().unwrap_or("?").to_string(), c.clone()))
                    .collect()
            };
            let (cb, ca) = (by_type(b.get(key)), by_type(a.get(key)));
            let types: std::collections::BTreeSet<&String> = cb.keys().chain(ca.keys()).collect();
            for t in types.into_iter().filter(|t| cb.get(*t) != ca.get(*t)) {
                changed.push(format!("conditions.{t}"));
            }
        } else {
            changed.push(key.clone());
        }
    }
    if changed.is_empty() {
        changed.push("(only phase, reason or message)".into());
    }
    changed
}

/// Calls `f` with each completed request `user` made in namespace `ns`, oldest log file first (the API server
/// rotates `audit.log` into timestamped files; the namespace alone tells the runs apart).
fn for_each_request(
    dir: &Path,
    user: &str,
    ns: &str,
    mut f: impl FnMut(&serde_json::Value),
) -> Result<()> {
    let quoted_ns = format!("\"namespace\":\"{ns}\"");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("audit") && name.ends_with(".log") {
            files.push(path);
        }
    }
    // "audit-<time>.log" sorts before "audit.log", the newest.
    files.sort();
    for path in files {
        let file =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            // Cheap filters first: the log holds every component's requests.
            if !line.contains(&quoted_ns) || !line.contains(user) {
                continue;
            }
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if event["stage"] == "ResponseComplete"
                && event["user"]["username"] == user
                && event["objectRef"]["namespace"] == ns
            {
                f(&event);
            }
        }
    }
    Ok(())
}

/// The key counting requests answered 409 Conflict (also counted under their verb).
pub const CONFLICTS: &str = "(answered 409 Conflict)";

/// Writes among `requests_by_verb`'s counts.
pub fn writes(counts: &BTreeMap<String, u64>) -> u64 {
    counts
        .iter()
        .filter(|(verb, _)| {
            let verb = verb.split(' ').next().unwrap_or_default();
            matches!(verb, "create" | "update" | "patch" | "delete")
        })
        .map(|(_, n)| n)
        .sum()
}

/// The reconcile count and latency histogram the controller serves on /metrics.
#[derive(Debug, Default)]
pub struct Reconciles {
    pub count: u64,
    /// (upper bound in seconds, cumulative count), in order; the last bound is infinite.
    pub buckets: Vec<(f64, u64)>,
    /// Reconciles by `phase/reason` the migration was in when each began.
    pub by_state: BTreeMap<String, u64>,
}

impl Reconciles {
    pub fn parse(metrics: &str) -> Self {
        let mut out = Self::default();
        for line in metrics.lines() {
            if let Some(n) = line.strip_prefix("ferry_reconciles_total ") {
                out.count = n.trim().parse().unwrap_or_default();
            } else if let Some(rest) = line.strip_prefix("ferry_reconciles_by_state_total{phase=\"")
                && let Some((phase, rest)) = rest.split_once("\",reason=\"")
                && let Some((reason, n)) = rest.split_once("\"} ")
            {
                let state = if reason.is_empty() {
                    phase.to_string()
                } else {
                    format!("{phase}/{reason}")
                };
                out.by_state
                    .insert(state, n.trim().parse().unwrap_or_default());
            } else if let Some(rest) =
                line.strip_prefix("ferry_reconcile_duration_seconds_bucket{le=\"")
                && let Some((bound, n)) = rest.split_once("\"} ")
            {
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().unwrap_or(f64::INFINITY)
                };
                out.buckets
                    .push((bound, n.trim().parse().unwrap_or_default()));
            }
        }
        out
    }

    /// The upper bound of the bucket holding quantile `q` (0..1): the latency at most that share of
    /// reconciles took.
    pub fn quantile(&self, q: f64) -> f64 {
        let total = self.buckets.last().map_or(0, |b| b.1);
        let rank = (q * total as f64).ceil() as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank.max(1))
            .map_or(f64::NAN, |(bound, _)| *bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_cumulative_buckets() {
        let text = "ferry_reconciles_total 100\n\
            ferry_reconcile_duration_seconds_bucket{le=\"0.001\"} 10\n\
            ferry_reconcile_duration_seconds_bucket{le=\"0.005\"} 60\n\
            ferry_reconcile_duration_seconds_bucket{le=\"0.05\"} 98\n\
            ferry_reconcile_duration_seconds_bucket{le=\"1\"} 100\n\
            ferry_reconcile_duration_seconds_bucket{le=\"+Inf\"} 100\n\
            ferry_reconciles_by_state_total{phase=\"Importing\",reason=\"WaitingForImport\"} 70\n\
            ferry_reconciles_by_state_total{phase=\"Succeeded\",reason=\"\"} 30\n";
        let r = Reconciles::parse(text);
        assert_eq!(r.count, 100);
        assert_eq!(r.by_state["Importing/WaitingForImport"], 70);
        assert_eq!(r.by_state["Succeeded"], 30);
        assert_eq!(r.quantile(0.5), 0.005);
        assert_eq!(r.quantile(0.99), 1.0);
        assert_eq!(r.quantile(0.1), 0.001);
    }

    #[test]
    fn only_mutating_verbs_are_writes() {
        let counts: BTreeMap<String, u64> = [
            ("get jobs", 5),
            ("create jobs", 3),
            ("patch virtualmachinemigrations/status", 4),
            ("delete datavolumes", 1),
            ("watch pods", 2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(writes(&counts), 8);
    }

    #[test]
    fn a_status_write_is_named_by_the_fields_it_changed() {
        let before = serde_json::json!({
            "phase": "Converting", "reason": "A", "progress": "1/8",
            "conditions": [{"type": "SourceReady", "status": "True"}, {"type": "Converted", "status": "False"}],
        });
        let after = serde_json::json!({
            "phase": "Importing", "reason": "B", "progress": "2/8",
            "conditions": [{"type": "SourceReady", "status": "True"}, {"type": "Converted", "status": "True"}],
        });
        assert_eq!(
            changed_fields(&before, &after),
            ["conditions.Converted", "progress"]
        );
        assert_eq!(
            changed_fields(&after, &after),
            ["(only phase, reason or message)"]
        );
        assert_eq!(
            changed_fields(
                &serde_json::Value::Null,
                &serde_json::json!({"progress": "0/8"})
            ),
            ["progress"]
        );
    }

    #[test]
    fn this_process_has_a_cpu_time_and_a_peak() {
        let me = std::process::id() as i32;
        assert!(cpu_seconds(me).unwrap() >= 0.0);
        assert!(peak_rss_mib(me).unwrap() > 1.0);
    }
}
