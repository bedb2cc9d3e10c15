//! Cleanup after a cancel, a delete or a failure. Desired: nothing labelled with the migration's UID left (VM,
//! DataVolumes, Jobs), no staged image (with `spec.staging`), no snapshot of a warm migration left on the source
//! (nor the tracking Ferry turned on), and the source powered on again if `restorePowerState` asks and Ferry
//! powered it off. Observed: those objects by label, the staged objects by name, the source's snapshots by name
//! and its power. Action: delete what is there; power on only once the target VM and its instance are gone
//! (never both running). Recorded: power.restored.

use std::time::Duration;

use ferry_api::{ErrorClass, PowerState};
use kube::api::DynamicObject;
use kube::{Api, Resource, ResourceExt};

use super::source;
use crate::build::{vm_resource, vmi_resource};
use crate::checkpoint::step::Step;
use crate::children;
use crate::error::Result;
use crate::owned::Owned;

/// One pass; true when everything is gone and power is as it should be.
pub async fn cleanup(step: &mut Step<'_>) -> Result<bool> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let owned = Owned::of(step.ctx, step.vmm);
    let vm_name = children::vm_name(step.vmm);
    let mut foreign_vm = None;
    if step.status.target_vm_uid.is_none() {
        // Created, but not yet recorded (a crash in between): its uid, before it goes.
        let vms =
            Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vm_resource());
        match vms.get_opt(&vm_name).await? {
            Some(vm) if children::is_ours(&vm, step.vmm) => step.status.target_vm_uid = vm.uid(),
            Some(vm) => foreign_vm = vm.uid(),
            None => {}
        }
    }
    let mut remaining = owned.delete_kept_kinds().await?;
    // The VM's instance goes after the VM (garbage collection); until it has, the target may still run, and the
    // source must not be powered on.
    let vmis = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vmi_resource());
    let ours = step.status.target_vm_uid.as_deref();
    if let Some(vmi) = vmis.get_opt(&vm_name).await?
        && instance_of_ours(&vmi, ours, foreign_vm.as_deref())
    {
        remaining += 1;
    }
    remaining += owned.delete_jobs().await?;
    super::credentials::take_back(step.ctx, step.vmm).await?;
    remove_staged(step).await?;
    if remaining > 0 {
        return Ok(false);
    }
    // Before power: the snapshots go while the source is as it was left.
    if !super::warm_source::restore(step).await? {
        return Ok(false);
    }
    restore_power(step).await
}

/// Whether `vmi` may be the instance of the VM this migration created (`vm_uid`, when recorded): only then does
/// cleanup wait for it. An instance no VirtualMachine owns, or one owned by somebody else's VM under the name
/// (`foreign_vm`), never is. With no uid recorded (a VM of ours deleted before its uid was), an instance of a VM
/// that is gone is waited for, rather than power the source on beside a target that might still run.
fn instance_of_ours(vmi: &DynamicObject, vm_uid: Option<&str>, foreign_vm: Option<&str>) -> bool {
    let owner = vmi
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "VirtualMachine");
    match (owner, vm_uid) {
        (None, _) => false,
        (Some(owner), Some(ours)) => owner.uid == ours,
        (Some(owner), None) => foreign_vm != Some(owner.uid.as_str()),
    }
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
            staging
                .delete_all(&crate::staging::object_names(disks))
                .await?;
            Ok(())
        }
        // Without its Secret (or with an unsupported URL) staging cannot be reached: nothing was staged by us
        // either, since the conversion Job needs the same Secret.
        Err(e) if e.class == ErrorClass::Permanent => {
            tracing::warn!(class = ?e.class, reason = %e.reason, "staging not cleaned: {e}");
            Ok(())
        }
        // A migration being deleted waits for staging only so long: past the bound its finalizer goes, and an
        // Event names what is left for a person to remove.
        Err(e) if staging_outage_outlasted(step) => {
            let left = crate::staging::object_names(disks).join(", ");
            let note = format!(
                "staging unreachable for {}s since the migration was deleted ({e}); giving up, these staged \
                 objects are left: {left}",
                STAGING_CLEANUP_BOUND.as_secs()
            );
            tracing::warn!(class = ?e.class, reason = %e.reason, "{note}");
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: "StagingNotCleaned".into(),
                note: Some(note.chars().take(1000).collect()),
                action: "Cleanup".into(),
                secondary: None,
            };
            let _ = step
                .ctx
                .recorder
                .publish(&event, &step.vmm.object_ref(&()))
                .await;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// How long a deleted migration retries removing its staged objects through a staging outage before it lets
/// go: long enough for a restart or a failover of the store, short enough that a store that is gone for good
/// does not keep the migration (and its namespace) from being deleted.
pub const STAGING_CLEANUP_BOUND: Duration = Duration::from_secs(60 * 60);

fn staging_outage_outlasted(step: &Step<'_>) -> bool {
    step.vmm
        .metadata
        .deletion_timestamp
        .as_ref()
        .is_some_and(|deleted| {
            step.now.0.duration_since(deleted.0).as_secs() >= STAGING_CLEANUP_BOUND.as_secs() as i64
        })
}

pub(crate) async fn restore_power(step: &mut Step<'_>) -> Result<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(owner_uid: Option<&str>) -> DynamicObject {
        let owners: Vec<_> = owner_uid
            .map(|uid| {
                serde_json::json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                           "name": "web", "uid": uid, "controller": true})
            })
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "web", "ownerReferences": owners},
        }))
        .unwrap()
    }

    #[test]
    fn cleanup_waits_for_its_own_vms_instance_only() {
        assert!(instance_of_ours(&vmi(Some("vm-uid")), Some("vm-uid"), None));
        assert!(!instance_of_ours(&vmi(Some("other")), Some("vm-uid"), None));
        assert!(
            !instance_of_ours(&vmi(None), Some("vm-uid"), None),
            "a bare VMI a person started"
        );
        assert!(
            !instance_of_ours(&vmi(None), None, None),
            "a bare VMI a person started"
        );
        assert!(
            !instance_of_ours(&vmi(Some("theirs")), None, Some("theirs")),
            "the instance of somebody else's VM under the name"
        );
        assert!(
            instance_of_ours(&vmi(Some("gone")), None, None),
            "an instance whose VM is gone, with no uid on record: wait, to be safe"
        );
    }
}
