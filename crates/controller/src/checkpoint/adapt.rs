//! Adapting (`conversion.guestAdaptation: VirtV2v` only). Desired: the guest on the volumes adapted by virt-v2v
//! exactly once, its new sha256 and what virt-v2v found recorded. Observed: this attempt's Job
//! `<name>-adapt-<attempt>` and its report, or, after an attempt that may have changed the volumes, its rewrite
//! Job `<name>-rewrite-<attempt>`; pods of earlier attempts still running. Action: once no earlier pod runs,
//! rewrite the volumes from the source if `rewriteVolumes` says so, then create the adaptation Job (it refuses
//! volumes that no longer hold the source's bytes, so an adapted or torn disk is never adapted again); a failed
//! attempt is charged, and unless it failed before touching the volumes, they are marked for rewriting.
//! Recorded: each disk's `adaptedSha256`, `status.adaptation`, `rewriteVolumes`; GuestAdapted.

use std::time::Duration;

use ferry_api::{AdaptationStatus, ErrorClass, Phase, Reason};
use ferry_datapath::adapt::{AdaptedSummary, MAX_ADAPTED_DISKS};
use ferry_datapath::report::{JobReport, WrittenSummary};
use kube::ResourceExt;

use super::jobs::{self, JobState};
use super::{Next, Step};
use crate::error::{Failure, Result};
use crate::{build, children, status};

/// virt-v2v takes minutes; the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

/// The Jobs that write the volumes while a migration adapts.
const WRITERS: [&str; 2] = ["adapt", "rewrite"];

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    if !step.status.disks.is_empty() && step.status.disks.iter().all(|d| d.adapted_sha256.is_some())
    {
        return Ok(adapted(step));
    }
    let ns = step.vmm.namespace().unwrap_or_default();
    let attempt = status::budget_used(step.status, Phase::Adapting) + 1;
    if step.status.rewrite_volumes {
        return rewrite(step, &ns, attempt).await;
    }
    let name = children::adapt_job(step.vmm, attempt);
    match jobs::observe(step.ctx, step.vmm, &name).await? {
        JobState::Absent => {
            if attempt > 1 {
                jobs::delete(
                    step.ctx,
                    step.vmm,
                    &children::adapt_job(step.vmm, attempt - 1),
                )
                .await?;
            }
            if let Some(wait) = earlier_writers(step, &ns).await? {
                return Ok(wait);
            }
            create_job(step, &ns, attempt).await?;
            Ok(adapting(&name, attempt))
        }
        JobState::Terminating => Ok(Next::wait(
            "AdaptationRestarting",
            format!("Job {name} is being removed"),
            WAIT,
        )),
        JobState::Running => Ok(adapting(&name, attempt)),
        JobState::Succeeded(JobReport::Adapted(summary)) => record(step, &name, summary),
        JobState::Succeeded(_) => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} did not report an adaptation"),
        )),
        JobState::Failed(failure, uid) => {
            if failure.class != ErrorClass::Permanent && may_have_changed_volumes(&failure) {
                step.status.rewrite_volumes = true;
            }
            super::convert::retry(step, Phase::Adapting, &name, &uid, failure).await
        }
    }
}

/// Whether a failed attempt may have left the volumes changed. The worker classes virt-v2v's own refusals, and
/// virt-v2v writes only overlays in scratch; anything else (a lost pod, an error during or after the commit, a
/// volume found not to hold the source) may have left a volume half-adapted. Pure.
fn may_have_changed_volumes(failure: &Failure) -> bool {
    !matches!(
        failure.reason,
        Reason::AdaptationFailed
            | Reason::AdaptationApplianceFailed
            | Reason::GuestOSUnsupported
            | Reason::GuestDriversMissing
            | Reason::GuestDiskFull
            | Reason::GuestFilesystemUnwritable
    )
}

/// Writes every volume from the source again, then clears `rewriteVolumes`; its failures are charged to the
/// adaptation's budget, like the attempt that made it necessary.
async fn rewrite(step: &mut Step<'_>, ns: &str, attempt: i32) -> Result<Next> {
    let name = children::rewrite_job(step.vmm, attempt);
    match jobs::observe(step.ctx, step.vmm, &name).await? {
        JobState::Absent => {
            if attempt > 1 {
                for earlier in [
                    children::adapt_job(step.vmm, attempt - 1),
                    children::rewrite_job(step.vmm, attempt - 1),
                ] {
                    jobs::delete(step.ctx, step.vmm, &earlier).await?;
                }
            }
            if let Some(wait) = earlier_writers(step, ns).await? {
                return Ok(wait);
            }
            let provider = super::source::provider(step.ctx, step.vmm).await?;
            if let Some(next) = crate::slots::acquire(step, &provider).await? {
                return Ok(next);
            }
            super::credentials::lend(step.ctx, step.vmm, &provider).await?;
            let source = super::source::recorded(step.status)?;
            let job = build::job::rewrite_job(
                step.vmm,
                &source,
                &provider,
                attempt,
                &step.ctx.config.worker_image,
            );
            jobs::create(step.ctx, ns, &job).await?;
            Ok(rewriting(&name, attempt))
        }
        JobState::Terminating => Ok(Next::wait(
            "AdaptationRestarting",
            format!("Job {name} is being removed"),
            WAIT,
        )),
        JobState::Running => Ok(rewriting(&name, attempt)),
        JobState::Succeeded(JobReport::Written(summary)) => {
            super::credentials::take_back(step.ctx, step.vmm).await?;
            rewritten(step, &name, summary)
        }
        JobState::Succeeded(_) => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} did not report the volumes it wrote"),
        )),
        JobState::Failed(failure, uid) => {
            super::convert::retry(step, Phase::Adapting, &name, &uid, failure).await
        }
    }
}

/// Waits while a pod of an earlier attempt still runs: it may still be committing into a volume.
async fn earlier_writers(step: &Step<'_>, ns: &str) -> Result<Option<Next>> {
    jobs::wait_for_writers(step.ctx, ns, step.vmm, &WRITERS, "AdaptationRestarting").await
}

fn rewriting(job: &str, attempt: i32) -> Next {
    Next::wait(
        "RewritingVolumes",
        format!(
            "Job {job} (attempt {attempt}) writes the volumes from the source again: the previous attempt may \
             have changed them"
        ),
        WAIT,
    )
}

/// The volumes hold the source's bytes again, or the source itself changed.
fn rewritten(step: &mut Step<'_>, job: &str, summary: WrittenSummary) -> Result<Next> {
    let recorded: Vec<Option<&String>> = step
        .status
        .disks
        .iter()
        .map(|d| d.sha256.as_ref())
        .collect();
    if summary.sha256.len() != recorded.len() {
        return Err(Failure::bounded(
            Reason::DiskNotConverted,
            format!(
                "Job {job} wrote {} disk(s), the VM has {}",
                summary.sha256.len(),
                recorded.len()
            ),
        ));
    }
    for (index, (read, copied)) in summary.sha256.iter().zip(&recorded).enumerate() {
        if Some(read) != *copied {
            return Err(Failure::permanent(
                Reason::ChecksumMismatch,
                format!(
                    "disk {index} of the source now hashes to {read}, not to {} as when it was copied: the source \
                     changed while it was off, so this copy is not trusted; a new migration copies it again",
                    copied.map(String::as_str).unwrap_or("nothing recorded")
                ),
            ));
        }
    }
    step.status.rewrite_volumes = false;
    step.status.host_slot = None;
    Ok(Next::persist(
        "VolumesRewritten",
        format!(
            "Job {job} wrote {} disk(s) from the source again and read them back equal to it; adapting again",
            summary.sha256.len()
        ),
    ))
}

async fn create_job(step: &Step<'_>, ns: &str, attempt: i32) -> Result<()> {
    let source = super::source::recorded(step.status)?;
    if let Some(disk) = step.status.disks.iter().find(|d| d.sha256.is_none()) {
        return Err(Failure::bounded(
            Reason::DiskNotConverted,
            format!("disk {} has no recorded sha256 to adapt from", disk.index),
        ));
    }
    let job = build::adapt_job::adapt_job(
        step.vmm,
        &source,
        &step.status.disks,
        attempt,
        &step.ctx.config.worker_image,
    );
    jobs::create(step.ctx, ns, &job).await
}

fn adapting(job: &str, attempt: i32) -> Next {
    Next::wait(
        "Adapting",
        format!("Job {job} (attempt {attempt}) adapts the guest with virt-v2v"),
        WAIT,
    )
}

fn record(step: &mut Step<'_>, job: &str, summary: AdaptedSummary) -> Result<Next> {
    if summary.sha256.len() != step.status.disks.len() {
        return Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!(
                "Job {job} adapted {} disk(s), the VM has {}",
                summary.sha256.len(),
                step.status.disks.len()
            ),
        ));
    }
    for (disk, sha256) in step.status.disks.iter_mut().zip(&summary.sha256) {
        disk.adapted_sha256 = Some(sha256.clone());
    }
    let found = &summary.inspection;
    let firmware = match found.firmware {
        ferry_adapt::inspection::GuestFirmware::Bios => "BIOS",
        ferry_adapt::inspection::GuestFirmware::Uefi => "UEFI",
        ferry_adapt::inspection::GuestFirmware::Unknown => "",
    };
    let boot = summary
        .boot_disk
        .map(|d| format!(", root on disk {d}"))
        .unwrap_or_default();
    step.status.adaptation = Some(AdaptationStatus {
        os: format!("{}{boot}", found.describe()),
        os_type: found.kind.clone(),
        distro: found.distro.clone(),
        osinfo: found.osinfo.clone(),
        arch: found.arch.clone(),
        firmware: firmware.into(),
        boot_disk: summary.boot_disk.map(|d| d as i32),
        seconds: summary.seconds as i64,
    });
    Ok(adapted(step))
}

fn adapted(step: &Step<'_>) -> Next {
    let os = step
        .status
        .adaptation
        .as_ref()
        .map(|a| a.os.clone())
        .unwrap_or_default();
    Next::advance(
        "GuestAdapted",
        format!(
            "virt-v2v adapted {os} on {} disk(s) for KubeVirt's virtio devices",
            step.status.disks.len()
        ),
    )
}

/// The most disks an adapted migration takes: their results must fit the Job's termination message.
pub const MAX_DISKS: usize = MAX_ADAPTED_DISKS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_virt_v2vs_own_refusals_leave_the_volumes_unmarked() {
        for untouched in [
            Reason::AdaptationFailed,
            Reason::AdaptationApplianceFailed,
            Reason::GuestDiskFull,
        ] {
            assert!(!may_have_changed_volumes(&Failure::bounded(untouched, "")));
        }
        // A pod killed mid-commit reports nothing; a commit that failed is an I/O error; a volume found changed.
        for unknown in [
            Reason::JobFailed,
            Reason::VolumeWriteFailed,
            Reason::VolumeNotAsConverted,
        ] {
            assert!(may_have_changed_volumes(&Failure::bounded(unknown, "")));
        }
    }
}
