//! The source side: the Provider, a session to it, and the source VM's managed object.

use ferry_api::{Provider, Reason, VirtualMachineMigration, VirtualMachineMigrationStatus};
use ferry_vsphere::{MoRef, Session, VmSelector};
use kube::{Api, ResourceExt};

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
    let ns = vmm.namespace().unwrap_or_default();
    provider_named(ctx, &ns, &vmm.spec.source.provider_ref.name).await
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

/// The source VM as discovery recorded it in `status`, the working copy (discovery may have run in this very
/// reconcile, so the object as read may not have it yet).
pub fn source_vm(status: &VirtualMachineMigrationStatus) -> Result<MoRef> {
    status
        .source
        .as_ref()
        .map(|s| MoRef::new("VirtualMachine", s.moref.clone()))
        .ok_or_else(|| {
            Failure::transient(
                Reason::SourceNotDiscovered,
                "the source VM was not discovered yet",
            )
        })
}
