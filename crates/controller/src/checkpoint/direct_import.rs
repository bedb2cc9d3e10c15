//! Importing, on the direct path. Desired: each disk's volume proven to hold the source's bytes (the conversion
//! Job read it back past the page cache), and still the volume that was written. Observed: each DataVolume.
//! Action: none; it only observes, so it advances in the same pass as Converting. Recorded: verified, progress;
//! DiskImported.

use std::time::Duration;

use ferry_api::Reason;

use super::step::{Next, Step};
use super::support::volumes::{self, DvState};
use crate::error::{Failure, Result};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let mut waiting = Vec::new();
    for i in 0..step.status.disks.len() {
        let index = step.status.disks[i].index;
        let importing = |state: &DvState| matches!(state, DvState::InProgress { .. });
        let observed = volumes::observe(step, index, importing).await?;
        let (name, disk) = (observed.name, &mut step.status.disks[i]);
        match observed.state {
            DvState::Succeeded => {
                disk.progress = Some("100.0%".into());
                disk.verified = disk.sha256.is_some();
            }
            // Bound by its first consumer (the conversion pod); CDI finishes its own bookkeeping after.
            DvState::InProgress { phase, .. } => waiting.push(format!("{name} {phase}")),
            DvState::Absent | DvState::Terminating | DvState::Failed { .. } => {
                return Err(Failure::permanent(
                    Reason::VolumeReplaced,
                    format!(
                        "DataVolume {name} was removed or failed after disk {} was written into it; create a new \
                         migration",
                        disk.index
                    ),
                ));
            }
        }
    }
    if !waiting.is_empty() {
        return Ok(Next::wait(
            "Importing",
            waiting.join("; "),
            Duration::from_secs(30),
        ));
    }
    Ok(Next::advance(
        "DisksImportedAndVerified",
        format!(
            "{} disk(s) in their volumes; each read back equal to its source's sha256",
            step.status.disks.len()
        ),
    ))
}
