//! The checkpoints, in the order of [`CHECKPOINTS`]. Each file reads as desired (what must be true to leave it),
//! observed (what is read fresh on every reconcile), action (the one idempotent step it may take) and recorded
//! (what it writes into the status working copy). The reconciler turns the returned [`Next`] into the phase move,
//! conditions, Events and the single status write.

mod cleanup;
mod convert;
pub(crate) mod discover;
mod disk_files;
mod guest;
mod import;
pub(crate) mod jobs;
mod prepare;
mod source;
mod start;
mod validate;
mod vm;

use std::time::Duration;

use ferry_api::{
    ConditionType, Phase, VirtualMachineMigration, VirtualMachineMigrationStatus as Status,
};
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub use cleanup::cleanup;

use crate::context::Context;
use crate::error::Result;
use crate::status::StatusEditor;

/// One checkpoint: the phase a migration is in while it runs, the condition that turns True when it is left, and
/// its step. Adding a checkpoint is a file and a row of [`CHECKPOINTS`].
pub struct Checkpoint {
    pub phase: Phase,
    pub condition: Option<ConditionType>,
    run: for<'a, 'b> fn(&'a mut Step<'b>) -> BoxFuture<'a, Result<Next>>,
}

/// The itinerary: every migration runs these in this order, and is `Succeeded` after the last.
pub const CHECKPOINTS: [Checkpoint; 8] = [
    Checkpoint {
        phase: Phase::Discovering,
        condition: Some(ConditionType::SourceDiscovered),
        run: |step| Box::pin(discover::run(step)),
    },
    Checkpoint {
        phase: Phase::Validating,
        condition: Some(ConditionType::Validated),
        run: |step| Box::pin(validate::run(step)),
    },
    Checkpoint {
        phase: Phase::Preparing,
        condition: None,
        run: |step| Box::pin(prepare::run(step)),
    },
    Checkpoint {
        phase: Phase::Converting,
        condition: Some(ConditionType::DiskConverted),
        run: |step| Box::pin(convert::run(step)),
    },
    Checkpoint {
        phase: Phase::Importing,
        condition: Some(ConditionType::DiskImported),
        run: |step| Box::pin(import::run(step)),
    },
    Checkpoint {
        phase: Phase::CreatingVm,
        condition: Some(ConditionType::VmCreated),
        run: |step| Box::pin(vm::run(step)),
    },
    Checkpoint {
        phase: Phase::Starting,
        condition: Some(ConditionType::VmStarted),
        run: |step| Box::pin(start::run(step)),
    },
    Checkpoint {
        phase: Phase::ValidatingGuest,
        condition: Some(ConditionType::GuestReady),
        run: |step| Box::pin(guest::run(step)),
    },
];

/// The checkpoint a migration in `phase` runs; none for phases that are not checkpoints.
pub fn find(phase: Phase) -> Option<&'static Checkpoint> {
    CHECKPOINTS.iter().find(|c| c.phase == phase)
}

/// The phase that follows checkpoint `phase`: the next row, or `Succeeded` after the last.
pub fn after(phase: Phase) -> Phase {
    let i = CHECKPOINTS.iter().position(|c| c.phase == phase);
    i.and_then(|i| CHECKPOINTS.get(i + 1))
        .map_or(Phase::Succeeded, |c| c.phase)
}

/// The checkpoints' phases in order, then `Succeeded`: the only way a phase may move forward.
pub fn phases() -> impl Iterator<Item = Phase> {
    CHECKPOINTS
        .iter()
        .map(|c| c.phase)
        .chain([Phase::Succeeded])
}

/// The condition checkpoint `phase` makes true when it is left.
pub fn condition_of(phase: Phase) -> Option<ConditionType> {
    find(phase).and_then(|c| c.condition)
}

/// What one reconcile of a checkpoint concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Not there yet: look again after `after`, or sooner when a watched child changes.
    Wait {
        reason: &'static str,
        message: String,
        after: Duration,
    },
    /// What was recorded must be on record before the step may act on it (the source's original power state, a
    /// retry charged to the budget): write the status now, then run the checkpoint again at once.
    Persist {
        reason: &'static str,
        message: String,
    },
    /// The checkpoint's desired state holds and its evidence is recorded: the next checkpoint runs.
    Advance {
        reason: &'static str,
        message: String,
    },
}

impl Next {
    pub fn wait(reason: &'static str, message: impl Into<String>, after: Duration) -> Self {
        Next::Wait {
            reason,
            message: message.into(),
            after,
        }
    }

    pub fn persist(reason: &'static str, message: impl Into<String>) -> Self {
        Next::Persist {
            reason,
            message: message.into(),
        }
    }

    pub fn advance(reason: &'static str, message: impl Into<String>) -> Self {
        Next::Advance {
            reason,
            message: message.into(),
        }
    }
}

/// The inputs of one checkpoint run: the migration as observed, its status being edited, and the time.
pub struct Step<'a> {
    pub ctx: &'a Context,
    pub vmm: &'a VirtualMachineMigration,
    pub status: &'a mut Status,
    pub now: Time,
}

impl<'a> Step<'a> {
    pub fn new(
        ctx: &'a Context,
        vmm: &'a VirtualMachineMigration,
        edit: &'a mut StatusEditor,
    ) -> Self {
        let now = edit.now().clone();
        Step {
            ctx,
            vmm,
            status: &mut edit.status,
            now,
        }
    }
}

/// Runs checkpoint `phase`'s step; a phase that is no checkpoint has nothing to do.
pub async fn run(phase: Phase, step: &mut Step<'_>) -> Result<Next> {
    match find(phase) {
        Some(checkpoint) => (checkpoint.run)(step).await,
        None => Ok(Next::wait(
            "NothingToDo",
            format!("{phase:?} has no checkpoint"),
            Duration::from_secs(300),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_itinerary_runs_every_checkpoint_once_and_ends_in_succeeded() {
        let order: Vec<Phase> = phases().collect();
        assert_eq!(
            order,
            [
                Phase::Discovering,
                Phase::Validating,
                Phase::Preparing,
                Phase::Converting,
                Phase::Importing,
                Phase::CreatingVm,
                Phase::Starting,
                Phase::ValidatingGuest,
                Phase::Succeeded,
            ]
        );
        assert_eq!(after(Phase::Preparing), Phase::Converting);
        assert_eq!(after(Phase::ValidatingGuest), Phase::Succeeded);
        assert_eq!(condition_of(Phase::Preparing), None);
        assert_eq!(
            condition_of(Phase::Importing),
            Some(ConditionType::DiskImported)
        );
        assert!(find(Phase::Cancelling).is_none());
    }
}
