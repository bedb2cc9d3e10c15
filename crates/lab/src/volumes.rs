//! Where a claim's bytes are on this machine: every volume of the lab (stand-in CDI's, or the real node's
//! provisioner's) is a hostPath PV.

use std::path::PathBuf;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::{Api, Client};

/// The image claim `pvc` holds: `disk.img` in a Filesystem volume's directory (CDI's layout), or a Block
/// volume's file.
pub async fn volume_image(client: &Client, ns: &str, pvc: &str) -> Result<PathBuf> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get(pvc)
        .await
        .with_context(|| format!("PersistentVolumeClaim {ns}/{pvc}"))?;
    let pv_name = claim
        .spec
        .and_then(|s| s.volume_name)
        .with_context(|| format!("PersistentVolumeClaim {ns}/{pvc} is not bound"))?;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await?;
    let path = PathBuf::from(
        pv.spec
            .and_then(|s| s.host_path)
            .with_context(|| format!("PersistentVolume {pv_name} is not a hostPath volume"))?
            .path,
    );
    Ok(if path.is_dir() {
        path.join("disk.img")
    } else {
        path
    })
}
