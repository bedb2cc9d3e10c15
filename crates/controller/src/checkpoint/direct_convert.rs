//! Converting, on the direct path. Desired: every source disk read once, hashed, written into its blank volume,
//! synced and read back equal to the source, its sha256 recorded. Observed: the DataVolumes (still usable), any
//! pod of an earlier attempt still writing, this attempt's Job `<name>-convert-<attempt>` and its report.
//! Action: create the Job once the volumes are usable and no earlier writer runs; after a failed attempt, charge
//! it, then remove its Job (the next attempt rewrites every disk whole: a half-written volume never counts).
//! Recorded: sha256 and bytes per disk; DiskConverted (the source's bytes are durably where the VM reads them).

use std::time::Duration;

use ferry_api::{Phase, Reason};
use ferry_datapath::report::{JobReport, MAX_WRITTEN_DISKS, WrittenSummary};
use kube::ResourceExt;

use super::allocate::{Ensured, ensure};
use super::jobs::{self, JobState};
use super::{Next, Step};
use crate::error::{Failure, Result};
use crate::{children, status};

/// Long enough to stay quiet: the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let attempt = status::budget_used(step.status, Phase::Converting) + 1;
    let name = children::convert_job(step.vmm, attempt);
    match jobs::observe(step.ctx, step.vmm, &name).await? {
        JobState::Absent => {
            if attempt > 1 {
                // The failed attempt's Job was charged already; it makes room for this one.
                jobs::delete(
                    step.ctx,
                    step.vmm,
                    &children::convert_job(step.vmm, attempt - 1),
                )
                .await?;
            }
            match ensure(step).await? {
                Ensured::Usable => {}
                Ensured::Waiting(waiting) => {
                    return Ok(Next::wait("VolumesNotReady", waiting.join("; "), WAIT));
                }
                Ensured::Persist(next) => return Ok(next),
            }
            // A deleted Job's pods go later (background deletion); two writers on one volume would interleave.
            let writers = jobs::wait_for_writers(
                step.ctx,
                &ns,
                step.vmm,
                &["convert"],
                "ConversionRestarting",
            );
            if let Some(wait) = writers.await? {
                return Ok(wait);
            }
            super::convert::create_job(step, &ns, attempt).await?;
            Ok(writing(&name, attempt))
        }
        JobState::Terminating => Ok(Next::wait(
            "ConversionRestarting",
            format!("Job {name} is being removed"),
            WAIT,
        )),
        JobState::Running => Ok(writing(&name, attempt)),
        JobState::Succeeded(JobReport::Written(summary)) => {
            super::credentials::take_back(step.ctx, step.vmm).await?;
            record(step, &name, summary)
        }
        // A Job of another release, or another route's: nothing it says is about these volumes.
        JobState::Succeeded(_) => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} reported staged disks, but this migration writes its volumes"),
        )),
        JobState::Failed(failure, uid) => {
            super::convert::retry(step, Phase::Converting, &name, &uid, failure).await
        }
    }
}

fn writing(job: &str, attempt: i32) -> Next {
    // The same words while it starts and runs: its pod starting is no news worth a status write.
    Next::wait(
        "Converting",
        format!("Job {job} (attempt {attempt}) writes the disks into their volumes"),
        WAIT,
    )
}

fn record(step: &mut Step<'_>, job: &str, summary: WrittenSummary) -> Result<Next> {
    if summary.sha256.len() != step.status.disks.len() {
        return Err(Failure::bounded(
            Reason::DiskNotConverted,
            format!(
                "Job {job} wrote {} disk(s), the VM has {}",
                summary.sha256.len(),
                step.status.disks.len()
            ),
        ));
    }
    for (disk, sha256) in step.status.disks.iter_mut().zip(&summary.sha256) {
        disk.sha256 = Some(sha256.clone());
        // Every attempt reads each disk whole.
        disk.bytes_moved = disk.capacity_bytes;
    }
    step.ctx.metrics.bytes_moved(summary.bytes_read);
    Ok(Next::advance(
        "DisksWritten",
        format!(
            "{} disk(s) written into their volumes and read back ({:?}) equal to the source: {} bytes read, {} written, \
             the rest were zeros",
            summary.sha256.len(),
            summary.read_back,
            summary.bytes_read,
            summary.bytes_written
        ),
    ))
}

/// The most disks the direct path takes: their results must fit the conversion pod's termination message.
pub const MAX_DISKS: usize = MAX_WRITTEN_DISKS;
