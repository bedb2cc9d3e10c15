//! Precopying, on a warm migration. Desired: the disks' volumes follow the running source round after round, until
//! the cutover is asked for and at least one round is copied. Observed: the one snapshot Ferry holds (by its
//! recorded task and moref, or by name after a crash before they were recorded), the round's Job and its report.
//! Action, one per pass, each recorded before the next acts on it: turn Changed Block Tracking on when allowed;
//! take a disk slot on the host and name the round's snapshot; create it; run Job
//! `<name>-precopy-<round>-<attempt>` reading the snapshot's frozen base; remove the snapshot (Forklift's order:
//! the change IDs are on record before the snapshot goes, and only one exists at a time). Recorded: each round's
//! bytes, areas and times, each disk's change ID, the next round's time. A vCenter that will not serve a running
//! VM's base (SourceDiskLocked) refuses warm mode: the migration waits for a person to allow a cold copy
//! (`fallBackToCold`), then for the cutover, and copies cold. The snapshot's own steps are in [`snapshot`].

use std::time::Duration;

use ferry_api::{
    ChangeTrackingChange, Phase, Reason, WarmRound, WarmSnapshot, WarmSpec, WarmStatus,
};
use ferry_datapath::report::{JobReport, RoundSummary};
use ferry_datapath::spec::RoundSpec;
use ferry_vsphere::{MoRef, Session, cbt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::step::{Next, Step};
use super::support::jobs::{self, Attempt, JobAttempt};
use super::support::vsphere_task::TASK_TIMEOUT;
use super::support::{conversion, credentials, host_slot, one_per_vm, source, warm_round};
use crate::children;
use crate::error::{Failure, Result};

mod snapshot;

/// Long enough to stay quiet: the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

/// What a pass of Precopying does, from the spec and what is recorded. Pure.
#[derive(Debug, PartialEq)]
pub enum Precopy {
    /// Ferry may turn tracking on and the source has it off: record that it will, first.
    RecordTrackingChange,
    TurnTrackingOn,
    /// A round is due: take a slot on the host, then name its snapshot.
    NameSnapshot {
        round: i32,
    },
    /// Named, neither created nor being created as far as the record shows.
    CreateSnapshot,
    FollowCreate(String),
    CopyRound,
    RemoveSnapshot(Option<String>),
    FollowRemove(String),
    Cutover,
    /// Until the next round, or the cutover.
    Idle(Time),
    /// Warm mode was refused: the cutover copies every disk whole.
    AwaitCutover,
    /// Warm mode was refused, and nobody allowed a cold copy yet.
    AwaitColdAllowed,
}

pub fn decide(spec: &WarmSpec, warm: &WarmStatus, tracking_on: bool, now: &Time) -> Precopy {
    if spec.enable_change_tracking && !tracking_on && warm.refused.is_none() {
        match warm.change_tracking_enabled {
            None => return Precopy::RecordTrackingChange,
            Some(ChangeTrackingChange::Enabling) => return Precopy::TurnTrackingOn,
            Some(_) => {}
        }
    }
    if let Some(snapshot) = &warm.snapshot {
        return match (&snapshot.task, &snapshot.moref, snapshot.removing) {
            (Some(task), _, true) => Precopy::FollowRemove(task.clone()),
            (None, moref, true) => Precopy::RemoveSnapshot(moref.clone()),
            (Some(task), None, false) => Precopy::FollowCreate(task.clone()),
            (None, None, false) => Precopy::CreateSnapshot,
            (_, Some(_), false) => Precopy::CopyRound,
        };
    }
    let due = spec.cutover_due(now);
    if warm.refused.is_some() {
        if !spec.fall_back_to_cold {
            return Precopy::AwaitColdAllowed;
        }
        return if due {
            Precopy::Cutover
        } else {
            Precopy::AwaitCutover
        };
    }
    if due && warm.rounds_done >= 1 {
        return Precopy::Cutover;
    }
    match &warm.next_round_at {
        Some(at) if at.0 > now.0 && !due => Precopy::Idle(at.clone()),
        _ => Precopy::NameSnapshot {
            round: warm.rounds_done + 1,
        },
    }
}

const PRECOPY: JobAttempt = JobAttempt {
    phase: Phase::Precopying,
    job: |vmm, status, n| children::precopy_job(vmm, round_in_flight(status), n),
    replaced: |vmm, status, n| vec![children::precopy_job(vmm, round_in_flight(status), n)],
    // It writes the volumes, as the cutover's copy will.
    writers: &["convert"],
    running: |job, n| {
        Next::wait(
            "Precopying",
            format!("Job {job} (attempt {n}) copies the running source's disks from its snapshot"),
            WAIT,
        )
    },
    failed: JobAttempt::only_charged,
    fixable_in_place: &[],
    restarting: "PrecopyRestarting",
    retrying: "PrecopyRetrying",
};

fn round_in_flight(status: &ferry_api::VirtualMachineMigrationStatus) -> i32 {
    let warm = status.warm.as_ref();
    warm.and_then(|w| w.snapshot.as_ref())
        .map(|s| s.round)
        .unwrap_or_else(|| warm.map_or(0, |w| w.rounds_done) + 1)
}

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let spec = step.vmm.spec.warm.clone().unwrap_or_default();
    let recorded = source::recorded(step.status)?;
    let disks = step.status.disks.len();
    let warm = step.status.warm.get_or_insert_with(WarmStatus::default);
    if warm.change_ids.len() != disks {
        warm.change_ids = vec![None; disks];
    }
    let decision = decide(&spec, warm, recorded.change_tracking, &step.now);
    match decision {
        Precopy::RecordTrackingChange => {
            warm.change_tracking_enabled = Some(ChangeTrackingChange::Enabling);
            Ok(Next::persist(
                "EnablingChangeTracking",
                "turning Changed Block Tracking on, as spec.warm.enableChangeTracking allows (it is turned off \
                 again when the migration ends)",
            ))
        }
        Precopy::TurnTrackingOn => {
            let (session, vm) = checked_session(step).await?;
            // Asked before a crash that kept it off the record: not asked again.
            if !cbt::change_tracking_enabled(&session, &vm).await? {
                cbt::set_change_tracking(&session, &vm, true, TASK_TIMEOUT).await?;
            }
            warm_mut(step).change_tracking_enabled = Some(ChangeTrackingChange::Enabled);
            Ok(Next::persist(
                "ChangeTrackingEnabled",
                format!("Changed Block Tracking is on for {vm}; it starts at the first snapshot"),
            ))
        }
        Precopy::NameSnapshot { round } => name_snapshot(step, round).await,
        Precopy::CreateSnapshot => snapshot::create(step).await,
        Precopy::FollowCreate(task) => snapshot::follow_create(step, task).await,
        Precopy::CopyRound => copy_round(step).await,
        Precopy::RemoveSnapshot(moref) => snapshot::remove(step, moref).await,
        Precopy::FollowRemove(task) => snapshot::follow_remove(step, task).await,
        Precopy::Cutover => {
            let warm = warm_mut(step);
            Ok(Next::advance(
                "CutoverStarted",
                match &warm.refused {
                    Some(_) => "cutover: the source is powered off and copied whole (warm mode was refused)".into(),
                    None => format!(
                        "cutover after {} precopy round(s): the source is powered off and what changed since is \
                         copied",
                        warm.rounds_done
                    ),
                },
            ))
        }
        Precopy::Idle(at) => {
            let seconds = at.0.duration_since(step.now.0).as_secs_f64().max(1.0);
            Ok(Next::wait(
                "Precopying",
                format!(
                    "{} round(s) copied; the next starts in {}s (or set spec.warm.cutover)",
                    warm_mut(step).rounds_done,
                    seconds.ceil()
                ),
                Duration::from_secs_f64(seconds.min(3600.0)),
            ))
        }
        Precopy::AwaitColdAllowed => Err(Failure::fixable(
            Reason::SourceDiskLocked,
            format!(
                "warm mode refused: {}; nothing was changed on the source (its snapshot is removed). Set \
                 spec.warm.fallBackToCold to copy it cold at the cutover (powered off, every byte), or cancel",
                warm_mut(step).refused.clone().unwrap_or_default()
            ),
        )),
        Precopy::AwaitCutover => Ok(Next::wait(
            "WarmRefused",
            format!(
                "{}; the migration waits for the cutover (spec.warm.cutover or cutoverAt), then powers the source \
                 off and copies it whole",
                warm_mut(step).refused.clone().unwrap_or_default()
            ),
            Duration::from_secs(3600),
        )),
    }
}

fn warm_mut<'a>(step: &'a mut Step<'_>) -> &'a mut WarmStatus {
    step.status.warm.get_or_insert_with(WarmStatus::default)
}

async fn checked_session(step: &Step<'_>) -> Result<(Session, MoRef)> {
    let provider = source::provider(step.ctx, step.vmm).await?;
    let session = source::session_for(step.ctx, &provider).await?;
    let vm = source::checked_source_vm(&session, step.status).await?;
    Ok((session, vm))
}

/// Each round holds a disk slot on the source's host from before its snapshot until it is copied.
async fn name_snapshot(step: &mut Step<'_>, round: i32) -> Result<Next> {
    if let Some(wait) = one_per_vm::wait_for_another(step, &source::recorded(step.status)?) {
        return Ok(wait);
    }
    let provider = source::provider(step.ctx, step.vmm).await?;
    if let Some(next) = host_slot::acquire(step, &provider).await {
        return Ok(next);
    }
    let name = format!("{}{round}", children::snapshot_prefix(step.vmm));
    warm_mut(step).snapshot = Some(WarmSnapshot {
        round,
        name: name.clone(),
        ..Default::default()
    });
    Ok(Next::persist(
        "PrecopyRoundStarted",
        format!("round {round}: taking snapshot {name} of the running source"),
    ))
}

async fn copy_round(step: &mut Step<'_>) -> Result<Next> {
    let taken = recorded_snapshot(step)?;
    let attempt = match jobs::attempt(step, &PRECOPY).await {
        Err(failure) if failure.reason == Reason::SourceDiskLocked => {
            return Ok(refuse_warm(step, failure.message));
        }
        other => other?,
    };
    match attempt {
        Attempt::Start { name, .. } => {
            let round = RoundSpec {
                vm_moref: source::recorded(step.status)?.moref,
                snapshot: taken.moref.clone(),
                since: warm_mut(step).change_ids.clone(),
                // The source runs on: only the frozen base's areas are proven, each round.
                hash_source: false,
            };
            conversion::create_round_job(step, &name, round).await?;
            Ok(Next::wait(
                "Precopying",
                format!(
                    "round {}: Job {name} copies the disks from snapshot {}",
                    taken.round, taken.name
                ),
                WAIT,
            ))
        }
        Attempt::Succeeded {
            name,
            report: JobReport::Round(summary),
        } => {
            credentials::take_back(step.ctx, step.vmm).await?;
            record_round(step, &name, &taken, summary)
        }
        Attempt::Succeeded { name, .. } => Err(Failure::bounded(
            Reason::JobResultUnreadable,
            format!("Job {name} reported no warm round"),
        )),
        Attempt::Wait(next) => Ok(next),
    }
}

/// The vCenter will not serve the running VM's frozen base: no round can be copied while it runs.
fn refuse_warm(step: &mut Step<'_>, why: String) -> Next {
    step.status.host_slot = None;
    let warm = warm_mut(step);
    warm.refused = Some(why.clone());
    if let Some(s) = &mut warm.snapshot {
        s.removing = true;
    }
    Next::persist(
        "WarmRefused",
        format!(
            "warm mode refused: {why}; the snapshot is removed and the source copied cold at cutover"
        ),
    )
}

fn record_round(
    step: &mut Step<'_>,
    job: &str,
    taken: &WarmSnapshot,
    summary: RoundSummary,
) -> Result<Next> {
    let round = warm_round::tally(
        WarmRound {
            round: taken.round,
            // The round's reads began once its slot was granted.
            started: step
                .status
                .host_slot
                .as_ref()
                .map(|slot| Time(slot.granted.0)),
            finished: Some(step.now.clone()),
            ..Default::default()
        },
        job,
        &summary,
        step.status.disks.len(),
    )?;
    let warm = warm_mut(step);
    for disk in &summary.disks {
        if let Some(slot) = warm.change_ids.get_mut(disk.index as usize) {
            *slot = disk.change_id.clone();
        }
    }
    let message = format!(
        "round {}: {} bytes read ({} changed areas, {} disk(s) whole){}",
        round.round,
        round.bytes_read,
        round.areas,
        round.full_disks,
        match round.reasons.is_empty() {
            true => String::new(),
            false => format!("; copied whole again: {}", round.reasons.join("; ")),
        }
    );
    warm.push_round(round);
    if let Some(s) = &mut warm.snapshot {
        s.removing = true;
    }
    step.ctx
        .metrics
        .bytes_moved(summary.disks.iter().map(|d| d.bytes_read).sum());
    // The slot's reads are done; the snapshot's removal does not read the disks.
    step.status.host_slot = None;
    Ok(Next::persist("PrecopyRoundCopied", message))
}

fn recorded_snapshot(step: &mut Step<'_>) -> Result<WarmSnapshot> {
    warm_mut(step).snapshot.clone().ok_or_else(|| {
        Failure::bounded(
            Reason::InvalidConversionSpec,
            "no precopy snapshot on record",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap())
    }

    fn snapshot(task: Option<&str>, moref: Option<&str>, removing: bool) -> WarmSnapshot {
        WarmSnapshot {
            round: 1,
            name: "ferry-u-1".into(),
            task: task.map(Into::into),
            moref: moref.map(Into::into),
            removing,
        }
    }

    #[test]
    fn a_round_walks_name_create_copy_remove_each_on_record_first() {
        let spec = WarmSpec::default();
        let mut warm = WarmStatus::default();
        assert_eq!(
            decide(&spec, &warm, true, &at(0)),
            Precopy::NameSnapshot { round: 1 }
        );
        warm.snapshot = Some(snapshot(None, None, false));
        assert_eq!(decide(&spec, &warm, true, &at(0)), Precopy::CreateSnapshot);
        warm.snapshot = Some(snapshot(Some("task-1"), None, false));
        assert_eq!(
            decide(&spec, &warm, true, &at(0)),
            Precopy::FollowCreate("task-1".into())
        );
        warm.snapshot = Some(snapshot(None, Some("snapshot-3"), false));
        assert_eq!(decide(&spec, &warm, true, &at(0)), Precopy::CopyRound);
        warm.snapshot = Some(snapshot(None, Some("snapshot-3"), true));
        assert_eq!(
            decide(&spec, &warm, true, &at(0)),
            Precopy::RemoveSnapshot(Some("snapshot-3".into()))
        );
        warm.snapshot = Some(snapshot(Some("task-2"), Some("snapshot-3"), true));
        assert_eq!(
            decide(&spec, &warm, true, &at(0)),
            Precopy::FollowRemove("task-2".into())
        );
    }

    #[test]
    fn rounds_follow_the_interval_until_the_cutover_after_one_round_at_least() {
        let mut spec = WarmSpec::default();
        let mut warm = WarmStatus {
            rounds_done: 1,
            next_round_at: Some(at(3600)),
            ..Default::default()
        };
        assert_eq!(decide(&spec, &warm, true, &at(10)), Precopy::Idle(at(3600)));
        assert_eq!(
            decide(&spec, &warm, true, &at(3600)),
            Precopy::NameSnapshot { round: 2 }
        );
        spec.cutover_at = Some(at(100));
        assert_eq!(decide(&spec, &warm, true, &at(99)), Precopy::Idle(at(3600)));
        assert_eq!(decide(&spec, &warm, true, &at(100)), Precopy::Cutover);
        // Asked before any round: the first round is copied first.
        warm.rounds_done = 0;
        assert_eq!(
            decide(&spec, &warm, true, &at(100)),
            Precopy::NameSnapshot { round: 1 }
        );
        // A round in flight finishes before the cutover.
        warm.rounds_done = 1;
        warm.snapshot = Some(snapshot(None, Some("snapshot-3"), false));
        assert_eq!(decide(&spec, &warm, true, &at(100)), Precopy::CopyRound);
    }

    #[test]
    fn tracking_is_turned_on_only_when_allowed_and_recorded_first() {
        let mut spec = WarmSpec::default();
        let mut warm = WarmStatus::default();
        assert_eq!(
            decide(&spec, &warm, false, &at(0)),
            Precopy::NameSnapshot { round: 1 }
        );
        spec.enable_change_tracking = true;
        assert_eq!(
            decide(&spec, &warm, false, &at(0)),
            Precopy::RecordTrackingChange
        );
        warm.change_tracking_enabled = Some(ChangeTrackingChange::Enabling);
        assert_eq!(decide(&spec, &warm, false, &at(0)), Precopy::TurnTrackingOn);
        warm.change_tracking_enabled = Some(ChangeTrackingChange::Enabled);
        assert_eq!(
            decide(&spec, &warm, false, &at(0)),
            Precopy::NameSnapshot { round: 1 }
        );
        // Already on in vSphere: nothing to change, nothing to restore.
        warm.change_tracking_enabled = None;
        assert_eq!(
            decide(&spec, &warm, true, &at(0)),
            Precopy::NameSnapshot { round: 1 }
        );
    }

    #[test]
    fn a_refused_warm_mode_removes_its_snapshot_then_waits_for_the_cutover() {
        let mut spec = WarmSpec {
            fall_back_to_cold: true,
            ..Default::default()
        };
        let mut warm = WarmStatus {
            refused: Some("locked".into()),
            snapshot: Some(snapshot(None, Some("snapshot-3"), true)),
            ..Default::default()
        };
        assert_eq!(
            decide(&spec, &warm, true, &at(0)),
            Precopy::RemoveSnapshot(Some("snapshot-3".into()))
        );
        warm.snapshot = None;
        assert_eq!(decide(&spec, &warm, true, &at(0)), Precopy::AwaitCutover);
        spec.cutover = true;
        assert_eq!(decide(&spec, &warm, true, &at(0)), Precopy::Cutover);
        spec.fall_back_to_cold = false;
        assert_eq!(
            decide(&spec, &warm, true, &at(0)),
            Precopy::AwaitColdAllowed,
            "a cold copy only when a person allowed it"
        );
    }
}
