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

use crate::checkpoint::{self, CHECKPOINTS, Next, Step};
use crate::children::MANAGER;
use crate::context::Context;
use crate::error::{Failure, Result};
use crate::status::StatusEditor;

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
    let action = run.conclude(stop).await;
    run.write().await?;
    Ok(action)
}

/// A migration waiting for a person re-runs the checkpoint that stopped it.
fn resume_point(phase: Phase, status: &Status) -> Phase {
    match phase {
        Phase::ManualInterventionRequired => status
            .retry
            .as_ref()
            .and_then(|r| r.last_error.as_ref())
            .map_or(Phase::Discovering, |e| e.phase),
        other => other,
    }
}

/// Where a reconcile's run of checkpoints stopped.
enum Stop {
    /// Not there yet in `checkpoint`: record why, and look again after `after`.
    Waiting {
        checkpoint: Phase,
        reason: &'static str,
        message: String,
        after: Duration,
    },
    Failed {
        checkpoint: Phase,
        failure: Failure,
    },
    /// Entered a phase this reconcile does not run: `Succeeded`, or one held by the annotation.
    Entered(Phase),
}

/// One reconcile of one migration: the copy it read, the status it edits, and the checkpoints it passed.
struct Reconcile<'a> {
    ctx: &'a Context,
    vmm: &'a VirtualMachineMigration,
    key: String,
    before: Status,
    edit: StatusEditor,
    /// Each checkpoint passed in this reconcile, for its one Event.
    passed: Vec<(&'static str, String)>,
}

impl<'a> Reconcile<'a> {
    fn new(ctx: &'a Context, vmm: &'a VirtualMachineMigration) -> Self {
        let before = vmm.status.clone().unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        Self {
            ctx,
            vmm,
            key: key(vmm),
            edit: StatusEditor::new(before.clone(), vmm.metadata.generation, now),
            before,
            passed: Vec::new(),
        }
    }

    fn has_finalizer(&self) -> bool {
        self.vmm.finalizers().iter().any(|f| f == FINALIZER)
    }

    /// Deleted: clean up unless the migration succeeded or already did, then release the finalizer.
    async fn deleted(&mut self) -> Result<Action> {
        self.ctx.metrics.phase(&self.key, None);
        if !self.has_finalizer() {
            return Ok(Action::await_change());
        }
        let status = &self.edit.status;
        let must_clean = status.phase != Some(Phase::Succeeded) && !status.cleaned_up;
        if must_clean && !self.clean_up(|_| {}).await? {
            return Ok(Action::requeue(CLEANUP_RECHECK));
        }
        set_finalizer(self.ctx, self.vmm, false).await?;
        Ok(Action::await_change())
    }

    /// A finished migration releases its finalizer; a new one gets it before anything else happens.
    async fn guard(&mut self) -> Result<Option<Action>> {
        let status = &self.edit.status;
        let phase = status.phase;
        let phase_name = phase.map(|p| format!("{p:?}"));
        self.ctx.metrics.phase(&self.key, phase_name.as_deref());
        let finished = matches!(phase, Some(Phase::Succeeded) | Some(Phase::Cancelled))
            || (phase == Some(Phase::Failed) && status.cleaned_up);
        if finished {
            // Nothing is left to clean up: a delete need not wait for the controller.
            if self.has_finalizer() {
                set_finalizer(self.ctx, self.vmm, false).await?;
            }
            return Ok(Some(Action::await_change()));
        }
        if !self.has_finalizer() {
            set_finalizer(self.ctx, self.vmm, true).await?;
            return Ok(Some(Action::requeue(Duration::ZERO)));
        }
        Ok(None)
    }

    /// The migration's phase; a new migration starts at the first checkpoint.
    fn start(&mut self) -> Phase {
        if let Some(phase) = self.edit.status.phase {
            return phase;
        }
        let first = CHECKPOINTS[0].phase;
        self.edit.status.start_time = Some(self.edit.now().clone());
        self.edit.status.target_vm = Some(crate::children::vm_name(self.vmm));
        self.edit.enter(first);
        self.edit.status.reason = Some("Started".into());
        self.edit.status.message = Some("discovering the source VM".into());
        self.passed
            .push(("Discovering", "migration started".into()));
        first
    }

    /// The wait left before the next attempt after a transient error, if any.
    fn backing_off(&self) -> Option<Duration> {
        let next = self
            .edit
            .status
            .retry
            .as_ref()?
            .next_attempt_time
            .as_ref()?;
        let now = self.edit.now();
        (next.0 > now.0).then(|| now.0.duration_until(next.0).unsigned_abs())
    }

    async fn hold(&mut self, held: Phase) -> Result<Action> {
        self.publish_passed().await;
        self.edit.status.reason = Some("Held".into());
        self.edit.status.message = Some(format!(
            "held before {held:?} by the annotation {HOLD_ANNOTATION}; remove it to go on"
        ));
        self.write().await?;
        Ok(Action::await_change())
    }

    /// Runs checkpoints from `checkpoint` on. One that advanced acted on nothing in that pass (it only observed
    /// its desired state), so the next one runs at once, and one status write records them all. A step that must
    /// be on record before it acts ends its pass with [`Next::Persist`], and that write, of its own.
    async fn run_checkpoints(&mut self, mut checkpoint: Phase) -> Stop {
        loop {
            let mut step = Step::new(self.ctx, self.vmm, &mut self.edit);
            let (reason, message) = match checkpoint::run(checkpoint, &mut step).await {
                Ok(Next::Advance { reason, message }) => (reason, message),
                Ok(Next::Wait {
                    reason,
                    message,
                    after,
                }) => {
                    return Stop::Waiting {
                        checkpoint,
                        reason,
                        message,
                        after,
                    };
                }
                Ok(Next::Persist { reason, message }) => {
                    return Stop::Waiting {
                        checkpoint,
                        reason,
                        message,
                        after: Duration::ZERO,
                    };
                }
                Err(failure) => {
                    return Stop::Failed {
                        checkpoint,
                        failure,
                    };
                }
            };
            let to = checkpoint::after(checkpoint);
            self.edit.advance(checkpoint, to, reason, message.clone());
            if let Some(retry) = &mut self.edit.status.retry {
                retry.last_error = None;
            }
            self.ctx.metrics.transition(&format!("{to:?}"));
            tracing::info!(from = ?checkpoint, to = ?to, reason, "{message}");
            self.passed.push((reason, message));
            if to.is_terminal() || held_before(self.vmm, to).is_some() {
                return Stop::Entered(to);
            }
            checkpoint = to;
        }
    }

    /// Turns where the checkpoints stopped into the status and what to do next.
    async fn conclude(&mut self, stop: Stop) -> Action {
        self.publish_passed().await;
        match stop {
            Stop::Entered(Phase::Succeeded) => {
                self.edit.status.completion_time = Some(self.edit.now().clone());
                let message = "the VM runs in KubeVirt and is handed over";
                let ready = ConditionType::Ready;
                self.edit
                    .condition(ready, true, "MigrationSucceeded", message);
                Action::await_change()
            }
            // Held before it: the hold is recorded on the next pass.
            Stop::Entered(_) => Action::requeue(Duration::ZERO),
            Stop::Waiting {
                checkpoint,
                reason,
                message,
                after,
            } => {
                self.warn_new_error(checkpoint).await;
                let status = &mut self.edit.status;
                status.phase = Some(checkpoint);
                status.reason = Some(reason.into());
                status.message = Some(message);
                Action::requeue(after)
            }
            Stop::Failed {
                checkpoint,
                failure,
            } => self.on_failure(checkpoint, failure).await,
        }
    }

    /// A checkpoint that charged a failed child to its budget recorded the error: say so, once.
    async fn warn_new_error(&self, checkpoint: Phase) {
        let last_error = |s: &Status| s.retry.as_ref().and_then(|r| r.last_error.clone());
        let before = last_error(&self.before);
        let Some(error) = last_error(&self.edit.status).filter(|e| Some(e) != before.as_ref())
        else {
            return;
        };
        tracing::warn!(checkpoint = ?checkpoint, class = ?error.class, reason = %error.reason, "{}", error.message);
        event(
            self.ctx,
            self.vmm,
            EventType::Warning,
            &error.reason,
            &error.message,
        )
        .await;
    }

    async fn on_failure(&mut self, checkpoint: Phase, failure: Failure) -> Action {
        let ctx = self.ctx;
        ctx.metrics
            .error(&format!("{:?}", failure.class), failure.reason.as_str());
        let last = self
            .edit
            .status
            .retry
            .as_ref()
            .and_then(|r| r.last_error.as_ref());
        let repeated = last.is_some_and(|e| {
            e.reason == failure.reason.as_str()
                && e.message == failure.message
                && e.phase == checkpoint
        });
        // The same error seen again (a person has not fixed it yet) is neither a new Event nor a new write.
        if !repeated {
            tracing::warn!(checkpoint = ?checkpoint, class = ?failure.class, reason = %failure.reason, "{}", failure.message);
            self.edit.record_error(&failure, checkpoint);
            let (reason, message) = (failure.reason.as_str(), &failure.message);
            event(ctx, self.vmm, EventType::Warning, reason, message).await;
        }
        let ready = ConditionType::Ready;
        match failure.class {
            ErrorClass::Transient => Action::requeue(
                self.edit
                    .transient_attempt(&self.key, ctx.config.max_backoff),
            ),
            ErrorClass::Permanent if failure.fixable => {
                self.edit.status.phase = Some(Phase::ManualInterventionRequired);
                let message = format!("{} (at {checkpoint:?})", failure.message);
                self.edit
                    .condition(ready, false, failure.reason.as_str(), message);
                Action::requeue(MANUAL_RECHECK)
            }
            ErrorClass::Permanent | ErrorClass::BoundedRetryable => {
                self.edit.status.phase = Some(Phase::Failed);
                self.edit.status.completion_time = Some(self.edit.now().clone());
                if let Some(kind) = checkpoint::condition_of(checkpoint) {
                    let message = failure.message.clone();
                    self.edit
                        .condition(kind, false, failure.reason.as_str(), message);
                }
                let message = format!("failed at {checkpoint:?}: {}", failure.message);
                self.edit
                    .condition(ready, false, failure.reason.as_str(), message);
                ctx.metrics.transition("Failed");
                Action::requeue(Duration::ZERO)
            }
        }
    }

    /// Cancelled, or Failed: remove what was created, restore power if asked, then stop for good.
    async fn cancel_or_fail(&mut self) -> Result<Action> {
        let phase = self.edit.status.phase;
        let cancelling = phase != Some(Phase::Failed);
        let ready = ConditionType::Ready;
        if cancelling && phase != Some(Phase::Cancelling) {
            self.edit.status.phase = Some(Phase::Cancelling);
            self.edit.status.reason = Some("CancelRequested".into());
            self.edit.status.message = Some("removing what the migration created".into());
            self.edit
                .condition(ready, false, "Cancelling", "spec.cancel is true");
            self.write().await?;
            let message = "spec.cancel is true: cleaning up";
            event(self.ctx, self.vmm, EventType::Normal, "Cancelling", message).await;
            return Ok(Action::requeue(Duration::ZERO));
        }
        let metrics = &self.ctx.metrics;
        let cancelled = |edit: &mut StatusEditor| {
            if !cancelling {
                return;
            }
            edit.status.phase = Some(Phase::Cancelled);
            edit.status.completion_time = Some(edit.now().clone());
            edit.status.reason = Some("Cancelled".into());
            let message = "cancelled; everything the migration created was removed";
            edit.status.message = Some(message.into());
            edit.condition(ready, false, "Cancelled", "the migration was cancelled");
            metrics.transition("Cancelled");
        };
        if !self.clean_up(cancelled).await? {
            return Ok(Action::requeue(CLEANUP_RECHECK));
        }
        Ok(Action::await_change())
    }

    /// One cleanup pass, written. While something remains, false; once nothing does, `cleaned_up` is recorded
    /// with `finish`'s edits in the same write, and an Event says so.
    async fn clean_up(&mut self, finish: impl FnOnce(&mut StatusEditor)) -> Result<bool> {
        let done = {
            let mut step = Step::new(self.ctx, self.vmm, &mut self.edit);
            checkpoint::cleanup(&mut step).await?
        };
        if done {
            self.edit.status.cleaned_up = true;
            finish(&mut self.edit);
        }
        self.write().await?;
        if done {
            let message = "everything the migration created was removed";
            event(self.ctx, self.vmm, EventType::Normal, "CleanedUp", message).await;
        }
        Ok(done)
    }

    /// One Normal Event for the checkpoints this reconcile passed, named after the last one.
    async fn publish_passed(&self) {
        if let Some((reason, _)) = self.passed.last() {
            let messages: Vec<&str> = self.passed.iter().map(|(_, m)| m.as_str()).collect();
            event(
                self.ctx,
                self.vmm,
                EventType::Normal,
                reason,
                &messages.join("; "),
            )
            .await;
        }
    }

    async fn write(&mut self) -> Result<()> {
        write_status(self.ctx, self.vmm, &self.before, &mut self.edit.status).await
    }
}

/// Writes status when it differs from what was read, with that read's resourceVersion as a precondition.
async fn write_status(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    before: &Status,
    status: &mut Status,
) -> Result<()> {
    status.progress = crate::status::progress(status).or(status.progress.take());
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
