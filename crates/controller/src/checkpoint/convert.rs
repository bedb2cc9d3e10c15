//! Converting. Desired: every disk staged with its sha256 recorded. Observed: this attempt's conversion Job
//! `<name>-convert-<attempt>`, the summary in its termination message and each disk's manifest in staging.
//! Action: create the Job if absent; after a failed attempt, delete it and spend one bounded retry. Recorded:
//! staged URL, sha256 and bytes per disk; DiskConverted.

use std::time::Duration;

use ferry_api::{Phase, Reason};
use ferry_datapath::report::JobReport;

use super::step::{Next, Step};
use super::support::jobs::{self, Attempt, JobAttempt};
use super::support::{conversion, credentials, source};
use crate::error::{Failure, Result};
use crate::{build, children};

const CONVERSION: JobAttempt = JobAttempt {
    phase: Phase::Converting,
    job: |vmm, _, n| children::convert_job(vmm, n),
    replaced: |vmm, _, n| vec![children::convert_job(vmm, n)],
    // It writes only to staging, under a name of its own attempt.
    writers: &[],
    // The same words while it starts and runs: its pod starting is no news worth a status write.
    running: |job, n| {
        Next::wait(
            "Converting",
            format!("Job {job} (attempt {n}) converts the disks"),
            WAIT,
        )
    },
    failed: JobAttempt::only_charged,
    fixable_in_place: &[],
    restarting: "ConversionRestarting",
    retrying: "ConversionRetrying",
};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    match jobs::attempt(step, &CONVERSION).await? {
        Attempt::Start { name, n } => {
            conversion::create_job(step, n).await?;
            Ok((CONVERSION.running)(&name, n))
        }
        Attempt::Succeeded { name, report } => {
            credentials::take_back(step.ctx, step.vmm).await?;
            record(step, &name, report).await
        }
        Attempt::Wait(next) => Ok(next),
    }
}

/// Long enough to stay quiet: the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

async fn record(step: &mut Step<'_>, job: &str, report: JobReport) -> Result<Next> {
    let vm_uuid = build::job::source_vm_uuid(&source::recorded(step.status)?);
    let disks = crate::staging::converted(
        step.ctx,
        step.vmm,
        &step.status.disks,
        &vm_uuid,
        report,
        job,
    )
    .await?;
    let mut moved = 0;
    for disk in &mut step.status.disks {
        let Some(found) = disks.iter().find(|d| d.index == disk.index as u32) else {
            return Err(Failure::bounded(
                Reason::DiskNotConverted,
                format!("Job {job} reported no result for disk {}", disk.index),
            ));
        };
        disk.staged_url = Some(found.staged.url.clone());
        disk.sha256 = Some(found.staged.source_sha256.clone());
        disk.bytes_moved = found.bytes_read as i64;
        moved += found.bytes_read;
    }
    step.ctx.metrics.bytes_moved(moved);
    Ok(Next::advance(
        "DisksStaged",
        format!(
            "{} disk(s) staged with their sha256 ({moved} bytes read)",
            disks.len()
        ),
    ))
}
