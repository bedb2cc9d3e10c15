//! The stages of one reconcile, each a method of [`Reconcile`]: what was read, the status being edited, and the
//! checkpoints passed so far.

use std::time::Duration;

use ferry_api::{
    ConditionType, ErrorClass, FINALIZER, Phase, VirtualMachineMigration,
    VirtualMachineMigrationStatus as Status,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::writes::{event, set_finalizer, write_status};
use super::{CLEANUP_RECHECK, HOLD_ANNOTATION, MANUAL_RECHECK, held_before, key};
use crate::checkpoint::{self, CHECKPOINTS, Next, Step};
use crate::context::Context;
use crate::error::{Failure, Result};
use crate::status::StatusEditor;

/// Where a reconcile's run of checkpoints stopped.
pub(super) enum Stop {
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
pub(super) struct Reconcile<'a> {
    ctx: &'a Context,
    vmm: &'a VirtualMachineMigration,
    key: String,
    before: Status,
    pub(super) edit: StatusEditor,
    /// Each checkpoint passed in this reconcile, for its one Event.
    passed: Vec<(&'static str, String)>,
}

impl<'a> Reconcile<'a> {
    pub(super) fn new(ctx: &'a Context, vmm: &'a VirtualMachineMigration) -> Self {
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
    pub(super) async fn deleted(&mut self) -> Result<Action> {
        self.ctx.metrics.phase(&self.key, None);
        if !self.has_finalizer() {
            return Ok(Action::await_change());
        }
        let status = &self.edit.status;
        crate::slots::left_line(&self.ctx.slots, self.vmm, status);
        let must_clean = status.phase != Some(Phase::Succeeded) && !status.cleaned_up;
        if must_clean && !self.clean_up(|_| {}).await? {
            return Ok(Action::requeue(CLEANUP_RECHECK));
        }
        set_finalizer(self.ctx, self.vmm, false).await?;
        Ok(Action::await_change())
    }

    /// A finished migration releases its finalizer; a new one gets it before anything else happens.
    pub(super) async fn guard(&mut self) -> Result<Option<Action>> {
        let status = &self.edit.status;
        let phase = status.phase;
        let phase_name = phase.map(|p| format!("{p:?}"));
        let entered = status
            .checkpoints
            .iter()
            .rfind(|c| Some(c.phase) == phase)
            .map(|c| c.entered.0.as_millisecond() as f64 / 1000.0);
        let now_in = phase_name.as_deref().map(|p| (p, entered));
        self.ctx.metrics.phase(&self.key, now_in);
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
    pub(super) fn start(&mut self) -> Phase {
        if let Some(phase) = self.edit.status.phase {
            return phase;
        }
        let first = CHECKPOINTS[0].phase;
        self.edit.status.start_time = Some(self.edit.now().clone());
        self.edit.status.target_vm = Some(crate::children::vm_name(self.vmm));
        self.edit.enter(checkpoint::with_condition(first));
        self.edit.status.reason = Some("Started".into());
        self.edit.status.message = Some("discovering the source VM".into());
        self.passed
            .push(("Discovering", "migration started".into()));
        first
    }

    /// The wait left before the next attempt after a transient error, if any.
    pub(super) fn backing_off(&self) -> Option<Duration> {
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

    pub(super) async fn hold(&mut self, held: Phase) -> Result<Action> {
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
    pub(super) async fn run_checkpoints(&mut self, mut checkpoint: Phase) -> Stop {
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
            let to = checkpoint::after(checkpoint::Route::of(self.vmm), checkpoint);
            self.edit.advance(
                checkpoint::with_condition(checkpoint),
                checkpoint::with_condition(to),
                reason,
                message.clone(),
            );
            if checkpoint::frees_host_slot(checkpoint) {
                self.edit.status.host_slot = None;
            }
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
    pub(super) async fn conclude(&mut self, stop: Stop) -> Action {
        self.publish_passed().await;
        self.publish_new_warnings().await;
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

    /// A warning condition that turned True in this pass (`ConditionType::WARNINGS`): said once, as an Event.
    async fn publish_new_warnings(&self) {
        let true_warning = |s: &Status, type_: ConditionType| {
            s.conditions
                .iter()
                .find(|c| c.type_ == type_.as_str() && c.status == "True")
                .cloned()
        };
        for type_ in ConditionType::WARNINGS {
            let Some(now) = true_warning(&self.edit.status, type_) else {
                continue;
            };
            if true_warning(&self.before, type_).is_some() {
                continue;
            }
            // The user's to weigh, not an error of the controller's: logged as news.
            tracing::info!(condition = type_.as_str(), reason = %now.reason, "{}", now.message);
            event(
                self.ctx,
                self.vmm,
                EventType::Warning,
                &now.reason,
                &now.message,
            )
            .await;
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
    pub(super) async fn cancel_or_fail(&mut self) -> Result<Action> {
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
            self.edit.status.host_slot = None;
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

    pub(super) async fn write(&mut self) -> Result<()> {
        write_status(
            self.ctx,
            self.vmm,
            &self.before,
            &mut self.edit.status,
            false,
        )
        .await?;
        Ok(())
    }

    /// Writes the status of a reconcile that waits, or defers a change of progress alone: `Some` is when to look
    /// again to show it.
    pub(super) async fn write_waiting(&mut self) -> Result<Option<Duration>> {
        write_status(
            self.ctx,
            self.vmm,
            &self.before,
            &mut self.edit.status,
            true,
        )
        .await
    }
}
