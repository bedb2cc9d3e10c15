//! What a warm migration changes on its source besides power, undone: the snapshots it took (found by their
//! name, so one a crash left unrecorded goes too) and Changed Block Tracking when Ferry turned it on.

use std::time::Duration;

use ferry_api::ChangeTrackingChange;
use ferry_vsphere::{cbt, snapshot};

use super::source;
use crate::checkpoint::step::Step;
use crate::children;
use crate::error::Result;

const TASK_TIMEOUT: Duration = Duration::from_secs(600);

/// One pass; true once no snapshot of the migration remains and tracking is as it was.
pub async fn restore(step: &mut Step<'_>) -> Result<bool> {
    let Some(warm) = &step.status.warm else {
        return Ok(true);
    };
    let turned_on = matches!(
        warm.change_tracking_enabled,
        Some(ChangeTrackingChange::Enabling | ChangeTrackingChange::Enabled)
    );
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
        if cbt::change_tracking_enabled(&session, &vm).await? {
            cbt::set_change_tracking(&session, &vm, false, TASK_TIMEOUT).await?;
        }
        if let Some(warm) = &mut step.status.warm {
            warm.change_tracking_enabled = Some(ChangeTrackingChange::Restored);
        }
    }
    Ok(finish(step))
}

/// Forgets the snapshot on record: none remains.
fn finish(step: &mut Step<'_>) -> bool {
    if let Some(warm) = &mut step.status.warm {
        warm.snapshot = None;
    }
    true
}
