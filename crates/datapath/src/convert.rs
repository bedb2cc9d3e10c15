//! One disk: read once from the datastore, hash in the same pass, convert, and stage, all in one streaming pass
//! with nothing on a local disk. A raw upload resumes where an earlier attempt left it (`upload.rs`); a qcow2
//! is made as it uploads (`qcow2_upload.rs`) and starts over.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use ferry_types::DiskFormat;
use ferry_vsphere::datastore::{Download, FlatDisk, flat_disk};
use ferry_vsphere::{ConnectConfig, Session};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::error::{Error, Result};
use crate::hash::Hasher;
use crate::progress::Progress;
use crate::qcow2_upload::{Qcow2Upload, Streamed};
use crate::spec::{ConvertSpec, DiskSpec, read_secret};
use crate::staging::{PartPlan, SourceIdentity, StagedObject, Staging, object_name};
use crate::upload::{Target, Upload};

/// One disk's result. The controller reads it back from the disk's manifest (`StagedObject`); earlier releases
/// sent the whole list in the pod's termination message.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiskResult {
    pub index: u32,
    #[serde(flatten)]
    pub staged: StagedObject,
    /// Bytes read from the source in this run: 0 when an identical staged object was found.
    pub bytes_read: u64,
    pub skipped: bool,
}

/// Logs in to the source's vCenter or ESXi, as the spec's credentials and trust say.
pub async fn connect(spec: &ConvertSpec) -> Result<Session> {
    let source = &spec.source;
    let config = ConnectConfig {
        url: source.url.clone(),
        username: read_secret(&source.credentials_dir, "user")?,
        password: read_secret(&source.credentials_dir, "password")?,
        tls: source.trust.tls_mode()?,
        timeout: Duration::from_secs(120),
    };
    Ok(Session::connect_with(config, spec.transfer.policy()).await?)
}

/// Converts and stages every disk of `spec`, `spec.parallel` at a time.
pub async fn convert_all(spec: &ConvertSpec, progress: &Progress) -> Result<Vec<DiskResult>> {
    convert_run(spec, progress, &crate::report::run_id()).await
}

/// [`convert_all`], marking the manifests this run writes with `run`.
pub async fn convert_run(
    spec: &ConvertSpec,
    progress: &Progress,
    run: &str,
) -> Result<Vec<DiskResult>> {
    // Before any byte moves: a disk too large for S3's part limit would fail only after the others were copied.
    for disk in &spec.disks {
        PartPlan::of(&describe(disk), disk.capacity_bytes)?;
    }
    // The S3 client takes the process's TLS provider; ours is ring everywhere.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let session = connect(spec).await?;
    crate::source_check::confirm(&session, spec).await?;
    // Renews the SOAP session while disks stream; stops when this function returns, however it returns.
    let keepalive = spec
        .transfer
        .keepalive()
        .map(|every| session.keep_alive_every(every));
    let staging = spec
        .staging
        .as_ref()
        .ok_or_else(|| Error::Spec("this spec stages nothing; its disks go to volumes".into()))?;
    let staging = Staging::open(staging)?;
    let mut results: Vec<DiskResult> = futures::stream::iter(spec.disks.iter())
        .map(|disk| convert_disk(&session, &staging, spec, disk, run, progress))
        .buffer_unordered(spec.parallel.max(1))
        .try_collect()
        .await?;
    drop(keepalive);
    session.logout().await;
    results.sort_by_key(|r| r.index);
    Ok(results)
}

async fn convert_disk(
    session: &Session,
    staging: &Staging,
    spec: &ConvertSpec,
    disk: &DiskSpec,
    run: &str,
    progress: &Progress,
) -> Result<DiskResult> {
    let name = object_name(disk.index, spec.format);
    let identity = SourceIdentity {
        vm_uuid: spec.source.vm_uuid.clone(),
        disk_file: disk.file.clone(),
        capacity_bytes: disk.capacity_bytes,
    };
    let format = format!("{:?}", spec.format).to_lowercase();
    if let Some(done) = already_staged(staging, &name, &identity, &format).await? {
        if spec.format == DiskFormat::Raw {
            // An attempt that died between writing the manifest and removing the journal left it.
            forget_journal(staging, &name).await;
        }
        progress.skipped(disk.index, done.source_bytes);
        return Ok(result(disk, done, 0, true));
    }

    let flat = flat_disk(session, &spec.source.datacenter, &disk.file).await?;
    // Its size on the datastore may differ from the capacity vSphere reports.
    PartPlan::of(&describe(disk), flat.size)?;
    if flat.size == 0 && disk.capacity_bytes > 0 {
        return Err(Error::EmptyDisk {
            index: disk.index,
            file: disk.file.clone(),
            capacity: disk.capacity_bytes,
        });
    }
    let from = Source {
        session,
        datacenter: &spec.source.datacenter,
        flat: &flat,
        index: disk.index,
    };
    let (object_sha256, object_bytes, source_sha256, bytes_read) = match spec.format {
        DiskFormat::Raw => {
            let target = Target {
                name: &name,
                source: &identity,
                format: &format,
                bytes: flat.size,
                plan: PartPlan::of(&name, flat.size)?,
            };
            let (sha, read) = stream_raw(staging, &from, &target, progress).await?;
            (Some(sha.clone()), flat.size, sha, read)
        }
        DiskFormat::Qcow2 => {
            let streamed = stream_qcow2(staging, &from, &name, &identity, progress).await?;
            (
                None,
                streamed.object_bytes,
                streamed.source_sha256,
                flat.size,
            )
        }
    };
    let (stored_bytes, e_tag) = staging.head(&name).await?.ok_or_else(|| Error::Staging {
        url: staging.url_of(&name),
        detail: "the finished upload is not there".into(),
    })?;
    if stored_bytes != object_bytes {
        return Err(Error::ShortRead {
            index: disk.index,
            got: stored_bytes,
            expected: object_bytes,
        });
    }
    let staged = StagedObject {
        url: staging.url_of(&name),
        format,
        object_sha256,
        object_bytes,
        source_sha256,
        source_bytes: flat.size,
        source: identity,
        e_tag,
        run: Some(run.to_string()),
        bytes_read: Some(bytes_read),
    };
    staging.write_manifest(&name, &staged).await?;
    if spec.format == DiskFormat::Raw {
        forget_journal(staging, &name).await;
    }
    progress.done(disk.index, flat.size);
    Ok(result(disk, staged, bytes_read, false))
}

/// Removes a finished upload's journal. Left behind, it only costs a read at the next attempt (the manifest
/// wins) and is removed with the object, so failing here does not fail the disk.
async fn forget_journal(staging: &Staging, name: &str) {
    if let Err(e) = staging.delete_journal(name).await {
        tracing::warn!(object = name, "removing the finished upload's journal: {e}");
    }
}

fn describe(disk: &DiskSpec) -> String {
    format!("disk {} ({})", disk.index, disk.file)
}

fn result(disk: &DiskSpec, staged: StagedObject, bytes_read: u64, skipped: bool) -> DiskResult {
    DiskResult {
        index: disk.index,
        staged,
        bytes_read,
        skipped,
    }
}

/// A staged object counts only with a manifest for the same source, and unchanged since it was written.
async fn already_staged(
    staging: &Staging,
    name: &str,
    identity: &SourceIdentity,
    format: &str,
) -> Result<Option<StagedObject>> {
    let Some(manifest) = staging.manifest(name).await? else {
        return Ok(None);
    };
    if manifest.source != *identity || manifest.format != format {
        tracing::info!(
            object = name,
            "a staged object from another source is there; staging again"
        );
        return Ok(None);
    }
    match staging.head(name).await? {
        Some((size, e_tag))
            if size == manifest.object_bytes
                && (manifest.e_tag.is_none() || manifest.e_tag == e_tag) =>
        {
            Ok(Some(manifest))
        }
        _ => {
            tracing::warn!(
                object = name,
                "the staged object changed after it was written; staging again"
            );
            Ok(None)
        }
    }
}

/// Where a raw disk is read from.
struct Source<'a> {
    session: &'a Session,
    datacenter: &'a str,
    flat: &'a FlatDisk,
    index: u32,
}

/// Download → hash → multipart upload, overlapped: parts upload while the next bytes arrive. Goes on with the
/// upload an earlier attempt left, and starts over once if the store lost it. Returns the sha256 of the disk and
/// the bytes read from the source in this run.
async fn stream_raw(
    staging: &Staging,
    from: &Source<'_>,
    target: &Target<'_>,
    progress: &Progress,
) -> Result<(String, u64)> {
    let upload = Upload::open(staging, target).await?;
    let resumed = upload.resumed();
    match copy(from, upload, progress).await {
        Err(Error::UploadGone { .. }) if resumed => {
            tracing::warn!(
                disk = from.index,
                "the upload to resume is gone from staging (aborted or expired); uploading again from byte 0"
            );
            copy(from, Upload::fresh(staging, target).await?, progress).await
        }
        outcome => outcome,
    }
}

/// Streams the source from where `upload` stands to its end into it.
async fn copy(
    from: &Source<'_>,
    mut upload: Upload<'_>,
    progress: &Progress,
) -> Result<(String, u64)> {
    let (size, start) = (from.flat.size, upload.offset());
    if upload.resumed() {
        let (done, total) = upload.parts();
        tracing::info!(
            "resuming disk {} at part {done} of {total} ({start} bytes already staged)",
            from.index
        );
        progress.resumed(from.index, start, size);
    }
    if start < size {
        let mut download =
            Download::open(from.session, from.datacenter, &from.flat.extent, start).await?;
        while let Some(chunk) = download.next_chunk().await? {
            upload.push(chunk).await?;
            progress.bytes(from.index, download.offset(), size);
        }
        if download.offset() != size {
            return Err(Error::ShortRead {
                index: from.index,
                got: download.offset(),
                expected: size,
            });
        }
    }
    let sha = upload.finish().await?;
    Ok((sha, size - start))
}

/// Download → hash → qcow2 → multipart upload, overlapped ([`Qcow2Upload`]). Returns what was staged.
async fn stream_qcow2(
    staging: &Staging,
    from: &Source<'_>,
    name: &str,
    identity: &SourceIdentity,
    progress: &Progress,
) -> Result<Streamed> {
    let size = from.flat.size;
    let started = std::time::Instant::now();
    let mut upload = Qcow2Upload::start(staging, name, identity, from.index, size).await?;
    let read = async {
        let mut download =
            Download::open(from.session, from.datacenter, &from.flat.extent, 0).await?;
        while let Some(chunk) = download.next_chunk().await? {
            upload.push(chunk).await?;
            progress.bytes(from.index, download.offset(), size);
        }
        Ok(())
    }
    .await;
    if let Err(e) = read {
        upload.abort().await;
        return Err(e);
    }
    let streamed = upload.finish().await?;
    tracing::info!(
        disk = from.index,
        object_bytes = streamed.object_bytes,
        data_clusters = streamed.data_clusters,
        seconds = started.elapsed().as_secs_f64(),
        "qcow2 made and staged in one pass"
    );
    Ok(streamed)
}

/// Uploads a local file to `name`, hashing it on the way; returns (sha256, bytes).
pub async fn upload_file(staging: &Staging, name: &str, path: &Path) -> Result<(String, u64)> {
    let mut file = tokio::fs::File::open(path).await.map_err(|e| io(path, e))?;
    let size = file.metadata().await.map_err(|e| io(path, e))?.len();
    let plan = PartPlan::of(&staging.url_of(name), size)?;
    let mut upload = staging.writer(name, plan).await?;
    let (hasher, mut bytes) = (Hasher::start(), 0u64);
    loop {
        let mut buf = vec![0u8; 4 << 20];
        let n = file.read(&mut buf).await.map_err(|e| io(path, e))?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        bytes += n as u64;
        send(staging, &mut upload, plan, &hasher, Bytes::from(buf)).await?;
    }
    upload.finish().await.map_err(|e| staging.error(e))?;
    Ok((hasher.finish(), bytes))
}

/// Hands a chunk to the hasher and the upload, waiting while too many parts are in flight.
async fn send(
    staging: &Staging,
    upload: &mut object_store::WriteMultipart,
    plan: PartPlan,
    hasher: &Hasher,
    chunk: Bytes,
) -> Result<()> {
    hasher.update(chunk.clone());
    upload
        .wait_for_capacity(plan.in_flight)
        .await
        .map_err(|e| staging.error(e))?;
    upload.put(chunk);
    Ok(())
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}
