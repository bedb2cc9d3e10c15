//! Prometheus metrics in the text exposition format, kept in memory: reconciles, errors by class and reason,
//! reconcile latency, phase transitions, bytes moved, migrations per phase and when the oldest of each entered it.
//! The series alert rules and the dashboard (charts/ferry/files) name are checked against a lab controller's
//! /metrics by crates/cli/tests/migrate.rs.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Distinct phase/reason series kept; Ferry's own number in the tens.
const MAX_STATES: usize = 512;
const OTHER_STATE: &str = "Other/Other";

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    reconciles: u64,
    /// Reconciles by the phase and reason the migration was in when each began.
    reconciles_by_state: BTreeMap<String, u64>,
    latency_buckets: [u64; BUCKETS.len()],
    latency_sum: f64,
    errors: BTreeMap<(String, String), u64>,
    transitions: BTreeMap<String, u64>,
    bytes_moved: u64,
    /// Each migration's phase now and when it entered it (Unix seconds, when recorded), by `namespace/name`.
    phases: BTreeMap<String, (String, Option<f64>)>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reconcile that began with the migration in `state` (its phase, and its reason if any).
    pub fn reconciled(&self, took: Duration, state: &str) {
        let mut m = self.lock();
        m.reconciles += 1;
        let states = &mut m.reconciles_by_state;
        if let Some(n) = states.get_mut(state) {
            *n += 1;
        } else if states.len() < MAX_STATES {
            states.insert(state.into(), 1);
        } else {
            // Reasons are words anyone with status rights can write: past the bound they share one series.
            *states.entry(OTHER_STATE.into()).or_default() += 1;
        }
        let seconds = took.as_secs_f64();
        m.latency_sum += seconds;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                m.latency_buckets[i] += 1;
            }
        }
    }

    pub fn error(&self, class: &str, reason: &str) {
        *self
            .lock()
            .errors
            .entry((class.into(), reason.into()))
            .or_default() += 1;
    }

    pub fn transition(&self, phase: &str) {
        *self.lock().transitions.entry(phase.into()).or_default() += 1;
    }

    pub fn bytes_moved(&self, bytes: u64) {
        self.lock().bytes_moved += bytes;
    }

    /// The phase each migration is in now, by `namespace/name`, and when it entered it; None when it is gone.
    pub fn phase(&self, key: &str, phase: Option<(&str, Option<f64>)>) {
        let mut m = self.lock();
        match phase {
            Some((p, entered)) => m.phases.insert(key.into(), (p.into(), entered)),
            None => m.phases.remove(key),
        };
    }

    pub fn render(&self) -> String {
        let m = self.lock();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# TYPE ferry_reconciles_total counter\nferry_reconciles_total {}",
            m.reconciles
        );
        let _ = writeln!(out, "# TYPE ferry_reconciles_by_state_total counter");
        for (state, n) in &m.reconciles_by_state {
            let (phase, reason) = state.split_once('/').unwrap_or((state, ""));
            let (phase, reason) = (escaped(phase), escaped(reason));
            let _ = writeln!(
                out,
                "ferry_reconciles_by_state_total{{phase=\"{phase}\",reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(out, "# TYPE ferry_reconcile_duration_seconds histogram");
        for (i, bound) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "ferry_reconcile_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                m.latency_buckets[i]
            );
        }
        let _ = writeln!(
            out,
            "ferry_reconcile_duration_seconds_bucket{{le=\"+Inf\"}} {}",
            m.reconciles
        );
        let _ = writeln!(
            out,
            "ferry_reconcile_duration_seconds_sum {}",
            m.latency_sum
        );
        let _ = writeln!(
            out,
            "ferry_reconcile_duration_seconds_count {}",
            m.reconciles
        );
        let _ = writeln!(out, "# TYPE ferry_errors_total counter");
        for ((class, reason), n) in &m.errors {
            let (class, reason) = (escaped(class), escaped(reason));
            let _ = writeln!(
                out,
                "ferry_errors_total{{class=\"{class}\",reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(out, "# TYPE ferry_phase_transitions_total counter");
        for (phase, n) in &m.transitions {
            let phase = escaped(phase);
            let _ = writeln!(
                out,
                "ferry_phase_transitions_total{{phase=\"{phase}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# TYPE ferry_bytes_moved_total counter\nferry_bytes_moved_total {}",
            m.bytes_moved
        );
        // Per phase: how many, and when the one there longest entered it (a stuck migration's age is
        // `time() - ...`, with one series per phase however many migrations run).
        let mut per_phase: BTreeMap<&str, (u64, Option<f64>)> = BTreeMap::new();
        for (phase, entered) in m.phases.values() {
            let (n, oldest) = per_phase.entry(phase).or_default();
            *n += 1;
            if let Some(t) = entered {
                *oldest = Some(oldest.map_or(*t, |o: f64| o.min(*t)));
            }
        }
        let _ = writeln!(out, "# TYPE ferry_migrations gauge");
        for (phase, (n, _)) in &per_phase {
            let phase = escaped(phase);
            let _ = writeln!(out, "ferry_migrations{{phase=\"{phase}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# TYPE ferry_migrations_oldest_phase_entered_timestamp_seconds gauge"
        );
        for (phase, (_, oldest)) in &per_phase {
            if let Some(t) = oldest {
                let phase = escaped(phase);
                let _ = writeln!(
                    out,
                    "ferry_migrations_oldest_phase_entered_timestamp_seconds{{phase=\"{phase}\"}} {t:.3}"
                );
            }
        }
        out
    }
}

/// A label value as the text format needs it: backslash, quote and newline escaped, so no value (a status
/// reason anyone with status rights can write) can end its label or start a line of its own.
pub(crate) fn escaped(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histogram_and_gauges() {
        let m = Metrics::default();
        m.reconciled(Duration::from_millis(20), "Importing/WaitingForImport");
        m.error("Transient", "Conflict");
        m.phase("ns/a", Some(("Converting", None)));
        m.phase("ns/b", Some(("Converting", None)));
        m.phase("ns/b", None);
        let text = m.render();
        assert!(text.contains("ferry_reconciles_total 1"), "{text}");
        assert!(
            text.contains(
                "ferry_reconciles_by_state_total{phase=\"Importing\",reason=\"WaitingForImport\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("ferry_reconcile_duration_seconds_bucket{le=\"0.025\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferry_reconcile_duration_seconds_bucket{le=\"0.01\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("ferry_errors_total{class=\"Transient\",reason=\"Conflict\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferry_migrations{phase=\"Converting\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn a_label_value_cannot_end_its_label_or_add_a_line() {
        let m = Metrics::default();
        let hostile = "Failed/x\"} 1\nferry_forged_total{a=\"\\";
        m.reconciled(Duration::from_millis(1), hostile);
        let text = m.render();
        assert!(!text.contains("\nferry_forged_total"), "{text}");
        assert!(
            text.contains(r#"reason="x\"} 1\nferry_forged_total{a=\"\\"} 1"#),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("ferry_"), "a line of its own: {line}");
        }
    }

    #[test]
    fn reasons_past_the_bound_share_one_series() {
        let m = Metrics::default();
        for i in 0..MAX_STATES + 100 {
            m.reconciled(Duration::from_millis(1), &format!("Failed/Made{i}"));
        }
        let text = m.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("ferry_reconciles_by_state_total{"));
        assert_eq!(series.count(), MAX_STATES + 1, "{text}");
        assert!(
            text.contains(r#"{phase="Other",reason="Other"} 100"#),
            "{text}"
        );
    }

    #[test]
    fn a_migration_gone_leaves_no_series_of_its_own() {
        let m = Metrics::default();
        m.phase("ns/a", Some(("Converting", Some(10.0))));
        m.phase("ns/a", None);
        assert!(!m.render().contains("Converting"), "{}", m.render());
    }

    #[test]
    fn each_phase_shows_when_its_oldest_migration_entered_it() {
        let m = Metrics::default();
        m.phase("ns/a", Some(("Converting", Some(200.5))));
        m.phase("ns/b", Some(("Converting", Some(100.25))));
        m.phase("ns/c", Some(("Importing", None)));
        let text = m.render();
        assert!(
            text.contains("ferry_migrations{phase=\"Converting\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "ferry_migrations_oldest_phase_entered_timestamp_seconds{phase=\"Converting\"} 100.250"
            ),
            "{text}"
        );
        // No time recorded, no series: an absent age alerts on nothing rather than on the epoch.
        assert!(
            !text.contains("timestamp_seconds{phase=\"Importing\"}"),
            "{text}"
        );
    }
}
