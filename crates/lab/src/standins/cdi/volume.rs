//! The stand-in's volumes, as CDI makes them: a claim sized as CDI renders `spec.storage` (the file system's
//! overhead on top), its PV (a directory, or a Block volume's file), whether CDI waits for the claim's first
//! consumer or fills it with populators, and the blank image CDI's importer leaves.

use std::path::Path;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::{Error, SELECTED_NODE, STORAGE_CLASS, dv_resource};

/// CDI's request to bind a DataVolume's claim now, without waiting for a consumer (Forklift's imports set it).
const BIND_IMMEDIATE: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
/// CDI's default `filesystemOverhead.global`: the share of a Filesystem volume its file system takes.
pub(super) const FILESYSTEM_OVERHEAD: f64 = 0.06;
/// CDI aligns image sizes to this.
pub(super) const ALIGN: u64 = 1 << 20;
/// Where a Block volume's device lives in its directory.
pub(super) const BLOCK_FILE: &str = "block";
/// CDI's importer pods run as user 107 (qemu, as virt-launcher) in group 0 (they set no group): what they write
/// is theirs, and a workload that shares the volume writes it as 107 too (Ferry's Jobs do).
const IMPORTER_ID: u32 = 107;

/// Owns `path` as CDI's importer would have written it. Only root can give files away: a lab run by another user
/// (the node agent runs pods as that user) leaves them as they are.
pub(super) fn as_importer(path: &Path) -> std::io::Result<()> {
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(path, Some(IMPORTER_ID), Some(0))?;
    }
    Ok(())
}

#[derive(Debug, PartialEq)]
pub(super) enum Volume {
    Bound,
    Pending,
    /// A WaitForFirstConsumer claim no pod has used yet.
    AwaitingConsumer(Populators),
    /// Bound on CDI's legacy path, and a pod that has not ended uses it: the importer waits.
    InUse,
    /// A blank volume populated before its claim bound.
    Populated,
}

/// Whether CDI fills a WaitForFirstConsumer claim with volume populators (its class's provisioner has a
/// `CSIDriver`) or takes its legacy path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Populators {
    Used,
    NotUsed,
}

/// The StorageClass a DataVolume asks for (the lab's default if none), whether its claim waits for a first
/// consumer (the class binds on first use and the DataVolume did not ask for immediate binding), and whether CDI
/// would fill it with populators.
pub(super) async fn storage_class(
    client: &Client,
    dv: &DynamicObject,
) -> Result<(String, bool, Populators), Error> {
    let spec = &dv.data["spec"];
    let class = spec["storage"]["storageClassName"]
        .as_str()
        .or(spec["pvc"]["storageClassName"].as_str())
        .unwrap_or(STORAGE_CLASS)
        .to_string();
    let found = Api::<StorageClass>::all(client.clone())
        .get_opt(&class)
        .await?;
    let mode = found.as_ref().and_then(|c| c.volume_binding_mode.clone());
    let immediate = dv.annotations().get(BIND_IMMEDIATE).map(String::as_str) == Some("true");
    let csi_driver = match &found {
        Some(class) => Api::<CSIDriver>::all(client.clone())
            .get_opt(&class.provisioner)
            .await?
            .is_some(),
        None => false,
    };
    Ok((
        class,
        mode.as_deref() == Some("WaitForFirstConsumer") && !immediate,
        if csi_driver {
            Populators::Used
        } else {
            Populators::NotUsed
        },
    ))
}

/// The PVC `<dv>` (owned by the DataVolume) and a hostPath PV pre-bound to it; on a WaitForFirstConsumer class,
/// the PV only once the scheduler picked a node for the claim's first consumer.
pub(super) async fn ensure_volume(
    client: &Client,
    dv: &DynamicObject,
    dir: &Path,
) -> Result<Volume, Error> {
    let ns = dv.namespace().unwrap_or_default();
    let name = dv.name_any();
    let (class, wait_for_consumer, populators) = storage_class(client, dv).await?;
    std::fs::create_dir_all(dir)
        .and_then(|()| as_importer(dir))
        .map_err(|e| Error::Volume(format!("{}: {e}", dir.display())))?;
    let (size, block) = claim_size(dv);
    let size = size.to_string();
    let volume_mode = if block { "Block" } else { "Filesystem" };
    // A Block volume is a file the node binds as the device; a Filesystem one a directory.
    let host_path = if block {
        let device = dir.join(BLOCK_FILE);
        if !device.exists() {
            stale_device(&device, claim_size(dv).0)
                .and_then(|()| as_importer(&device))
                .map_err(|e| Error::Volume(format!("{}: {e}", device.display())))?;
        }
        device
    } else {
        dir.to_path_buf()
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pv_name = format!(
        "lab-{}-{}",
        ns,
        dir.file_name().unwrap_or_default().to_string_lossy()
    );
    let owner = dv
        .controller_owner_ref(&dv_resource())
        .expect("a stored DataVolume has a uid");
    let mut claim = json!({
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner], "labels": dv.labels()},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "volumeMode": volume_mode,
                 "resources": {"requests": {"storage": size}}},
    });
    if !wait_for_consumer {
        claim["spec"]["volumeName"] = json!(pv_name);
    }
    let claim: PersistentVolumeClaim =
        serde_json::from_value(claim).map_err(|e| Error::Volume(e.to_string()))?;
    let existing = claims.get_opt(&name).await?;
    if existing.is_none() {
        claims.create(&PostParams::default(), &claim).await?;
    }
    // A claim of that name owned by an earlier DataVolume is not this one's: wait until it is gone, as CDI does.
    let owned_here = existing.as_ref().is_none_or(|c| {
        c.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == dv.metadata.uid.as_ref())
    });
    if !owned_here {
        return Ok(Volume::Pending);
    }
    let selected_node = existing
        .as_ref()
        .and_then(|c| c.annotations().get(SELECTED_NODE).cloned());
    if wait_for_consumer && selected_node.is_none() {
        return Ok(Volume::AwaitingConsumer(populators));
    }
    let populated_first = wait_for_consumer
        && populators == Populators::Used
        && dv.data["spec"]["source"]["blank"].is_object();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    if pvs.get_opt(&pv_name).await?.is_none() {
        if populated_first {
            // A populator fills the volume before the claim binds: its consumer never sees it unpopulated.
            create_blank(dv, dir).map_err(|e| Error::Volume(format!("{e:#}")))?;
        }
        let mut pv = json!({
            "metadata": {"name": pv_name, "labels": {"lab.ferry.dev/datavolume-uid": dv.uid()}},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                     "volumeMode": volume_mode, "persistentVolumeReclaimPolicy": "Delete",
                     "hostPath": {"path": host_path.display().to_string()},
                     "claimRef": {"namespace": ns, "name": name}},
        });
        if let Some(node) = selected_node {
            // Local storage: the volume lives on the node its first consumer was scheduled to.
            pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}});
        }
        let pv: PersistentVolume =
            serde_json::from_value(pv).map_err(|e| Error::Volume(e.to_string()))?;
        pvs.create(&PostParams::default(), &pv).await?;
    }
    let bound = existing.and_then(|c| c.status).and_then(|s| s.phase);
    if bound.as_deref() != Some("Bound") {
        // CDI says it waits for the first consumer until the claim binds, not only until a node is picked.
        return Ok(match wait_for_consumer {
            true => Volume::AwaitingConsumer(populators),
            false => Volume::Pending,
        });
    }
    if populated_first {
        return Ok(Volume::Populated);
    }
    if wait_for_consumer && claim_in_use(client, &ns, &name).await? {
        return Ok(Volume::InUse);
    }
    Ok(Volume::Bound)
}

/// Whether a pod that has not ended uses claim `name`, as CDI's `GetPodsUsingPVCs` counts them.
async fn claim_in_use(client: &Client, ns: &str, name: &str) -> Result<bool, Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await?;
    Ok(pods.items.iter().any(|pod| {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        !matches!(phase, Some("Succeeded" | "Failed"))
            && pod
                .spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == name)
                })
    }))
}

/// The claim's size as CDI renders it, and whether it is a Block volume. `spec.storage` on a Filesystem volume
/// gets the file system's overhead on top (`GetRequiredSpace`); `spec.pvc` is taken as written.
pub(super) fn claim_size(dv: &DynamicObject) -> (u64, bool) {
    let storage = &dv.data["spec"]["storage"];
    let pvc = &dv.data["spec"]["pvc"];
    let spec = if storage.is_object() { storage } else { pvc };
    let block = spec["volumeMode"].as_str() == Some("Block");
    let asked = spec["resources"]["requests"]["storage"]
        .as_str()
        .and_then(parse_quantity)
        .unwrap_or(1 << 30);
    if block || !storage.is_object() {
        return (asked, block);
    }
    let aligned = asked.next_multiple_of(ALIGN);
    (
        (aligned as f64 * (1.0 + FILESYSTEM_OVERHEAD)).ceil() as u64,
        false,
    )
}

/// CDI's scratch claim's size for a volume of `claim` bytes (`createScratchPersistentVolumeClaim`): the usable
/// space with the file system's overhead on top, rounded up to whole MiB.
pub(super) fn scratch_size(claim: u64) -> u64 {
    let usable = usable_space(claim);
    ((usable as f64 * (1.0 + FILESYSTEM_OVERHEAD)).ceil() as u64).next_multiple_of(ALIGN)
}

/// What CDI's importer makes a blank image's size on a Filesystem volume of `available` bytes
/// (`GetUsableSpace`): the claim's size without the overhead [`claim_size`] added, rounded down to whole MiB.
pub(super) fn usable_space(available: u64) -> u64 {
    let usable = (available as f64 / (1.0 + FILESYSTEM_OVERHEAD)).ceil() as u64;
    usable / ALIGN * ALIGN
}

/// Bytes of a Kubernetes quantity in the forms DataVolumes use: plain bytes or a binary/decimal suffix.
pub(crate) fn parse_quantity(text: &str) -> Option<u64> {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<u64>().ok()?.checked_mul(factor);
        }
    }
    text.parse().ok()
}

/// A Block volume's device: `size` bytes, not zeroed (CDI leaves a blank Block volume as the storage gives it),
/// with stale bytes at its start, middle and end.
pub(crate) fn stale_device(path: &Path, size: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::create(path)?;
    file.set_len(size)?;
    for at in [0, size / 2, size.saturating_sub(4096)] {
        file.write_all_at(&[0xA5; 4096], at.min(size.saturating_sub(4096)))?;
    }
    file.sync_all()
}

/// CDI's importer for a `blank` source: on a Filesystem volume a sparse `disk.img` of the usable size, mode 0660
/// and synced; on a Block volume nothing.
pub(super) fn create_blank(dv: &DynamicObject, dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (size, block) = claim_size(dv);
    if block {
        return Ok(());
    }
    let image = dir.join("disk.img");
    if let Ok(found) = std::fs::metadata(&image)
        && found.blocks() > 0
    {
        // `qemu-img create` truncates what is there, as CDI's importer runs it.
        tracing::info!(dv = %dv.name_any(), "blank import over a written disk.img ({} bytes): made anew", found.len());
    }
    let file = std::fs::File::create(&image)?;
    file.set_len(usable_space(size))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o660))?;
    file.sync_all()?;
    as_importer(&image)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_are_sized_as_cdi_sizes_them() {
        let dv = |spec: serde_json::Value| -> DynamicObject {
            serde_json::from_value(
                json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "d"}, "spec": spec}),
            )
            .unwrap()
        };
        let storage = |mode: &str, size: &str| {
            dv(
                json!({"source": {"blank": {}}, "storage": {"volumeMode": mode,
                "resources": {"requests": {"storage": size}}}}),
            )
        };
        // 1 GiB on a file system: 6 % overhead on top, and the image gets back exactly what was asked. Both
        // figures are real CDI v1.65.0's for a blank 1Gi DataVolume (its claim, and the disk.img its importer made).
        let (claim, block) = claim_size(&storage("Filesystem", "1073741824"));
        assert!(!block);
        assert_eq!(claim, 1_138_166_334);
        assert_eq!(usable_space(claim), 1 << 30);
        // Not whole MiB: aligned up first.
        let (claim, _) = claim_size(&storage("Filesystem", "1048577"));
        assert_eq!(usable_space(claim), 2 << 20);
        assert_eq!(claim_size(&storage("Block", "1Gi")), (1 << 30, true));
        let pvc = dv(json!({"pvc": {"resources": {"requests": {"storage": "10Mi"}}}}));
        assert_eq!(
            claim_size(&pvc),
            (10 << 20, false),
            "spec.pvc is taken as written"
        );
    }
}
