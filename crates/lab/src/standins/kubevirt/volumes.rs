//! What KubeVirt v1.9.0 says of a VMI's volumes: virt-controller's `DataVolumesReady` (from each DataVolume's own
//! `Ready`, `aggregateDataVolumesConditions`) and virt-handler's `LiveMigratable` (False while any claim is not
//! ReadWriteMany, `checkVolumesForMigration`) and `StorageLiveMigratable`, which no volume makes False. The
//! lab's pod-network checks of both are not modelled: Ferry puts only masquerade on the pod network.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::DynamicObject;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use ferry_api::foreign::dv_resource;

/// A condition's status, reason and message.
pub type Said = (&'static str, &'static str, String);

/// The VMI's volumes as KubeVirt judges them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeFacts {
    /// Each DataVolume volume's `Ready` status, in the spec's order (`Unknown` while it has none or is missing).
    pub data_volumes: Vec<String>,
    /// The first claim, in the spec's order, that is not shared (ReadWriteMany), or whose access is unknown.
    pub not_shared: Option<Unshared>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Unshared {
    Claim(String),
    Unknown(String),
}

/// The claims of `vmi`'s volumes, and what CDI and the claims say of them.
pub async fn observe(client: &Client, vmi: &DynamicObject) -> kube::Result<VolumeFacts> {
    let ns = vmi.namespace().unwrap_or_default();
    let dvs = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &dv_resource());
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    let mut facts = VolumeFacts::default();
    for volume in vmi.data["spec"]["volumes"].as_array().into_iter().flatten() {
        let (claim, data_volume) = match (
            volume["dataVolume"]["name"].as_str(),
            volume["persistentVolumeClaim"]["claimName"].as_str(),
        ) {
            (Some(dv), _) => (dv, true),
            (None, Some(claim)) => (claim, false),
            _ => continue,
        };
        if data_volume {
            let ready = dvs
                .get_opt(claim)
                .await?
                .and_then(|dv| ready_status(&dv.data));
            facts
                .data_volumes
                .push(ready.unwrap_or_else(|| "Unknown".into()));
        }
        if facts.not_shared.is_none() {
            let modes = pvcs.get_opt(claim).await?.map(|pvc| {
                let status = pvc.status.and_then(|s| s.access_modes);
                status
                    .or(pvc.spec.and_then(|s| s.access_modes))
                    .unwrap_or_default()
            });
            facts.not_shared = match modes {
                None => Some(Unshared::Unknown(claim.to_string())),
                Some(modes) if !modes.iter().any(|m| m == "ReadWriteMany") => {
                    Some(Unshared::Claim(claim.to_string()))
                }
                Some(_) => None,
            };
        }
    }
    Ok(facts)
}

fn ready_status(dv: &Value) -> Option<String> {
    dv["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
        .map(String::from)
}

/// `DataVolumesReady`, for a VMI with DataVolumes: True only when each is Ready, False when any is not, else
/// Unknown.
pub fn data_volumes_ready(facts: &VolumeFacts) -> Option<Said> {
    if facts.data_volumes.is_empty() {
        return None;
    }
    let all_ready = facts.data_volumes.iter().all(|s| s == "True");
    if all_ready {
        return Some((
            "True",
            "AllDVsReady",
            "All of the VMI's DVs are bound and ready".into(),
        ));
    }
    let status = if facts.data_volumes.iter().any(|s| s == "False") {
        "False"
    } else {
        "Unknown"
    };
    Some((
        status,
        "NotAllDVsReady",
        "Not all of the VMI's DVs are ready".into(),
    ))
}

/// `LiveMigratable`, as virt-handler words it.
pub fn live_migratable(facts: &VolumeFacts) -> Said {
    const SHARED: &str =
        "live migration requires that all PVCs must be shared (using ReadWriteMany access mode)";
    match &facts.not_shared {
        None => ("True", "", String::new()),
        Some(Unshared::Claim(claim)) => (
            "False",
            "DisksNotLiveMigratable",
            format!("cannot migrate VMI: PVC {claim} is not shared, {SHARED}"),
        ),
        Some(Unshared::Unknown(claim)) => (
            "False",
            "DisksNotLiveMigratable",
            format!("cannot migrate VMI: Unable to determine if PVC {claim} is shared, {SHARED}"),
        ),
    }
}

/// `StorageLiveMigratable`: a claim that is not shared does not stop a storage migration.
pub fn storage_live_migratable() -> Said {
    ("True", "", String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claim_not_shared_makes_the_vmi_not_live_migratable_in_kubevirts_words() {
        let facts = VolumeFacts {
            data_volumes: vec!["True".into(), "True".into()],
            not_shared: Some(Unshared::Claim("web-disk-0".into())),
        };
        assert_eq!(
            data_volumes_ready(&facts).unwrap().1,
            "AllDVsReady",
            "both DataVolumes are Ready"
        );
        assert_eq!(
            live_migratable(&facts),
            (
                "False",
                "DisksNotLiveMigratable",
                "cannot migrate VMI: PVC web-disk-0 is not shared, live migration requires that all PVCs must be \
                 shared (using ReadWriteMany access mode)"
                    .into()
            )
        );
        let waiting = VolumeFacts {
            data_volumes: vec!["True".into(), "Unknown".into()],
            not_shared: None,
        };
        assert_eq!(
            data_volumes_ready(&waiting),
            Some((
                "Unknown",
                "NotAllDVsReady",
                "Not all of the VMI's DVs are ready".into()
            ))
        );
        assert_eq!(live_migratable(&waiting).0, "True");
        assert_eq!(data_volumes_ready(&VolumeFacts::default()), None);
    }
}
