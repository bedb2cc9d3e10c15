//! What a checkpoint is given ([`Step`]) and what it concludes ([`Next`]).

use std::time::Duration;

use ferry_api::{VirtualMachineMigration, VirtualMachineMigrationStatus as Status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::context::Context;
use crate::status::StatusEditor;

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
