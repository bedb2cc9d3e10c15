//! What a plan does next, from its spec, what its status recorded, and its migrations as observed. Pure.

use std::collections::{BTreeMap, HashSet};

use ferry_api::keys::{MANAGED_BY, MANAGED_BY_LABEL, PLAN_LABEL, PLAN_UID_LABEL};
use ferry_api::names::{child_name, dns_label, plan_child};
use ferry_api::{
    MigrationPlan, MigrationPlanStatus, Phase, PlanPhase, PlanVm, PlanVmStatus, SourceSpec,
    TargetSpec, VirtualMachineMigration, VirtualMachineMigrationSpec,
};
use kube::{Resource, ResourceExt};

/// One reconcile's conclusion.
#[derive(Debug, Default)]
pub struct Decision {
    /// Migrations to create, in the order of `spec.vms`.
    pub create: Vec<VirtualMachineMigration>,
    /// Migrations to cancel (by name).
    pub cancel: Vec<String>,
    pub status: MigrationPlanStatus,
}

/// The plan's VMs, each once (by the name of its migration), in the order of `spec.vms`.
pub fn vms(plan: &MigrationPlan) -> Vec<(String, &PlanVm)> {
    let mut seen = HashSet::new();
    let plan_name = plan.name_any();
    plan.spec
        .vms
        .iter()
        .map(|vm| (plan_child(&plan_name, vm.key()), vm))
        .filter(|(name, _)| seen.insert(name.clone()))
        .collect()
}

/// The migration of `vm`: the plan's settings, the VM, its target name; owned and labelled by the plan.
pub fn migration(plan: &MigrationPlan, name: &str, vm: &PlanVm) -> VirtualMachineMigration {
    let spec = &plan.spec;
    let mut child = VirtualMachineMigration::new(
        name,
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
                        .unwrap_or_else(|| child_name(&dns_label(vm.key()), "")),
                ),
                ..spec.target.clone()
            },
            conversion: spec.conversion.clone(),
            staging: spec.staging.clone(),
            retry: spec.retry,
            guest_check: spec.guest_check,
            cancel: false,
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
/// missing, which `status` covers).
pub fn decide(
    plan: &MigrationPlan,
    observed: &BTreeMap<String, &VirtualMachineMigration>,
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
        .filter(|(name, _)| exists(name) && !ended(name))
        .count();
    let mut decision = Decision::default();
    let limit = plan.spec.max_in_flight.max(1) as usize;
    let mut created: HashSet<String> = HashSet::new();
    for (name, vm) in &vms {
        if plan.spec.cancel {
            let live = observed.get(name).is_some_and(|m| !m.spec.cancel) && !ended(name);
            if live {
                decision.cancel.push(name.clone());
            }
        } else if !exists(name) && running < limit {
            decision.create.push(migration(plan, name, vm));
            created.insert(name.clone());
            running += 1;
        }
    }
    decision.status = summarize(plan, &vms, observed, |name| {
        exists(name) || created.contains(name)
    });
    decision
}

/// The plan's status from its migrations: counts, bytes, each VM's phase and reason.
fn summarize(
    plan: &MigrationPlan,
    vms: &[(String, &PlanVm)],
    observed: &BTreeMap<String, &VirtualMachineMigration>,
    created: impl Fn(&str) -> bool,
) -> MigrationPlanStatus {
    let mut status = MigrationPlanStatus {
        observed_generation: plan.metadata.generation,
        total: vms.len() as i32,
        ..Default::default()
    };
    let (mut done, mut total) = (0.0, 0i64);
    for (name, vm) in vms {
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
        }
        status.vms.push(PlanVmStatus {
            vm: vm.key().to_string(),
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
        _ if status.pending > 0 || ended < status.total => PlanPhase::Running,
        _ if status.succeeded == status.total => PlanPhase::Succeeded,
        _ => PlanPhase::Failed,
    });
    status.message = Some(format!(
        "{} of {} VMs succeeded, {} running, {} waiting, {} failed, {} cancelled",
        status.succeeded,
        status.total,
        status.running,
        status.pending,
        status.failed,
        status.cancelled
    ));
    status
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
        let d = decide(&p, &BTreeMap::new());
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
        let d = decide(&p, &observed);
        assert_eq!(names(&d), ["wave-c"]);
        // Recorded as created but not yet in the cache: it still counts, so nothing more starts.
        p.status = Some(d.status.clone());
        p.spec.vms.push(PlanVm {
            name: Some("d".into()),
            ..Default::default()
        });
        let d = decide(&p, &observed);
        assert!(d.create.is_empty(), "{:?}", names(&d));
        let c = child("wave-c", Some(Phase::Failed));
        let mut observed = observed;
        observed.insert("wave-c".into(), &c);
        let d = decide(&p, &observed);
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
        let d = decide(&p, &observed);
        assert!(d.create.is_empty());
        assert_eq!(d.cancel, ["wave-b"]);
        assert_eq!(d.status.phase, Some(PlanPhase::Cancelling));
        let b = child("wave-b", Some(Phase::Cancelled));
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        let d = decide(&p, &observed);
        assert!(d.cancel.is_empty());
        assert_eq!(d.status.phase, Some(PlanPhase::Cancelled));
        assert_eq!(
            (d.status.succeeded, d.status.cancelled, d.status.pending),
            (1, 1, 1)
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
            decide(&p, &observed).status.phase,
            Some(PlanPhase::Succeeded)
        );
        let b = child("wave-b", Some(Phase::Failed));
        let observed = BTreeMap::from([("wave-a".to_string(), &a), ("wave-b".to_string(), &b)]);
        assert_eq!(decide(&p, &observed).status.phase, Some(PlanPhase::Failed));
    }
}
