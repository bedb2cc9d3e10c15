//! A plan as the dashboard shows it: its VMs by phase and outcome, bytes copied of the total, throughput over
//! time from the samples taken while the UI runs, and the time left.

use std::collections::BTreeMap;

use ferry_api::{MigrationPlan, Phase, PlanPhase, PlanVmStatus, VirtualMachineMigration, keys};

use crate::format;
use crate::samples::{Samples, eta_seconds};

/// The rate the ETA is taken at: bytes done over this many seconds. Progress moves in steps (a disk converted, an
/// import's percentage), so a shorter window often sees none.
pub const RATE_WINDOW_SECONDS: f64 = 120.0;

/// Points in the throughput chart at most.
pub const CHART_POINTS: usize = 60;

/// Each point of the chart is the rate over this many seconds before it: a disk's bytes are recorded at once
/// when it is written, so a shorter span shows spikes of bytes that took longer to copy.
pub const CHART_WINDOW_SECONDS: f64 = 30.0;

#[derive(Clone, Debug, PartialEq)]
pub struct PlanView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `Running`, `Succeeded`, ...; `Pending` before the controller summed it up.
    pub phase: String,
    pub ended: bool,
    pub provider: String,
    pub max_in_flight: i32,
    pub totals: Totals,
    /// VMs per phase: `Waiting` (no migration yet), then each phase in the order migrations go through them.
    pub by_phase: Vec<(String, usize)>,
    pub bytes_done: f64,
    /// The disks of the VMs whose sizes are known.
    pub bytes_total: i64,
    /// VMs still to copy whose size is not known yet (not discovered).
    pub not_sized: usize,
    /// Bytes still to copy by migrations that have not ended, VMs not sized yet counted at the average size.
    pub bytes_left: f64,
    /// Bytes per second over the last [`RATE_WINDOW_SECONDS`].
    pub rate: Option<f64>,
    pub eta: Eta,
    pub chart: Chart,
    pub sampled_seconds: f64,
    pub vms: Vec<PlanVmRow>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub vms: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub cancelled: usize,
    pub running: usize,
    /// No migration yet: waiting for a place in `maxInFlight` (or the plan's start).
    pub waiting: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Eta {
    /// The plan ended: nothing left.
    Ended,
    /// Seconds left at the sampled rate.
    Estimate(f64),
    /// The controller's own estimate (its average since the plan started), before the UI has a rate.
    Recorded(String),
    Unknown(&'static str),
}

/// Throughput over time, as the chart draws it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chart {
    /// (seconds since the UNIX epoch, bytes per second over the [`Chart::window`] seconds before).
    pub points: Vec<(f64, f64)>,
    pub window: f64,
    pub samples: usize,
    /// Bytes per second over all the samples.
    pub average: Option<f64>,
}

impl Chart {
    pub fn of(samples: Option<&Samples>) -> Self {
        let Some(samples) = samples else {
            return Chart {
                window: CHART_WINDOW_SECONDS,
                ..Chart::default()
            };
        };
        Chart {
            points: samples.series(CHART_POINTS, CHART_WINDOW_SECONDS),
            window: CHART_WINDOW_SECONDS,
            samples: samples.len(),
            average: samples.recent_rate(f64::INFINITY),
        }
    }
}

/// One VM of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanVmRow {
    pub vm: String,
    /// Its migration's name, once the plan created it.
    pub migration: Option<String>,
    pub phase: String,
    pub reason: Option<String>,
}

impl PlanView {
    /// `plan` with its migrations among `migrations` (those labelled with its UID) and its `samples`.
    pub fn of(
        plan: &MigrationPlan,
        migrations: &[std::sync::Arc<VirtualMachineMigration>],
        samples: Option<&Samples>,
    ) -> Self {
        let uid = plan.metadata.uid.clone().unwrap_or_default();
        let children: BTreeMap<&str, &VirtualMachineMigration> = migrations
            .iter()
            .filter(|m| of_plan(m, &uid))
            .filter_map(|m| Some((m.metadata.name.as_deref()?, m.as_ref())))
            .collect();
        let status = plan.status.clone().unwrap_or_default();
        let listed: Vec<PlanVmStatus> = if status.vms.is_empty() {
            // Not summed up yet: the VMs the spec lists, none started.
            let vm = |v: &ferry_api::PlanVm| PlanVmStatus {
                vm: v.key().to_string(),
                ..PlanVmStatus::default()
            };
            plan.spec.vms.iter().map(vm).collect()
        } else {
            status.vms.clone()
        };
        let mut totals = Totals {
            vms: listed.len(),
            ..Totals::default()
        };
        let mut phases: BTreeMap<Option<Phase>, usize> = BTreeMap::new();
        let (mut done, mut total, mut sized, mut not_sized) = (0.0, 0i64, 0usize, 0usize);
        // What migrations that have not ended still have to copy: one that failed copies nothing more.
        let mut left = 0.0;
        let mut vms = Vec::new();
        for PlanVmStatus {
            vm,
            migration: name,
            created,
            phase: recorded_phase,
            reason: recorded_reason,
        } in listed
        {
            // The migration as watched now; the plan's record of it lags a little.
            let child = children.get(name.as_str()).copied();
            let child_status = child.and_then(|c| c.status.as_ref());
            let made = child.is_some() || created;
            let phase = match child {
                Some(_) => child_status.and_then(|s| s.phase),
                None => recorded_phase,
            };
            match (made, phase) {
                (false, _) => totals.waiting += 1,
                (true, Some(Phase::Succeeded)) => totals.succeeded += 1,
                (true, Some(Phase::Failed)) => totals.failed += 1,
                (true, Some(Phase::Cancelled)) => totals.cancelled += 1,
                (true, _) => totals.running += 1,
            }
            if made {
                *phases.entry(phase).or_default() += 1;
            }
            let (moved, bytes) = child_status.map_or((0.0, 0), |s| s.bytes_done());
            done += moved;
            total += bytes;
            let still_to_copy = !phase.is_some_and(Phase::is_terminal);
            if still_to_copy {
                left += bytes as f64 - moved;
            }
            match (bytes > 0, still_to_copy) {
                (true, _) => sized += 1,
                (false, true) => not_sized += 1,
                (false, false) => {}
            }
            vms.push(PlanVmRow {
                vm,
                migration: made.then_some(name),
                phase: if made {
                    format::phase(phase)
                } else {
                    "Waiting".into()
                },
                reason: child_status
                    .and_then(|s| s.reason.clone())
                    .or(recorded_reason),
            });
        }
        let mut by_phase = Vec::new();
        if totals.waiting > 0 {
            by_phase.push(("Waiting".to_string(), totals.waiting));
        }
        by_phase.extend(phases.into_iter().map(|(p, n)| (format::phase(p), n)));
        let ended = status.phase.is_some_and(|p| {
            matches!(
                p,
                PlanPhase::Succeeded | PlanPhase::Failed | PlanPhase::Cancelled
            )
        });
        let rate = samples.and_then(|s| s.recent_rate(RATE_WINDOW_SECONDS));
        // VMs not sized yet count at the average size of those that are, as the controller counts them.
        let bytes_left = left + not_sized as f64 * total as f64 / sized.max(1) as f64;
        let eta = match (ended, eta_seconds(bytes_left, rate), &status.eta) {
            (true, _, _) => Eta::Ended,
            (false, Some(seconds), _) => Eta::Estimate(seconds),
            (false, None, Some(recorded)) => Eta::Recorded(recorded.clone()),
            (false, None, None) if rate == Some(0.0) => {
                Eta::Unknown("no bytes moved in the last 2 minutes")
            }
            (false, None, None) => Eta::Unknown(
                "no rate yet: it is sampled every few seconds while this page is served",
            ),
        };
        Self {
            namespace: plan.metadata.namespace.clone().unwrap_or_default(),
            name: plan.metadata.name.clone().unwrap_or_default(),
            uid,
            phase: status
                .phase
                .map_or_else(|| "Pending".into(), |p| format!("{p:?}")),
            ended,
            provider: plan.spec.provider_ref.to_string(),
            max_in_flight: plan.spec.max_in_flight,
            totals,
            by_phase,
            bytes_done: done,
            bytes_total: total,
            not_sized,
            bytes_left,
            rate,
            eta,
            chart: Chart::of(samples),
            sampled_seconds: samples.map_or(0.0, Samples::span),
            vms,
        }
    }

    pub fn fraction(&self) -> f64 {
        if self.bytes_total > 0 {
            self.bytes_done / self.bytes_total as f64
        } else {
            0.0
        }
    }

    /// The ETA in words: `about 3 min`, `ended`, or why it is not known.
    pub fn eta_text(&self) -> String {
        match &self.eta {
            Eta::Ended => "none: the plan ended".into(),
            Eta::Estimate(seconds) => format!("about {}", format::duration(*seconds)),
            Eta::Recorded(text) => format!("{text} (the controller's estimate)"),
            Eta::Unknown(why) => format!("not known yet: {why}"),
        }
    }
}

/// Whether `m` is one of the plan's migrations: the plan labels each with its UID.
pub fn of_plan(m: &VirtualMachineMigration, plan_uid: &str) -> bool {
    !plan_uid.is_empty()
        && m.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(keys::PLAN_UID_LABEL))
            .map(String::as_str)
            == Some(plan_uid)
}

/// Bytes done by the plan's migrations now: what the sampler records.
pub fn bytes_done(plan_uid: &str, migrations: &[std::sync::Arc<VirtualMachineMigration>]) -> f64 {
    migrations
        .iter()
        .filter(|m| of_plan(m, plan_uid))
        .filter_map(|m| m.status.as_ref())
        .map(|s| s.bytes_done().0)
        .sum()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::migrations::tests::vmm;
    use serde_json::json;

    const MIB: i64 = 1048576;

    pub fn plan(status: serde_json::Value) -> MigrationPlan {
        serde_json::from_value(json!({
            "apiVersion": "migration.platform.example/v1alpha1", "kind": "MigrationPlan",
            "metadata": {"name": "wave", "namespace": "apps", "uid": "plan-uid"},
            "spec": {"providerRef": {"name": "vc"}, "maxInFlight": 2,
                     "vms": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}]},
            "status": status}))
        .unwrap()
    }

    fn running_plan() -> MigrationPlan {
        plan(json!({"phase": "Running", "total": 4, "eta": "about 9 min",
            "vms": [{"vm": "a", "migration": "wave-a", "created": true, "phase": "Succeeded"},
                    {"vm": "b", "migration": "wave-b", "created": true, "phase": "Converting"},
                    {"vm": "c", "migration": "wave-c", "created": true, "phase": "Validating"},
                    {"vm": "d", "migration": "wave-d"}]}))
    }

    fn children() -> Vec<Arc<VirtualMachineMigration>> {
        let disk = |sha: bool, verified: bool| {
            json!({"index": 0, "sourceFile": "f", "capacityBytes": 100 * MIB,
            "sha256": if sha { Some("ab") } else { None }, "verified": verified})
        };
        vec![
            Arc::new(vmm(
                "wave-a",
                json!({"phase": "Succeeded", "disks": [disk(true, true)]}),
            )),
            // The plan's record says Converting; the migration itself has moved on.
            Arc::new(vmm(
                "wave-b",
                json!({"phase": "Importing", "disks": [disk(true, false)]}),
            )),
            Arc::new(vmm(
                "wave-c",
                json!({"phase": "Failed", "reason": "EncryptedDisk"}),
            )),
            Arc::new(vmm(
                "other",
                json!({"phase": "Converting", "disks": [disk(true, true)]}),
            )),
        ]
        .into_iter()
        .map(|m| {
            let mut m = Arc::unwrap_or_clone(m);
            if m.metadata.name.as_deref() == Some("other") {
                m.metadata.labels = None;
            }
            Arc::new(m)
        })
        .collect()
    }

    #[test]
    fn totals_count_each_vm_once_by_what_its_migration_says_now() {
        let view = PlanView::of(&running_plan(), &children(), None);
        assert_eq!(
            view.totals,
            Totals {
                vms: 4,
                succeeded: 1,
                failed: 1,
                cancelled: 0,
                running: 1,
                waiting: 1
            }
        );
        let by_phase: Vec<_> = view
            .by_phase
            .iter()
            .map(|(p, n)| (p.as_str(), *n))
            .collect();
        assert_eq!(
            by_phase,
            [
                ("Waiting", 1),
                ("Importing", 1),
                ("Succeeded", 1),
                ("Failed", 1)
            ]
        );
        let phases: Vec<_> = view.vms.iter().map(|v| v.phase.as_str()).collect();
        assert_eq!(phases, ["Succeeded", "Importing", "Failed", "Waiting"]);
        assert_eq!(view.vms[2].reason.as_deref(), Some("EncryptedDisk"));
        assert_eq!(view.vms[3].migration, None);
    }

    #[test]
    fn bytes_count_only_the_plans_migrations() {
        let view = PlanView::of(&running_plan(), &children(), None);
        // a: 100 MiB done; b: converted, half; the unlabelled one is not the plan's.
        assert_eq!(view.bytes_done, 150.0 * MIB as f64);
        assert_eq!(view.bytes_total, 200 * MIB);
        assert_eq!(view.fraction(), 0.75);
        assert_eq!(bytes_done("plan-uid", &children()), 150.0 * MIB as f64);
        // d waits and is not sized; c failed before it was, and will copy nothing.
        assert_eq!(view.not_sized, 1);
    }

    #[test]
    fn the_eta_is_what_is_left_at_the_sampled_rate_counting_unsized_vms_at_the_average() {
        let mut samples = Samples::default();
        samples.record(0.0, 0.0);
        samples.record(100.0, 100.0 * MIB as f64);
        let view = PlanView::of(&running_plan(), &children(), Some(&samples));
        assert_eq!(view.rate, Some(MIB as f64));
        // 200 MiB known + d at the average (100 MiB), less 150 MiB done, at 1 MiB/s.
        assert_eq!(view.eta, Eta::Estimate(150.0));
        assert_eq!(view.eta_text(), "about 2 min 30 s");
        assert_eq!(view.chart.samples, 2);
        assert_eq!(view.chart.average, Some(MIB as f64));
        assert!(!view.chart.points.is_empty());
        // No rate sampled yet: the controller's figure, said to be its own.
        let view = PlanView::of(&running_plan(), &children(), None);
        assert_eq!(view.eta_text(), "about 9 min (the controller's estimate)");
        let ended = plan(json!({"phase": "Failed", "eta": "stale"}));
        assert_eq!(PlanView::of(&ended, &[], Some(&samples)).eta, Eta::Ended);
    }

    #[test]
    fn a_plan_not_summed_up_yet_lists_its_vms_as_waiting() {
        let view = PlanView::of(&plan(json!(null)), &[], None);
        assert_eq!(view.phase, "Pending");
        assert_eq!(view.totals.waiting, 4);
        assert!(matches!(view.eta, Eta::Unknown(_)));
    }
}
