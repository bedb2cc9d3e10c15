//! A first consumer for volumes that wait for one. On a WaitForFirstConsumer class without volume populators
//! (storage with no CSIDriver: CDI's legacy path), CDI leaves a blank DataVolume in `WaitForFirstConsumer` until a
//! pod binds its claim, then starts its blank importer as soon as no pod uses the claim any more, and that
//! importer makes `disk.img` anew. So the conversion pod must not be the first consumer, or what it wrote is
//! lost after it ends. A short Job that mounts every disk's volume and exits binds them (all on one node, since
//! one pod holds them all), as KubeVirt's virt-controller does for a VM's volumes; the volumes are written once
//! CDI says `Succeeded`. With populators CDI says `PendingPopulation` instead, and the conversion pod may be the
//! first consumer: the claim binds only once population is done.
//! Desired: the Job while a volume waits for a consumer, none after. Observed: the volumes' phases, the Job.
//! Action: create it, remove it once it failed (to start again) or is no longer needed. Recorded: nothing.

use k8s_openapi::api::batch::v1::Job;
use kube::{Api, ResourceExt};

use super::jobs;
use crate::checkpoint::step::Step;
use crate::error::Result;
use crate::{build, children};

/// Makes the first-consumer Job exist while `waiting` (some volume waits for a consumer, and every disk's
/// DataVolume exists), and removes it once nothing waits. Returns what the migration waits for, if anything.
pub async fn ensure(step: &Step<'_>, waiting: bool) -> Result<Option<String>> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let name = children::bind_job(step.vmm);
    if !waiting {
        // The watch cache is enough here: a Job it has not seen yet is removed with the migration's others when it
        // ends, and the common case (no such Job) costs no request.
        if step.ctx.caches.job(&ns, &name).is_some() {
            jobs::delete(step.ctx, step.vmm, &name).await?;
        }
        return Ok(None);
    }
    let api: Api<Job> = Api::namespaced(step.ctx.client.clone(), &ns);
    let cached = step.ctx.caches.job(&ns, &name);
    let pending = |job: &Job| job.metadata.deletion_timestamp.is_none() && !failed(job);
    let found = crate::cache::read(cached, &api, &name, pending).await?;
    let found = children::refuse_unless_ours(found, step.vmm, "Job", ferry_api::Reason::JobExists)?;
    Ok(Some(match found {
        None => {
            let disks = step.status.disks.iter().map(|d| d.index as u32);
            let job = build::job::bind_job(step.vmm, disks, &step.ctx.config.worker_image);
            jobs::create(step.ctx, &ns, &job).await?;
            format!("Job {name} created to be the volumes' first consumer")
        }
        Some(job) if job.metadata.deletion_timestamp.is_some() => {
            format!("Job {name}, the volumes' first consumer, being removed to start again")
        }
        Some(job) if failed(&job) => {
            // It binds nothing more: start it again (the volumes' bind deadline bounds how often).
            jobs::delete(step.ctx, step.vmm, &name).await?;
            format!("Job {name}, the volumes' first consumer, failed; starting it again")
        }
        Some(_) => format!("Job {name} is the volumes' first consumer"),
    }))
}

fn failed(job: &Job) -> bool {
    jobs::condition(job, "Failed")
}
