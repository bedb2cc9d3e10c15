//! The CDI stand-in: each DataVolume gets a PVC and a hostPath PV that the real binder binds, then its `http` or
//! `s3` source is really downloaded, converted to a raw `disk.img` of the volume's usable size as CDI's importer
//! does (a qcow2 one through a scratch claim), and reported through the phases, conditions and `progress` CDI
//! uses ([`report`]). A `blank` source gets what CDI's importer leaves: a sparse `disk.img` of the usable size on
//! a Filesystem volume, and on a Block volume nothing at all (the lab's device is a file, with a few stale blocks,
//! as a recycled device may have). An importer that fails is restarted without end, as CDI's pod is. The
//! annotation `lab.ferry.dev/fault: fail|stall`, or the namespace's fault switch (`faults`), injects failures.
//! `crates/cli/tests/cdi_conformance` holds all this to what real CDI v1.65.0 does.
//!
//! On a WaitForFirstConsumer class it takes the path CDI v1.65.0 takes. With a `CSIDriver` named like the class's
//! provisioner, volume populators: `PendingPopulation` until a pod is scheduled, and the claim binds only once the
//! blank image is made, so that pod never sees it unpopulated. Without one (the legacy path):
//! `WaitForFirstConsumer` until a pod binds the claim, `PVCBound` while any pod that has not ended uses it, then
//! the blank importer, which makes `disk.img` anew over whatever that pod wrote.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use ferry_api::foreign::dv_resource;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

mod report;
mod source;

use report::Report;

pub const FAULT_ANNOTATION: &str = "lab.ferry.dev/fault";
pub const STORAGE_CLASS: &str = "lab-hostpath";
/// The lab's StorageClass that binds a volume only once a pod uses it, on that pod's node, as local storage does.
pub const WFFC_STORAGE_CLASS: &str = "lab-hostpath-wffc";
/// What the scheduler writes on a WaitForFirstConsumer claim once it picked a node for its first consumer.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The lab's WaitForFirstConsumer class whose provisioner has a `CSIDriver`, so CDI fills its volumes with
/// populators.
pub const POPULATED_WFFC_STORAGE_CLASS: &str = "lab-hostpath-wffc-csi";
/// The provisioner of the lab's classes, and that of [`POPULATED_WFFC_STORAGE_CLASS`] (a `CSIDriver` of its name).
pub const PROVISIONER: &str = "lab.ferry.dev/hostpath";
pub const CSI_PROVISIONER: &str = "hostpath.csi.lab.ferry.dev";
/// CDI's request to bind a DataVolume's claim now, without waiting for a consumer (Forklift's imports set it).
const BIND_IMMEDIATE: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
const MANAGER: &str = "cdi-standin";
/// CDI's default `filesystemOverhead.global`: the share of a Filesystem volume its file system takes.
const FILESYSTEM_OVERHEAD: f64 = 0.06;
/// CDI aligns image sizes to this.
const ALIGN: u64 = 1 << 20;
/// Where a Block volume's device lives in its directory.
const BLOCK_FILE: &str = "block";
/// CDI's importer pods run as user 107 (qemu, as virt-launcher) in group 0 (they set no group): what they write
/// is theirs, and a workload that shares the volume writes it as 107 too (Ferry's Jobs do).
const IMPORTER_ID: u32 = 107;

/// Owns `path` as CDI's importer would have written it. Only root can give files away: a lab run by another user
/// (the node agent runs pods as that user) leaves them as they are.
fn as_importer(path: &Path) -> std::io::Result<()> {
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(path, Some(IMPORTER_ID), Some(0))?;
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Volume(String),
}

/// What the CDI stand-in's reconciles share.
struct Cdi {
    client: Client,
    volumes: PathBuf,
    /// Imports in flight, by DataVolume uid.
    imports: super::Tasks,
    /// Importer pods running at once, as a node's pod capacity bounds CDI's; the rest stay ImportScheduled.
    importers: Arc<tokio::sync::Semaphore>,
}

pub async fn run(
    client: Client,
    namespace: Option<&str>,
    state_dir: &Path,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let volumes = state_dir.join("volumes");
    std::fs::create_dir_all(&volumes)?;
    let ctx = Arc::new(Cdi {
        client: client.clone(),
        volumes: volumes.canonicalize()?,
        imports: Mutex::default(),
        importers: Arc::new(tokio::sync::Semaphore::new(super::node::MAX_PODS)),
    });
    let dvs = super::scoped_dynamic(&client, namespace, &dv_resource());
    let claims = super::scoped::<PersistentVolumeClaim>(&client, namespace);
    let controller = Controller::new_with(dvs, watcher::Config::default(), dv_resource())
        .owns(claims, watcher::Config::default());
    super::run_controller("cdi stand-in", controller, shutdown, reconcile, ctx.clone()).await;
    super::abort_all(&ctx.imports);
    Ok(())
}

async fn reconcile(dv: Arc<DynamicObject>, ctx: Arc<Cdi>) -> Result<Action, Error> {
    if dv.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = dv.namespace().unwrap_or_default();
    let name = dv.name_any();
    let uid = dv.uid().unwrap_or_default();
    let phase = dv.data["status"]["phase"].as_str().unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") {
        return Ok(Action::await_change());
    }
    let started = ctx
        .imports
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&uid);
    let injected = dv.annotations().get(FAULT_ANNOTATION).map(String::as_str) == Some("fail")
        || (!started
            && phase != "ImportInProgress"
            && super::faults::take(
                &ctx.client,
                &ns,
                super::faults::FAIL_IMPORTS,
                &name,
                dv.labels(),
            )
            .await?);
    if injected {
        report(&ctx.client, &dv, Report::fault_injected(&name)).await?;
        return Ok(Action::await_change());
    }
    if let Some(refusal) = claim_refusal(&dv) {
        report(&ctx.client, &dv, Report::claim_not_valid(refusal)).await?;
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    let dir = ctx
        .volumes
        .join(&ns)
        .join(format!("{name}-{}", &uid[..uid.len().min(8)]));
    let waiting = match ensure_volume(&ctx.client, &dv, &dir).await? {
        Volume::AwaitingConsumer(Populators::Used) => Some(Report::pending_population(&name)),
        // CDI's legacy path (HonorWaitForFirstConsumer, as its release turns on): somebody else binds the claim.
        Volume::AwaitingConsumer(Populators::NotUsed) => {
            Some(Report::waiting_for_first_consumer(&name))
        }
        // CDI's import controller creates no importer while a pod uses the claim (ImportTargetInUse).
        Volume::InUse => Some(Report::pvc_bound(&name)),
        Volume::Pending => Some(Report::pending(&name)),
        Volume::Populated => {
            report(&ctx.client, &dv, Report::succeeded(&name)).await?;
            return Ok(Action::await_change());
        }
        Volume::Bound => None,
    };
    if let Some(waiting) = waiting {
        report(&ctx.client, &dv, waiting).await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // One import per DataVolume per stand-in run; it records its own end, so a stale read cannot restart it.
    if !started {
        if phase != "ImportInProgress" {
            report(&ctx.client, &dv, Report::import_scheduled(&name)).await?;
        }
        let (client, dv, dir) = (ctx.client.clone(), (*dv).clone(), dir.clone());
        let importers = ctx.importers.clone();
        let task = tokio::spawn(async move {
            if let Ok(_importer) = importers.acquire_owned().await {
                import(client, dv, dir).await
            }
        });
        ctx.imports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid, task);
    }
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// Why CDI cannot render the claim `spec.storage` asks for: access modes left to the class's StorageProfile,
/// which CDI fills only for provisioners it knows, and it knows none of the lab's.
fn claim_refusal(dv: &DynamicObject) -> Option<String> {
    let storage = &dv.data["spec"]["storage"];
    let modes = storage["accessModes"]
        .as_array()
        .is_some_and(|m| !m.is_empty());
    (storage.is_object() && !modes).then(|| {
        let class = storage["storageClassName"]
            .as_str()
            .unwrap_or(STORAGE_CLASS);
        format!("no accessMode specified in StorageProfile {class}")
    })
}

#[derive(Debug, PartialEq)]
enum Volume {
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
enum Populators {
    Used,
    NotUsed,
}

/// The StorageClass a DataVolume asks for (the lab's default if none), whether its claim waits for a first
/// consumer (the class binds on first use and the DataVolume did not ask for immediate binding), and whether CDI
/// would fill it with populators.
async fn storage_class(
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
async fn ensure_volume(client: &Client, dv: &DynamicObject, dir: &Path) -> Result<Volume, Error> {
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
fn claim_size(dv: &DynamicObject) -> (u64, bool) {
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

/// What CDI's importer makes a blank image's size on a Filesystem volume of `available` bytes
/// (`GetUsableSpace`): the claim's size without the overhead [`claim_size`] added, rounded down to whole MiB.
fn usable_space(available: u64) -> u64 {
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
fn create_blank(dv: &DynamicObject, dir: &Path) -> anyhow::Result<()> {
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

/// Writes `report` as the DataVolume's status, unless it already says it.
async fn report(client: &Client, dv: &DynamicObject, report: Report) -> Result<(), Error> {
    if report.is_current(dv) {
        return Ok(());
    }
    let dvs = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &dv.namespace().unwrap_or_default(),
        &dv_resource(),
    );
    let patch = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                       "status": report.status(dv)});
    dvs.patch_status(
        &dv.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Whether the lab's fault switch `switch` strikes this DataVolume's import (an unreadable switch never does).
async fn fault_for(client: &Client, dv: &DynamicObject, switch: &str) -> bool {
    let ns = dv.namespace().unwrap_or_default();
    super::faults::take(client, &ns, switch, &dv.name_any(), dv.labels())
        .await
        .unwrap_or(false)
}

/// Downloads the source into the volume and converts it to raw `disk.img`, reporting progress.
async fn import(client: Client, dv: DynamicObject, dir: PathBuf) {
    let blank = dv.data["spec"]["source"]["blank"].is_object();
    let mut killed = !blank && fault_for(&client, &dv, super::faults::KILL_IMPORTS).await;
    let mut restarts = dv.data["status"]["restartCount"].as_i64().unwrap_or(0);
    loop {
        let refused = !blank && fault_for(&client, &dv, super::faults::REFUSE_IMPORTS).await;
        let mut result = if blank {
            create_blank(&dv, &dir)
        } else {
            import_once(&client, &dv, &dir, killed, refused).await
        };
        if killed {
            // As when CDI's importer pod dies: the kubelet starts it again, and it starts over.
            tracing::info!(dv = %dv.name_any(), "importer killed by the lab's fault switch; importing again");
            (killed, restarts) = (false, restarts + 1);
            continue;
        }
        if result.is_ok() && !blank && fault_for(&client, &dv, super::faults::CORRUPT_IMPORTS).await
        {
            // Silent corruption on the way: the import still reports success; only reading it back can tell.
            tracing::info!(dv = %dv.name_any(), "corrupting the imported disk by the lab's fault switch");
            result = corrupt(&dir.join("disk.img"));
        }
        let name = dv.name_any();
        let outcome = match &result {
            // A blank Block volume is left as it is, and CDI says no more than that its importer completed.
            Ok(()) if blank && claim_size(&dv).1 => {
                report_current(&client, &dv, Report::left_as_is(&name)).await
            }
            Ok(()) => report_current(&client, &dv, Report::succeeded(&name)).await,
            Err(e) => {
                // CDI never fails the DataVolume: its importer pod restarts, backing off, for as long as it lives.
                restarts += 1;
                tracing::warn!(dv = %name, restarts, "import failed: {e:#}");
                report_current(
                    &client,
                    &dv,
                    Report::importer_failed(&name, restarts, format!("{e:#}")),
                )
                .await
            }
        };
        match outcome {
            Ok(true) if result.is_err() => {
                let backoff = Duration::from_secs(1 << (restarts.clamp(1, 5) - 1));
                tokio::time::sleep(backoff).await;
            }
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(dv = %name, "recording the import result: {e}");
                return;
            }
        }
    }
}

/// Writes `report` on the DataVolume as it is now; false if it is gone, or is another of that name.
async fn report_current(
    client: &Client,
    dv: &DynamicObject,
    status: Report,
) -> Result<bool, Error> {
    let current = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &dv.namespace().unwrap_or_default(),
        &dv_resource(),
    )
    .get_opt(&dv.name_any())
    .await?;
    match current {
        Some(current)
            if current.uid() == dv.uid() && current.metadata.deletion_timestamp.is_none() =>
        {
            report(client, &current, status).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Flips every bit of the image's first byte.
fn corrupt(image: &Path) -> anyhow::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)?;
    let mut first = [0u8; 1];
    file.read_exact(&mut first)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&[!first[0]])?;
    Ok(())
}

/// One importer's run; `killed` ends it after its first chunk, as a killed importer pod would; `refused`, it
/// presents a wrong key.
async fn import_once(
    client: &Client,
    dv: &DynamicObject,
    dir: &Path,
    killed: bool,
    refused: bool,
) -> anyhow::Result<()> {
    let name = dv.name_any();
    let (mut body, total) = source::open_source(client, dv, refused).await?;
    let first = body.next().await.transpose()?;
    // A qcow2 source over http or S3 is downloaded to scratch space first: CDI's importer exits asking for it,
    // and the controller makes the claim and starts the importer again.
    let scratch = match &first {
        Some(chunk) if chunk.starts_with(QCOW2_MAGIC) => {
            report_current(client, dv, Report::import_in_progress(&name, "N/A")).await?;
            let claim = scratch_claim(client, dv).await?;
            report_current(client, dv, Report::import_scheduled(&name)).await?;
            Some(claim)
        }
        _ => None,
    };
    let body = futures::stream::iter(first.map(Ok)).chain(body);
    let result = download(client, dv, dir, body, total, killed).await;
    if let Some(claim) = scratch {
        let claims = Api::<PersistentVolumeClaim>::namespaced(
            client.clone(),
            &dv.namespace().unwrap_or_default(),
        );
        let _ = claims.delete(&claim, &Default::default()).await;
    }
    result
}

/// The qcow2 magic: the first four bytes of a qcow2 image.
const QCOW2_MAGIC: &[u8] = b"QFI\xfb";

/// CDI's scratch claim `<dv>-scratch`, in the DataVolume's class, sized to hold what the volume holds: the usable
/// space with the file system's overhead on top, rounded up to whole MiB (`createScratchPersistentVolumeClaim`).
/// CDI's importer pod owns it; the stand-in has none, so the DataVolume does.
async fn scratch_claim(client: &Client, dv: &DynamicObject) -> anyhow::Result<String> {
    let ns = dv.namespace().unwrap_or_default();
    let name = format!("{}-scratch", dv.name_any());
    let (class, _, _) = storage_class(client, dv).await?;
    let owner = dv
        .controller_owner_ref(&dv_resource())
        .expect("a stored DataVolume has a uid");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "volumeMode": "Filesystem",
                 "resources": {"requests": {"storage": scratch_size(claim_size(dv).0).to_string()}}},
    }))?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    if claims.get_opt(&name).await?.is_none() {
        claims.create(&PostParams::default(), &claim).await?;
    }
    Ok(name)
}

fn scratch_size(claim: u64) -> u64 {
    let usable = usable_space(claim);
    ((usable as f64 * (1.0 + FILESYSTEM_OVERHEAD)).ceil() as u64).next_multiple_of(ALIGN)
}

/// Downloads the source into the volume and converts it to a raw `disk.img` of the volume's usable size, as
/// CDI's importer leaves it, reporting progress.
async fn download(
    client: &Client,
    dv: &DynamicObject,
    dir: &Path,
    mut body: impl futures::Stream<Item = anyhow::Result<bytes::Bytes>> + Unpin,
    total: Option<u64>,
    killed: bool,
) -> anyhow::Result<()> {
    let name = dv.name_any();
    let partial = dir.join("download.partial");
    let mut file = tokio::fs::File::create(&partial).await?;
    let (mut done, mut reported) = (0u64, Instant::now());
    report_current(client, dv, Report::import_in_progress(&name, "0.00%")).await?;
    let stall = dv.annotations().get(FAULT_ANNOTATION).map(String::as_str) == Some("stall");
    while let Some(chunk) = body.next().await {
        use tokio::io::{AsyncSeekExt, AsyncWriteExt};
        let chunk = chunk?;
        // Zeros become a hole, as qemu-img leaves them in the volume: a mostly empty disk stays small on the
        // lab's own disk, and reads back the same.
        if crate::disks::is_zero(&chunk) {
            file.seek(std::io::SeekFrom::Current(chunk.len() as i64))
                .await?;
        } else {
            file.write_all(&chunk).await?;
        }
        done += chunk.len() as u64;
        if killed {
            return Ok(());
        }
        if stall {
            futures::future::pending::<()>().await;
        }
        if reported.elapsed() > Duration::from_millis(250)
            && let Some(total) = total
        {
            reported = Instant::now();
            let percent = format!("{:.2}%", done as f64 * 100.0 / total as f64);
            report_current(client, dv, Report::import_in_progress(&name, percent)).await?;
        }
    }
    anyhow::ensure!(
        total.is_none_or(|t| t == done),
        "the source ended after {done} of {} bytes",
        total.unwrap_or(0)
    );
    // tokio's File writes in the background: without this flush the last chunk can still be in flight when
    // qemu-img reads the file (the chaos suite's verifications caught disk.img 39,424 bytes short).
    {
        use tokio::io::AsyncWriteExt;
        file.flush().await?;
    }
    // A trailing hole has no bytes written after it: the length says where the source ended.
    file.set_len(done).await?;
    drop(file);
    let (claim, block) = claim_size(dv);
    if block {
        // CDI's importer writes the image onto the device as it is: the device keeps its size, and what lies past
        // the image keeps what the storage left there.
        crate::disks::qemu_img(
            &["convert", "-n", "-O", "raw"],
            &[&partial, &dir.join(BLOCK_FILE)],
        )?;
        tokio::fs::remove_file(&partial).await?;
        return Ok(());
    }
    // CDI's importer converts whatever it gets (raw, qcow2, ...) to a raw disk.img ...
    let image = dir.join("disk.img");
    crate::disks::qemu_img(&["convert", "-O", "raw"], &[&partial, &image])?;
    tokio::fs::remove_file(&partial).await?;
    // ... then resizes it to the volume's usable space (`ResizeImage`), refusing one that does not fit.
    let (size, usable) = (
        tokio::fs::metadata(&image).await?.len(),
        usable_space(claim),
    );
    anyhow::ensure!(
        size <= usable,
        "virtual image size {size} is larger than the reported available storage {usable}. A larger PVC is \
         required"
    );
    tokio::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .await?
        .set_len(usable)
        .await?;
    // CDI's data processor leaves the image 0660 (`data-processor.go`), which its owner alone reads on a volume
    // whose storage applies no fsGroup.
    {
        use std::os::unix::fs::PermissionsExt;
        tokio::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o660)).await?;
    }
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
