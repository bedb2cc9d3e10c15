//! Importing. Desired: DataVolume `<name>-disk-<i>` Succeeded for every disk, and its content proven to hash to
//! the source's sha256. Observed: each DataVolume's phase and progress, then each verification Job ([`observe`]).
//! Action ([`decide`], pure; [`act`]): create an absent DataVolume from the staged image; run `ferry verify` on
//! its PVC; a failed import or a mismatch deletes the DataVolume and spends one bounded retry. Recorded:
//! progress, verified; DiskImported.

use std::time::Duration;

use ferry_api::{DiskStatus, Phase, Reason};
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::step::{Next, Step};
use super::support::jobs::{self, JobState};
use super::support::retry::{self, Charged};
use super::support::volumes::{self, DvState, unbound_past_deadline};
use crate::error::{Failure, Result};
use crate::{build, children};

/// DataVolumes and Jobs are watched: their changes wake the migration, and this only catches a lost event. Under a
/// fleet's backlog hundreds of migrations wait here for minutes, so it is long.
const WATCHED_WAIT: Duration = Duration::from_secs(180);

/// A leftover claim going away is not watched: it is looked at this often.
const CLAIM_WAIT: Duration = Duration::from_secs(15);

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let mut pass = Pass {
        waiting: Vec::new(),
        wait: WATCHED_WAIT,
        ca_ready: false,
    };
    for i in 0..step.status.disks.len() {
        let disk = step.status.disks[i].clone();
        if disk.verified {
            continue;
        }
        let seen = observe(step, &disk).await?;
        let action = decide(&seen);
        if let Some(next) = act(step, &mut pass, i, &seen, action).await? {
            return Ok(next);
        }
    }
    if pass.waiting.is_empty() {
        return Ok(Next::advance(
            "DisksImportedAndVerified",
            format!(
                "{} disk(s) imported; each hashes to its source's sha256",
                step.status.disks.len()
            ),
        ));
    }
    Ok(Next::wait("Importing", pass.waiting.join("; "), pass.wait))
}

/// One disk's import as a pass sees it.
struct Seen {
    /// The DataVolume's name, and its verification Job's for this attempt.
    volume: String,
    verifier: String,
    dv: Option<DynamicObject>,
    state: DvState,
    /// Its failure is on record and it is not being removed yet.
    charged: bool,
    uid: String,
    /// Why it is still Pending past its deadline, if it is.
    unbound: Option<String>,
    /// The verification Job, read once the volume is imported.
    verification: Option<JobState>,
}

async fn observe(step: &Step<'_>, disk: &DiskStatus) -> Result<Seen> {
    let verifier = children::verify_job(step.vmm, disk.index, disk.verify_failures + 1);
    // An import the cache shows in progress, or imported and still being verified, only makes us wait; its end
    // comes as an event.
    let waiting_only = |state: &DvState| match state {
        DvState::InProgress { .. } => true,
        DvState::Succeeded => jobs::cached_running(step.ctx, step.vmm, &verifier),
        _ => false,
    };
    let volume = volumes::observe(step, disk.index, waiting_only).await?;
    let unbound = match (&volume.state, &volume.dv) {
        (DvState::InProgress { .. }, Some(dv)) => unbound_past_deadline(dv, &step.now),
        _ => None,
    };
    let verification = match volume.state {
        DvState::Succeeded if !volume.charged => {
            Some(jobs::observe(step.ctx, step.vmm, &verifier).await?)
        }
        _ => None,
    };
    Ok(Seen {
        volume: volume.name,
        verifier,
        dv: volume.dv,
        state: volume.state,
        charged: volume.charged,
        uid: volume.uid,
        unbound,
        verification,
    })
}

/// What a pass does about one disk's import.
#[derive(Debug, PartialEq)]
enum DiskAction {
    /// Its failure is on record: remove it (and its verification Jobs), and the import starts over.
    RemoveCharged,
    /// None yet: create it, once no claim of its name is left from an earlier one.
    Create,
    Wait(String),
    /// CDI imports it: record its progress and wait.
    Importing {
        phase: String,
        progress: Option<String>,
    },
    /// Imported: what its verification needs.
    Imported(Verification),
    /// The import or its verification failed: charge the child `failed` (a uid).
    Retry {
        failed: String,
        failure: Failure,
    },
}

#[derive(Debug, PartialEq)]
enum Verification {
    Start,
    Wait,
    Done,
}

/// Pure.
fn decide(seen: &Seen) -> DiskAction {
    let name = &seen.volume;
    if seen.charged {
        return DiskAction::RemoveCharged;
    }
    match &seen.state {
        DvState::Absent => DiskAction::Create,
        DvState::Terminating => DiskAction::Wait(format!("{name} being removed")),
        DvState::InProgress { .. } if let Some(why) = &seen.unbound => DiskAction::Retry {
            failed: seen.uid.clone(),
            failure: Failure::bounded(
                Reason::VolumeNotBound,
                format!("DataVolume {name} is {why}"),
            ),
        },
        DvState::InProgress { phase, progress } => DiskAction::Importing {
            phase: phase.clone(),
            progress: progress.clone(),
        },
        DvState::Failed { message } => DiskAction::Retry {
            failed: seen.uid.clone(),
            failure: Failure::bounded(
                Reason::ImportFailed,
                format!("DataVolume {name}: {message}"),
            ),
        },
        DvState::Succeeded => match &seen.verification {
            None | Some(JobState::Absent) => DiskAction::Imported(Verification::Start),
            Some(JobState::Running | JobState::Terminating) => {
                DiskAction::Imported(Verification::Wait)
            }
            Some(JobState::Succeeded(_)) => DiskAction::Imported(Verification::Done),
            // Only wrong or short content is the import's fault; a verifier that died (killed, evicted) just
            // runs again on the same DataVolume.
            Some(JobState::Failed(failure, job)) => {
                let content_wrong =
                    matches!(failure.reason, Reason::ChecksumMismatch | Reason::ShortRead);
                DiskAction::Retry {
                    failed: if content_wrong {
                        seen.uid.clone()
                    } else {
                        job.uid.clone()
                    },
                    failure: failure.clone(),
                }
            }
        },
    }
}

/// What one pass gathers across the disks.
struct Pass {
    waiting: Vec<String>,
    wait: Duration,
    /// The staging CA's ConfigMap is ensured once a pass, before the first DataVolume that names it.
    ca_ready: bool,
}

/// Carries out disk `i`'s action; a move that ends the pass (a failure charged) is returned.
async fn act(
    step: &mut Step<'_>,
    pass: &mut Pass,
    i: usize,
    seen: &Seen,
    action: DiskAction,
) -> Result<Option<Next>> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let disk = step.status.disks[i].clone();
    let (name, job) = (&seen.volume, &seen.verifier);
    match action {
        DiskAction::RemoveCharged => {
            // A pod that mounted the claim, even a finished one, keeps the claim from being released.
            for earlier in 1..=disk.verify_failures {
                let verifier = children::verify_job(step.vmm, disk.index, earlier);
                jobs::delete(step.ctx, step.vmm, &verifier).await?;
            }
            if let Some(dv) = &seen.dv {
                volumes::delete_dv(&volumes::data_volumes(step, &ns), dv).await?;
            }
            step.status.disks[i].progress = None;
            pass.waiting
                .push(format!("{name} removed for a new import"));
        }
        DiskAction::Create => {
            if volumes::earlier_claim_left(step, &ns, name).await? {
                pass.waiting
                    .push(format!("the previous claim {name} is being removed"));
                pass.wait = CLAIM_WAIT;
                return Ok(None);
            }
            if !pass.ca_ready {
                volumes::ensure_staging_ca(step, &ns).await?;
                pass.ca_ready = true;
            }
            let placement = crate::maps::disk_storage(step.vmm, &disk);
            let dv =
                build::datavolume::data_volume(step.vmm, &disk, &placement).ok_or_else(|| {
                    Failure::transient(
                        Reason::DiskNotStaged,
                        format!("disk {} has no staged image", disk.index),
                    )
                })?;
            ferry_kube::create::create_if_absent(&volumes::data_volumes(step, &ns), &dv).await?;
            step.status.disks[i].data_volume = Some(name.clone());
            pass.waiting.push(format!("{name} created"));
        }
        DiskAction::Wait(why) => pass.waiting.push(why),
        DiskAction::Importing { phase, progress } => {
            step.status.disks[i].data_volume = Some(name.clone());
            step.status.disks[i].progress = progress.clone();
            let shown = progress.unwrap_or_default();
            pass.waiting.push(format!("{name} {phase} {shown}"));
        }
        DiskAction::Retry { failed, failure } => {
            return import_failed(step, i, &failed, failure).map(Some);
        }
        DiskAction::Imported(verification) => {
            step.status.disks[i].progress = Some("100.0%".into());
            match verification {
                Verification::Start => {
                    let spec = build::job::verify_job(
                        step.vmm,
                        disk.index,
                        disk.verify_failures + 1,
                        disk.sha256.as_deref().unwrap_or_default(),
                        disk.capacity_bytes,
                        &step.ctx.config.worker_image,
                    );
                    jobs::create(step.ctx, &ns, &spec).await?;
                    pass.waiting.push(format!("{job} verifies {name}"));
                }
                Verification::Wait => pass.waiting.push(format!("{job} verifies {name}")),
                Verification::Done => step.status.disks[i].verified = true,
            }
        }
    }
    Ok(None)
}

/// A failed import or verification of disk `i`: the failed child is charged to the budget, recorded before
/// anything is removed; the next pass removes a charged DataVolume for a new import, and runs the next
/// verification Job.
fn import_failed(step: &mut Step<'_>, i: usize, failed: &str, failure: Failure) -> Result<Next> {
    if retry::charge(step, Phase::Importing, failed, &failure)? == Charged::Now {
        step.status.disks[i].verify_failures += 1;
    }
    Ok(retry::persist(
        step,
        Phase::Importing,
        "ImportRetrying",
        &failure,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(state: DvState) -> Seen {
        Seen {
            volume: "m-disk-0".into(),
            verifier: "m-verify-0-1".into(),
            dv: None,
            state,
            charged: false,
            uid: "dv-uid".into(),
            unbound: None,
            verification: None,
        }
    }

    fn failed_job() -> jobs::FailedJob {
        jobs::FailedJob {
            uid: "job-uid".into(),
            made_from: None,
        }
    }

    fn imported(verification: JobState) -> Seen {
        Seen {
            verification: Some(verification),
            ..seen(DvState::Succeeded)
        }
    }

    #[test]
    fn a_volume_whose_failure_is_on_record_is_removed_whatever_its_state() {
        for state in [
            DvState::Succeeded,
            DvState::Failed {
                message: "x".into(),
            },
        ] {
            let charged = Seen {
                charged: true,
                ..seen(state)
            };
            assert_eq!(decide(&charged), DiskAction::RemoveCharged);
        }
    }

    #[test]
    fn an_absent_volume_is_created_and_a_terminating_one_waited_for() {
        assert_eq!(decide(&seen(DvState::Absent)), DiskAction::Create);
        assert_eq!(
            decide(&seen(DvState::Terminating)),
            DiskAction::Wait("m-disk-0 being removed".into())
        );
    }

    #[test]
    fn an_import_in_progress_records_its_progress_until_it_is_unbound_too_long() {
        let importing = DvState::InProgress {
            phase: "ImportInProgress".into(),
            progress: Some("12.5%".into()),
        };
        assert_eq!(
            decide(&seen(importing.clone())),
            DiskAction::Importing {
                phase: "ImportInProgress".into(),
                progress: Some("12.5%".into())
            }
        );
        let unbound = Seen {
            unbound: Some("still Pending".into()),
            ..seen(importing)
        };
        let DiskAction::Retry { failed, failure } = decide(&unbound) else {
            panic!("an unbound volume past its deadline is a failure");
        };
        assert_eq!(
            (failed.as_str(), failure.reason),
            ("dv-uid", Reason::VolumeNotBound)
        );
    }

    #[test]
    fn a_failed_import_charges_the_volume() {
        let failed = seen(DvState::Failed {
            message: "404 from staging".into(),
        });
        let DiskAction::Retry { failed, failure } = decide(&failed) else {
            panic!("a failed import is retried");
        };
        assert_eq!(failed, "dv-uid");
        assert_eq!(failure.reason, Reason::ImportFailed);
        assert!(
            failure.message.contains("404 from staging"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn an_imported_volume_is_verified_once() {
        assert_eq!(
            decide(&imported(JobState::Absent)),
            DiskAction::Imported(Verification::Start)
        );
        assert_eq!(
            decide(&imported(JobState::Running)),
            DiskAction::Imported(Verification::Wait)
        );
        let report = ferry_datapath::report::JobReport::parse(r#"{"disks": []}"#).unwrap();
        assert_eq!(
            decide(&imported(JobState::Succeeded(report))),
            DiskAction::Imported(Verification::Done)
        );
    }

    #[test]
    fn wrong_content_charges_the_volume_and_a_dead_verifier_only_its_job() {
        let mismatch = Failure::bounded(Reason::ChecksumMismatch, "sha256 differs");
        let DiskAction::Retry { failed, .. } =
            decide(&imported(JobState::Failed(mismatch, failed_job())))
        else {
            panic!("a mismatch is retried");
        };
        assert_eq!(failed, "dv-uid");
        let killed = Failure::bounded(Reason::JobFailed, "evicted");
        let DiskAction::Retry { failed, .. } =
            decide(&imported(JobState::Failed(killed, failed_job())))
        else {
            panic!("a dead verifier is retried");
        };
        assert_eq!(failed, "job-uid");
    }
}
