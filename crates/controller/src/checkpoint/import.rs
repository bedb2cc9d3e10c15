//! Importing. Desired: DataVolume `<name>-disk-<i>` Succeeded for every disk, and its content proven to hash to
//! the source's sha256. Observed: each DataVolume's phase and progress, then each verification Job. Action: create
//! an absent DataVolume from the staged image; run `ferry verify` on its PVC; a failed import or a mismatch
//! deletes the DataVolume and spends one bounded retry. Recorded: progress, verified; DiskImported.

use std::time::Duration;

use ferry_api::{ErrorClass, Phase, Reason};
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

use super::jobs::{self, JobState};
use super::{Next, Step, volumes};
use crate::build::datavolume::{DvState, dv_state, unbound_past_deadline};
use crate::build::{self, dv_resource};
use crate::error::{Failure, Result};
use crate::{children, status};

/// DataVolumes and Jobs are watched: their changes wake the migration, and this only catches a lost event. Under a
/// fleet's backlog hundreds of migrations wait here for minutes, so it is long.
const WATCHED_WAIT: Duration = Duration::from_secs(180);

/// A leftover claim going away is not watched: it is looked at this often.
const CLAIM_WAIT: Duration = Duration::from_secs(15);

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let dvs = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &dv_resource());
    let mut waiting = Vec::new();
    let mut wait = WATCHED_WAIT;
    let mut ca_ready = false;
    for i in 0..step.status.disks.len() {
        let disk = step.status.disks[i].clone();
        if disk.verified {
            continue;
        }
        let attempt = disk.verify_failures + 1;
        let name = children::data_volume(step.vmm, disk.index);
        // An import the cache shows in progress, or imported and still being verified, only makes us wait; its
        // end comes as an event.
        let verifier = children::verify_job(step.vmm, disk.index, attempt);
        let waiting_only = |dv: &DynamicObject| {
            !status::is_charged(step.status, &dv.uid().unwrap_or_default())
                && match dv_state(Some(dv)) {
                    DvState::InProgress { .. } => true,
                    DvState::Succeeded => jobs::cached_running(step.ctx, step.vmm, &verifier),
                    _ => false,
                }
        };
        let cached = step.ctx.caches.data_volume(&ns, &name);
        let observed = crate::cache::read(cached, &dvs, &name, waiting_only).await?;
        let observed = children::refuse_unless_ours(
            observed,
            step.vmm,
            "DataVolume",
            Reason::DataVolumeExists,
        )?;
        if let Some(dv) = &observed
            && dv.metadata.deletion_timestamp.is_none()
            && status::is_charged(step.status, &dv.uid().unwrap_or_default())
        {
            // Its failure is on record: remove it, and the import starts over. Its earlier verification Jobs go
            // too: a pod that mounted the claim, even a finished one, keeps the claim from being released.
            for earlier in 1..attempt {
                jobs::delete(
                    step.ctx,
                    step.vmm,
                    &children::verify_job(step.vmm, disk.index, earlier),
                )
                .await?;
            }
            volumes::delete_dv(&dvs, dv).await?;
            step.status.disks[i].progress = None;
            waiting.push(format!("{name} removed for a new import"));
            continue;
        }
        let dv_uid = observed.as_ref().and_then(|d| d.uid()).unwrap_or_default();
        match dv_state(observed.as_ref()) {
            DvState::Absent => {
                if volumes::earlier_claim_left(step, &ns, &name).await? {
                    waiting.push(format!("the previous claim {name} is being removed"));
                    wait = CLAIM_WAIT;
                    continue;
                }
                if !ca_ready {
                    volumes::ensure_staging_ca(step, &ns).await?;
                    ca_ready = true;
                }
                let dv = build::datavolume::data_volume(
                    step.vmm,
                    &disk,
                    &crate::maps::disk_storage(step.vmm, &disk),
                )
                .ok_or_else(|| {
                    Failure::transient(
                        Reason::DiskNotStaged,
                        format!("disk {} has no staged image", disk.index),
                    )
                })?;
                ferry_kube::create::create_if_absent(&dvs, &dv).await?;
                step.status.disks[i].data_volume = Some(name.clone());
                waiting.push(format!("{name} created"));
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
                return retry(step, i, &dv_uid, failure);
            }
            DvState::InProgress { phase, progress } => {
                step.status.disks[i].data_volume = Some(name.clone());
                step.status.disks[i].progress = progress.clone();
                waiting.push(format!("{name} {phase} {}", progress.unwrap_or_default()));
            }
            DvState::Failed { message } => {
                let failure = Failure::bounded(
                    Reason::ImportFailed,
                    format!("DataVolume {name}: {message}"),
                );
                return retry(step, i, &dv_uid, failure);
            }
            DvState::Succeeded => {
                step.status.disks[i].progress = Some("100.0%".into());
                let job = verifier;
                match jobs::observe(step.ctx, step.vmm, &job).await? {
                    JobState::Absent => {
                        let sha = disk.sha256.clone().unwrap_or_default();
                        let spec = build::job::verify_job(
                            step.vmm,
                            disk.index,
                            attempt,
                            &sha,
                            disk.capacity_bytes,
                            &step.ctx.config.worker_image,
                        );
                        jobs::create(step.ctx, &ns, &spec).await?;
                        waiting.push(format!("{job} verifies {name}"));
                    }
                    JobState::Running | JobState::Terminating => {
                        waiting.push(format!("{job} verifies {name}"))
                    }
                    JobState::Succeeded(_) => step.status.disks[i].verified = true,
                    // Only wrong or short content is the import's fault; a verifier that died (killed,
                    // evicted) just runs again on the same DataVolume.
                    JobState::Failed(failure, job_uid) => {
                        let content_wrong =
                            matches!(failure.reason, Reason::ChecksumMismatch | Reason::ShortRead);
                        let failed = if content_wrong { &dv_uid } else { &job_uid };
                        return retry(step, i, failed, failure);
                    }
                }
            }
        }
    }
    if waiting.is_empty() {
        return Ok(Next::advance(
            "DisksImportedAndVerified",
            format!(
                "{} disk(s) imported; each hashes to its source's sha256",
                step.status.disks.len()
            ),
        ));
    }
    Ok(Next::wait("Importing", waiting.join("; "), wait))
}

/// A failed import or verification of disk `i`: permanent errors stop; otherwise the failed object (`failed`,
/// a DataVolume or a verification Job) is charged to the budget, recorded before anything is removed; the next
/// pass removes a charged DataVolume for a new import, and runs the next verification Job.
fn retry(step: &mut Step<'_>, i: usize, failed: &str, failure: Failure) -> Result<Next> {
    if failure.class == ErrorClass::Permanent {
        return Err(failure);
    }
    let budget = step.vmm.spec.retry.budget;
    match status::charge(step.status, Phase::Importing, budget, failed) {
        status::Charge::Exhausted => return Err(status::exhausted(&failure, budget)),
        status::Charge::Charged => step.status.disks[i].verify_failures += 1,
        status::Charge::AlreadyCharged => {}
    }
    status::record_error(step.status, &failure, Phase::Importing, &step.now);
    Ok(Next::persist(
        "ImportRetrying",
        format!(
            "{} (retry {} of {budget})",
            failure.message,
            status::budget_used(step.status, Phase::Importing)
        ),
    ))
}
