//! The plan controller: one reconcile reads the plan's migrations (from the migrations' cache, with a read of its
//! own for one the cache lacks), lets [`decide`] conclude, creates and cancels migrations, then writes the plan's
//! status. Deleting a plan deletes its migrations (they are owned by it), and each cleans up as a migration
//! deleted by hand does.

mod decide;
mod select;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::keys::{MANAGER, PLAN_UID_LABEL};
use ferry_api::{
    ErrorClass, MigrationPlan, MigrationPlanStatus, PlanPhase, VirtualMachineMigration,
};
use ferry_kube::status::apply_guarded;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

pub use decide::decide;

use crate::context::Context;
use crate::error::{Failure, Result};

/// A running plan looks again this often even when none of its migrations changed.
const RECHECK: Duration = Duration::from_secs(30);

/// A plan sums up its migrations at most this often: under load they change many times a second.
const MIN_INTERVAL: Duration = Duration::from_secs(2);

/// And at most once per this much per VM: summing up costs in proportion to its VMs (1,000 VMs: every 5 s).
const INTERVAL_PER_VM: Duration = Duration::from_millis(5);

/// How often `plan` may be summed up. Pure.
pub fn interval(plan: &MigrationPlan) -> Duration {
    let vms = plan
        .status
        .as_ref()
        .map_or(0, |s| s.vms.len())
        .max(plan.spec.vms.len());
    (INTERVAL_PER_VM * vms as u32).clamp(MIN_INTERVAL, RECHECK)
}

/// When each plan was last summed up. A debounce would never fire while a thousand migrations keep changing.
#[derive(Default)]
pub struct Throttle(std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>);

impl Throttle {
    /// None: run now (and it is recorded); else how long until the plan may run again.
    fn wait(&self, key: &str, interval: Duration) -> Option<Duration> {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if let Some(ran) = last.get(key)
            && now.duration_since(*ran) < interval
        {
            return Some(interval - now.duration_since(*ran));
        }
        last.insert(key.to_string(), now);
        None
    }

    fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// What the plan controller's reconciles share: what every reconcile does, and when each plan was last summed up.
pub struct PlanContext {
    pub ctx: Arc<Context>,
    throttle: Throttle,
}

impl PlanContext {
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            throttle: Throttle::default(),
        }
    }
}

/// A scheduled plan looks again at least this often (an edit of its start time wakes it anyway).
const SCHEDULED_RECHECK: Duration = Duration::from_secs(3600);

pub async fn reconcile(plan: Arc<MigrationPlan>, plans: Arc<PlanContext>) -> Result<Action> {
    // Its migrations are owned by it: the garbage collector deletes them, and each cleans up.
    let key = key(&plan);
    if plan.metadata.deletion_timestamp.is_some() {
        plans.throttle.forget(&key);
        return Ok(Action::await_change());
    }
    if let Some(wait) = plans.throttle.wait(&key, interval(&plan)) {
        return Ok(Action::requeue(wait));
    }
    let ctx = &plans.ctx;
    if ctx.is_stale(&key, plan.resource_version().as_deref()) {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    let ns = plan.namespace().unwrap_or_default();
    let api: Api<VirtualMachineMigration> = Api::namespaced(ctx.client.clone(), &ns);
    let mut plan = (*plan).clone();
    let now = Timestamp::now();
    if let Some(wait) = not_started(&mut plan, ctx, now).await? {
        return Ok(wait);
    }
    let observed = observe(ctx, &api, &mut plan).await?;
    let refs: BTreeMap<String, &VirtualMachineMigration> =
        observed.iter().map(|(k, v)| (k.clone(), &**v)).collect();
    let decision = decide(&plan, &refs, now);
    for migration in &decision.create {
        ferry_kube::create::create_if_absent(&api, migration).await?;
        tracing::info!(plan = %key, migration = %migration.name_any(), "created");
    }
    for name in &decision.cancel {
        let cancel = json!({"spec": {"cancel": true}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&cancel))
            .await?;
        tracing::info!(plan = %key, migration = %name, "cancelled");
    }
    for (name, patch) in &decision.cutover {
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        tracing::info!(plan = %key, migration = %name, "cutover passed on");
    }
    write_status(ctx, &mut plan, &decision.status).await?;
    ctx.succeeded(&key);
    Ok(match decision.status.phase {
        Some(PlanPhase::Running | PlanPhase::Cancelling) => Action::requeue(RECHECK),
        _ => Action::await_change(),
    })
}

/// Starts the plan: waits for its start time, then records when it started and what `spec.selector` chose, in
/// a write of their own before any migration exists, so a restart never chooses again. `Some`: not started (yet).
async fn not_started(
    plan: &mut MigrationPlan,
    ctx: &Context,
    now: Timestamp,
) -> Result<Option<Action>> {
    let recorded = plan.status.clone().unwrap_or_default();
    if recorded.started_at.is_none()
        && let Some(start) = plan.spec.start_time.as_ref().map(|t| t.0)
        && start > now
    {
        write_status(ctx, plan, &decide::scheduled(plan, start)).await?;
        let wait = start.duration_since(now).unsigned_abs() + Duration::from_secs(1);
        return Ok(Some(Action::requeue(wait.min(SCHEDULED_RECHECK))));
    }
    let mut started = MigrationPlanStatus {
        started_at: recorded.started_at.clone().or(Some(Time(now))),
        ..recorded.clone()
    };
    if let Some(selector) = &plan.spec.selector
        && started.selected.is_none()
    {
        match select::resolve(ctx, plan, selector).await {
            Ok(chosen) => started.selected = Some(chosen),
            Err(e) => {
                let permanent = e.class == ErrorClass::Permanent && !e.fixable;
                let failed = MigrationPlanStatus {
                    phase: if permanent {
                        Some(PlanPhase::Failed)
                    } else {
                        started.phase
                    },
                    message: Some(format!("choosing VMs with spec.selector: {e}")),
                    ..started
                };
                write_status(ctx, plan, &failed).await?;
                return if permanent {
                    Ok(Some(Action::await_change()))
                } else {
                    Err(e)
                };
            }
        }
    }
    if started != recorded {
        write_status(ctx, plan, &started).await?;
    }
    Ok(None)
}

/// The plan's migrations by name: the cache's, and any the plan created that the cache lacks, read directly. One
/// that is gone (deleted by hand) is no longer counted as created, so it is created again.
async fn observe(
    ctx: &Context,
    api: &Api<VirtualMachineMigration>,
    plan: &mut MigrationPlan,
) -> Result<BTreeMap<String, Arc<VirtualMachineMigration>>> {
    let uid = plan.uid().unwrap_or_default();
    let ns = plan.namespace();
    let mut observed: BTreeMap<String, Arc<VirtualMachineMigration>> = match ctx.slots.store() {
        Some(store) => store
            .state()
            .into_iter()
            .filter(|m| m.namespace() == ns && m.labels().get(PLAN_UID_LABEL) == Some(&uid))
            .map(|m| (m.name_any(), m))
            .collect(),
        None => api
            .list(&ListParams::default().labels(&format!("{PLAN_UID_LABEL}={uid}")))
            .await?
            .items
            .into_iter()
            .map(|m| (m.name_any(), Arc::new(m)))
            .collect(),
    };
    if let Some(status) = plan.status.as_mut() {
        for vm in status.vms.iter_mut().filter(|v| v.created) {
            if observed.contains_key(&vm.migration) {
                continue;
            }
            match api.get_opt(&vm.migration).await? {
                Some(found) => {
                    observed.insert(vm.migration.clone(), Arc::new(found));
                }
                None => vm.created = false,
            }
        }
    }
    Ok(observed)
}

/// Writes `status` unless the recorded one differs from it only in its time-dependent figures; keeps `plan`
/// as written (its resource version guards the next write).
async fn write_status(
    ctx: &Context,
    plan: &mut MigrationPlan,
    status: &MigrationPlanStatus,
) -> Result<()> {
    let unchanged = plan
        .status
        .as_ref()
        .is_some_and(|recorded| decide::without_rates(recorded) == decide::without_rates(status));
    if unchanged {
        return Ok(());
    }
    let api: Api<MigrationPlan> =
        Api::namespaced(ctx.client.clone(), &plan.namespace().unwrap_or_default());
    let written = apply_guarded(&api, plan, status, MANAGER).await?;
    ctx.wrote(&key(plan), written.resource_version());
    plan.metadata.resource_version = written.resource_version();
    plan.status = Some(status.clone());
    Ok(())
}

pub fn error_policy(plan: Arc<MigrationPlan>, error: &Failure, plans: Arc<PlanContext>) -> Action {
    tracing::warn!(plan = %key(&plan), class = ?error.class, reason = %error.reason, "{error}");
    Action::requeue(plans.ctx.failed(&key(&plan)))
}

/// The plan that controls migration `m`, if a plan created it. Pure.
pub fn owner_of(m: &VirtualMachineMigration) -> Option<ObjectRef<MigrationPlan>> {
    let owner = m.owner_references().iter().find(|o| {
        o.controller == Some(true)
            && o.kind == "MigrationPlan"
            && o.api_version == ferry_api::API_VERSION
    })?;
    Some(ObjectRef::new(&owner.name).within(m.metadata.namespace.as_deref()?))
}

/// Its own key in the backoff and the own-write record, apart from any migration's.
fn key(plan: &MigrationPlan) -> String {
    format!(
        "plan:{}/{}",
        plan.namespace().unwrap_or_default(),
        plan.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(vms: usize) -> MigrationPlan {
        let vms: Vec<_> = (0..vms)
            .map(|i| json!({"name": format!("vm-{i}")}))
            .collect();
        MigrationPlan::new(
            "wave",
            serde_json::from_value(json!({"providerRef": {"name": "vc"}, "vms": vms})).unwrap(),
        )
    }

    #[test]
    fn a_migration_wakes_the_plan_that_controls_it_and_no_other() {
        let owned = |kind: &str, controller: bool| -> VirtualMachineMigration {
            serde_json::from_value(json!({
                "apiVersion": ferry_api::API_VERSION, "kind": "VirtualMachineMigration",
                "metadata": {"name": "wave-vm-1", "namespace": "team", "ownerReferences": [{
                    "apiVersion": ferry_api::API_VERSION, "kind": kind, "name": "wave", "uid": "u",
                    "controller": controller}]},
                "spec": {"source": {"providerRef": {"name": "vc"}, "vm": {"name": "x"}}, "target": {}},
            }))
            .unwrap()
        };
        assert_eq!(
            owner_of(&owned("MigrationPlan", true)),
            Some(ObjectRef::new("wave").within("team"))
        );
        assert_eq!(owner_of(&owned("MigrationPlan", false)), None);
        assert_eq!(owner_of(&owned("ConfigMap", true)), None);
    }

    #[test]
    fn a_big_plan_is_summed_up_less_often_than_a_small_one_but_at_least_every_recheck() {
        assert_eq!(interval(&plan_of(3)), MIN_INTERVAL);
        assert_eq!(interval(&plan_of(1000)), Duration::from_secs(5));
        assert_eq!(interval(&plan_of(20_000)), RECHECK);
        let throttle = Throttle::default();
        assert_eq!(throttle.wait("p", Duration::from_secs(5)), None);
        let left = throttle.wait("p", Duration::from_secs(5)).unwrap();
        assert!(
            !left.is_zero() && left <= Duration::from_secs(5),
            "{left:?}"
        );
        throttle.forget("p");
        assert_eq!(throttle.wait("p", Duration::from_secs(5)), None);
    }
}
