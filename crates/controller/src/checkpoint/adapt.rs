//! Adapting (`conversion.guestAdaptation: VirtV2v` only). Desired: the guest on the volumes adapted by virt-v2v
//! exactly once, its new sha256 and what virt-v2v found recorded. Observed: this attempt's Job
//! `<name>-adapt-<attempt>` and its report, or, after an attempt that may have changed the volumes, its rewrite
//! Job `<name>-rewrite-<attempt>`; pods of earlier attempts still running. Action: once no earlier pod runs,
//! rewrite the volumes from the source if `rewriteVolumes` says so, then create the adaptation Job (it refuses
//! volumes that no longer hold the source's bytes, so an adapted or torn disk is never adapted again); a failed
//! attempt is charged, and unless it failed before touching the volumes, they are marked for rewriting; a refusal
//! the person fixes in the migration (the drivers or first-boot tool it names) waits for them with every volume
//! kept, and adapts again once the migration changed. A refusal the person fixes in the source (a hibernated
//! Windows, booted and shut down fully) waits the same way, and once `spec.recopy` grows the source (shown off
//! through vSphere) is copied again into the same volumes, its new bytes taken as the copy, before adapting again.
//! Recorded: each disk's `adaptedSha256`, `status.adaptation`, `rewriteVolumes`, `recopied`; GuestAdapted.

use std::time::Duration;

use ferry_adapt::clock::GuestClock;
use ferry_adapt::interface_names::{KeptName, NamesOutcome};
use ferry_api::{
    AdaptationStatus, ErrorClass, GuestClockStatus, GuestRtc, InterfaceNamesStatus,
    KeptInterfaceName, Phase, Reason, VirtualMachineMigrationStatus as Status,
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
    job: |vmm, _, n| children::adapt_job(vmm, n),
    replaced: |vmm, _, n| vec![children::adapt_job(vmm, n)],
    writers: WRITERS,
    running: |job, n| {
        Next::wait(
            "Adapting",
            format!("Job {job} (attempt {n}) adapts the guest with virt-v2v"),
            WAIT,
        )
    },
    failed: mark_for_rewriting,
    // The person names other drivers or a first-boot tool, and the volumes virt-v2v never touched are adapted
    // then; or ends the guest's hibernation in vSphere and raises spec.recopy, and they are copied again first.
    fixable_in_place: &[
        Reason::GuestDriversMissing,
        Reason::GuestFirstBootToolMissing,
        Reason::GuestFilesystemUnwritable,
    ],
    restarting: "AdaptationRestarting",
    retrying: "AdaptationRetrying",
};

/// Its failures are charged to the adaptation's budget, like the attempt that made it necessary.
const REWRITE: JobAttempt = JobAttempt {
    job: |vmm, _, n| children::rewrite_job(vmm, n),
    replaced: |vmm, _, n| vec![children::adapt_job(vmm, n), children::rewrite_job(vmm, n)],
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

/// One Job per `spec.recopy` asked for, whatever the attempt; its failures are charged like a rewrite's.
const RECOPY: JobAttempt = JobAttempt {
    job: |vmm, _, _| children::recopy_job(vmm, vmm.spec.recopy),
    running: |job, n| {
        Next::wait(
            "CopyingSourceAgain",
            format!(
                "Job {job} (attempt {n}) copies the source into the same volumes again, as spec.recopy asks: the \
                 source guest was changed on purpose"
            ),
            WAIT,
        )
    },
    ..REWRITE
};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    if !step.status.disks.is_empty() && step.status.disks.iter().all(|d| d.adapted_sha256.is_some())
    {
        return Ok(adapted(step));
    }
    if step.vmm.spec.recopy_wanted(step.status) {
        return write_again(step, &RECOPY, recopied).await;
    }
    if step.status.rewrite_volumes {
        return write_again(step, &REWRITE, rewritten).await;
    }
    match jobs::attempt(step, &ADAPTATION).await? {
        Attempt::Start { name, n } => {
            create_job(step, n).await?;
            Ok((ADAPTATION.running)(&name, n))
        }
        Attempt::Succeeded {
            name,
            report: JobReport::Adapted(summary),
        } => record(step, &name, *summary),
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

/// What a Job that wrote the volumes from the source again means for the migration.
type Written = fn(&mut Step<'_>, &str, WrittenSummary) -> Result<Next>;

/// Writes every volume from the source again with `kind`'s Job, once vSphere shows the source powered off (a
/// running guest's disk is no copy), then records what it wrote as `written` says.
async fn write_again(step: &mut Step<'_>, kind: &JobAttempt, written: Written) -> Result<Next> {
    match jobs::attempt(step, kind).await? {
        Attempt::Start { name, n } => {
            let provider = source::provider(step.ctx, step.vmm).await?;
            source_powered_off(step, &provider).await?;
            if let Some(next) = host_slot::acquire(step, &provider).await {
                return Ok(next);
            }
            credentials::lend(step.ctx, step.vmm, &provider).await?;
            let source = source::recorded(step.status)?;
            let job = build::job::rewrite_job(
                step.vmm,
                &source,
                &provider,
                &name,
                &step.ctx.config.worker_image,
            );
            jobs::create(step.ctx, &step.vmm.namespace().unwrap_or_default(), &job).await?;
            Ok((kind.running)(&name, n))
        }
        Attempt::Succeeded {
            name,
            report: JobReport::Written(summary),
        } => {
            credentials::take_back(step.ctx, step.vmm).await?;
            written(step, &name, summary)
        }
        Attempt::Succeeded { name, .. } => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} did not report the volumes it wrote"),
        )),
        Attempt::Wait(next) => Ok(next),
    }
}

/// A source someone powered on since Ferry powered it off is waited for: its disk changes while it runs, and
/// stopping a guest a person started is theirs to do.
async fn source_powered_off(step: &Step<'_>, provider: &ferry_api::Provider) -> Result<()> {
    let session = source::session_for(step.ctx, provider).await?;
    let (_, view) = source::checked_power_view(&session, step.status).await?;
    if view.state == ferry_api::PowerState::PoweredOff {
        return Ok(());
    }
    Err(Failure::fixable(
        Reason::SourcePoweredOn,
        format!(
            "the source VM is {:?} in vSphere: the volumes are written from its disks again only while it is off; \
             shut its guest down fully and power it off, and the migration resumes",
            view.state
        ),
    ))
}

/// The volumes hold the source's bytes again, or the source itself changed.
fn rewritten(step: &mut Step<'_>, job: &str, summary: WrittenSummary) -> Result<Next> {
    same_disk_count(step.status, job, &summary)?;
    let recorded: Vec<Option<&String>> = step
        .status
        .disks
        .iter()
        .map(|d| d.sha256.as_ref())
        .collect();
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

/// The source as it is now, changed on purpose, is the copy: each disk's `sha256` is what the Job read back.
fn recopied(step: &mut Step<'_>, job: &str, summary: WrittenSummary) -> Result<Next> {
    same_disk_count(step.status, job, &summary)?;
    let changed = record_recopy(step.status, step.vmm.spec.recopy, summary.sha256);
    step.status.host_slot = None;
    Ok(Next::persist(
        "SourceCopiedAgain",
        format!(
            "Job {job} copied the source into the same volumes again, as spec.recopy asked ({changed} of {} disk(s) \
             changed since the last copy); adapting again",
            step.status.disks.len()
        ),
    ))
}

/// Takes `sha256` as each disk's copy made for `spec.recopy` = `recopy`; returns how many disks changed. Pure.
fn record_recopy(status: &mut Status, recopy: i32, sha256: Vec<String>) -> usize {
    let mut changed = 0;
    for (disk, sha256) in status.disks.iter_mut().zip(sha256) {
        changed += usize::from(disk.sha256.as_deref() != Some(sha256.as_str()));
        disk.sha256 = Some(sha256);
        disk.adapted_sha256 = None;
    }
    status.recopied = recopy;
    status.rewrite_volumes = false;
    changed
}

fn same_disk_count(status: &Status, job: &str, summary: &WrittenSummary) -> Result<()> {
    if summary.sha256.len() == status.disks.len() {
        return Ok(());
    }
    Err(Failure::bounded(
        Reason::DiskNotConverted,
        format!(
            "Job {job} wrote {} disk(s), the VM has {}",
            summary.sha256.len(),
            status.disks.len()
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
        interface_names: summary.interface_names.as_ref().map(names_status),
        seconds: summary.seconds as i64,
    });
    Ok(adapted(step))
}

fn names_status(outcome: &NamesOutcome) -> InterfaceNamesStatus {
    InterfaceNamesStatus {
        kept: outcome
            .kept
            .iter()
            .map(|k| KeptInterfaceName {
                name: k.name.clone(),
                mac: k.mac.clone(),
            })
            .collect(),
        left_alone: outcome.left_alone.clone(),
        error: outcome.error.clone(),
    }
}

/// The names a status records, in the words the worker used for them.
pub fn describe_interface_names(names: &InterfaceNamesStatus) -> String {
    names_outcome(names).describe()
}

fn names_outcome(names: &InterfaceNamesStatus) -> NamesOutcome {
    NamesOutcome {
        kept: names
            .kept
            .iter()
            .map(|k| KeptName {
                name: k.name.clone(),
                mac: k.mac.clone(),
            })
            .collect(),
        left_alone: names.left_alone.clone(),
        error: names.error.clone(),
    }
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
        .map(|c| format!("; {}", guest_clock(c).describe()))
        .unwrap_or_default();
    let names = adaptation
        .and_then(|a| a.interface_names.as_ref())
        .map(|n| format!("; {}", describe_interface_names(n)))
        .unwrap_or_default();
    Next::advance(
        "GuestAdapted",
        format!(
            "virt-v2v adapted {os} on {} disk(s) for KubeVirt's virtio devices{clock}{names}",
            step.status.disks.len()
        ),
    )
}

/// The clock a status records, as the guest keeps it.
fn guest_clock(clock: &GuestClockStatus) -> GuestClock {
    match clock.rtc {
        GuestRtc::Utc => GuestClock::Utc,
        GuestRtc::LocalTime => GuestClock::LocalTime {
            windows_zone: clock.windows_zone.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guests_clock_is_recorded_with_its_iana_zone_and_read_back_as_found() {
        for found in [
            GuestClock::Utc,
            GuestClock::LocalTime {
                windows_zone: "W. Europe Standard Time".into(),
            },
            GuestClock::LocalTime {
                windows_zone: String::new(),
            },
        ] {
            assert_eq!(guest_clock(&clock_status(&found)), found);
        }
        let berlin = clock_status(&GuestClock::LocalTime {
            windows_zone: "W. Europe Standard Time".into(),
        });
        assert_eq!(
            (berlin.rtc, berlin.timezone.as_str()),
            (GuestRtc::LocalTime, "Europe/Berlin")
        );
        assert_eq!(clock_status(&GuestClock::Utc).rtc, GuestRtc::Utc);
    }

    #[test]
    fn a_recopy_takes_the_sources_new_bytes_as_the_copy_and_is_recorded_for_its_spec_value() {
        let disk = |sha: &str| ferry_api::DiskStatus {
            sha256: Some(sha.into()),
            ..Default::default()
        };
        let mut status = Status {
            disks: vec![disk("hibernated"), disk("data")],
            rewrite_volumes: true,
            ..Default::default()
        };
        let changed = record_recopy(&mut status, 2, vec!["shut-down".into(), "data".into()]);
        assert_eq!(changed, 1);
        let copied: Vec<_> = status.disks.iter().map(|d| d.sha256.as_deref()).collect();
        assert_eq!(copied, [Some("shut-down"), Some("data")]);
        assert!(status.disks.iter().all(|d| d.adapted_sha256.is_none()));
        assert_eq!((status.recopied, status.rewrite_volumes), (2, false));
        let spec: ferry_api::VirtualMachineMigrationSpec =
            serde_json::from_value(serde_json::json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "w"}}, "recopy": 2}))
            .unwrap();
        assert!(!spec.recopy_wanted(&status), "copied for recopy 2 already");
        status.recopied = 1;
        assert!(spec.recopy_wanted(&status));
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
