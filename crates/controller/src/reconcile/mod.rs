//! One reconcile of a migration: deletion and cancel first, then the finalizer, then the current checkpoint.
//! Whatever the checkpoint concluded becomes one status write (only when something changed, guarded by the
//! resourceVersion read, so a stale copy can never overwrite newer evidence), and an Event per transition or error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::{Phase, VirtualMachineMigration, VirtualMachineMigrationStatus as Status};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use serde_json::json;
use tracing::Instrument;

use crate::checkpoint::CHECKPOINTS;
use crate::context::Context;
use crate::error::{Failure, Result};
use stages::{Reconcile, Stop};

mod stages;
mod writes;

#[cfg(test)]
mod tests;

pub(crate) use writes::PROGRESS_INTERVAL;

/// `migration.platform.example/hold-before: Preparing` stops a migration before it runs that checkpoint, for
/// example to validate everything but power the source off only in a maintenance window. Cancel and delete work
/// while held.
pub use ferry_api::keys::HOLD_ANNOTATION;

fn held_before(vmm: &VirtualMachineMigration, phase: Phase) -> Option<Phase> {
    let wanted = vmm.annotations().get(HOLD_ANNOTATION)?;
    let held: Phase = serde_json::from_value(json!(wanted)).ok()?;
    (held == phase).then_some(held)
}

/// A reconcile skipped on a stale copy runs again after this, should the event of our write never come.
const STALE_RECHECK: Duration = Duration::from_secs(2);

/// Checked again this often when nothing else wakes a migration that waits for a person.
const MANUAL_RECHECK: Duration = Duration::from_secs(10);

/// A cleanup that left something behind (being deleted, or the target's instance still running) looks again
/// after this.
const CLEANUP_RECHECK: Duration = Duration::from_secs(2);

pub async fn reconcile(vmm: Arc<VirtualMachineMigration>, ctx: Arc<Context>) -> Result<Action> {
    let key = key(&vmm);
    if ctx.is_stale(&key, vmm.resource_version().as_deref()) {
        // A copy from before our own last write: acting on it would redo a step and lose the write to a 409.
        return Ok(Action::requeue(STALE_RECHECK));
    }
    let started = Instant::now();
    let span = tracing::info_span!("reconcile", migration = %key);
    let result = within_deadline(reconcile_one(&vmm, &ctx).instrument(span)).await;
    ctx.metrics
        .reconciled(started.elapsed(), &state_label(&vmm));
    if result.is_ok() {
        ctx.succeeded(&key);
    }
    result
}

/// Longer than any step waits within one reconcile (powering the source back on: up to 300 s). Each vSphere call
/// has its own timeout; this stops a reconcile (of a migration, a Provider or a plan) stuck anyway, so it gives
/// its worker back and runs again later.
const RECONCILE_DEADLINE: Duration = Duration::from_secs(600);

pub(crate) async fn within_deadline(
    reconcile: impl Future<Output = Result<Action>>,
) -> Result<Action> {
    tokio::time::timeout(RECONCILE_DEADLINE, reconcile)
        .await
        .unwrap_or_else(|_| {
            Err(Failure::transient(
                ferry_api::Reason::ReconcileDeadlineExceeded,
                format!(
                    "one reconcile took longer than {} s and was stopped; it runs again",
                    RECONCILE_DEADLINE.as_secs()
                ),
            ))
        })
}

/// `phase/reason` as the migration stood when the reconcile began; a label, so only `[A-Za-z0-9]`.
fn state_label(vmm: &VirtualMachineMigration) -> String {
    let status = vmm.status.as_ref();
    let phase = status
        .and_then(|s| s.phase)
        .map_or_else(|| "New".to_string(), |p| format!("{p:?}"));
    let reason: String = status
        .and_then(|s| s.reason.as_deref())
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(64)
        .collect();
    format!("{phase}/{reason}")
}

pub fn error_policy(
    vmm: Arc<VirtualMachineMigration>,
    error: &Failure,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics
        .error(&format!("{:?}", error.class), error.reason.as_str());
    tracing::warn!(migration = %vmm.name_any(), class = ?error.class, reason = %error.reason, "{error}");
    let key = key(&vmm);
    Action::requeue(ctx.failed(&key))
}

async fn reconcile_one(vmm: &VirtualMachineMigration, ctx: &Context) -> Result<Action> {
    let mut run = Reconcile::new(ctx, vmm);
    if vmm.metadata.deletion_timestamp.is_some() {
        return run.deleted().await;
    }
    if let Some(action) = run.guard().await? {
        return Ok(action);
    }
    let phase = run.start();
    if matches!(phase, Phase::Failed | Phase::Cancelling) || vmm.spec.cancel {
        return run.cancel_or_fail().await;
    }
    if let Some(wait) = run.backing_off() {
        return Ok(Action::requeue(wait));
    }
    if let Some(held) = held_before(vmm, phase) {
        return run.hold(held).await;
    }
    let stop = run
        .run_checkpoints(resume_point(phase, &run.edit.status))
        .await;
    // Only a checkpoint that waits may have its progress shown a little later.
    let waits = match &stop {
        Stop::Waiting { after, .. } if !after.is_zero() => Some(*after),
        _ => None,
    };
    let action = run.conclude(stop).await;
    let Some(waits) = waits else {
        run.write().await?;
        return Ok(action);
    };
    Ok(match run.write_waiting().await? {
        Some(show_progress) => Action::requeue(show_progress.min(waits)),
        None => action,
    })
}

/// A migration waiting for a person re-runs the checkpoint that stopped it.
fn resume_point(phase: Phase, status: &Status) -> Phase {
    match phase {
        Phase::ManualInterventionRequired => status
            .retry
            .as_ref()
            .and_then(|r| r.last_error.as_ref())
            .map_or(CHECKPOINTS[0].phase, |e| e.phase),
        other => other,
    }
}

/// `namespace/name`: the migration's key in metrics, backoff and the controller's own-write record.
pub(crate) fn key(vmm: &VirtualMachineMigration) -> String {
    format!("{}/{}", vmm.namespace().unwrap_or_default(), vmm.name_any())
}
