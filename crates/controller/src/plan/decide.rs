//! What a plan does next, from its spec, what its status recorded, and its migrations as observed. Pure.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use ferry_api::keys::{MANAGED_BY, MANAGED_BY_LABEL, PLAN_LABEL, PLAN_UID_LABEL};
use ferry_api::names::{child_name, dns_label, plan_child};
use ferry_api::{
    MigrationPlan, MigrationPlanStatus, Phase, PlanPhase, PlanVm, PlanVmStatus, SourceSpec,
    TargetSpec, VirtualMachineMigration, VirtualMachineMigrationSpec,
};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

/// One reconcile's conclusion.
#[derive(Debug, Default)]
pub struct Decision {
    /// Migrations to create, in the order of `spec.vms`.
    pub create: Vec<VirtualMachineMigration>,
    /// Migrations to cancel (by name).
    pub cancel: Vec<String>,
    /// Migrations to bring to the plan's cutover (by name), with it: `spec.warm.cutover` and `cutoverAt`.
    pub cutover: Vec<(String, serde_json::Value)>,
    pub status: MigrationPlanStatus,
}

/// One VM of the plan: from `spec.vms`, or chosen by `spec.selector` (by moref, named by its name).
#[derive(Debug)]
pub struct PlannedVm<'a> {
    /// Its migration's name.
    pub migration: String,
    /// How people know it: its name (or the path, uuid or moref `spec.vms` gave).
    pub key: Cow<'a, str>,
    pub vm: Cow<'a, PlanVm>,
}

/// The plan's VMs, each once (by the name of its migration): `spec.vms` in order, then those selected.
pub fn vms(plan: &MigrationPlan) -> Vec<PlannedVm<'_>> {
    let mut seen = HashSet::new();
    let plan_name = plan.name_any();
    let listed = plan.spec.vms.iter().map(|vm| PlannedVm {
        migration: plan_child(&plan_name, vm.key()),
        key: Cow::Borrowed(vm.key()),
        vm: Cow::Borrowed(vm),
    });
    let selected = plan
        .status
        .as_ref()
        .and_then(|s| s.selected.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|chosen| PlannedVm {
            migration: plan_child(&plan_name, &chosen.name),
            key: Cow::Borrowed(chosen.name.as_str()),
            vm: Cow::Owned(PlanVm {
                moref: Some(chosen.moref.clone()),
                ..Default::default()
            }),
        });
    listed
        .chain(selected)
        .filter(|planned| seen.insert(planned.migration.clone()))
        .collect()
}

/// The migration of `planned`: the plan's settings, the VM, its target name; owned and labelled by the plan.
pub fn migration(plan: &MigrationPlan, planned: &PlannedVm) -> VirtualMachineMigration {
    let spec = &plan.spec;
    let vm = &planned.vm;
    let mut child = VirtualMachineMigration::new(
        &planned.migration,
        VirtualMachineMigrationSpec {
            source: SourceSpec {
                provider_ref: spec.provider_ref.clone(),
                vm: vm.selector(),
                power_off: spec.power_off.clone(),
                restore_power_state: spec.restore_power_state,
            },
            target: TargetSpec {
                name: Some(
                    vm.target_name
                        .clone()
                        .unwrap_or_else(|| child_name(&dns_label(&planned.key), "")),
                ),
                ..spec.target.clone()
            },
            conversion: spec.conversion.clone(),
            staging: spec.staging.clone(),
            retry: spec.retry,
            guest_check: spec.guest_check,
            cancel: false,
            recopy: 0,
            warm: spec.warm.clone(),
        },
    );
    child.metadata.namespace = plan.namespace();
    child.metadata.labels = Some(BTreeMap::from([
        (PLAN_LABEL.to_string(), child_name(&plan.name_any(), "")),
        (PLAN_UID_LABEL.to_string(), plan.uid().unwrap_or_default()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]));
    child.metadata.owner_references = plan.controller_owner_ref(&()).map(|o| vec![o]);
    child
}

/// Creates migrations in `spec.vms` order while fewer than `maxInFlight` run; on cancel, creates none and
/// cancels those not ended. `observed` are the plan's migrations by name (a cache: one just created may be
/// missing, which `status` covers). The caller has recorded the start and the selection in `plan.status`.
pub fn decide(
    plan: &MigrationPlan,
    observed: &BTreeMap<String, &VirtualMachineMigration>,
    now: Timestamp,
) -> Decision {
    let recorded: HashSet<&str> = plan
        .status
        .as_ref()
        .map(|s| {
            s.vms
                .iter()
                .filter(|v| v.created)
                .map(|v| v.migration.as_str())
                .collect()
        })
        .unwrap_or_default();
    let phase_of = |name: &str| observed.get(name).and_then(|m| m.status.as_ref()?.phase);
    let exists = |name: &str| recorded.contains(name) || observed.contains_key(name);
    let ended = |name: &str| phase_of(name).is_some_and(Phase::is_terminal);
    let vms = vms(plan);
    let mut running = vms
        .iter()
        .filter(|p| exists(&p.migration) && !ended(&p.migration))
        .count();
    let mut decision = Decision::default();
    let limit = plan.spec.max_in_flight.max(1) as usize;
    let mut created: HashSet<String> = HashSet::new();
    for planned in &vms {
        let name = &planned.migration;
        if plan.spec.cancel {
            let live = observed.get(name).is_some_and(|m| !m.spec.cancel) && !ended(name);
            if live {
                decision.cancel.push(name.clone());
            }
        } else if let Some(patch) = observed.get(name).and_then(|m| cutover_patch(plan, m))
            && !ended(name)
        {
            decision.cutover.push((name.clone(), patch));
        } else if !exists(name) && running < limit {
            decision.create.push(migration(plan, planned));
            created.insert(name.clone());
            running += 1;
        }
    }
    decision.status = summarize(plan, &vms, observed, now, |name| {
        exists(name) || created.contains(name)
    });
    decision
}

/// The merge patch that gives `migration` the plan's cutover, when it lacks it. A cutover only moves forward: a
/// migration's `cutover` never goes back, and a `cutoverAt` the plan dropped stays.
fn cutover_patch(
    plan: &MigrationPlan,
    migration: &VirtualMachineMigration,
) -> Option<serde_json::Value> {
    let (wanted, has) = (plan.spec.warm.as_ref()?, migration.spec.warm.as_ref()?);
    let mut warm = serde_json::Map::new();
    if wanted.cutover && !has.cutover {
        warm.insert("cutover".into(), true.into());
    }
    if wanted.cutover_at.is_some() && wanted.cutover_at != has.cutover_at {
        warm.insert(
            "cutoverAt".into(),
            serde_json::to_value(&wanted.cutover_at).ok()?,
        );
    }
    (!warm.is_empty()).then(|| serde_json::json!({"spec": {"warm": warm}}))
}

/// The status of a plan whose start time has not come: nothing else changes.
pub fn scheduled(plan: &MigrationPlan, start: Timestamp) -> MigrationPlanStatus {
    MigrationPlanStatus {
        phase: Some(PlanPhase::Scheduled),
        observed_generation: plan.metadata.generation,
        message: Some(format!("starts at {start}")),
        total: plan.spec.vms.len() as i32,
        pending: plan.spec.vms.len() as i32,
        ..Default::default()
    }
}

/// The plan's status from its migrations: counts, bytes, each VM's phase and reason.
fn summarize(
    plan: &MigrationPlan,
    vms: &[PlannedVm],
    observed: &BTreeMap<String, &VirtualMachineMigration>,
    now: Timestamp,
    created: impl Fn(&str) -> bool,
) -> MigrationPlanStatus {
    let recorded = plan.status.as_ref();
    let mut status = MigrationPlanStatus {
        observed_generation: plan.metadata.generation,
        total: vms.len() as i32,
        started_at: recorded.and_then(|s| s.started_at.clone()),
        selected: recorded.and_then(|s| s.selected.clone()),
        ..Default::default()
    };
    let (mut done, mut total, mut sized) = (0.0, 0i64, 0);
    for planned in vms {
        let name = &planned.migration;
        let child = observed.get(name).and_then(|m| m.status.as_ref());
        let phase = child.and_then(|s| s.phase);
        let made = created(name);
        match phase {
            _ if !made => status.pending += 1,
            Some(Phase::Succeeded) => status.succeeded += 1,
            Some(Phase::Failed) => status.failed += 1,
            Some(Phase::Cancelled) => status.cancelled += 1,
            _ => status.running += 1,
        }
        if let Some(child) = child {
            let (moved, bytes) = crate::status::progress_bytes(child);
            done += moved;
            total += bytes;
            sized += usize::from(bytes > 0);
        }
        status.vms.push(PlanVmStatus {
            vm: planned.key.to_string(),
            migration: name.clone(),
            created: made,
            phase,
            reason: child.and_then(|s| s.reason.clone()),
        });
    }
    status.bytes_moved = done as i64;
    status.bytes_total = total;
    status.progress =
        (total > 0).then(|| format!("{}%", (done * 100.0 / total as f64).floor() as i64));
    let ended = status.succeeded + status.failed + status.cancelled;
    status.phase = Some(match () {
        _ if plan.spec.cancel && status.running > 0 => PlanPhase::Cancelling,
        _ if plan.spec.cancel => PlanPhase::Cancelled,
        _ if status.total == 0 => PlanPhase::Failed,
        _ if status.pending > 0 || ended < status.total => PlanPhase::Running,
        _ if status.succeeded == status.total => PlanPhase::Succeeded,
        _ => PlanPhase::Failed,
    });
    status.message = Some(if status.total == 0 {
        "no VM to migrate: spec.selector chose none and spec.vms is empty".to_string()
    } else {
        format!(
            "{} of {} VMs succeeded, {} running, {} waiting, {} failed, {} cancelled",
            status.succeeded,
            status.total,
            status.running,
            status.pending,
            status.failed,
            status.cancelled
        )
    });
    let running = matches!(status.phase, Some(PlanPhase::Running));
    let elapsed = status
        .started_at
        .as_ref()
        .map(|t| now.duration_since(t.0).as_secs_f64())
        .unwrap_or_default();
    // An ended plan reports its average over its whole run, however short; a running one after its first seconds.
    let rate = Rate::of(
        done,
        elapsed,
        if running { RATE_AFTER_SECONDS } else { 0.0 },
    );
    status.bytes_per_second = rate.bytes_per_second();
    status.throughput = rate.readable();
    // Sizes not known yet (VMs waiting, or not discovered) count as the average of those known.
    let unsized_vms = vms.len().saturating_sub(sized);
    let expected = total as f64 + unsized_vms as f64 * total as f64 / sized.max(1) as f64;
    status.eta = running.then(|| rate.time_left(expected - done)).flatten();
    status
}

/// Bytes moved per second, averaged since the plan started; none before a byte moved.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Rate(Option<f64>);

/// Below this, an average says more about start-up than about throughput.
const RATE_AFTER_SECONDS: f64 = 10.0;

impl Rate {
    fn of(bytes: f64, seconds: f64, at_least: f64) -> Self {
        Rate((seconds >= at_least && seconds > 0.0 && bytes > 0.0).then(|| bytes / seconds))
    }

    fn bytes_per_second(self) -> i64 {
        self.0.unwrap_or_default() as i64
    }

    fn readable(self) -> Option<String> {
        self.0.map(|r| format!("{:.1} MiB/s", r / 1_048_576.0))
    }

    fn time_left(self, bytes: f64) -> Option<String> {
        let seconds = (bytes.max(0.0) / self.0?).round() as u64;
        Some(match seconds {
            0..60 => "under a minute".to_string(),
            60..3600 => format!("about {} min", seconds.div_ceil(60)),
            _ => format!("about {} h {} min", seconds / 3600, (seconds % 3600) / 60),
        })
    }
}

/// The status with its time-dependent figures blanked: a status that differs from the recorded one only in
/// those is not worth a write (the next change carries them).
pub fn without_rates(status: &MigrationPlanStatus) -> MigrationPlanStatus {
    MigrationPlanStatus {
        bytes_per_second: 0,
        throughput: None,
        eta: None,
        ..status.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(vms: serde_json::Value, max_in_flight: i32, cancel: bool) -> MigrationPlan {
        let mut plan = MigrationPlan::new(
            "wave",
            serde_json::from_value(json!({
                "providerRef": {"name": "vc"}, "vms": vms, "maxInFlight": max_in_flight, "cancel": cancel,
                "target": {"networkMapRef": {"name": "nets"}}, "restorePowerState": true}))
            .unwrap(),
        );
        plan.metadata.namespace = Some("ns".into());
        plan.metadata.uid = Some("plan-uid".into());
        plan
    }

    fn child(name: &str, phase: Option<Phase>) -> VirtualMachineMigration {
        let mut m = VirtualMachineMigration::new(
            name,
            serde_json::from_value(json!({
            "source": {"providerRef": {"name": "vc"}, "vm": {"name": "x"}}}))
            .unwrap(),
        );
        m.status = Some(ferry_api::VirtualMachineMigrationStatus {
            phase,
            ..Default::default()
        });
        m
    }

    fn now() -> Timestamp {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    fn names(d: &Decision) -> Vec<String> {
        d.create.iter().map(|m| m.name_any()).collect()
    }

    #[test]
    fn it_starts_vms_in_order_up_to_max_in_flight_and_each_migration_carries_the_plans_settings() {
        let p = plan(
            json!([{"name": "a"}, {"name": "B_1", "targetName": "b"}, {"name": "c"}, {"name": "a"}]),
            2,
            false,
        );
        let d = decide(&p, &BTreeMap::new(), now());
        assert_eq!(names(&d), ["wave-a", plan_child("wave", "B_1").as_str()]);
        let b = &d.create[1];
        assert_eq!(b.spec.source.vm.name.as_deref(), Some("B_1"));
        assert_eq!(b.spec.target.name.as_deref(), Some("b"));
        assert_eq!(d.create[0].spec.target.name.as_deref(), Some("a"));
        assert_eq!(b.spec.target.network_map_ref.as_ref().unwrap().name, "nets");
        assert!(b.spec.source.restore_power_state);
        assert_eq!(b.labels()[PLAN_UID_LABEL], "plan-uid");
        let owner = &b.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("MigrationPlan", Some(true))
        );
        assert_eq!(d.status.total, 3, "a VM named twice is migrated once");
        assert_eq!((d.status.pending, d.status.running), (1, 2));
        assert_eq!(d.status.phase, Some(PlanPhase::Running));
    }

    #[test]
    fn a_slot_frees_when_a_migration_ends_and_a_vm_added_later_is_started() {
        let mut p = plan(
            json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]),
            2,
            false,
        );
        let (a, b) = (
            child("wave-a", Some(Phase::Succeeded)),
            child("wave-b", Some(Phase::Converting)),
        );
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        let d = decide(&p, &observed, now());
        assert_eq!(names(&d), ["wave-c"]);
        // Recorded as created but not yet in the cache: it still counts, so nothing more starts.
        p.status = Some(d.status.clone());
        p.spec.vms.push(PlanVm {
            name: Some("d".into()),
            ..Default::default()
        });
        let d = decide(&p, &observed, now());
        assert!(d.create.is_empty(), "{:?}", names(&d));
        let c = child("wave-c", Some(Phase::Failed));
        let mut observed = observed;
        observed.insert("wave-c".into(), &c);
        let d = decide(&p, &observed, now());
        assert_eq!(names(&d), ["wave-d"]);
        assert_eq!(
            (d.status.succeeded, d.status.failed, d.status.running),
            (1, 1, 2)
        );
    }

    #[test]
    fn cancel_starts_nothing_and_cancels_what_has_not_ended() {
        let p = plan(
            json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]),
            5,
            true,
        );
        let (a, b) = (
            child("wave-a", Some(Phase::Succeeded)),
            child("wave-b", Some(Phase::Preparing)),
        );
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        let d = decide(&p, &observed, now());
        assert!(d.create.is_empty());
        assert_eq!(d.cancel, ["wave-b"]);
        assert_eq!(d.status.phase, Some(PlanPhase::Cancelling));
        let b = child("wave-b", Some(Phase::Cancelled));
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        let d = decide(&p, &observed, now());
        assert!(d.cancel.is_empty());
        assert_eq!(d.status.phase, Some(PlanPhase::Cancelled));
        assert_eq!(
            (d.status.succeeded, d.status.cancelled, d.status.pending),
            (1, 1, 1)
        );
    }

    #[test]
    fn a_warm_plans_cutover_reaches_each_running_migration_once() {
        let mut p = plan(
            json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]),
            2,
            false,
        );
        p.spec.warm = Some(ferry_api::WarmSpec::default());
        let warm = |name, phase, cutover| {
            let mut m = child(name, Some(phase));
            m.spec.warm = Some(ferry_api::WarmSpec {
                cutover,
                ..Default::default()
            });
            m
        };
        let (a, b) = (
            warm("wave-a", Phase::Precopying, false),
            warm("wave-b", Phase::Succeeded, false),
        );
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        let d = decide(&p, &observed, now());
        assert!(d.cutover.is_empty(), "no cutover asked for yet");
        assert_eq!(names(&d), ["wave-c"]);
        assert_eq!(
            d.create[0].spec.warm, p.spec.warm,
            "children are warm as their plan"
        );

        p.spec.warm.as_mut().unwrap().cutover = true;
        let d = decide(&p, &observed, now());
        assert_eq!(
            d.cutover.len(),
            1,
            "only the one still running: {:?}",
            d.cutover
        );
        assert_eq!(d.cutover[0].0, "wave-a");
        assert_eq!(d.cutover[0].1, json!({"spec": {"warm": {"cutover": true}}}));
        assert!(
            d.create[0].spec.warm.as_ref().unwrap().cutover,
            "and those created after"
        );
        let a = warm("wave-a", Phase::Preparing, true);
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        assert!(
            decide(&p, &observed, now()).cutover.is_empty(),
            "passed on once"
        );
    }

    #[test]
    fn a_plan_ends_succeeded_only_when_every_vm_did() {
        let p = plan(json!([{"name": "a"}, {"name": "b"}]), 5, false);
        let (a, b) = (
            child("wave-a", Some(Phase::Succeeded)),
            child("wave-b", Some(Phase::Succeeded)),
        );
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        assert_eq!(
            decide(&p, &observed, now()).status.phase,
            Some(PlanPhase::Succeeded)
        );
        let b = child("wave-b", Some(Phase::Failed));
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        assert_eq!(
            decide(&p, &observed, now()).status.phase,
            Some(PlanPhase::Failed)
        );
    }

    #[test]
    fn selected_vms_follow_the_listed_ones_by_moref_and_are_named_by_their_names() {
        let mut p = plan(json!([{"name": "a"}, {"name": "web-1"}]), 10, false);
        p.status = Some(MigrationPlanStatus {
            selected: Some(vec![
                ferry_api::SelectedVm {
                    name: "web-1".into(),
                    moref: "vm-7".into(),
                },
                ferry_api::SelectedVm {
                    name: "Web_2".into(),
                    moref: "vm-8".into(),
                },
            ]),
            ..Default::default()
        });
        let d = decide(&p, &BTreeMap::new(), now());
        let web2 = plan_child("wave", "Web_2");
        assert_eq!(names(&d), ["wave-a", "wave-web-1", web2.as_str()]);
        assert_eq!(
            d.create[1].spec.source.vm.name.as_deref(),
            Some("web-1"),
            "a VM both listed and selected is migrated once, as listed"
        );
        let selected = &d.create[2];
        assert_eq!(selected.spec.source.vm.moref.as_deref(), Some("vm-8"));
        assert_eq!(selected.spec.source.vm.name, None);
        assert_eq!(
            selected.spec.target.name.as_deref(),
            Some(dns_label("Web_2").as_str())
        );
        assert_eq!(d.status.vms[2].vm, "Web_2");
        assert_eq!(d.status.selected.as_ref().unwrap().len(), 2, "kept");
    }

    #[test]
    fn a_plan_with_no_vm_at_all_fails_and_says_why() {
        let mut p = plan(json!([]), 10, false);
        p.status = Some(MigrationPlanStatus {
            selected: Some(vec![]),
            ..Default::default()
        });
        let d = decide(&p, &BTreeMap::new(), now());
        assert_eq!(d.status.phase, Some(PlanPhase::Failed));
        assert!(d.status.message.unwrap().contains("chose none"));
    }

    #[test]
    fn throughput_is_averaged_since_the_start_and_the_eta_counts_unsized_vms_at_the_average_size() {
        let mut p = plan(json!([{"name": "a"}, {"name": "b"}]), 10, false);
        let started = now() - k8s_openapi::jiff::SignedDuration::from_secs(100);
        p.status = Some(MigrationPlanStatus {
            started_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                started,
            )),
            ..Default::default()
        });
        // a: 1000 MiB, half copied; b: not discovered yet.
        let mut a = child("wave-a", Some(Phase::Converting));
        a.status.as_mut().unwrap().disks = vec![
            serde_json::from_value(json!({"index": 0, "sourceFile": "[ds] a/a.vmdk",
                "capacityBytes": 1000i64 << 20, "progress": "100%"}))
            .unwrap(),
        ];
        let b = child("wave-b", Some(Phase::Discovering));
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        let d = decide(&p, &observed, now());
        assert_eq!(d.status.bytes_per_second, 5 << 20);
        assert_eq!(d.status.throughput.as_deref(), Some("5.0 MiB/s"));
        // 2000 MiB expected in all, 500 moved: 1500 MiB at 5 MiB/s is 300 s.
        assert_eq!(d.status.eta.as_deref(), Some("about 5 min"));
        let recorded = MigrationPlanStatus {
            bytes_per_second: 1,
            throughput: Some("old".into()),
            eta: None,
            ..d.status.clone()
        };
        assert_eq!(without_rates(&recorded), without_rates(&d.status));
    }

    #[test]
    fn a_scheduled_plan_says_when_it_starts_and_counts_its_listed_vms_as_waiting() {
        let p = plan(json!([{"name": "a"}, {"name": "b"}]), 10, false);
        let s = scheduled(&p, now());
        assert_eq!(s.phase, Some(PlanPhase::Scheduled));
        assert_eq!((s.total, s.pending), (2, 2));
        assert_eq!(s.message.as_deref(), Some("starts at 2026-12-02T12:00:00Z"));
    }
}
