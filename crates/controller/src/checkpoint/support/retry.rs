//! A failed child (a Job or a DataVolume, by uid) charged to its checkpoint's retry budget, once.

use ferry_api::{ErrorClass, Phase};

use crate::checkpoint::step::{Next, Step};
use crate::error::{Failure, Result};
use crate::status;

/// When a failure was charged.
#[derive(Debug, PartialEq, Eq)]
pub enum Charged {
    /// In this pass: it must be on record before the failed child is removed.
    Now,
    /// In an earlier pass: the failed child can go.
    Before,
}

/// Charges `failure` of the child `failed` (its uid) to `phase`'s budget. A permanent failure, or one with the
/// budget spent, ends the migration (the error).
pub fn charge(
    step: &mut Step<'_>,
    phase: Phase,
    failed: &str,
    failure: &Failure,
) -> Result<Charged> {
    if failure.class == ErrorClass::Permanent {
        return Err(failure.clone());
    }
    let budget = step.vmm.spec.retry.budget;
    match status::charge(step.status, phase, budget, failed) {
        status::Charge::Exhausted => Err(status::exhausted(failure, budget)),
        status::Charge::Charged => Ok(Charged::Now),
        status::Charge::AlreadyCharged => Ok(Charged::Before),
    }
}

/// Records `failure` as `phase`'s last error and writes it before the checkpoint acts again: `reason`, with the
/// retry it starts.
pub fn persist(step: &mut Step<'_>, phase: Phase, reason: &'static str, failure: &Failure) -> Next {
    status::record_error(step.status, failure, phase, &step.now);
    Next::persist(
        reason,
        format!(
            "{} (retry {} of {})",
            failure.message,
            status::budget_used(step.status, phase),
            step.vmm.spec.retry.budget
        ),
    )
}
