//! What one run did, and the oracles that judge it against the fault-free run. Pure.

use std::collections::BTreeMap;

use ferry_api::Phase;
use ferry_controller::surface;

use super::plans::Expect;

/// What one run of a workload did and ended as.
#[derive(Clone, Debug, Default)]
pub struct Record {
    pub end: String,
    /// The migration's last reason and message, to say why a run ended elsewhere.
    pub why: String,
    pub reason: String,
    pub detail: String,
    pub conditions: BTreeMap<String, String>,
    /// Objects left in the namespace at the end, by kind.
    pub objects: BTreeMap<String, usize>,
    /// Objects labelled with a migration's UID left at the end.
    pub labelled_left: usize,
    /// Objects left at the end that a succeeded migration handed over to its user (a plan's other VMs).
    pub released: usize,
    pub creates: BTreeMap<String, usize>,
    pub deletes: BTreeMap<String, usize>,
    pub writes: usize,
    /// The controller's vSphere calls (from its chaos log), and the changes vcsim was asked for, by method.
    pub vsphere_calls: usize,
    pub vsphere_changes: BTreeMap<String, usize>,
    /// Bounded retries spent, over all checkpoints.
    pub budget_used: i32,
    pub jobs_seen: Vec<String>,
    pub data_volumes_seen: Vec<String>,
    pub seconds: f64,
    /// The trial's fault was injected (a plan aimed past the run's last write is not).
    pub fired: bool,
    pub violations: Vec<String>,
}

/// Reasons too vague to tell a person what happened.
const VAGUE_REASONS: [&str; 6] = ["", "Error", "Failed", "Unknown", "InternalError", "Failure"];

/// The only changes Ferry may ask of vSphere: the source's power.
const POWER_METHODS: [&str; 3] = ["PowerOnVM_Task", "PowerOffVM_Task", "ShutdownGuest"];

/// And of a warm migration's source: its snapshots, and Changed Block Tracking when allowed to turn it on. That
/// it left neither behind is judged apart ([`warm_source_left`]).
const WARM_METHODS: [&str; 3] = [
    "CreateSnapshot_Task",
    "RemoveSnapshot_Task",
    "ReconfigVM_Task",
];

/// Whether a SOAP method changes something (every `*_Task`, and the guest operations without a task).
pub fn changes_something(method: &str) -> bool {
    method.ends_with("_Task")
        || matches!(
            method,
            "ShutdownGuest" | "RebootGuest" | "StandbyGuest" | "UnregisterVM" | "MarkAsTemplate"
        )
}

/// The oracles that compare a perturbed run with the fault-free one.
pub fn compare(reference: &Record, run: &Record, expect: Expect, warm: bool) -> Vec<String> {
    let mut v = vec![];
    let failed_clean = expect == Expect::SameOrFailedClean && run.end == "Failed";
    if failed_clean {
        if VAGUE_REASONS.contains(&run.reason.as_str()) {
            v.push(format!("failed with a vague reason: {}", run.why));
        }
        if run.labelled_left > 0 {
            v.push(format!(
                "failed, and left {} object(s) with the migration's UID",
                run.labelled_left
            ));
        }
        if run.objects.values().sum::<usize>() > run.released {
            v.push(format!(
                "failed, and left objects {:?} ({} of them handed over by a migration that succeeded)",
                run.objects, run.released
            ));
        }
    } else {
        if run.end != reference.end {
            v.push(format!(
                "ended {} ({}) instead of {}",
                run.end, run.why, reference.end
            ));
        }
        let mut same = |what: &str, got: String, want: String| {
            if got != want {
                v.push(format!("{what} {got} instead of {want}"));
            }
        };
        same(
            "conditions",
            format!("{:?}", run.conditions),
            format!("{:?}", reference.conditions),
        );
        same(
            "objects",
            format!("{:?}", run.objects),
            format!("{:?}", reference.objects),
        );
        let (mut creates, mut deletes, mut budget) = (
            reference.creates.clone(),
            reference.deletes.clone(),
            reference.budget_used,
        );
        if expect == Expect::OneJobRetried {
            *creates.entry("jobs".into()).or_default() += 1;
            *deletes.entry("jobs".into()).or_default() += 1;
            budget += 1;
        }
        same(
            "creates",
            format!("{:?}", run.creates),
            format!("{creates:?}"),
        );
        same(
            "deletes",
            format!("{:?}", run.deletes),
            format!("{deletes:?}"),
        );
        same(
            "retries spent",
            run.budget_used.to_string(),
            budget.to_string(),
        );
        same(
            "vSphere changes",
            format!("{:?}", run.vsphere_changes),
            format!("{:?}", reference.vsphere_changes),
        );
    }
    v.extend(never_beyond_power(run, warm));
    v
}

/// Ferry never changes the source beyond its power state (and, migrating warm, its own snapshots and tracking).
pub fn never_beyond_power(run: &Record, warm: bool) -> Option<String> {
    let allowed = |m: &str| POWER_METHODS.contains(&m) || (warm && WARM_METHODS.contains(&m));
    let other: Vec<&String> = run.vsphere_changes.keys().filter(|m| !allowed(m)).collect();
    (!other.is_empty()).then(|| format!("asked vSphere for {other:?}, beyond the source's power"))
}

/// What a warm migration left on its source: snapshots of its own (`ferry-` names) and tracking it turned on
/// (the lab's sources start with it off).
pub fn warm_source_left(snapshots: &[String], tracking_on: bool) -> Vec<String> {
    let mut v = vec![];
    if !snapshots.is_empty() {
        v.push(format!("left snapshot(s) {snapshots:?} on the source"));
    }
    if tracking_on {
        v.push("left Changed Block Tracking on, which it turned on".into());
    }
    v
}

/// No host ever had more than `limit` migrations reading from it at once: `reads` are each migration's host and
/// its recorded Converting intervals. Each of the plan workload's migrations costs one slot at a limit of one.
pub fn over_host_limit(reads: &[(String, Vec<(i64, i64)>)], limit: usize) -> Vec<String> {
    let mut by_host: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for (host, intervals) in reads {
        by_host.entry(host).or_default().extend(intervals);
    }
    by_host
        .into_iter()
        .filter_map(|(host, intervals)| {
            let most = surface::most_at_once(&intervals);
            (most > limit).then(|| {
                format!(
                    "{most} migrations read from host {host} at once, over its limit of {limit}"
                )
            })
        })
        .collect()
}

/// Every error the controller logged carries its class and a specific reason. `logs` are its JSON lines.
pub fn unclassed_errors(logs: &str) -> Vec<String> {
    logs.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| matches!(e["level"].as_str(), Some("WARN" | "ERROR")))
        .filter(|e| e["target"].as_str().is_some_and(|t| t.starts_with("ferry")))
        .filter(|e| {
            let reason = e["fields"]["reason"].as_str().unwrap_or_default();
            e["fields"]["class"].is_null() || VAGUE_REASONS.contains(&reason)
        })
        .map(|e| format!("an error without class or specific reason: {}", e["fields"]))
        .collect()
}

/// A Warning Event's reason must say what went wrong.
pub fn vague_events(reasons: &[String]) -> Vec<String> {
    reasons
        .iter()
        .filter(|r| VAGUE_REASONS.contains(&r.as_str()))
        .map(|r| format!("a Warning Event with the vague reason {r:?}"))
        .collect()
}

/// The checkpoints only move forward; Failed, ManualInterventionRequired, Cancelling and Cancelled are exits.
pub fn phases_move_forward(phases: &[Phase]) -> bool {
    let rank = |p: &Phase| surface::phases().position(|c| c == *p);
    let ranks: Vec<usize> = phases.iter().filter_map(rank).collect();
    ranks.windows(2).all(|w| w[0] <= w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_must_not_go_back() {
        assert!(phases_move_forward(&[
            Phase::Discovering,
            Phase::Validating,
            Phase::Cancelling,
            Phase::Cancelled
        ]));
        assert!(!phases_move_forward(&[
            Phase::Converting,
            Phase::Validating
        ]));
    }

    fn record(end: &str, jobs: usize) -> Record {
        Record {
            end: end.into(),
            creates: [("jobs".to_string(), jobs)].into(),
            deletes: [("jobs".to_string(), jobs)].into(),
            vsphere_changes: [("PowerOffVM_Task".to_string(), 1)].into(),
            ..Record::default()
        }
    }

    #[test]
    fn a_killed_pod_may_cost_one_job_and_one_retry_and_nothing_else() {
        let reference = record("Succeeded", 2);
        let mut retried = record("Succeeded", 3);
        retried.budget_used = 1;
        assert!(compare(&reference, &retried, Expect::OneJobRetried, false).is_empty());
        assert_eq!(compare(&reference, &retried, Expect::Same, false).len(), 3);
        let twice = record("Succeeded", 4);
        assert!(!compare(&reference, &twice, Expect::OneJobRetried, false).is_empty());
    }

    #[test]
    fn a_permanent_error_may_fail_the_run_only_cleanly_and_specifically() {
        let reference = record("Succeeded", 2);
        let mut failed = record("Failed", 1);
        failed.reason = "VSphereObjectNotFound".into();
        failed.objects = [("Job".to_string(), 0)].into();
        assert!(compare(&reference, &failed, Expect::SameOrFailedClean, false).is_empty());
        failed.labelled_left = 1;
        failed.reason = "Failed".into();
        assert_eq!(
            compare(&reference, &failed, Expect::SameOrFailedClean, false).len(),
            2
        );
        assert!(!compare(&reference, &failed, Expect::Same, false).is_empty());
    }

    #[test]
    fn a_host_may_not_serve_more_reads_at_once_than_its_limit() {
        let reads = vec![
            ("h0".to_string(), vec![(0, 10)]),
            ("h0".to_string(), vec![(10, 20)]),
            ("h1".to_string(), vec![(5, 15)]),
        ];
        assert!(over_host_limit(&reads, 1).is_empty());
        let overlapping = vec![
            ("h0".to_string(), vec![(0, 10)]),
            ("h0".to_string(), vec![(9, 20)]),
        ];
        assert_eq!(over_host_limit(&overlapping, 1).len(), 1);
        assert!(over_host_limit(&overlapping, 2).is_empty());
    }

    #[test]
    fn a_failed_plan_may_keep_what_its_succeeded_migrations_handed_over() {
        let reference = record("Succeeded", 2);
        let mut failed = record("Failed", 1);
        failed.reason = "VSphereObjectNotFound".into();
        failed.objects = [("VirtualMachine".to_string(), 1)].into();
        failed.released = 1;
        assert!(compare(&reference, &failed, Expect::SameOrFailedClean, false).is_empty());
        failed.objects.insert("Job".into(), 1);
        assert_eq!(
            compare(&reference, &failed, Expect::SameOrFailedClean, false).len(),
            1
        );
    }

    #[test]
    fn only_power_changes_are_allowed_in_vsphere() {
        let mut run = record("Succeeded", 2);
        assert!(never_beyond_power(&run, false).is_none());
        run.vsphere_changes.insert("ReconfigVM_Task".into(), 1);
        assert!(never_beyond_power(&run, false).is_some());
        run.vsphere_changes.insert("CreateSnapshot_Task".into(), 1);
        assert!(
            never_beyond_power(&run, true).is_none(),
            "a warm migration's own"
        );
        run.vsphere_changes.insert("Destroy_Task".into(), 1);
        assert!(never_beyond_power(&run, true).is_some());
        assert!(warm_source_left(&[], false).is_empty());
        assert_eq!(warm_source_left(&["ferry-u-1".into()], true).len(), 2);
        assert!(changes_something("Destroy_Task") && !changes_something("RetrieveProperties"));
    }

    #[test]
    fn errors_need_a_class_and_a_specific_reason() {
        let logs = [
            r#"{"level":"WARN","target":"ferry_controller::reconcile","fields":{"class":"Transient","reason":"Conflict"}}"#,
            r#"{"level":"WARN","target":"ferry_controller::reconcile","fields":{"reason":"Conflict"}}"#,
            r#"{"level":"ERROR","target":"ferry_controller::x","fields":{"class":"Permanent","reason":"Error"}}"#,
            r#"{"level":"WARN","target":"kube_runtime::controller","fields":{}}"#,
            r#"{"level":"INFO","target":"ferry_controller::x","fields":{}}"#,
        ]
        .join("\n");
        assert_eq!(unclassed_errors(&logs).len(), 2);
        assert_eq!(
            vague_events(&["Unknown".into(), "ImportFailed".into()]).len(),
            1
        );
    }
}
