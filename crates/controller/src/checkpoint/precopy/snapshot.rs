//! A precopy round's snapshot on the source: created, then removed once the round is copied, each vSphere task
//! on record before it is followed, and the snapshot found by name when a crash kept it off the record.

use ferry_api::{Phase, WarmSnapshot};
use ferry_vsphere::{MoRef, Session, snapshot};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{checked_session, recorded_snapshot, warm_mut};
use crate::checkpoint::step::{Next, Step};
use crate::checkpoint::support::jobs;
use crate::checkpoint::support::vsphere_task::{self, Followed};
use crate::children;
use crate::error::{Failure, Result};
use crate::status;

pub(super) async fn create(step: &mut Step<'_>) -> Result<Next> {
    let (session, vm) = checked_session(step).await?;
    let name = recorded_snapshot(step)?.name;
    // A crash between the call and its record left it made: take it, do not make another.
    if let Some(found) = by_name(&session, &vm, &name).await?.into_iter().next() {
        let moref = found.value;
        set_snapshot(step, |s| s.moref = Some(moref.clone()));
        return Ok(Next::persist(
            "SnapshotCreated",
            format!("snapshot {name} is {moref}"),
        ));
    }
    let description = format!(
        "Ferry's warm migration {}/{}: removed after its round",
        step.vmm.metadata.namespace.as_deref().unwrap_or_default(),
        step.vmm.metadata.name.as_deref().unwrap_or_default()
    );
    let task = snapshot::start_create(&session, &vm, &name, &description).await?;
    set_snapshot(step, |s| s.task = Some(task.value.clone()));
    Ok(Next::persist(
        "CreatingSnapshot",
        format!("creating snapshot {name} (task {})", task.value),
    ))
}

pub(super) async fn follow_create(step: &mut Step<'_>, task: String) -> Result<Next> {
    let (session, _) = checked_session(step).await?;
    let running = |progress| format!("snapshot task {task} running ({progress}%)");
    match vsphere_task::follow(&session, &task, "CreatingSnapshot", running).await? {
        Followed::Running(wait) => Ok(wait),
        Followed::Succeeded(Some(moref)) => {
            set_snapshot(step, |s| {
                s.task = None;
                s.moref = Some(moref.value.clone());
            });
            Ok(Next::persist(
                "SnapshotCreated",
                format!("snapshot {} created", moref.value),
            ))
        }
        // Looked up by name on the next pass.
        Followed::Succeeded(None) => {
            set_snapshot(step, |s| s.task = None);
            Ok(Next::persist(
                "CreatingSnapshot",
                format!("snapshot task {task} named no snapshot: looking it up by name"),
            ))
        }
        Followed::Failed(error) => {
            // Nothing was made: the next attempt names it afresh.
            set_snapshot(step, |s| s.task = None);
            Err(Failure::from(error))
        }
    }
}

pub(super) async fn remove(step: &mut Step<'_>, moref: Option<String>) -> Result<Next> {
    let (session, vm) = checked_session(step).await?;
    let taken = recorded_snapshot(step)?;
    // This round's Jobs are done with: the next round's have names of their own.
    let job = children::precopy_job(
        step.vmm,
        taken.round,
        status::budget_used(step.status, Phase::Precopying) + 1,
    );
    jobs::delete(step.ctx, step.vmm, &job).await?;
    // Every snapshot of this round's name: one made by a create that raced a crash too.
    let mut found = by_name(&session, &vm, &taken.name).await?;
    // Renamed since, it is still ours; one gone is not asked for again (that would be a change vSphere logs).
    if let Some(moref) = moref.filter(|m| !found.iter().any(|f| &f.value == m)) {
        let recorded = MoRef::new("VirtualMachineSnapshot", moref);
        if snapshot::exists(&session, &recorded).await? {
            found.push(recorded);
        }
    }
    for snapshot in &found {
        if let Some(task) = snapshot::start_remove(&session, snapshot).await? {
            set_snapshot(step, |s| s.task = Some(task.value.clone()));
            return Ok(Next::persist(
                "RemovingSnapshot",
                format!("removing snapshot {} (task {})", taken.name, task.value),
            ));
        }
    }
    Ok(snapshot_gone(step, &taken))
}

pub(super) async fn follow_remove(step: &mut Step<'_>, task: String) -> Result<Next> {
    let (session, _) = checked_session(step).await?;
    let taken = recorded_snapshot(step)?;
    let running = |progress| format!("removing snapshot {} ({progress}%)", taken.name);
    match vsphere_task::follow(&session, &task, "RemovingSnapshot", running).await? {
        Followed::Running(wait) => Ok(wait),
        // Looked for again by name: another of the same name may remain.
        Followed::Succeeded(_) => {
            set_snapshot(step, |s| {
                s.task = None;
                s.moref = None;
            });
            Ok(Next::persist(
                "RemovingSnapshot",
                format!("snapshot {} removed", taken.name),
            ))
        }
        Followed::Failed(error) => {
            set_snapshot(step, |s| s.task = None);
            Err(Failure::from(error))
        }
    }
}

/// The snapshots of the source named as the round's: exactly, since round 1's name is a prefix of round 10's.
async fn by_name(session: &Session, vm: &MoRef, name: &str) -> Result<Vec<MoRef>> {
    Ok(snapshot::named(session, vm, name)
        .await?
        .into_iter()
        .filter(|n| n.name == name)
        .map(|n| n.snapshot)
        .collect())
}

/// No snapshot of the round remains: the next round is due after the interval.
fn snapshot_gone(step: &mut Step<'_>, taken: &WarmSnapshot) -> Next {
    let interval = step
        .vmm
        .spec
        .warm
        .as_ref()
        .map_or(3600, |w| w.precopy_interval_seconds)
        .max(1);
    let next = step.now.0 + std::time::Duration::from_secs(interval as u64);
    let warm = warm_mut(step);
    warm.snapshot = None;
    warm.next_round_at = Some(Time(next));
    Next::persist(
        "PrecopyRoundDone",
        format!(
            "snapshot {} removed; the next round starts in {interval}s unless the cutover comes first",
            taken.name
        ),
    )
}

fn set_snapshot(step: &mut Step<'_>, edit: impl FnOnce(&mut WarmSnapshot)) {
    if let Some(s) = &mut warm_mut(step).snapshot {
        edit(s);
    }
}
