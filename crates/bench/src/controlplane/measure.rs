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

/// Requests by verb and resource (`get jobs`, `patch virtualmachinemigrations/status`) that `user` made in namespace `ns`, from every audit log file in `dir` (the API server
/// rotates `audit.log`; the namespace alone tells the runs apart).
pub fn requests_by_verb(dir: &Path, user: &str, ns: &str) -> Result<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    let quoted_ns = format!("\"namespace\":\"{ns}\"");
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !(name.starts_with("audit") && name.ends_with(".log")) {
            continue;
        }
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
            if event["stage"] != "ResponseComplete"
                || event["user"]["username"] != user
                || event["objectRef"]["namespace"] != ns
            {
                continue;
            }
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
        }
    }
    Ok(counts)
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
}

impl Reconciles {
    pub fn parse(metrics: &str) -> Self {
        let mut out = Self::default();
        for line in metrics.lines() {
            if let Some(n) = line.strip_prefix("ferry_reconciles_total ") {
                out.count = n.trim().parse().unwrap_or_default();
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
            ferry_reconcile_duration_seconds_bucket{le=\"+Inf\"} 100\n";
        let r = Reconciles::parse(text);
        assert_eq!(r.count, 100);
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
    fn this_process_has_a_cpu_time_and_a_peak() {
        let me = std::process::id() as i32;
        assert!(cpu_seconds(me).unwrap() >= 0.0);
        assert!(peak_rss_mib(me).unwrap() > 1.0);
    }
}
