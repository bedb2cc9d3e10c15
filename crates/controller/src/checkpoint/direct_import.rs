//! Importing, on the direct path. Desired: each disk's volume proven to hold the source's bytes (the conversion
//! Job read it back past the page cache), and still the volume that was written. Observed: each DataVolume.
//! Action: none; it only observes, so it advances in the same pass as Converting. Recorded: verified, progress;
//! DiskImported.

use std::time::Duration;

use ferry_api::Reason;
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

use super::{Next, Step};
use crate::build::datavolume::{DvState, dv_state};
use crate::build::dv_resource;
use crate::children;
use crate::error::{Failure, Result};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let dvs = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &dv_resource());
    let mut waiting = Vec::new();
    for disk in &mut step.status.disks {
        let name = children::data_volume(step.vmm, disk.index);
        let importing =
            |dv: &DynamicObject| matches!(dv_state(Some(dv)), DvState::InProgress { .. });
        let cached = step.ctx.caches.data_volume(&ns, &name);
        let observed = crate::cache::read(cached, &dvs, &name, importing).await?;
        let observed = children::refuse_unless_ours(
            observed,
            step.vmm,
            "DataVolume",
            Reason::DataVolumeExists,
        )?;
        match dv_state(observed.as_ref()) {
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
