//! The benchmark's printout, and its first targets (writes, memory and CPU per migration, floor ratio) checked
//! against it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::time::Duration;

use super::FerryRun;
use super::measure::writes;

pub struct Report {
    pub migrations: usize,
    /// The Provider's `maxConcurrentDisksPerHost` in Ferry's run.
    pub disks_per_host: i32,
    /// Ferry's run was one plan.
    pub plan: bool,
    pub floor_wall: Duration,
    pub floor_requests: BTreeMap<String, u64>,
    pub ferry_requests: BTreeMap<String, u64>,
    /// Ferry's Event and status writes by what they carried (`measure::writes_by_content`).
    pub ferry_write_content: BTreeMap<String, u64>,
    pub ferry: FerryRun,
}

/// (what, target, met).
pub type Target = (&'static str, String, bool);

impl Report {
    pub fn all_succeeded(&self) -> bool {
        self.ferry.succeeded == self.migrations
    }

    fn per_migration(&self, n: u64) -> f64 {
        n as f64 / self.migrations.max(1) as f64
    }

    pub fn floor_ratio(&self) -> f64 {
        self.floor_wall.as_secs_f64() / self.ferry.wall.as_secs_f64().max(1e-9)
    }

    pub fn targets(&self) -> Vec<Target> {
        let writes = self.per_migration(writes(&self.ferry_requests));
        let cpu_ms = 1000.0 * self.ferry.cpu_seconds / self.migrations.max(1) as f64;
        let limit = self.disks_per_host.max(0) as usize;
        let busiest = self.ferry.host_peaks.values().copied().max().unwrap_or(0);
        vec![
            (
                "disks read at once per host <= the Provider's limit",
                format!("{busiest} (limit {limit})"),
                busiest <= limit,
            ),
            (
                "API writes per migration <= 30",
                format!("{writes:.1}"),
                writes <= 30.0,
            ),
            (
                "controller peak RSS <= 150 MiB",
                format!("{:.0} MiB", self.ferry.peak_rss_mib),
                self.ferry.peak_rss_mib <= 150.0,
            ),
            (
                "controller CPU <= 50 ms per migration",
                format!("{cpu_ms:.1} ms"),
                cpu_ms <= 50.0,
            ),
            (
                "floor ratio >= 0.5",
                format!("{:.2}", self.floor_ratio()),
                self.floor_ratio() >= 0.5,
            ),
        ]
    }

    pub fn render(&self) -> String {
        let n = self.migrations;
        let f = &self.ferry;
        let mut out = String::new();
        let how = if self.plan {
            ", as one MigrationPlan"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "ferry bench controlplane: {n} single-disk migrations of 1 MiB VMs{how}\n\
             (real kube-apiserver, etcd, kube-controller-manager and vcsim; Jobs run by the node agent, imports \
             by the CDI stand-in; KubeVirt stand-in --no-boot)\n"
        );
        let _ = writeln!(out, "{:<46}{:>10}{:>10}", "", "floor", "ferry");
        let _ = writeln!(
            out,
            "{:<46}{:>9.1}s{:>9.1}s   floor/ferry {:.2}",
            "wall time until all Succeeded",
            self.floor_wall.as_secs_f64(),
            f.wall.as_secs_f64(),
            self.floor_ratio()
        );
        let _ = writeln!(
            out,
            "{:<46}{:>10}{:>10}",
            "succeeded",
            format!("{n}/{n}"),
            format!("{}/{n}", f.succeeded)
        );
        if !f.unfinished.is_empty() {
            let _ = writeln!(out, "  not succeeded, by phase: {:?}", f.unfinished);
        }
        let _ = writeln!(
            out,
            "disks read at once, most per ESXi host (limit {}): {}",
            self.disks_per_host,
            f.host_peaks
                .iter()
                .map(|(host, peak)| format!("{host} {peak}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            out,
            "API requests per migration, by verb and resource (audit log):"
        );
        let verbs: BTreeSet<&String> = self
            .floor_requests
            .keys()
            .chain(self.ferry_requests.keys())
            .collect();
        for verb in verbs {
            let count = |m: &BTreeMap<String, u64>| self.per_migration(*m.get(verb).unwrap_or(&0));
            let _ = writeln!(
                out,
                "  {:<44}{:>10.2}{:>10.2}",
                verb,
                count(&self.floor_requests),
                count(&self.ferry_requests)
            );
        }
        let _ = writeln!(
            out,
            "  {:<44}{:>10.2}{:>10.2}",
            "writes (create/update/patch/delete)",
            self.per_migration(writes(&self.floor_requests)),
            self.per_migration(writes(&self.ferry_requests))
        );
        let _ = writeln!(
            out,
            "ferry's Events and status writes per migration, by what they carried (audit log bodies):"
        );
        let mut content: Vec<(&String, &u64)> = self.ferry_write_content.iter().collect();
        content.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let (shown, rest) = content.split_at(content.len().min(24));
        for (what, n) in shown {
            let _ = writeln!(out, "  {:>6.2}  {what}", self.per_migration(**n));
        }
        if !rest.is_empty() {
            let n = rest.iter().map(|(_, n)| **n).sum();
            let _ = writeln!(
                out,
                "  {:>6.2}  ({} others)",
                self.per_migration(n),
                rest.len()
            );
        }
        let _ = writeln!(
            out,
            "controller CPU                    {:.2}s, {:.1} ms per migration",
            f.cpu_seconds,
            1000.0 * f.cpu_seconds / n.max(1) as f64
        );
        let _ = writeln!(
            out,
            "controller peak RSS               {:.0} MiB",
            f.peak_rss_mib
        );
        let _ = writeln!(
            out,
            "reconciles                        {} ({:.1} per migration), latency p50 <= {}, p99 <= {}",
            f.reconciles.count,
            self.per_migration(f.reconciles.count),
            millis(f.reconciles.quantile(0.5)),
            millis(f.reconciles.quantile(0.99))
        );
        let mut by_state: Vec<_> = f.reconciles.by_state.iter().collect();
        by_state.sort_by_key(|(state, n)| (std::cmp::Reverse(**n), *state));
        for (state, n) in by_state {
            let _ = writeln!(out, "  {:>8.2}  {state}", self.per_migration(*n));
        }
        let _ = writeln!(out, "targets:");
        for (what, value, met) in self.targets() {
            let verdict = if met { "met" } else { "MISSED" };
            let _ = writeln!(out, "  {what:<40} {value:>10}  {verdict}");
        }
        out
    }
}

fn millis(seconds: f64) -> String {
    if seconds.is_finite() {
        format!("{:.1} ms", seconds * 1000.0)
    } else {
        "(above the last bucket)".into()
    }
}
