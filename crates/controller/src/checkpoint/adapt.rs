//! Adapting (`conversion.guestAdaptation: VirtV2v` only). Desired: the guest on the volumes adapted by virt-v2v
//! exactly once, its new sha256 and what virt-v2v found recorded. Observed: this attempt's Job
//! `<name>-adapt-<attempt>` and its report. Action: create the Job (it refuses volumes that no longer hold the
//! source's bytes, so an adapted disk is never adapted again); after a failed attempt that left the volumes as
//! they were, charge it and remove its Job. Recorded: each disk's `adaptedSha256`, `status.adaptation`;
//! GuestAdapted.

use std::time::Duration;

use ferry_api::{AdaptationStatus, Phase, Reason};
use ferry_datapath::adapt::{AdaptedSummary, MAX_ADAPTED_DISKS};
use ferry_datapath::report::JobReport;
use kube::ResourceExt;

use super::jobs::{self, JobState};
use super::{Next, Step};
use crate::error::{Failure, Result};
use crate::{build, children, status};

/// virt-v2v takes minutes; the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    if !step.status.disks.is_empty() && step.status.disks.iter().all(|d| d.adapted_sha256.is_some())
    {
        return Ok(adapted(step));
    }
    let ns = step.vmm.namespace().unwrap_or_default();
    let attempt = status::budget_used(step.status, Phase::Adapting) + 1;
    let name = children::adapt_job(step.vmm, attempt);
    match jobs::observe(step.ctx, &ns, &name).await? {
        JobState::Absent => {
            if attempt > 1 {
                jobs::delete(step.ctx, &ns, &children::adapt_job(step.vmm, attempt - 1)).await?;
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
            super::convert::retry(step, Phase::Adapting, &ns, &name, &uid, failure).await
        }
    }
}

async fn create_job(step: &Step<'_>, ns: &str, attempt: i32) -> Result<()> {
    let source = step.status.source.clone().ok_or_else(|| {
        Failure::transient(Reason::SourceNotDiscovered, "discovery recorded no source")
    })?;
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
