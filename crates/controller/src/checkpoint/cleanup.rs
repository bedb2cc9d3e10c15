//! Cleanup after a cancel, a delete or a failure. Desired: nothing labelled with the migration's UID left (VM,
//! DataVolumes, Jobs), no staged image (with `spec.staging`), and the source powered on again if `restorePowerState` asks and Ferry
//! powered it off. Observed: those objects by label, the staged objects by name, the source's power. Action:
//! delete what is there; power on only once the target VM and its instance are gone (never both running).
//! Recorded: power.restored.

use std::time::Duration;

use ferry_api::{ErrorClass, PowerState};
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

use super::{Step, source};
use crate::build::vmi_resource;
use crate::children;
use crate::error::Result;
use crate::owned::Owned;

/// One pass; true when everything is gone and power is as it should be.
pub async fn cleanup(step: &mut Step<'_>) -> Result<bool> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let owned = Owned::of(step.ctx, step.vmm);
    let mut remaining = owned.delete_kept_kinds().await?;
    // The VM's instance goes after the VM (garbage collection); until it has, the target may still run, and the
    // source must not be powered on.
    let vmis = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vmi_resource());
    if vmis.get_opt(&children::vm_name(step.vmm)).await?.is_some() {
        remaining += 1;
    }
    remaining += owned.delete_jobs().await?;
    remove_staged(step).await?;
    if remaining > 0 {
        return Ok(false);
    }
    restore_power(step).await
}

async fn remove_staged(step: &Step<'_>) -> Result<()> {
    let disks = step
        .status
        .source
        .as_ref()
        .map_or(step.status.disks.len(), |s| s.disks.len());
    if disks == 0 || !crate::staging::staged(step.vmm) {
        return Ok(());
    }
    match crate::staging::open(step.ctx, step.vmm).await {
        Ok(staging) => {
            for object in crate::staging::object_names(disks) {
                staging.delete(&object).await?;
            }
            Ok(())
        }
        // Without its Secret (or with an unsupported URL) staging cannot be reached: nothing was staged by us
        // either, since the conversion Job needs the same Secret.
        Err(e) if e.class == ErrorClass::Permanent => {
            tracing::warn!(class = ?e.class, reason = %e.reason, "staging not cleaned: {e}");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

pub(super) async fn restore_power(step: &mut Step<'_>) -> Result<bool> {
    let Some(recorded) = step.status.power.clone() else {
        return Ok(true);
    };
    let asked = step.vmm.spec.source.restore_power_state;
    if !asked || recorded.original != Some(PowerState::PoweredOn) || recorded.restored {
        return Ok(true);
    }
    let session = source::session(step.ctx, step.vmm).await?;
    let vm = source::checked_source_vm(&session, step.status).await?;
    let observed = ferry_vsphere::power::current_power_state(&session, &vm).await?;
    if observed != PowerState::PoweredOn {
        ferry_vsphere::power::power_on(&session, &vm, Duration::from_secs(300)).await?;
    }
    let power = step.status.power.get_or_insert_default();
    power.restored = true;
    power.current = Some(PowerState::PoweredOn);
    power.task = None;
    Ok(true)
}
