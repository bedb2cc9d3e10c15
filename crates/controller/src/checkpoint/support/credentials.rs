//! A lent Provider's credentials in the migration's namespace, where its Jobs can mount them. Desired: a copy of
//! the Provider's `user` and `password` while a Job that reads the source is to be created, none once it has
//! succeeded or the migration ends. Observed: the copy, by name. Action: create it, bring it up to date (a
//! rotated password), or delete it (ours only, with a uid precondition). Recorded: nothing; the copy is the record.

use ferry_api::{Provider, Reason, VirtualMachineMigration};
use ferry_kube::create::{Created, create_if_absent};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

use crate::context::Context;
use crate::error::{Failure, Result};
use crate::{build, children};

/// Copies `provider`'s credentials for `vmm`'s Jobs when the Provider is lent from another namespace; nothing
/// otherwise. The copy is the migration's (owner and labels), so it goes with the migration at the latest.
pub async fn lend(ctx: &Context, vmm: &VirtualMachineMigration, provider: &Provider) -> Result<()> {
    if !vmm.provider_is_lent() {
        return Ok(());
    }
    let values = ctx
        .secret_values(
            &provider.namespace().unwrap_or_default(),
            &provider.spec.secret_ref.name,
            build::job::SOURCE_KEYS,
        )
        .await?;
    let Some(wanted) = build::job::lent_credentials(vmm, values) else {
        return Ok(());
    };
    let ns = vmm.namespace().unwrap_or_default();
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    if create_if_absent(&secrets, &wanted).await? == Created::Now {
        return Ok(());
    }
    let name = wanted.name_any();
    let found = secrets.get_opt(&name).await?;
    match children::refuse_unless_ours(found, vmm, "Secret", Reason::SecretExists)? {
        Some(found) if found.data != wanted.data => {
            let patch = serde_json::json!({"data": wanted.data});
            secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(())
        }
        Some(_) => Ok(()),
        None => Err(Failure::transient(
            Reason::NotFound,
            format!("Secret {ns}/{name} went away as it was created; creating it again"),
        )),
    }
}

/// Deletes the copy once no Job needs it: the credentials stay in the tenant's namespace no longer than a
/// conversion runs. Somebody else's Secret under the name is left alone.
pub async fn take_back(ctx: &Context, vmm: &VirtualMachineMigration) -> Result<()> {
    if !vmm.provider_is_lent() {
        return Ok(());
    }
    let ns = vmm.namespace().unwrap_or_default();
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    match secrets.get_opt(&children::source_credentials(vmm)).await? {
        Some(copy) if children::is_ours(&copy, vmm) => {
            let uid = copy.uid().unwrap_or_default();
            ferry_kube::delete::delete_exactly(&secrets, &copy.name_any(), &uid).await?;
            Ok(())
        }
        _ => Ok(()),
    }
}
