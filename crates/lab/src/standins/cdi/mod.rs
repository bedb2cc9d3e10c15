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
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

mod report;
mod source;
mod volume;

use report::Report;
use volume::{
    BLOCK_FILE, Populators, Volume, as_importer, claim_size, create_blank, ensure_volume,
    scratch_size, storage_class, usable_space,
};
pub(crate) use volume::{parse_quantity, stale_device};

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
const MANAGER: &str = "cdi-standin";
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

/// CDI's scratch claim `<dv>-scratch`, in the DataVolume's class, sized as CDI sizes it ([`scratch_size`]).
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
