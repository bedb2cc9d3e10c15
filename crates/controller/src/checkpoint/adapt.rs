//! Adapting (`conversion.guestAdaptation: VirtV2v` only). Desired: the guest on the volumes adapted by virt-v2v
//! exactly once, its new sha256 and what virt-v2v found recorded. Observed: this attempt's Job
//! `<name>-adapt-<attempt>` and its report, or, after an attempt that may have changed the volumes, its rewrite
//! Job `<name>-rewrite-<attempt>`; pods of earlier attempts still running. Action: once no earlier pod runs,
//! rewrite the volumes from the source if `rewriteVolumes` says so, then create the adaptation Job (it refuses
//! volumes that no longer hold the source's bytes, so an adapted or torn disk is never adapted again); a failed
//! attempt is charged, and unless it failed before touching the volumes, they are marked for rewriting; a refusal
//! the person fixes in the migration (the drivers or first-boot tool it names) waits for them with every volume
//! kept, and adapts again once the migration changed.
//! Recorded: each disk's `adaptedSha256`, `status.adaptation`, `rewriteVolumes`; GuestAdapted.

use std::time::Duration;

use ferry_adapt::clock::GuestClock;
use ferry_api::{
    AdaptationStatus, ErrorClass, GuestClockStatus, GuestRtc, Phase, Reason,
    VirtualMachineMigrationStatus as Status,
};
use ferry_datapath::adapt::AdaptedSummary;
use ferry_datapath::report::{JobReport, WrittenSummary};
use kube::ResourceExt;

use super::step::{Next, Step};
use super::support::jobs::{self, Attempt, JobAttempt};
use super::support::{credentials, host_slot, source};
use crate::error::{Failure, Result};
use crate::{build, children};

/// virt-v2v takes minutes; the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

/// The Jobs that write the volumes while a migration adapts.
const WRITERS: &[&str] = &["adapt", "rewrite"];

const ADAPTATION: JobAttempt = JobAttempt {
    phase: Phase::Adapting,
    job: children::adapt_job,
    replaced: |vmm, n| vec![children::adapt_job(vmm, n)],
    writers: WRITERS,
    running: |job, n| {
        Next::wait(
            "Adapting",
            format!("Job {job} (attempt {n}) adapts the guest with virt-v2v"),
            WAIT,
        )
    },
    failed: mark_for_rewriting,
    // The person names other drivers or a first-boot tool; the volumes virt-v2v never touched are adapted then.
    fixable_in_place: &[
        Reason::GuestDriversMissing,
        Reason::GuestFirstBootToolMissing,
    ],
    restarting: "AdaptationRestarting",
    retrying: "AdaptationRetrying",
};

/// Its failures are charged to the adaptation's budget, like the attempt that made it necessary.
const REWRITE: JobAttempt = JobAttempt {
    job: children::rewrite_job,
    replaced: |vmm, n| vec![children::adapt_job(vmm, n), children::rewrite_job(vmm, n)],
    running: |job, n| {
        Next::wait(
            "RewritingVolumes",
            format!(
                "Job {job} (attempt {n}) writes the volumes from the source again: the previous attempt may \
                 have changed them"
            ),
            WAIT,
        )
    },
    failed: JobAttempt::only_charged,
    fixable_in_place: &[],
    ..ADAPTATION
};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    if !step.status.disks.is_empty() && step.status.disks.iter().all(|d| d.adapted_sha256.is_some())
    {
        return Ok(adapted(step));
    }
    if step.status.rewrite_volumes {
        return rewrite(step).await;
    }
    match jobs::attempt(step, &ADAPTATION).await? {
        Attempt::Start { name, n } => {
            create_job(step, n).await?;
            Ok((ADAPTATION.running)(&name, n))
        }
        Attempt::Succeeded {
            name,
            report: JobReport::Adapted(summary),
        } => record(step, &name, summary),
        Attempt::Succeeded { name, .. } => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} did not report an adaptation"),
        )),
        Attempt::Wait(next) => Ok(next),
    }
}

/// Unless it failed before touching the volumes, a failed attempt leaves them to be written again.
fn mark_for_rewriting(status: &mut Status, failure: &Failure) {
    if failure.class != ErrorClass::Permanent && may_have_changed_volumes(failure) {
        status.rewrite_volumes = true;
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
            | Reason::GuestFirstBootToolMissing
            | Reason::GuestDiskFull
            | Reason::GuestFilesystemUnwritable
    )
}

/// Writes every volume from the source again, then clears `rewriteVolumes`.
async fn rewrite(step: &mut Step<'_>) -> Result<Next> {
    match jobs::attempt(step, &REWRITE).await? {
        Attempt::Start { name, n } => {
            let provider = source::provider(step.ctx, step.vmm).await?;
            if let Some(next) = host_slot::acquire(step, &provider).await {
                return Ok(next);
            }
            credentials::lend(step.ctx, step.vmm, &provider).await?;
            let source = source::recorded(step.status)?;
            let job = build::job::rewrite_job(
                step.vmm,
                &source,
                &provider,
                n,
                &step.ctx.config.worker_image,
            );
            jobs::create(step.ctx, &step.vmm.namespace().unwrap_or_default(), &job).await?;
            Ok((REWRITE.running)(&name, n))
        }
        Attempt::Succeeded {
            name,
            report: JobReport::Written(summary),
        } => {
            credentials::take_back(step.ctx, step.vmm).await?;
            rewritten(step, &name, summary)
        }
        Attempt::Succeeded { name, .. } => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} did not report the volumes it wrote"),
        )),
        Attempt::Wait(next) => Ok(next),
    }
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

async fn create_job(step: &Step<'_>, attempt: i32) -> Result<()> {
    let source = source::recorded(step.status)?;
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
    jobs::create(step.ctx, &step.vmm.namespace().unwrap_or_default(), &job).await
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
        clock: summary.clock.as_ref().map(clock_status),
        seconds: summary.seconds as i64,
    });
    Ok(adapted(step))
}

fn clock_status(clock: &GuestClock) -> GuestClockStatus {
    match clock {
        GuestClock::Utc => GuestClockStatus {
            rtc: GuestRtc::Utc,
            ..Default::default()
        },
        GuestClock::LocalTime { windows_zone } => GuestClockStatus {
            rtc: GuestRtc::LocalTime,
            windows_zone: windows_zone.clone(),
            timezone: clock.iana_zone().unwrap_or_default().into(),
        },
    }
}

fn adapted(step: &Step<'_>) -> Next {
    let adaptation = step.status.adaptation.as_ref();
    let os = adaptation.map(|a| a.os.clone()).unwrap_or_default();
    let clock = adaptation
        .and_then(|a| a.clock.as_ref())
        .map(|c| format!("; {}", describe_clock(c)))
        .unwrap_or_default();
    Next::advance(
        "GuestAdapted",
        format!(
            "virt-v2v adapted {os} on {} disk(s) for KubeVirt's virtio devices{clock}",
            step.status.disks.len()
        ),
    )
}

fn describe_clock(clock: &GuestClockStatus) -> String {
    match (clock.rtc, clock.timezone.as_str()) {
        (GuestRtc::Utc, _) => "the guest keeps its clock in UTC".into(),
        (GuestRtc::LocalTime, "") => format!(
            "the guest keeps local time in a zone with no IANA name ({}), so the VM's clock runs in UTC and \
             the guest shows UTC until it syncs its time",
            if clock.windows_zone.is_empty() {
                "unnamed"
            } else {
                &clock.windows_zone
            }
        ),
        (GuestRtc::LocalTime, zone) => format!(
            "the guest keeps local time ({}), so the VM's clock runs in {zone}",
            clock.windows_zone
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guests_clock_is_recorded_with_its_iana_zone_and_said_plainly() {
        let utc = clock_status(&GuestClock::Utc);
        assert_eq!(utc.rtc, GuestRtc::Utc);
        assert_eq!(describe_clock(&utc), "the guest keeps its clock in UTC");
        let berlin = clock_status(&GuestClock::LocalTime {
            windows_zone: "W. Europe Standard Time".into(),
        });
        assert_eq!(
            (berlin.rtc, berlin.timezone.as_str()),
            (GuestRtc::LocalTime, "Europe/Berlin")
        );
        assert_eq!(
            describe_clock(&berlin),
            "the guest keeps local time (W. Europe Standard Time), so the VM's clock runs in Europe/Berlin"
        );
        let unknown = clock_status(&GuestClock::LocalTime {
            windows_zone: String::new(),
        });
        assert_eq!(unknown.timezone, "");
        assert!(
            describe_clock(&unknown).contains("(unnamed), so the VM's clock runs in UTC"),
            "{}",
            describe_clock(&unknown)
        );
    }

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
