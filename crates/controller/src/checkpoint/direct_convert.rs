//! Converting, on the direct path. Desired: every source disk read once, hashed, written into its blank volume,
//! synced and read back equal to the source, its sha256 recorded. Observed: the DataVolumes (still usable), any
//! pod of an earlier attempt still writing, this attempt's Job `<name>-convert-<attempt>` and its report.
//! Action: create the Job once the volumes are usable and no earlier writer runs; after a failed attempt, charge
//! it, then remove its Job (the next attempt rewrites every disk whole: a half-written volume never counts).
//! Recorded: sha256 and bytes per disk; DiskConverted (the source's bytes are durably where the VM reads them).

use std::time::Duration;

use ferry_api::{Phase, Reason};
use ferry_datapath::report::{JobReport, WrittenSummary};
use ferry_datapath::spec::RoundSpec;

use super::step::{Next, Step};
use super::support::jobs::{self, Attempt, JobAttempt};
use super::support::volumes::{Ensured, ensure_blank};
use super::support::{conversion, credentials};
use crate::children;
use crate::error::{Failure, Result};

/// Long enough to stay quiet: the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

const WRITING: JobAttempt = JobAttempt {
    phase: Phase::Converting,
    job: |vmm, _, n| children::convert_job(vmm, n),
    replaced: |vmm, _, n| vec![children::convert_job(vmm, n)],
    // A deleted Job's pods go later (background deletion); two writers on one volume would interleave.
    writers: &["convert"],
    // The same words while it starts and runs: its pod starting is no news worth a status write.
    running: |job, n| {
        Next::wait(
            "Converting",
            format!("Job {job} (attempt {n}) writes the disks into their volumes"),
            WAIT,
        )
    },
    failed: JobAttempt::only_charged,
    fixable_in_place: &[],
    restarting: "ConversionRestarting",
    retrying: "ConversionRetrying",
};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    match jobs::attempt(step, &WRITING).await? {
        Attempt::Start { name, n } => {
            match ensure_blank(step).await? {
                Ensured::Usable => {}
                Ensured::Waiting(waiting) => {
                    return Ok(Next::wait("VolumesNotReady", waiting.join("; "), WAIT));
                }
                Ensured::Persist(next) => return Ok(next),
            }
            match final_sync(step) {
                Some(round) => conversion::create_round_job(step, &name, round).await?,
                None => conversion::create_job(step, n).await?,
            }
            Ok((WRITING.running)(&name, n))
        }
        Attempt::Succeeded {
            name,
            report: JobReport::Written(summary),
        } => {
            credentials::take_back(step.ctx, step.vmm).await?;
            // A warm migration copied cold (warm mode refused) leaves the source's tracking as it found it too.
            super::support::warm_source::restore_tracking(step).await?;
            record(step, &name, summary)
        }
        Attempt::Succeeded {
            name,
            report: JobReport::Round(summary),
        } => {
            credentials::take_back(step.ctx, step.vmm).await?;
            // Copied for the last time: the source's tracking goes back to how it was.
            super::support::warm_source::restore_tracking(step).await?;
            super::warm_cutover::record(step, &name, summary)
        }
        // A Job of another release, or another route's: nothing it says is about these volumes.
        Attempt::Succeeded { name, .. } => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} reported staged disks, but this migration writes its volumes"),
        )),
        Attempt::Wait(next) => Ok(next),
    }
}

/// A warm migration's last copy, once the source is off: each disk's changes since its last precopy round (the
/// volumes hold that round). None for a cold migration, or a warm one with no round copied.
fn final_sync(step: &Step<'_>) -> Option<RoundSpec> {
    let warm = step.status.warm.as_ref()?;
    if step.vmm.spec.warm.is_none() || warm.rounds_done == 0 || warm.refused.is_some() {
        return None;
    }
    let check = step.vmm.spec.warm.as_ref()?.cutover_check;
    Some(RoundSpec {
        vm_moref: step.status.source.as_ref()?.moref.clone(),
        snapshot: None,
        since: warm.change_ids.clone(),
        hash_source: check == ferry_api::CutoverCheck::Source,
    })
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
