//! The lab's drivers and first-boot tool as a user provides them: claims in the migration's namespace, each bound
//! to a read-only hostPath volume on the fixtures' directory (a container mounts the directory itself, so the
//! Job's uid reads it wherever the cache is), and the spec of an adapted Windows migration naming them.

use std::path::Path;

use anyhow::Result;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::phony::PhonyFixtures;

/// The claims [`create_claims`] makes.
pub const DRIVERS_CLAIM: &str = "virtio-win";
/// Windows Server 2019's drivers only: another version's, for a Windows Server 2022 guest.
pub const DRIVERS_2K19_CLAIM: &str = "virtio-win-2k19";
pub const FIRST_BOOT_TOOL_CLAIM: &str = "virt-tools";

/// Creates the three claims in `ns` and their volumes; returns the volumes' names, for [`delete_volumes`].
pub async fn create_claims(
    client: &Client,
    ns: &str,
    fixtures: &PhonyFixtures,
) -> Result<Vec<String>> {
    let mut volumes = vec![];
    for (claim, dir) in [
        (DRIVERS_CLAIM, &fixtures.virtio_win),
        (DRIVERS_2K19_CLAIM, &fixtures.virtio_win_2k19_only),
        (FIRST_BOOT_TOOL_CLAIM, &fixtures.first_boot_tool),
    ] {
        volumes.push(files_claim(client, ns, claim, dir).await?);
    }
    Ok(volumes)
}

/// Deletes volumes [`create_claims`] made (their claims go with the namespace, or stay Lost).
pub async fn delete_volumes(client: &Client, volumes: &[String]) {
    let api = Api::<PersistentVolume>::all(client.clone());
    for volume in volumes {
        let _ = api.delete(volume, &DeleteParams::default()).await;
    }
}

async fn files_claim(client: &Client, ns: &str, claim: &str, dir: &Path) -> Result<String> {
    let volume = format!("{ns}-{claim}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": volume, "labels": {"lab.ferry.dev/windows-fixtures": "true"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "hostPath": {"path": dir.display().to_string(), "type": "Directory"},
                 "claimRef": {"namespace": ns, "name": claim}}}))?;
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let existing = pvs.get_opt(&volume).await?;
    let released = |pv: &PersistentVolume| {
        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
    };
    if existing.as_ref().is_some_and(released) {
        // A previous namespace's claim is gone: the volume stays bound to it until it is made again.
        pvs.delete(&volume, &DeleteParams::default()).await?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while pvs.get_opt(&volume).await?.is_some() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "PersistentVolume {volume} is still being deleted after a minute"
            );
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    if existing.is_none() || existing.as_ref().is_some_and(released) {
        pvs.create(&PostParams::default(), &pv).await?;
    }
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": volume,
                 "resources": {"requests": {"storage": "1Gi"}}}}))?;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    if pvcs.get_opt(claim).await?.is_none() {
        pvcs.create(&PostParams::default(), &pvc).await?;
    }
    Ok(volume)
}

/// What an adapted Windows migration adds to the lab's migration spec: the drivers from `drivers_claim` and,
/// with `tool`, the first-boot tool; and a guest check that settles for a running VM, since a phony guest never
/// boots and no agent answers.
pub fn adapted_spec(drivers_claim: &str, tool: bool) -> Value {
    let mut spec = json!({
        "conversion": {"guestAdaptation": "VirtV2v", "preserveStaticIPs": true,
                       "virtioWin": {"persistentVolumeClaim": drivers_claim, "path": "virtio-win.iso"}},
        "guestCheck": {"agent": "Optional", "settleSeconds": 5, "timeoutSeconds": 600},
    });
    if tool {
        spec["conversion"]["firstBootTool"] =
            json!({"persistentVolumeClaim": FIRST_BOOT_TOOL_CLAIM});
    }
    spec
}
