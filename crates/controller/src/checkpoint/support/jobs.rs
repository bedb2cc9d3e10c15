//! A checkpoint's Job, one attempt at a time ([`attempt`]), a Job's state, and the result its pod left in the
//! termination message.

use std::time::Duration;

use ferry_api::{
    ErrorClass, Phase, Reason, VirtualMachineMigration, VirtualMachineMigrationStatus as Status,
};
use ferry_datapath::report::JobReport;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::retry::{self, Charged};
use crate::checkpoint::step::{Next, Step};
use crate::context::Context;
use crate::error::{Failure, Result};
use crate::{children, owned, status};

/// How a checkpoint runs its Job: attempt `n` is charged to `phase`'s budget, and a failed attempt's Job is
/// removed only once that charge is on record.
pub struct JobAttempt {
    /// The budget a failed attempt is charged to.
    pub phase: Phase,
    /// Attempt `n`'s Job (the status names the round of a Job that runs once per round).
    pub job: fn(&VirtualMachineMigration, &Status, i32) -> String,
    /// The Jobs of attempt `n` that make room for attempt `n + 1`.
    pub replaced: fn(&VirtualMachineMigration, &Status, i32) -> Vec<String>,
    /// The steps (pod labels) of Jobs whose pods must have ended before a new Job starts: two writers on one
    /// volume would interleave. None when the Job writes no volume.
    pub writers: &'static [&'static str],
    /// What the migration says while attempt `n`'s Job starts and runs.
    pub running: fn(&str, i32) -> Next,
    /// What a failure of this Job means beyond its charge (adaptation marks the volumes for rewriting).
    pub failed: fn(&mut Status, &Failure),
    /// Permanent refusals that a change to the migration fixes (the drivers it names): see [`refusal`].
    pub fixable_in_place: &'static [Reason],
    /// Said while a Job is removed or an earlier writer ends.
    pub restarting: &'static str,
    /// Said once a failed attempt is charged.
    pub retrying: &'static str,
}

impl JobAttempt {
    /// A failure that means nothing beyond its charge.
    pub fn only_charged(_: &mut Status, _: &Failure) {}
}

/// Where a checkpoint's Job attempt stands.
pub enum Attempt {
    /// Attempt `n` has no Job, the earlier attempt's Jobs are removed and none of their pods runs: the checkpoint
    /// creates Job `name` once its own gate passes.
    Start { name: String, n: i32 },
    /// Job `name` succeeded with its report (never an error).
    Succeeded { name: String, report: JobReport },
    /// Running, being removed, or a failure charged or being cleared away: say this.
    Wait(Next),
}

/// Long enough to stay quiet: the Job's own changes wake the migration up.
const WAIT: Duration = Duration::from_secs(60);

/// Observes the current attempt of `kind`'s Job and does what its state calls for, except create the Job and
/// record its result, which are the checkpoint's.
pub async fn attempt(step: &mut Step<'_>, kind: &JobAttempt) -> Result<Attempt> {
    let n = status::budget_used(step.status, kind.phase) + 1;
    let name = (kind.job)(step.vmm, step.status, n);
    Ok(match observe(step.ctx, step.vmm, &name).await? {
        JobState::Absent => {
            if n > 1 {
                // The failed attempt's Jobs were charged already; they make room for this one.
                for earlier in (kind.replaced)(step.vmm, step.status, n - 1) {
                    delete(step.ctx, step.vmm, &earlier).await?;
                }
            }
            if !kind.writers.is_empty() {
                let ns = step.vmm.namespace().unwrap_or_default();
                let writers =
                    wait_for_writers(step.ctx, &ns, step.vmm, kind.writers, kind.restarting);
                if let Some(wait) = writers.await? {
                    return Ok(Attempt::Wait(wait));
                }
            }
            Attempt::Start { name, n }
        }
        JobState::Terminating => Attempt::Wait(Next::wait(
            kind.restarting,
            format!("Job {name} is being removed"),
            WAIT,
        )),
        JobState::Running => Attempt::Wait((kind.running)(&name, n)),
        JobState::Succeeded(report) => Attempt::Succeeded { name, report },
        JobState::Failed(failure, job) => {
            if let Some(wait) = fixable_in_place(step, kind, &name, job.made_from, &failure).await?
            {
                return Ok(Attempt::Wait(wait));
            }
            (kind.failed)(step.status, &failure);
            Attempt::Wait(charge_failed(step, kind, &name, &job.uid, failure).await?)
        }
    })
}

/// What a permanent refusal that a person can fix in the migration means now.
#[derive(Debug, PartialEq)]
pub enum Refusal {
    /// Not one a change to the migration fixes: charged, or the end of the migration, as any failure.
    Final,
    /// The migration is no newer than the Job that refused: it waits for a person (`ManualInterventionRequired`),
    /// the Job kept as the evidence and every volume as it was.
    Waiting(Failure),
    /// The migration changed since the Job refused: the Job goes, and the same attempt starts again, uncharged.
    Fixed,
}

/// `failure` of a Job made from the migration's generation `made_from` (an earlier release's Job has no record:
/// the first), now that the migration is at `generation`. Pure.
pub fn refusal(
    failure: &Failure,
    fixable: &[Reason],
    made_from: Option<i64>,
    generation: Option<i64>,
) -> Refusal {
    if failure.class != ErrorClass::Permanent || !fixable.contains(&failure.reason) {
        return Refusal::Final;
    }
    if generation.unwrap_or_default() > made_from.unwrap_or(1) {
        return Refusal::Fixed;
    }
    Refusal::Waiting(Failure {
        fixable: true,
        ..failure.clone()
    })
}

/// The wait while a refused Job is removed because the migration changed since; `None` unless the failure is one
/// `kind` lets a person fix; the fixable failure itself while nobody has.
async fn fixable_in_place(
    step: &Step<'_>,
    kind: &JobAttempt,
    job: &str,
    made_from: Option<i64>,
    failure: &Failure,
) -> Result<Option<Next>> {
    match refusal(
        failure,
        kind.fixable_in_place,
        made_from,
        step.vmm.metadata.generation,
    ) {
        Refusal::Final => Ok(None),
        Refusal::Waiting(fixable) => Err(fixable),
        Refusal::Fixed => {
            delete(step.ctx, step.vmm, job).await?;
            Ok(Some(Next::wait(
                kind.restarting,
                format!(
                    "the migration changed since Job {job} refused ({}): removing it to try again",
                    failure.reason
                ),
                Duration::from_secs(2),
            )))
        }
    }
}

/// A failed attempt: charged (recorded first), then its Job removed on the next pass, which makes room for the
/// next attempt's.
async fn charge_failed(
    step: &mut Step<'_>,
    kind: &JobAttempt,
    job: &str,
    uid: &str,
    failure: Failure,
) -> Result<Next> {
    match retry::charge(step, kind.phase, uid, &failure)? {
        Charged::Now => Ok(retry::persist(step, kind.phase, kind.retrying, &failure)),
        Charged::Before => {
            delete(step.ctx, step.vmm, job).await?;
            Ok(Next::wait(
                kind.retrying,
                format!("removing the failed Job {job}"),
                Duration::from_secs(2),
            ))
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum JobState {
    Absent,
    Terminating,
    Running,
    /// The Job's report; never `JobReport::Error`.
    Succeeded(JobReport),
    Failed(Failure, FailedJob),
}

/// Which Job failed, read from the Job that reported the failure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FailedJob {
    /// A retry charges each failed Job once.
    pub uid: String,
    /// The migration's generation the Job was made from (annotation `spec-generation`); `None` for a Job of an
    /// earlier release.
    pub made_from: Option<i64>,
}

impl FailedJob {
    fn of(job: &Job) -> Self {
        FailedJob {
            uid: job.uid().unwrap_or_default(),
            made_from: job
                .annotations()
                .get(ferry_api::keys::SPEC_GENERATION_ANNOTATION)
                .and_then(|value| value.parse().ok()),
        }
    }
}

/// True when the watch cache shows `vmm`'s Job `name` running: a stale copy can only make us wait longer.
pub fn cached_running(ctx: &Context, vmm: &VirtualMachineMigration, name: &str) -> bool {
    let ns = vmm.namespace().unwrap_or_default();
    ctx.caches
        .job(&ns, name)
        .is_some_and(|job| running(&job) && children::is_ours(&*job, vmm))
}

fn running(job: &Job) -> bool {
    job.metadata.deletion_timestamp.is_none() && !ended(job)
}

/// The state of `vmm`'s Job `name`; a Job of that name that is not its own is refused, never read.
pub async fn observe(ctx: &Context, vmm: &VirtualMachineMigration, name: &str) -> Result<JobState> {
    let ns = &vmm.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    // A Job of ours the cache shows running only makes us wait; its end comes as an event.
    let cached = ctx.caches.job(ns, name);
    let waiting_only = |job: &Job| running(job) && children::is_ours(job, vmm);
    let observed = crate::cache::read(cached, &jobs, name, waiting_only).await?;
    let observed = children::refuse_unless_ours(observed, vmm, "Job", Reason::JobExists)?;
    let Some(job) = observed else {
        return Ok(JobState::Absent);
    };
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(JobState::Terminating);
    }
    let finished = |kind: &str| condition(&job, kind);
    if !ended(&job) {
        return Ok(JobState::Running);
    }
    if let Some(failure) = past_deadline(&job) {
        return Ok(JobState::Failed(failure, FailedJob::of(&job)));
    }
    let message = termination_message(ctx, ns, &job).await?;
    Ok(
        match state_of(finished("Complete"), message.as_deref(), name) {
            JobState::Failed(failure, _) => JobState::Failed(failure, FailedJob::of(&job)),
            other => other,
        },
    )
}

/// Whether `job` has condition `kind` (`Complete`, `Failed`) true.
pub fn condition(job: &Job, kind: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
}

/// A Job the Job controller stopped at its `activeDeadlineSeconds`: its pod was killed, so it left no result.
fn past_deadline(job: &Job) -> Option<Failure> {
    let failed = job.status.as_ref()?.conditions.as_ref()?.iter().find(|c| {
        c.type_ == "Failed" && c.status == "True" && c.reason.as_deref() == Some("DeadlineExceeded")
    })?;
    let deadline = job
        .spec
        .as_ref()?
        .active_deadline_seconds
        .unwrap_or_default();
    Some(Failure::bounded(
        Reason::JobDeadlineExceeded,
        format!(
            "Job {} was stopped after its deadline of {deadline}s (its time to start, and its disks at the slowest \
             rate that counts as progress): {}",
            job.name_any(),
            failed.message.as_deref().unwrap_or("no message")
        ),
    ))
}

fn ended(job: &Job) -> bool {
    condition(job, "Complete") || condition(job, "Failed")
}

/// What a finished Job's result means. Pure.
pub fn state_of(succeeded: bool, message: Option<&str>, job: &str) -> JobState {
    let report = message.and_then(JobReport::parse);
    if succeeded {
        return match report {
            Some(report) if !matches!(report, JobReport::Error(_)) => JobState::Succeeded(report),
            _ => JobState::Failed(
                Failure::bounded(
                    Reason::JobResultUnreadable,
                    format!("Job {job} finished without a readable result"),
                ),
                FailedJob::default(),
            ),
        };
    }
    let failure = match report {
        Some(JobReport::Error(e)) => {
            // A reason this controller does not know (a Job of another version) stays in the message.
            let (reason, unknown) = match Reason::from_name(&e.reason) {
                Some(reason) => (reason, String::new()),
                None => (Reason::JobFailed, format!("{}: ", e.reason)),
            };
            Failure {
                class: e.class,
                reason,
                message: format!("Job {job}: {unknown}{}", e.message),
                fixable: false,
            }
        }
        _ => Failure::bounded(
            Reason::JobFailed,
            format!(
                "Job {job} failed: {}",
                message
                    .map(|m| m.trim())
                    .filter(|m| !m.is_empty())
                    .unwrap_or("no message")
            ),
        ),
    };
    JobState::Failed(failure, FailedJob::default())
}

/// The result `job`'s pod left; only a pod the Job itself owns counts (anyone can put the Job's name label on a
/// pod of their own).
async fn termination_message(ctx: &Context, ns: &str, job: &Job) -> Result<Option<String>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={}", job.name_any());
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    let job_uid = job.uid().unwrap_or_default();
    let owned = |pod: &&Pod| {
        pod.owner_references()
            .iter()
            .any(|o| o.uid == job_uid && o.controller == Some(true))
    };
    Ok(listed.items.iter().filter(owned).find_map(|pod| {
        pod.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
    }))
}

/// This migration's pods of the Jobs of `steps` that have not ended. A deleted or failed Job's pod can still run
/// (background deletion, a pod counted failed while it terminates): two writers on one volume would interleave.
async fn pods_running(
    ctx: &Context,
    ns: &str,
    vmm: &VirtualMachineMigration,
    steps: &[&str],
) -> Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{},{} in ({})",
        children::uid_selector(vmm),
        children::STEP_LABEL,
        steps.join(",")
    );
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    Ok(listed
        .items
        .iter()
        .filter(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .map(|pod| pod.name_any())
        .collect())
}

/// A wait while a pod of `steps` still runs: the next writer of the volumes starts only after it.
async fn wait_for_writers(
    ctx: &Context,
    ns: &str,
    vmm: &VirtualMachineMigration,
    steps: &[&str],
    reason: &'static str,
) -> Result<Option<Next>> {
    let running = pods_running(ctx, ns, vmm, steps).await?;
    Ok((!running.is_empty()).then(|| {
        Next::wait(
            reason,
            format!(
                "waiting for the earlier writer pod(s) {} to end",
                running.join(", ")
            ),
            Duration::from_secs(2),
        )
    }))
}

/// Creates `job`; one already there is ours (an earlier reconcile's, by its deterministic name).
pub async fn create(ctx: &Context, ns: &str, job: &Job) -> Result<()> {
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), ns);
    ferry_kube::create::create_if_absent(&jobs, job).await?;
    Ok(())
}

/// Deletes this migration's Job `name`, if there is one. A Job under that name that is not ours is left alone,
/// and the uid precondition spares one created under the name since it was read.
pub async fn delete(ctx: &Context, vmm: &VirtualMachineMigration, name: &str) -> Result<()> {
    let ns = vmm.namespace().unwrap_or_default();
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), &ns);
    let found = match ctx.caches.job(&ns, name) {
        Some(cached) => Some(cached),
        None => jobs.get_opt(name).await?.map(std::sync::Arc::new),
    };
    match found {
        Some(job) if children::is_ours(&*job, vmm) && job.metadata.deletion_timestamp.is_none() => {
            owned::delete_job(&jobs, &job).await
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::ErrorClass;

    #[test]
    fn a_job_stopped_at_its_deadline_says_so() {
        let job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "m-convert-1"},
            "spec": {"activeDeadlineSeconds": 1900, "template": {}},
            "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                       "message": "Job was active longer than specified deadline"}]},
        }))
        .unwrap();
        let failure = past_deadline(&job).unwrap();
        assert_eq!(failure.reason, "JobDeadlineExceeded");
        assert_eq!(failure.class, ErrorClass::BoundedRetryable);
        assert!(
            failure.message.contains("deadline of 1900s"),
            "{}",
            failure.message
        );
        let mut other = job.clone();
        other.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some("BackoffLimitExceeded".into());
        assert!(past_deadline(&other).is_none());
    }

    #[test]
    fn a_refusal_a_person_can_fix_waits_for_a_newer_migration() {
        let fixable = [Reason::GuestDriversMissing];
        let drivers = Failure::permanent(Reason::GuestDriversMissing, "no driver for 2k22");
        let Refusal::Waiting(waiting) = refusal(&drivers, &fixable, Some(3), Some(3)) else {
            panic!("the migration did not change")
        };
        assert!(waiting.fixable && waiting.message == drivers.message);
        assert_eq!(
            refusal(&drivers, &fixable, Some(3), Some(4)),
            Refusal::Fixed
        );
        assert_eq!(
            refusal(&drivers, &fixable, None, Some(2)),
            Refusal::Fixed,
            "an earlier release's Job counts as made from the first generation"
        );
        assert!(matches!(
            refusal(&drivers, &fixable, None, Some(1)),
            Refusal::Waiting(_)
        ));
        let disk_full = Failure::permanent(Reason::GuestDiskFull, "no room");
        assert_eq!(
            refusal(&disk_full, &fixable, Some(1), Some(9)),
            Refusal::Final
        );
        let retried = Failure::bounded(
            Reason::GuestDriversMissing,
            "as an earlier release classed it",
        );
        assert_eq!(
            refusal(&retried, &fixable, Some(1), Some(1)),
            Refusal::Final
        );
    }

    #[test]
    fn results_and_classed_errors_are_read_from_the_message() {
        assert!(matches!(
            state_of(true, Some(r#"{"disks": []}"#), "j"),
            JobState::Succeeded(_)
        ));
        let summary = r#"{"staged": {"bytesRead": 0, "disks": 12, "format": "raw", "run": "r"}}"#;
        assert!(matches!(
            state_of(true, Some(summary), "j"),
            JobState::Succeeded(JobReport::Staged(_))
        ));
        let JobState::Failed(f, _) = state_of(true, None, "j") else {
            panic!()
        };
        assert_eq!(f.reason, "JobResultUnreadable");
        // An earlier release's disk list, cut at 4 KiB by the kubelet, does not parse.
        let JobState::Failed(f, _) =
            state_of(true, Some(r#"{"disks": [{"index": 0, "url": "s3://b"#), "j")
        else {
            panic!()
        };
        assert_eq!(f.reason, "JobResultUnreadable");
        let msg = r#"{"error": {"class": "Permanent", "reason": "LoginFailed", "message": "login failed"}}"#;
        let JobState::Failed(f, _) = state_of(false, Some(msg), "j") else {
            panic!()
        };
        assert_eq!(
            (f.class, f.reason.as_str()),
            (ErrorClass::Permanent, "LoginFailed")
        );
        let JobState::Failed(f, _) = state_of(false, Some("oom"), "j") else {
            panic!()
        };
        assert_eq!(
            (f.class, f.reason.as_str()),
            (ErrorClass::BoundedRetryable, "JobFailed")
        );
    }
}
