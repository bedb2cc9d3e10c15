//! The source side: the Provider, a session to it, and the source VM's managed object.

use ferry_api::{Provider, Reason, VirtualMachineMigration, VirtualMachineMigrationStatus};
use ferry_vsphere::power::PowerView;
use ferry_vsphere::{MoRef, Session, VmSelector};
use kube::Api;

use crate::context::Context;
use crate::error::{Failure, Result};

/// The source VM as discovery recorded it in the status.
pub fn recorded(status: &VirtualMachineMigrationStatus) -> Result<ferry_api::SourceVmStatus> {
    status.source.clone().ok_or_else(|| {
        Failure::transient(Reason::SourceNotDiscovered, "discovery recorded no source")
    })
}

/// The migration's Provider: as the Provider controller's cache holds it (its watch lags the migrations' by a
/// moment at most, and a migration waiting for a fixed Provider looks again), else read.
pub async fn provider(ctx: &Context, vmm: &VirtualMachineMigration) -> Result<Provider> {
    let ns = vmm.provider_namespace();
    provider_named(ctx, ns, &vmm.spec.source.provider_ref.name).await
}

/// The Provider `ns/name`, as [`provider`] finds it.
pub async fn provider_named(ctx: &Context, ns: &str, name: &str) -> Result<Provider> {
    if let Some(cached) = ctx.cached_provider(ns, name) {
        return Ok((*cached).clone());
    }
    Api::<Provider>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await?
        .ok_or_else(|| {
            Failure::fixable(
                Reason::ProviderNotFound,
                format!(
                    "Provider {ns}/{name} does not exist; create it, and the migration resumes"
                ),
            )
        })
}

/// A session to the migration's Provider; a failed login is forgotten so the next attempt logs in afresh.
pub async fn session(ctx: &Context, vmm: &VirtualMachineMigration) -> Result<Session> {
    session_for(ctx, &provider(ctx, vmm).await?).await
}

/// A session to `provider`, as [`session`] (for a step that needs the Provider itself too).
pub async fn session_for(ctx: &Context, provider: &Provider) -> Result<Session> {
    ctx.session(provider)
        .await
        .inspect_err(|_| ctx.forget_session(provider))
}

pub fn selector(vmm: &VirtualMachineMigration) -> VmSelector {
    let vm = &vmm.spec.source.vm;
    match (&vm.name, &vm.inventory_path, &vm.uuid, &vm.moref) {
        (Some(n), ..) => VmSelector::Name(n.clone()),
        (_, Some(p), ..) => VmSelector::InventoryPath(p.clone()),
        (_, _, Some(u), _) => VmSelector::Uuid(u.clone()),
        (_, _, _, Some(m)) => VmSelector::Moref(m.clone()),
        _ => VmSelector::Name(String::new()),
    }
}

/// The source VM as discovery recorded it, once the endpoint is shown to be the vCenter it was found on and the
/// moref still the VM with its instance UUID. A moref is reused when a VM is removed and another registered, and
/// a Provider's URL may reach another vCenter: no power operation or Job acts on a VM not shown to be this one.
pub async fn checked_source_vm(
    session: &Session,
    status: &VirtualMachineMigrationStatus,
) -> Result<MoRef> {
    let recorded = recorded(status)?;
    let vm = MoRef::new("VirtualMachine", recorded.moref.clone());
    let endpoint = session.about().instance_uuid.clone();
    let found = match &recorded.instance_uuid {
        Some(_) => ferry_vsphere::inventory::instance_uuid(session, &vm).await?,
        None => None,
    };
    match identity_changed(&recorded, endpoint.as_deref(), found.as_deref()) {
        Some(message) => Err(Failure::fixable(Reason::SourceIdentityChanged, message)),
        None => Ok(vm),
    }
}

/// The source VM and its [`PowerView`], once shown to be the VM discovered as [`checked_source_vm`] shows it, in
/// one property read.
pub async fn checked_power_view(
    session: &Session,
    status: &VirtualMachineMigrationStatus,
) -> Result<(MoRef, PowerView)> {
    let recorded = recorded(status)?;
    let vm = MoRef::new("VirtualMachine", recorded.moref.clone());
    let view = ferry_vsphere::power::power_view(session, &vm).await?;
    let endpoint = session.about().instance_uuid.clone();
    let found = recorded
        .instance_uuid
        .as_ref()
        .and(view.instance_uuid.as_deref());
    match identity_changed(&recorded, endpoint.as_deref(), found) {
        Some(message) => Err(Failure::fixable(Reason::SourceIdentityChanged, message)),
        None => Ok((vm, view)),
    }
}

/// What differs between the identities discovery recorded and those seen now, if anything. An identity vSphere
/// did not report at discovery cannot be compared (an ESXi host has no instance UUID of its own).
pub fn identity_changed(
    recorded: &ferry_api::SourceVmStatus,
    endpoint_now: Option<&str>,
    vm_now: Option<&str>,
) -> Option<String> {
    let untouched = "nothing was done to it; check the Provider's URL and the VM, then delete this migration and \
                     create a new one for the VM you mean";
    if let Some(was) = &recorded.vcenter_uuid
        && endpoint_now != Some(was.as_str())
    {
        return Some(format!(
            "the Provider's endpoint is no longer the vCenter {} was found on (instance UUID {was}, now {}); \
             {untouched}",
            recorded.name,
            endpoint_now.unwrap_or("none")
        ));
    }
    if let Some(was) = &recorded.instance_uuid
        && vm_now != Some(was.as_str())
    {
        return Some(format!(
            "{} no longer names {} (instance UUID {was}, now {}): the VM was removed or re-registered; {untouched}",
            recorded.moref,
            recorded.name,
            vm_now.unwrap_or("none")
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded() -> ferry_api::SourceVmStatus {
        ferry_api::SourceVmStatus {
            name: "web-1".into(),
            moref: "vm-42".into(),
            instance_uuid: Some("5012-aaaa".into()),
            vcenter_uuid: Some("vc-1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_same_vcenter_and_vm_pass() {
        assert_eq!(
            identity_changed(&recorded(), Some("vc-1"), Some("5012-aaaa")),
            None
        );
    }

    #[test]
    fn another_vcenter_or_a_reused_moref_is_named() {
        let other_vcenter = identity_changed(&recorded(), Some("vc-2"), Some("5012-aaaa")).unwrap();
        assert!(
            other_vcenter.contains("no longer the vCenter web-1 was found on"),
            "{other_vcenter}"
        );
        assert!(other_vcenter.contains("vc-2"), "{other_vcenter}");
        let reused = identity_changed(&recorded(), Some("vc-1"), Some("5012-bbbb")).unwrap();
        assert!(reused.contains("vm-42 no longer names web-1"), "{reused}");
        assert!(identity_changed(&recorded(), Some("vc-1"), None).is_some());
    }

    #[test]
    fn identities_not_reported_at_discovery_are_not_compared() {
        let mut esxi = recorded();
        esxi.vcenter_uuid = None;
        esxi.instance_uuid = None;
        assert_eq!(identity_changed(&esxi, None, None), None);
    }
}
