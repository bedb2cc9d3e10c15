//! What the checkpoints that create DataVolumes share: a claim of the DataVolume's name left behind, and removal.

use ferry_api::Reason;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

use super::Step;
use crate::children;
use crate::error::{Failure, Result};

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
