//! Allocating (the direct path), before the source is touched: a quota, StorageClass or provisioning failure
//! shows here while the source VM still runs. Desired: a blank DataVolume `<name>-disk-<i>` per disk, allocated
//! by CDI (`Succeeded`) or waiting for its first consumer with populators (`PendingPopulation`: the conversion
//! pod will be, as in Forklift's AllocateDisks). On CDI's legacy path (`WaitForFirstConsumer`) a Job of its own
//! binds them first (`support::first_consumer`). Observed: each DataVolume's phase, a claim of its name left
//! behind, the first-consumer Job. Action: create an absent DataVolume, or the first consumer; a failed volume is
//! charged to the budget, then removed and created again. Recorded: each disk's DataVolume.

use std::time::Duration;

use super::step::{Next, Step};
use super::support::volumes::{Ensured, ensure_blank};
use crate::error::Result;

// DataVolumes are watched: this only catches a lost event.
const WAIT: Duration = Duration::from_secs(60);

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    match ensure_blank(step).await? {
        Ensured::Usable => Ok(Next::advance(
            "VolumesAllocated",
            format!(
                "{} blank DataVolume(s) ready to be written",
                step.status.disks.len()
            ),
        )),
        Ensured::Waiting(waiting) => Ok(Next::wait("Allocating", waiting.join("; "), WAIT)),
        Ensured::Persist(next) => Ok(next),
    }
}
