//! The lab's volume provisioner, for a node that runs real CDI: every claim of the lab's StorageClasses gets a
//! hostPath PV in a directory of its own, as an external provisioner answers claims (those CDI makes for itself,
//! scratch space and populators' prime claims, included). On a WaitForFirstConsumer class it provisions only once
//! the scheduler named the node of the claim's first consumer, and the PV keeps to that node. A volume released by
//! its claim is deleted with its directory (the classes' reclaim policy). A Block claim gets a file of its size
//! with stale bytes in it (a recycled device is not zeroed), attached as a loop device that a `local` PV names,
//! kept to the node as local PVs must be; the device is detached when the volume is deleted.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::cdi::{CSI_PROVISIONER, Error, PROVISIONER, SELECTED_NODE};

/// Marks what this provisioner made, as external provisioners do.
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Labels this provisioner's PVs with the directory's name under `volumes`.
const DIRECTORY_LABEL: &str = "lab.ferry.dev/volume-dir";

struct Provisioner {
    client: Client,
    volumes: PathBuf,
}

pub async fn run(
    client: Client,
    state_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let volumes = state_dir.join("volumes");
    std::fs::create_dir_all(&volumes)?;
    let ctx = Arc::new(Provisioner {
        client: client.clone(),
        volumes: volumes.canonicalize()?,
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stopped| *stopped).await;
    };
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    );
    let provisioned = Controller::new(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default().labels(DIRECTORY_LABEL),
    );
    futures::future::join(
        super::run_controller(
            "provisioner",
            claims,
            until_stopped(stopped.clone()),
            reconcile_claim,
            ctx.clone(),
        ),
        super::run_controller(
            "provisioner",
            provisioned,
            until_stopped(stopped),
            reconcile_volume,
            ctx,
        ),
    )
    .await;
    Ok(())
}

/// What a claim needs of this provisioner.
#[derive(Debug, PartialEq)]
enum Decision {
    /// Not this provisioner's, bound, or being deleted.
    None,
    /// Its class waits for the first consumer, and no pod using it has been scheduled yet.
    AwaitConsumer,
    /// A PV for it, on `node` if the class waits for the first consumer; a device if it is a Block claim.
    Provision { node: Option<String>, block: bool },
}

fn decide(claim: &PersistentVolumeClaim, class: Option<&StorageClass>) -> Decision {
    let spec = claim.spec.clone().unwrap_or_default();
    let ours =
        class.is_some_and(|c| c.provisioner == PROVISIONER || c.provisioner == CSI_PROVISIONER);
    if !ours || claim.metadata.deletion_timestamp.is_some() || spec.volume_name.is_some() {
        return Decision::None;
    }
    let block = spec.volume_mode.as_deref() == Some("Block");
    let waits =
        class.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer");
    let node = claim.annotations().get(SELECTED_NODE).cloned();
    match (waits, node) {
        (true, None) => Decision::AwaitConsumer,
        (true, node) => Decision::Provision { node, block },
        (false, _) => Decision::Provision { node: None, block },
    }
}

/// The PV for `claim` in directory `dir` (or on `device`, a Block claim's), named after the claim's uid, bound to
/// it and sized as it asks.
fn volume_for(
    claim: &PersistentVolumeClaim,
    class: &str,
    dir: &Path,
    device: Option<&Path>,
    node: Option<&str>,
) -> Value {
    let spec = claim.spec.clone().unwrap_or_default();
    let uid = claim.uid().unwrap_or_default();
    let size = spec
        .resources
        .and_then(|r| r.requests)
        .and_then(|r| r.get("storage").cloned());
    let mut pv = json!({
        "metadata": {"name": format!("lab-{uid}"),
            "labels": {DIRECTORY_LABEL: dir.file_name().unwrap_or_default().to_string_lossy()},
            "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {"capacity": {"storage": size}, "accessModes": spec.access_modes, "storageClassName": class,
            "volumeMode": "Filesystem", "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": dir.display().to_string()},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": claim.namespace(), "name": claim.name_any(), "uid": uid}},
    });
    if let Some(device) = device {
        pv["spec"]["volumeMode"] = json!("Block");
        pv["spec"]["local"] = json!({"path": device.display().to_string()});
        pv["spec"]
            .as_object_mut()
            .map(|spec| spec.remove("hostPath"));
    }
    if let Some(node) = node {
        pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}});
    }
    pv
}

async fn reconcile_claim(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Provisioner>,
) -> Result<Action, Error> {
    let class_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    let class = if class_name.is_empty() {
        None
    } else {
        Api::<StorageClass>::all(ctx.client.clone())
            .get_opt(&class_name)
            .await?
    };
    let (node, block) = match decide(&claim, class.as_ref()) {
        Decision::None | Decision::AwaitConsumer => return Ok(Action::await_change()),
        Decision::Provision { node, block } => (node, block),
    };
    let uid = claim.uid().unwrap_or_default();
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if pvs.get_opt(&format!("lab-{uid}")).await?.is_some() {
        return Ok(Action::await_change());
    }
    let dir = ctx.volumes.join(format!(
        "{}-{}-{}",
        claim.namespace().unwrap_or_default(),
        claim.name_any(),
        &uid[..uid.len().min(8)]
    ));
    // Writable by any pod's user: the kubelet applies no fsGroup to a hostPath volume (CDI's importer runs as 107).
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)))
        .map_err(|e| Error::Volume(format!("{}: {e}", dir.display())))?;
    let (device, node) = match block {
        true => {
            let device = block_device(&claim, &dir)?;
            // A local PV must name its node: the one the scheduler picked, or the cluster's only one.
            let node = match node {
                Some(node) => node,
                None => only_node(&ctx.client).await?,
            };
            (Some(device), Some(node))
        }
        false => (None, node),
    };
    let pv: PersistentVolume = serde_json::from_value(volume_for(
        &claim,
        &class_name,
        &dir,
        device.as_deref(),
        node.as_deref(),
    ))
    .map_err(|e| Error::Volume(e.to_string()))?;
    pvs.create(&PostParams::default(), &pv).await?;
    tracing::info!(claim = %claim.name_any(), pv = %pv.name_any(), "provisioned");
    Ok(Action::await_change())
}

/// A Block claim's device: a file of the claim's size in `dir`, with stale bytes, on a loop device.
fn block_device(claim: &PersistentVolumeClaim, dir: &Path) -> Result<PathBuf, Error> {
    let asked = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| super::cdi::parse_quantity(&q.0))
        .ok_or_else(|| Error::Volume(format!("claim {} asks for no size", claim.name_any())))?;
    let file = dir.join(BLOCK_FILE);
    if !file.exists() {
        super::cdi::stale_device(&file, asked)
            .map_err(|e| Error::Volume(format!("{}: {e}", file.display())))?;
    }
    crate::real_node::loops::attach(&file).map_err(|e| Error::Volume(format!("{e:#}")))
}

/// The file behind a Block volume's loop device, in the volume's directory.
const BLOCK_FILE: &str = "device";

async fn only_node(client: &Client) -> Result<String, Error> {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&Default::default())
        .await?;
    match nodes.items.as_slice() {
        [node] => Ok(node.name_any()),
        nodes => Err(Error::Volume(format!(
            "a Block volume needs its node, and there are {} nodes",
            nodes.len()
        ))),
    }
}

/// Deletes a released volume, its device and its directory.
async fn reconcile_volume(
    pv: Arc<PersistentVolume>,
    ctx: Arc<Provisioner>,
) -> Result<Action, Error> {
    let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    if !released || pv.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(dir) = pv
        .labels()
        .get(DIRECTORY_LABEL)
        .filter(|d| !d.contains('/') && !d.is_empty())
    {
        let dir = ctx.volumes.join(dir);
        if let Some(device) = pv.spec.as_ref().and_then(|s| s.local.as_ref()) {
            crate::real_node::loops::detach_if_under(Path::new(&device.path), &dir)
                .map_err(|e| Error::Volume(format!("{e:#}")))?;
        }
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(Error::Volume(format!("{}: {e}", dir.display())));
        }
    }
    Api::<PersistentVolume>::all(ctx.client.clone())
        .delete(&pv.name_any(), &DeleteParams::default())
        .await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(provisioner: &str, mode: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": "c"}, "provisioner": provisioner,
            "volumeBindingMode": mode}),
        )
        .unwrap()
    }

    fn claim(extra: Value) -> PersistentVolumeClaim {
        let mut claim = json!({"metadata": {"name": "disk", "namespace": "team", "uid": "0123456789abcdef"},
            "spec": {"storageClassName": "c", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1123Mi"}}}});
        for (key, value) in extra.as_object().unwrap() {
            claim[key]
                .as_object_mut()
                .unwrap()
                .extend(value.as_object().unwrap().clone());
        }
        serde_json::from_value(claim).unwrap()
    }

    #[test]
    fn an_immediate_claim_is_provisioned_at_once_and_a_waiting_one_on_its_consumers_node() {
        let immediate = class(PROVISIONER, "Immediate");
        let waiting = class(PROVISIONER, "WaitForFirstConsumer");
        assert_eq!(
            decide(&claim(json!({})), Some(&immediate)),
            Decision::Provision {
                node: None,
                block: false
            }
        );
        assert_eq!(
            decide(&claim(json!({})), Some(&waiting)),
            Decision::AwaitConsumer
        );
        let scheduled = claim(json!({"metadata": {"annotations": {SELECTED_NODE: "lab-node"}}}));
        assert_eq!(
            decide(&scheduled, Some(&waiting)),
            Decision::Provision {
                node: Some("lab-node".into()),
                block: false
            }
        );
        let csi = class(CSI_PROVISIONER, "WaitForFirstConsumer");
        assert_eq!(
            decide(&scheduled, Some(&csi)),
            Decision::Provision {
                node: Some("lab-node".into()),
                block: false
            }
        );
    }

    #[test]
    fn claims_of_other_provisioners_or_bound_are_not_provisioned_and_block_ones_get_a_device() {
        let ours = class(PROVISIONER, "Immediate");
        assert_eq!(
            decide(&claim(json!({})), Some(&class("other.io/x", "Immediate"))),
            Decision::None
        );
        assert_eq!(decide(&claim(json!({})), None), Decision::None);
        assert_eq!(
            decide(&claim(json!({"spec": {"volumeName": "pv"}})), Some(&ours)),
            Decision::None
        );
        assert_eq!(
            decide(
                &claim(json!({"spec": {"volumeMode": "Block"}})),
                Some(&ours)
            ),
            Decision::Provision {
                node: None,
                block: true
            }
        );
    }

    #[test]
    fn the_volume_is_bound_to_the_claim_sized_as_asked_and_kept_to_the_node() {
        let pv = volume_for(
            &claim(json!({})),
            "c",
            Path::new("/v/team-disk-01234567"),
            None,
            Some("lab-node"),
        );
        assert_eq!(pv["metadata"]["name"], "lab-0123456789abcdef");
        assert_eq!(
            pv["metadata"]["labels"][DIRECTORY_LABEL],
            "team-disk-01234567"
        );
        assert_eq!(pv["spec"]["capacity"]["storage"], "1123Mi");
        assert_eq!(pv["spec"]["claimRef"]["uid"], "0123456789abcdef");
        assert_eq!(pv["spec"]["claimRef"]["name"], "disk");
        assert_eq!(pv["spec"]["hostPath"]["path"], "/v/team-disk-01234567");
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
                [0],
            "lab-node"
        );
        let pv: PersistentVolume = serde_json::from_value(pv).unwrap();
        assert_eq!(pv.spec.unwrap().access_modes.unwrap(), ["ReadWriteOnce"]);
        let block = volume_for(
            &claim(json!({})),
            "c",
            Path::new("/v/d"),
            Some(Path::new("/dev/loop7")),
            Some("lab-node"),
        );
        assert_eq!(block["spec"]["volumeMode"], "Block");
        assert_eq!(block["spec"]["local"]["path"], "/dev/loop7");
        assert!(block["spec"].get("hostPath").is_none());
    }
}
