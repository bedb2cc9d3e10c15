//! The checkpoints of architecture §3. Each reads like a row of the seed's table: what must be true to leave it
//! (desired), what is read fresh on every reconcile (observed), the one idempotent step it may take (action), and
//! what it writes into the status working copy (recorded). The reconciler turns the returned [`Next`] into the
//! phase move, conditions, Events and the single status write.

mod cleanup;
mod convert;
pub(crate) mod discover;
mod guest;
mod import;
pub(crate) mod jobs;
mod power;
mod prepare;
mod start;
mod validate;
mod vm;

use std::time::Duration;

use ferry_api::{Phase, VirtualMachineMigration, VirtualMachineMigrationStatus as Status};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub use cleanup::cleanup;

use crate::context::Context;
use crate::error::Result;

/// What one reconcile of a checkpoint concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Not there yet: look again after `after`, or sooner when a watched child changes.
    Wait {
        reason: &'static str,
        message: String,
        after: Duration,
    },
    /// The checkpoint's desired state holds and its evidence is recorded: move on.
    Advance {
        to: Phase,
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

    pub fn advance(to: Phase, reason: &'static str, message: impl Into<String>) -> Self {
        Next::Advance {
            to,
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

pub async fn run(phase: Phase, step: &mut Step<'_>) -> Result<Next> {
    match phase {
        Phase::Discovering => discover::run(step).await,
        Phase::Validating => validate::run(step).await,
        Phase::Preparing => prepare::run(step).await,
        Phase::Converting => convert::run(step).await,
        Phase::Importing => import::run(step).await,
        Phase::CreatingVm => vm::run(step).await,
        Phase::Starting => start::run(step).await,
        Phase::ValidatingGuest => guest::run(step).await,
        other => Ok(Next::wait(
            "NothingToDo",
            format!("{other:?} has no checkpoint"),
            Duration::from_secs(300),
        )),
    }
}
