//! What a warm migration changes on its source besides power, undone: the snapshots it took (found by their
//! name, so one a crash left unrecorded goes too) and Changed Block Tracking when Ferry turned it on.

use ferry_api::{ChangeTrackingChange, WarmStatus};
use ferry_vsphere::{MoRef, Session, cbt, snapshot};

use super::source;
use crate::checkpoint::step::Step;
use crate::checkpoint::support::vsphere_task::TASK_TIMEOUT;
use crate::children;
use crate::error::Result;

/// One pass of cleanup (cancel, failure, deletion); true once no snapshot of the migration remains and tracking is
/// as it was.
pub async fn restore(step: &mut Step<'_>) -> Result<bool> {
    let Some(warm) = &step.status.warm else {
        return Ok(true);
    };
    let turned_on = tracking_turned_on(warm);
    let session = source::session(step.ctx, step.vmm).await?;
    let vm = source::checked_source_vm(&session, step.status).await?;
    let ours = snapshot::named(&session, &vm, &children::snapshot_prefix(step.vmm)).await?;
    if let Some(first) = ours.first() {
        // One at a time: vSphere runs one snapshot task per VM.
        tracing::info!(snapshot = %first.name, "removing the migration's snapshot");
        snapshot::remove(&session, &first.snapshot, TASK_TIMEOUT).await?;
        return Ok(ours.len() == 1 && !turned_on && finish(step));
    }
    if turned_on {
        turn_tracking_off(step, &session, &vm).await?;
    }
    Ok(finish(step))
}

/// After the cutover's copy: Precopying removed every snapshot before it, so only tracking is left as it was
/// found, without reading the snapshot tree again.
pub async fn restore_tracking(step: &mut Step<'_>) -> Result<()> {
    if !step.status.warm.as_ref().is_some_and(tracking_turned_on) {
        return Ok(());
    }
    let session = source::session(step.ctx, step.vmm).await?;
    let vm = source::checked_source_vm(&session, step.status).await?;
    turn_tracking_off(step, &session, &vm).await
}

fn tracking_turned_on(warm: &WarmStatus) -> bool {
    matches!(
        warm.change_tracking_enabled,
        Some(ChangeTrackingChange::Enabling | ChangeTrackingChange::Enabled)
    )
}

async fn turn_tracking_off(step: &mut Step<'_>, session: &Session, vm: &MoRef) -> Result<()> {
    if cbt::change_tracking_enabled(session, vm).await? {
        cbt::set_change_tracking(session, vm, false, TASK_TIMEOUT).await?;
    }
    if let Some(warm) = &mut step.status.warm {
        warm.change_tracking_enabled = Some(ChangeTrackingChange::Restored);
    }
    Ok(())
}

/// Forgets the snapshot on record: none remains.
fn finish(step: &mut Step<'_>) -> bool {
    if let Some(warm) = &mut step.status.warm {
        warm.snapshot = None;
    }
    true
}
