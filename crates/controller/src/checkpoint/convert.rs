//! Converting. Desired: every disk staged with its sha256 recorded. Observed: this attempt's conversion Job
//! `<name>-convert-<attempt>`, the summary in its termination message and each disk's manifest in staging.
//! Action: create the Job if absent; after a failed attempt, delete it and spend one bounded retry. Recorded:
//! staged URL, sha256 and bytes per disk; DiskConverted.

use std::time::Duration;

use ferry_api::{ErrorClass, Phase, Reason};
use ferry_datapath::report::JobReport;
use kube::ResourceExt;

use super::jobs::{self, JobState};
use super::{Next, Step};
use crate::error::{Failure, Result};
use crate::{build, children, status};

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
            create_job(step, &ns, attempt).await?;
            // The same words as while it runs: its pod starting is no news worth a status write.
            Ok(Next::wait(
                "Converting",
                format!("Job {name} (attempt {attempt}) converts the disks"),
                WAIT,
            ))
        }
        JobState::Terminating => Ok(Next::wait(
            "ConversionRestarting",
            format!("Job {name} is being removed"),
            WAIT,
        )),
        JobState::Running => Ok(Next::wait(
            "Converting",
            format!("Job {name} (attempt {attempt}) converts the disks"),
            WAIT,
        )),
        JobState::Succeeded(result) => {
            super::credentials::take_back(step.ctx, step.vmm).await?;
            record(step, &name, result).await
        }
        JobState::Failed(failure, uid) => {
            retry(step, Phase::Converting, &name, &uid, failure).await
        }
    }
}

/// Creates attempt `attempt`'s conversion Job for the disks discovery recorded (either route: the spec decides
/// whether it stages or writes the volumes), once the source is shown to be the VM discovery found.
pub(super) async fn create_job(step: &Step<'_>, ns: &str, attempt: i32) -> Result<()> {
    let provider = super::source::provider(step.ctx, step.vmm).await?;
    let session = super::source::session_for(step.ctx, &provider).await?;
    super::source::checked_source_vm(&session, step.status).await?;
    super::credentials::lend(step.ctx, step.vmm, &provider).await?;
    let source = super::source::recorded(step.status)?;
    let job = build::job::convert_job(
        step.vmm,
        &source,
        &provider,
        attempt,
        &step.ctx.config.worker_image,
    );
    jobs::create(step.ctx, ns, &job).await
}

/// Long enough to stay quiet: the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

async fn record(step: &mut Step<'_>, job: &str, report: JobReport) -> Result<Next> {
    let vm_uuid = build::job::source_vm_uuid(&super::source::recorded(step.status)?);
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

/// A failed attempt: permanent errors stop; anything else is charged to `phase`'s budget (recorded first), and
/// the failed Job removed on the next pass, which makes room for the next attempt's Job.
pub(super) async fn retry(
    step: &mut Step<'_>,
    phase: Phase,
    job: &str,
    uid: &str,
    failure: Failure,
) -> Result<Next> {
    let retrying = match phase {
        Phase::Adapting => "AdaptationRetrying",
        _ => "ConversionRetrying",
    };
    if failure.class == ErrorClass::Permanent {
        return Err(failure);
    }
    let budget = step.vmm.spec.retry.budget;
    match status::charge(step.status, phase, budget, uid) {
        status::Charge::Exhausted => Err(status::exhausted(&failure, budget)),
        status::Charge::Charged => {
            status::record_error(step.status, &failure, phase, &step.now);
            Ok(Next::persist(
                retrying,
                format!(
                    "{} (retry {} of {budget})",
                    failure.message,
                    status::budget_used(step.status, phase)
                ),
            ))
        }
        status::Charge::AlreadyCharged => {
            jobs::delete(step.ctx, step.vmm, job).await?;
            Ok(Next::wait(
                retrying,
                format!("removing the failed Job {job}"),
                Duration::from_secs(2),
            ))
        }
    }
}
