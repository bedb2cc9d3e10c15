//! What the checkpoints that create DataVolumes share: a claim of the DataVolume's name left behind, and removal.

use ferry_api::Reason;
use ferry_kube::create::{Created, create_if_absent};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::Step;
use crate::error::{Failure, Result};
use crate::{build, children};

/// Whether a claim named `name` is still there from an earlier DataVolume of this migration (being collected):
/// a new DataVolume must wait, or it would take that claim for its own. A claim that is not this migration's
/// is a person's to remove.
pub async fn earlier_claim_left(step: &Step<'_>, ns: &str, name: &str) -> Result<bool> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(step.ctx.client.clone(), ns);
    let Some(claim) = claims.get_opt(name).await? else {
        return Ok(false);
    };
    if claim.metadata.deletion_timestamp.is_none()
        && claim.labels().get(children::UID_LABEL) != Some(&children::uid(step.vmm))
    {
        return Err(Failure::fixable(
            Reason::PersistentVolumeClaimExists,
            format!(
                "PersistentVolumeClaim {ns}/{name} exists and is not this migration's; delete it"
            ),
        ));
    }
    Ok(true)
}

/// Deletes `dv`, one of ours just read, unless it has been replaced since.
pub async fn delete_dv(dvs: &Api<DynamicObject>, dv: &DynamicObject) -> Result<()> {
    let uid = dv.metadata.uid.as_deref().unwrap_or_default();
    Ok(ferry_kube::delete::delete_exactly(dvs, &dv.name_any(), uid).await?)
}

/// The ConfigMap with the staging CA bundle that CDI's importer trusts, there before any DataVolume names it, and
/// brought up to date if the bundle changed. Nothing without a bundle.
pub async fn ensure_staging_ca(step: &Step<'_>, ns: &str) -> Result<()> {
    let Some(wanted) = build::datavolume::staging_ca(step.vmm) else {
        return Ok(());
    };
    let maps = Api::<ConfigMap>::namespaced(step.ctx.client.clone(), ns);
    if create_if_absent(&maps, &wanted).await? == Created::Now {
        return Ok(());
    }
    let name = wanted.name_any();
    let found = maps.get_opt(&name).await?;
    match children::refuse_unless_ours(found, step.vmm, "ConfigMap", Reason::ConfigMapExists)? {
        Some(found) if found.data != wanted.data => {
            let patch = serde_json::json!({"data": wanted.data});
            maps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(())
        }
        Some(_) => Ok(()),
        None => Err(Failure::transient(
            Reason::NotFound,
            format!("ConfigMap {ns}/{name} went away as it was created; creating it again"),
        )),
    }
}
