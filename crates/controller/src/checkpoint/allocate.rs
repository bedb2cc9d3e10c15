//! Allocating (the direct path), before the source is touched: a quota, StorageClass or provisioning failure
//! shows here while the source VM still runs. Desired: a blank DataVolume `<name>-disk-<i>` per disk, allocated
//! by CDI (`Succeeded`) or waiting for its first consumer (`PendingPopulation`: the conversion pod will be, as
//! in Forklift's AllocateDisks). Observed: each DataVolume's phase, and a claim of its name left behind.
//! Action: create an absent DataVolume; a failed one is charged to the budget, then removed and created again.
//! Recorded: each disk's DataVolume.

use std::time::Duration;

use ferry_api::{ErrorClass, Phase, Reason};
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

use super::{Next, Step, volumes};
use crate::build::datavolume::{DvState, blank_data_volume, dv_state, unbound_past_deadline};
use crate::build::dv_resource;
use crate::error::{Failure, Result};
use crate::{children, status};

// DataVolumes are watched: this only catches a lost event.
const WAIT: Duration = Duration::from_secs(60);

/// CDI's phases of a blank volume that a writer can use: allocated, or bound by its first consumer.
pub fn usable(state: &DvState) -> bool {
    match state {
        DvState::Succeeded => true,
        DvState::InProgress { phase, .. } => phase == "PendingPopulation",
        _ => false,
    }
}

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    match ensure(step).await? {
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

/// Where the disks' blank DataVolumes stand after one pass of [`ensure`].
pub enum Ensured {
    /// Every one can be written.
    Usable,
    /// Not yet: what each is waiting for.
    Waiting(Vec<String>),
    /// Something must be on record first (a failure charged, the disks the volumes are for): write the status.
    Persist(Next),
}

/// Makes every disk's blank DataVolume exist, created again after a failure (charged to Allocating's budget).
/// Converting runs it too before each attempt, so a volume lost since Allocating is allocated again.
pub async fn ensure(step: &mut Step<'_>) -> Result<Ensured> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let dvs = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &dv_resource());
    let mut waiting = Vec::new();
    for i in 0..step.status.disks.len() {
        let disk = step.status.disks[i].clone();
        let name = children::data_volume(step.vmm, disk.index);
        // A volume the cache shows usable or on its way is only checked again; anything else is read afresh.
        let settled = |dv: &DynamicObject| {
            !status::is_charged(step.status, &dv.uid().unwrap_or_default())
                && matches!(dv_state(Some(dv)), s if usable(&s) || matches!(s, DvState::InProgress { .. }))
        };
        let cached = step.ctx.caches.data_volume(&ns, &name);
        let observed = crate::cache::read(cached, &dvs, &name, settled).await?;
        let observed = children::refuse_unless_ours(
            observed,
            step.vmm,
            "DataVolume",
            Reason::DataVolumeExists,
        )?;
        let uid = observed.as_ref().and_then(|d| d.uid()).unwrap_or_default();
        if let Some(dv) = &observed
            && dv.metadata.deletion_timestamp.is_none()
            && status::is_charged(step.status, &uid)
        {
            // Its failure is on record: remove it, and it is allocated again.
            volumes::delete_dv(&dvs, dv).await?;
            waiting.push(format!("{name} removed to be allocated again"));
            continue;
        }
        let state = dv_state(observed.as_ref());
        if usable(&state) {
            step.status.disks[i].data_volume = Some(name);
            continue;
        }
        match state {
            DvState::Absent => {
                // Discovery's disks may still be only in this pass's working copy: a volume is created only for
                // a disk on record.
                let on_record = step
                    .vmm
                    .status
                    .as_ref()
                    .is_some_and(|s| s.disks.len() == step.status.disks.len());
                if !on_record {
                    return Ok(Ensured::Persist(Next::persist(
                        "Allocating",
                        "recording the source's disks before allocating their volumes",
                    )));
                }
                if volumes::earlier_claim_left(step, &ns, &name).await? {
                    waiting.push(format!("the previous claim {name} is being removed"));
                    continue;
                }
                let placement = crate::maps::disk_storage(step.vmm, &disk);
                let dv = blank_data_volume(step.vmm, disk.index, disk.capacity_bytes, &placement)
                    .ok_or_else(|| {
                    Failure::permanent(
                        Reason::APIRejected,
                        format!("DataVolume {name} does not build"),
                    )
                })?;
                ferry_kube::create::create_if_absent(&dvs, &dv).await?;
                step.status.disks[i].data_volume = Some(name.clone());
                waiting.push(format!("{name} created"));
            }
            DvState::Failed { message } => {
                let failure = Failure::bounded(
                    Reason::VolumeAllocationFailed,
                    format!("DataVolume {name}: {message}"),
                );
                return retry(step, &uid, failure).map(Ensured::Persist);
            }
            DvState::Terminating => waiting.push(format!("{name} being removed")),
            DvState::InProgress { .. }
                if let Some(why) = observed
                    .as_ref()
                    .and_then(|dv| unbound_past_deadline(dv, &step.now)) =>
            {
                let failure = Failure::bounded(
                    Reason::VolumeNotBound,
                    format!("DataVolume {name} is {why}"),
                );
                return retry(step, &uid, failure).map(Ensured::Persist);
            }
            DvState::InProgress { phase, .. } => waiting.push(format!("{name} {phase}")),
            DvState::Succeeded => {}
        }
    }
    Ok(if waiting.is_empty() {
        Ensured::Usable
    } else {
        Ensured::Waiting(waiting)
    })
}

/// A failed allocation: charged to the budget and recorded before the DataVolume is removed.
fn retry(step: &mut Step<'_>, failed: &str, failure: Failure) -> Result<Next> {
    if failure.class == ErrorClass::Permanent {
        return Err(failure);
    }
    let budget = step.vmm.spec.retry.budget;
    if let status::Charge::Exhausted =
        status::charge(step.status, Phase::Allocating, budget, failed)
    {
        return Err(status::exhausted(&failure, budget));
    }
    status::record_error(step.status, &failure, Phase::Allocating, &step.now);
    Ok(Next::persist(
        "AllocationRetrying",
        format!(
            "{} (retry {} of {budget})",
            failure.message,
            status::budget_used(step.status, Phase::Allocating)
        ),
    ))
}
