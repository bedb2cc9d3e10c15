//! One reconcile of a migration: deletion and cancel first, then the finalizer, then the current checkpoint.
//! Whatever the checkpoint concluded becomes one status write (only when something changed, guarded by the
//! resourceVersion read, so a stale copy can never overwrite newer evidence), and an Event per transition or error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::{
    ConditionType, ErrorClass, FINALIZER, Phase, VirtualMachineMigration,
    VirtualMachineMigrationStatus as Status,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use crate::checkpoint::{self, Next, Step};
use crate::children::MANAGER;
use crate::context::Context;
use crate::error::{Failure, Result};
use crate::status;

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

pub async fn reconcile(vmm: Arc<VirtualMachineMigration>, ctx: Arc<Context>) -> Result<Action> {
    let key = key(&vmm);
    if ctx.is_stale(&key, vmm.resource_version().as_deref()) {
        // A copy from before our own last write: acting on it would redo a step and lose the write to a 409.
        return Ok(Action::requeue(STALE_RECHECK));
    }
    let started = Instant::now();
    let span = tracing::info_span!("reconcile", migration = %key);
    let result = reconcile_one(&vmm, &ctx).instrument(span).await;
    ctx.metrics.reconciled(started.elapsed());
    if result.is_ok() {
        ctx.succeeded(&key);
    }
    result
}

pub fn error_policy(
    vmm: Arc<VirtualMachineMigration>,
    error: &Failure,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics
        .error(&format!("{:?}", error.class), &error.reason);
    tracing::warn!(migration = %vmm.name_any(), class = ?error.class, reason = %error.reason, "{error}");
    let key = key(&vmm);
    Action::requeue(ctx.failed(&key))
}

async fn reconcile_one(vmm: &VirtualMachineMigration, ctx: &Context) -> Result<Action> {
    let key = key(vmm);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let before = vmm.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let generation = vmm.metadata.generation;
    let has_finalizer = vmm.finalizers().iter().any(|f| f == FINALIZER);

    if vmm.metadata.deletion_timestamp.is_some() {
        ctx.metrics.phase(&key, None);
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        if status.phase != Some(Phase::Succeeded) && !status.cleaned_up {
            let mut step = Step {
                ctx,
                vmm,
                status: &mut status,
                now: now.clone(),
            };
            let done = checkpoint::cleanup(&mut step).await?;
            if !done {
                write_status(ctx, vmm, &before, &mut status).await?;
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
            status.cleaned_up = true;
            write_status(ctx, vmm, &before, &mut status).await?;
            cleaned_up_event(ctx, vmm).await;
        }
        set_finalizer(ctx, vmm, false).await?;
        return Ok(Action::await_change());
    }

    let phase = status.phase;
    ctx.metrics
        .phase(&key, phase.map(|p| format!("{p:?}")).as_deref());
    let finished = matches!(phase, Some(Phase::Succeeded) | Some(Phase::Cancelled))
        || (phase == Some(Phase::Failed) && status.cleaned_up);
    if finished {
        // Nothing is left to clean up: a delete need not wait for the controller.
        if has_finalizer {
            set_finalizer(ctx, vmm, false).await?;
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        set_finalizer(ctx, vmm, true).await?;
        return Ok(Action::requeue(Duration::ZERO));
    }
    // Each checkpoint passed in this reconcile, for its one Event.
    let mut passed: Vec<(&'static str, String)> = Vec::new();
    let phase = match phase {
        Some(phase) => phase,
        None => {
            status.start_time = Some(now.clone());
            status.target_vm = Some(crate::children::vm_name(vmm));
            status::enter(&mut status, Phase::Discovering, generation, &now);
            status.reason = Some("Started".into());
            status.message = Some("discovering the source VM".into());
            passed.push(("Discovering", "migration started".into()));
            Phase::Discovering
        }
    };

    if matches!(phase, Phase::Failed | Phase::Cancelling)
        || (vmm.spec.cancel && phase != Phase::Cancelling)
    {
        return finish_with_cleanup(ctx, vmm, before, status, now).await;
    }
    if let Some(next) = status
        .retry
        .as_ref()
        .and_then(|r| r.next_attempt_time.clone())
        && next.0 > now.0
    {
        let wait = now.0.duration_until(next.0).unsigned_abs();
        return Ok(Action::requeue(wait));
    }

    if let Some(held) = held_before(vmm, phase) {
        publish_passed(ctx, vmm, &passed).await;
        status.reason = Some("Held".into());
        status.message = Some(format!(
            "held before {held:?} by the annotation {HOLD_ANNOTATION}; remove it to go on"
        ));
        write_status(ctx, vmm, &before, &mut status).await?;
        return Ok(Action::await_change());
    }

    // A migration waiting for a person re-runs the checkpoint that stopped it.
    let mut checkpoint = match phase {
        Phase::ManualInterventionRequired => status
            .retry
            .as_ref()
            .and_then(|r| r.last_error.as_ref())
            .map_or(Phase::Discovering, |e| e.phase),
        other => other,
    };
    // A checkpoint that advanced acted on nothing in that pass (it only observed its desired state), so the
    // next one runs at once, and one status write records them all. A step that must be on record before it
    // acts (the source's power state) ends its pass with a wait, and that write, of its own.
    let outcome = loop {
        let outcome = {
            let mut step = Step {
                ctx,
                vmm,
                status: &mut status,
                now: now.clone(),
            };
            checkpoint::run(checkpoint, &mut step).await
        };
        let Ok(Next::Advance {
            to,
            reason,
            message,
        }) = outcome
        else {
            break outcome;
        };
        status::advance(
            &mut status,
            checkpoint,
            to,
            reason,
            message.clone(),
            generation,
            &now,
        );
        if let Some(retry) = &mut status.retry {
            retry.last_error = None;
        }
        ctx.metrics.transition(&format!("{to:?}"));
        tracing::info!(from = ?checkpoint, to = ?to, reason, "{message}");
        passed.push((reason, message));
        if to.is_terminal() || held_before(vmm, to).is_some() {
            break Ok(Next::Advance {
                to,
                reason,
                message: String::new(),
            });
        }
        checkpoint = to;
    };
    publish_passed(ctx, vmm, &passed).await;
    let action = match outcome {
        Ok(Next::Advance { to, .. }) => {
            if to == Phase::Succeeded {
                status.completion_time = Some(now.clone());
                status::condition(
                    &mut status,
                    ConditionType::Ready,
                    true,
                    "MigrationSucceeded",
                    "the VM runs in KubeVirt and is handed over".into(),
                    generation,
                    &now,
                );
                Action::await_change()
            } else {
                // Held before `to`: the hold is recorded on the next pass.
                Action::requeue(Duration::ZERO)
            }
        }
        Ok(Next::Wait {
            reason,
            message,
            after,
        }) => {
            // A checkpoint that charged a failed child to its budget recorded the error: say so, once.
            let last_error = |s: &Status| s.retry.as_ref().and_then(|r| r.last_error.clone());
            if let Some(error) =
                last_error(&status).filter(|e| Some(e) != last_error(&before).as_ref())
            {
                tracing::warn!(checkpoint = ?checkpoint, class = ?error.class, reason = %error.reason, "{}", error.message);
                event(ctx, vmm, EventType::Warning, &error.reason, &error.message).await;
            }
            status.phase = Some(checkpoint);
            status.reason = Some(reason.into());
            status.message = Some(message);
            Action::requeue(after)
        }
        Err(failure) => on_failure(ctx, vmm, &mut status, checkpoint, failure, &now).await,
    };
    write_status(ctx, vmm, &before, &mut status).await?;
    Ok(action)
}

async fn on_failure(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    status: &mut Status,
    checkpoint: Phase,
    failure: Failure,
    now: &Time,
) -> Action {
    ctx.metrics
        .error(&format!("{:?}", failure.class), &failure.reason);
    let last = status.retry.as_ref().and_then(|r| r.last_error.clone());
    let repeated = last.as_ref().is_some_and(|e| {
        e.reason == failure.reason && e.message == failure.message && e.phase == checkpoint
    });
    // The same error seen again (a person has not fixed it yet) is neither a new Event nor a new write.
    if !repeated {
        tracing::warn!(checkpoint = ?checkpoint, class = ?failure.class, reason = %failure.reason, "{}", failure.message);
        status::record_error(status, &failure, checkpoint, now);
        event(
            ctx,
            vmm,
            EventType::Warning,
            &failure.reason,
            &failure.message,
        )
        .await;
    }
    let generation = vmm.metadata.generation;
    match failure.class {
        ErrorClass::Transient => {
            let seed = key(vmm);
            let wait = status::transient_attempt(status, &seed, ctx.config.max_backoff, now);
            Action::requeue(wait)
        }
        ErrorClass::Permanent if failure.fixable => {
            status.phase = Some(Phase::ManualInterventionRequired);
            status::condition(
                status,
                ConditionType::Ready,
                false,
                &failure.reason,
                format!("{} (at {checkpoint:?})", failure.message),
                generation,
                now,
            );
            Action::requeue(MANUAL_RECHECK)
        }
        ErrorClass::Permanent | ErrorClass::BoundedRetryable => {
            status.phase = Some(Phase::Failed);
            status.completion_time = Some(now.clone());
            if let Some(kind) = status::condition_of(checkpoint) {
                status::condition(
                    status,
                    kind,
                    false,
                    &failure.reason,
                    failure.message.clone(),
                    generation,
                    now,
                );
            }
            status::condition(
                status,
                ConditionType::Ready,
                false,
                &failure.reason,
                format!("failed at {checkpoint:?}: {}", failure.message),
                generation,
                now,
            );
            ctx.metrics.transition("Failed");
            Action::requeue(Duration::ZERO)
        }
    }
}

/// Cancelled, or Failed: remove what was created, restore power if asked, then stop for good.
async fn finish_with_cleanup(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    before: Status,
    mut status: Status,
    now: Time,
) -> Result<Action> {
    let generation = vmm.metadata.generation;
    let cancelling = status.phase != Some(Phase::Failed);
    if cancelling && status.phase != Some(Phase::Cancelling) {
        status.phase = Some(Phase::Cancelling);
        status.reason = Some("CancelRequested".into());
        status.message = Some("removing what the migration created".into());
        status::condition(
            &mut status,
            ConditionType::Ready,
            false,
            "Cancelling",
            "spec.cancel is true".into(),
            generation,
            &now,
        );
        write_status(ctx, vmm, &before, &mut status).await?;
        event(
            ctx,
            vmm,
            EventType::Normal,
            "Cancelling",
            "spec.cancel is true: cleaning up",
        )
        .await;
        return Ok(Action::requeue(Duration::ZERO));
    }
    let done = {
        let mut step = Step {
            ctx,
            vmm,
            status: &mut status,
            now: now.clone(),
        };
        checkpoint::cleanup(&mut step).await?
    };
    if !done {
        write_status(ctx, vmm, &before, &mut status).await?;
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    status.cleaned_up = true;
    if cancelling {
        status.phase = Some(Phase::Cancelled);
        status.completion_time = Some(now.clone());
        status.reason = Some("Cancelled".into());
        status.message = Some("cancelled; everything the migration created was removed".into());
        status::condition(
            &mut status,
            ConditionType::Ready,
            false,
            "Cancelled",
            "the migration was cancelled".into(),
            generation,
            &now,
        );
        ctx.metrics.transition("Cancelled");
    }
    write_status(ctx, vmm, &before, &mut status).await?;
    cleaned_up_event(ctx, vmm).await;
    Ok(Action::await_change())
}

async fn cleaned_up_event(ctx: &Context, vmm: &VirtualMachineMigration) {
    let message = "everything the migration created was removed";
    event(ctx, vmm, EventType::Normal, "CleanedUp", message).await;
}

/// Writes status when it differs from what was read, with that read's resourceVersion as a precondition.
async fn write_status(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    before: &Status,
    status: &mut Status,
) -> Result<()> {
    status.progress = status::progress(status).or(status.progress.take());
    status.observed_generation = vmm.metadata.generation;
    if status == before {
        return Ok(());
    }
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &vmm.namespace().unwrap_or_default());
    let patch = json!({
        "apiVersion": ferry_api::API_VERSION,
        "kind": "VirtualMachineMigration",
        "metadata": {"name": vmm.name_any(), "resourceVersion": vmm.resource_version()},
        "status": status,
    });
    let written = api
        .patch_status(
            &vmm.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    ctx.wrote(&key(vmm), written.resource_version());
    Ok(())
}

/// `namespace/name`: the migration's key in metrics, backoff and the controller's own-write record.
fn key(vmm: &VirtualMachineMigration) -> String {
    format!("{}/{}", vmm.namespace().unwrap_or_default(), vmm.name_any())
}

async fn set_finalizer(ctx: &Context, vmm: &VirtualMachineMigration, present: bool) -> Result<()> {
    let mut finalizers: Vec<String> = vmm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER.to_string());
    }
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &vmm.namespace().unwrap_or_default());
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": vmm.resource_version()}});
    match api
        .patch(
            &vmm.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        // Released: the migration is over, and nothing reconciles it against our writes any more.
        Ok(_) if !present => {
            ctx.forget(&key(vmm));
            Ok(())
        }
        Ok(written) => {
            ctx.wrote(&key(vmm), written.resource_version());
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 && !present => {
            ctx.forget(&key(vmm));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// One Normal Event for the checkpoints a reconcile passed, named after the last one.
async fn publish_passed(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    passed: &[(&'static str, String)],
) {
    if let Some((reason, _)) = passed.last() {
        let messages: Vec<&str> = passed.iter().map(|(_, m)| m.as_str()).collect();
        event(ctx, vmm, EventType::Normal, reason, &messages.join("; ")).await;
    }
}

async fn event(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &vmm.object_ref(&())).await {
        tracing::warn!(
            class = "Transient",
            reason = "EventNotPublished",
            "publishing an event: {e}"
        );
    }
}
