//! The staging store (object_store: `file://` or `s3://`). Each object gets a manifest written after its data,
//! so a manifest proves a complete object, and a partial upload never shows under the object's name. A raw
//! disk's upload in progress has a journal beside it (`<name>.upload.json`, see `upload.rs`), so the next Job
//! attempt resumes it and [`Staging::delete`] can abort it.

use std::sync::Arc;
use std::time::Duration;

use ferry_types::DiskFormat;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{Certificate, ClientOptions};
use object_store::{MultipartId, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::local_parts::LocalParts;
use crate::spec::{StagingSpec, read_secret};

const MIB: u64 = 1 << 20;
/// The smallest part: disks up to about 140 GiB upload in parts of this size.
pub const MIN_PART_BYTES: u64 = 16 * MIB;
/// S3's (and MinIO's) largest part.
pub const MAX_PART_BYTES: u64 = 5 << 30;
/// Parts an upload aims for. S3 takes at most 10,000 per upload; the rest is headroom.
pub const TARGET_PARTS: u64 = 9_000;
/// The largest object staging takes: 9,000 parts of 5 GiB, about 43.9 TiB (VMFS allows 62 TB disks).
pub const MAX_STAGED_BYTES: u64 = MAX_PART_BYTES * TARGET_PARTS;
/// Part bytes in flight per upload while parts are small (4 of 16 MiB); larger parts keep two in flight.
const IN_FLIGHT_BYTES: u64 = 64 * MIB;

/// The HTTP client of an S3 store: no limit on a whole request, since a part grows with the disk (up to 5 GiB)
/// and a download streams a whole disk; a response that stalls for `STALLED` still fails (and is retried).
/// (object_store's default, 30 s per request, cut every part slower than 30 s and every longer download.)
pub fn s3_client_options() -> ClientOptions {
    ClientOptions::new()
        .with_timeout_disabled()
        .with_connect_timeout(Duration::from_secs(10))
        .with_read_timeout(STALLED)
}

/// How long an S3 connection may go without a byte before the request fails (and is retried).
pub const STALLED: Duration = Duration::from_secs(60);

/// The controller's own S3 calls (a HEAD, a DELETE, a listing, a small manifest): it serves every tenant, so one
/// tenant's unreachable store must give its worker back soon. Each call: 15 s, connect 5 s, at most 2 retries
/// within 20 s. (object_store's default retries for up to 3 min.)
fn control_client_options() -> ClientOptions {
    ClientOptions::new()
        .with_timeout(Duration::from_secs(15))
        .with_connect_timeout(Duration::from_secs(5))
}

fn control_retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 2,
        retry_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

/// Who calls the store: a Job moving disks (long requests, patient retries) or the controller (short, bounded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Caller {
    Job,
    Controller,
}

/// How an object of a known size is uploaded. `WriteMultipart` keeps its chunk size for the whole upload and
/// sends the remainder as a smaller last part, so the part count is `ceil(size / part_bytes)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartPlan {
    pub part_bytes: u64,
    /// Parts uploading at once.
    pub in_flight: usize,
}

impl PartPlan {
    /// `max(16 MiB, ceil(size / 9,000))` rounded up to 1 MiB; `None` when even 5 GiB parts would need more
    /// than 9,000. Pure.
    pub fn for_size(object_bytes: u64) -> Option<Self> {
        if object_bytes > MAX_STAGED_BYTES {
            return None;
        }
        let part_bytes = object_bytes
            .div_ceil(TARGET_PARTS)
            .next_multiple_of(MIB)
            .max(MIN_PART_BYTES);
        // Two in flight at least, so the download goes on while a part uploads.
        let in_flight = (IN_FLIGHT_BYTES / part_bytes).clamp(2, 4) as usize;
        Some(Self {
            part_bytes,
            in_flight,
        })
    }

    /// The plan for `what` (a disk, an object), or the error that names it, its size and the limit.
    pub fn of(what: &str, object_bytes: u64) -> Result<Self> {
        Self::for_size(object_bytes).ok_or_else(|| Error::TooLargeToStage {
            what: what.to_string(),
            bytes: object_bytes,
        })
    }

    /// Memory an upload holds at most: the parts in flight, the one filling included (a part is buffered whole,
    /// as object_store sends each part as one request body).
    pub fn memory_bytes(&self) -> u64 {
        self.part_bytes * self.in_flight as u64
    }
}

/// Why `what` (`bytes` long) cannot be staged, in words a person can act on.
pub fn too_large_message(what: &str, bytes: u64) -> String {
    format!(
        "{what} is {} ({bytes} bytes): S3 staging uploads at most {TARGET_PARTS} parts of 5 GiB per disk, {} \
         ({MAX_STAGED_BYTES} bytes)",
        human(bytes),
        human(MAX_STAGED_BYTES)
    )
}

fn human(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    let gib = bytes as f64 / GIB;
    if gib >= 1024.0 {
        format!("{:.1} TiB", gib / 1024.0)
    } else {
        format!("{gib:.1} GiB")
    }
}

/// What was staged, from which source disk. Stored beside the object as `<name>.manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StagedObject {
    pub url: String,
    pub format: String,
    /// sha256 of the object's bytes: a raw object's is the source's. Absent for a qcow2, which is made as it
    /// uploads with its header written last, so no pass reads it in order; its import is checked against
    /// `source_sha256` like every other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_sha256: Option<String>,
    pub object_bytes: u64,
    /// sha256 of the disk's raw content: what the imported disk must hash to.
    pub source_sha256: String,
    pub source_bytes: u64,
    pub source: SourceIdentity,
    /// The store's entity tag when written; a different one later means the object was replaced.
    #[serde(default)]
    pub e_tag: Option<String>,
    /// The conversion run that wrote it, so the controller tells a disk copied in this run from one found
    /// staged already. Absent in manifests of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Bytes that run read from the source: less than `source_bytes` when it resumed an upload an earlier
    /// attempt left. Absent in manifests of earlier releases, which read the whole source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_read: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SourceIdentity {
    pub vm_uuid: String,
    pub disk_file: String,
    pub capacity_bytes: u64,
}

/// A raw disk's upload in progress, `<name>.upload.json` beside the object: enough for the next Job attempt to
/// go on where this one stopped. A qcow2's upload has one too, with no parts, only so it can be aborted. Rewritten each time the run of finished parts from the first grows; removed
/// once the manifest is written, or by [`Staging::delete`] with the upload.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UploadJournal {
    /// What is uploaded, as the manifest will say: a journal of another source or format is not resumed.
    pub source: SourceIdentity,
    pub format: String,
    pub object_bytes: u64,
    pub part_bytes: u64,
    pub upload_id: String,
    /// Ids of parts 0, 1, ... as the store answered them: the finished parts in a row from the first.
    pub parts: Vec<String>,
    /// sha256 of the bytes of `parts`, as sha2's serialized hasher state (hex), so the hash resumes exactly.
    pub sha256_state: String,
}

impl UploadJournal {
    /// Where the bytes not yet staged start.
    pub fn offset(&self) -> u64 {
        (self.parts.len() as u64 * self.part_bytes).min(self.object_bytes)
    }

    /// Parts of the whole object.
    pub fn part_count(&self) -> u64 {
        self.object_bytes.div_ceil(self.part_bytes)
    }
}

/// The object a disk is staged as, `disk-<index>.<raw|qcow2>`: the conversion Job writes it, the controller
/// removes it after the import.
pub fn object_name(index: u32, format: DiskFormat) -> String {
    let ext = match format {
        DiskFormat::Raw => "raw",
        DiskFormat::Qcow2 => "qcow2",
    };
    format!("disk-{index}.{ext}")
}

/// `s3://bucket/a/b` as (`bucket`, `a/b`).
pub fn s3_bucket_and_prefix(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("s3://")?;
    Some(rest.split_once('/').unwrap_or((rest, "")))
}

pub struct Staging {
    store: Arc<dyn ObjectStore>,
    /// The same store's multipart uploads, part by part (object_store has them in a trait of their own).
    parts: Arc<dyn MultipartStore>,
    base_url: String,
    prefix: Path,
}

impl Staging {
    pub fn open(spec: &StagingSpec) -> Result<Self> {
        Self::open_with(spec, None, Caller::Job)
    }

    /// Opens s3 staging for the controller's own short calls, with keys held in memory (it reads them from a
    /// Secret, never from files).
    pub fn open_with_keys(
        spec: &StagingSpec,
        access_key: String,
        secret_key: String,
    ) -> Result<Self> {
        Self::open_with(spec, Some((access_key, secret_key)), Caller::Controller)
    }

    fn open_with(
        spec: &StagingSpec,
        keys: Option<(String, String)>,
        caller: Caller,
    ) -> Result<Self> {
        let url = spec.url.trim_end_matches('/').to_string();
        let fail = |detail: String| Error::Staging {
            url: url.clone(),
            detail,
        };
        if let Some(dir) = url.strip_prefix("file://") {
            std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
            let store =
                Arc::new(LocalFileSystem::new_with_prefix(dir).map_err(|e| fail(e.to_string()))?);
            return Ok(Self {
                parts: Arc::new(LocalParts::new(store.clone())),
                store,
                base_url: url.clone(),
                prefix: Path::default(),
            });
        }
        if let Some((bucket, prefix)) = s3_bucket_and_prefix(&url) {
            let (access_key, secret_key) = match (&keys, spec.credentials_dir.as_deref()) {
                (Some(keys), _) => keys.clone(),
                (None, Some(dir)) => (
                    read_secret(dir, "accessKeyId")?,
                    read_secret(dir, "secretKey")?,
                ),
                (None, None) => {
                    return Err(fail(
                        "s3 staging needs a credentials directory (accessKeyId, secretKey)".into(),
                    ));
                }
            };
            let mut builder = AmazonS3Builder::new()
                .with_bucket_name(bucket)
                .with_access_key_id(access_key)
                .with_secret_access_key(secret_key)
                .with_region(spec.region.clone().unwrap_or_else(|| "us-east-1".into()))
                .with_virtual_hosted_style_request(false)
                // Before `with_allow_http` below, which edits these options.
                .with_client_options(trusting(
                    match caller {
                        Caller::Job => s3_client_options(),
                        Caller::Controller => control_client_options(),
                    },
                    spec.ca_bundle.as_deref(),
                    &fail,
                )?)
                // The manifest's sha256 already proves the content; signing each part would hash every byte again.
                .with_unsigned_payload(true);
            if caller == Caller::Controller {
                builder = builder.with_retry(control_retries());
            }
            if let Some(endpoint) = &spec.endpoint {
                builder = builder
                    .with_endpoint(endpoint)
                    .with_allow_http(endpoint.starts_with("http://"));
            }
            let store = Arc::new(builder.build().map_err(|e| fail(e.to_string()))?);
            return Ok(Self {
                parts: store.clone(),
                store,
                base_url: url.clone(),
                prefix: Path::from(prefix),
            });
        }
        Err(Error::Spec(format!(
            "staging url {url} must start with file:// or s3://"
        )))
    }

    /// The same store and keys for another folder of the same S3 bucket (`s3://bucket/folder`); `None` for
    /// another bucket or a `file://` store. Opening a store builds an HTTP client, which reads the system's CA
    /// certificates: too costly for every reconcile.
    pub fn within(&self, url: &str) -> Option<Self> {
        let url = url.trim_end_matches('/');
        let (bucket, prefix) = s3_bucket_and_prefix(url)?;
        let (own, _) = s3_bucket_and_prefix(&self.base_url)?;
        (bucket == own).then(|| Self {
            store: self.store.clone(),
            parts: self.parts.clone(),
            base_url: url.to_string(),
            prefix: Path::from(prefix),
        })
    }

    pub(crate) fn path(&self, name: &str) -> Path {
        self.prefix.clone().join(name)
    }

    /// The store's multipart uploads, for tasks that outlive a borrow of `self`.
    pub(crate) fn parts(&self) -> Arc<dyn MultipartStore> {
        self.parts.clone()
    }

    /// The object's URL, as the CDI stand-in or a real CDI importer reads it.
    pub fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.base_url)
    }

    pub async fn manifest(&self, name: &str) -> Result<Option<StagedObject>> {
        self.read_json(&format!("{name}.manifest.json")).await
    }

    /// The journal of `name`'s upload in progress, if there is one that parses.
    pub async fn journal(&self, name: &str) -> Result<Option<UploadJournal>> {
        self.read_json(&journal_name(name)).await
    }

    pub async fn write_journal(&self, name: &str, journal: &UploadJournal) -> Result<()> {
        self.write_json(&journal_name(name), journal).await
    }

    /// `file`'s JSON; `None` when it is absent or does not parse.
    async fn read_json<T: serde::de::DeserializeOwned>(&self, file: &str) -> Result<Option<T>> {
        match self.store.get(&self.path(file)).await {
            Ok(found) => {
                let bytes = found.bytes().await.map_err(|e| self.error(e))?;
                Ok(serde_json::from_slice(&bytes).ok())
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(e)),
        }
    }

    async fn write_json<T: Serialize>(&self, file: &str, value: &T) -> Result<()> {
        let body = serde_json::to_vec_pretty(value).map_err(|e| Error::Spec(e.to_string()))?;
        self.store
            .put(&self.path(file), PutPayload::from(body))
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Starts a multipart upload of `name`; its parts go through [`Self::parts`].
    pub(crate) async fn create_upload(&self, name: &str) -> Result<MultipartId> {
        self.parts
            .create_multipart(&self.path(name))
            .await
            .map_err(|e| self.error(e))
    }

    /// Makes the object of upload `id` from its parts, in order.
    pub(crate) async fn complete_upload(
        &self,
        name: &str,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> Result<()> {
        self.parts
            .complete_multipart(&self.path(name), id, parts)
            .await
            .map(|_| ())
            .map_err(|e| self.upload_error(name, e))
    }

    /// Drops upload `id` and its parts; one already gone is fine.
    pub(crate) async fn abort_upload(&self, name: &str, id: &MultipartId) -> Result<()> {
        match self.parts.abort_multipart(&self.path(name), id).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }

    /// An upload's `NotFound` (S3's NoSuchUpload: aborted, or expired by a lifecycle rule) is
    /// [`Error::UploadGone`]: starting over helps, unlike other errors.
    pub(crate) fn upload_error(&self, name: &str, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::UploadGone {
                url: self.url_of(name),
            },
            e => self.error(e),
        }
    }

    /// Size and entity tag of a stored object, if it exists.
    pub async fn head(&self, name: &str) -> Result<Option<(u64, Option<String>)>> {
        match self.store.head(&self.path(name)).await {
            Ok(meta) => Ok(Some((meta.size, meta.e_tag))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(e)),
        }
    }

    /// A streaming upload to `name` in `plan`'s parts; the object appears only when it is finished.
    pub async fn writer(&self, name: &str, plan: PartPlan) -> Result<WriteMultipart> {
        let upload = self
            .store
            .put_multipart(&self.path(name))
            .await
            .map_err(|e| self.error(e))?;
        Ok(WriteMultipart::new_with_chunk_size(
            upload,
            plan.part_bytes as usize,
        ))
    }

    pub async fn write_manifest(&self, name: &str, manifest: &StagedObject) -> Result<()> {
        self.write_json(&format!("{name}.manifest.json"), manifest)
            .await
    }

    /// Reads the whole object back and hashes it.
    pub async fn read_sha256(&self, name: &str) -> Result<(String, u64)> {
        let found = self
            .store
            .get(&self.path(name))
            .await
            .map_err(|e| self.error(e))?;
        let mut stream = found.into_stream();
        let (mut hash, mut bytes) = (Sha256::new(), 0u64);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.error(e))?;
            bytes += chunk.len() as u64;
            hash.update(&chunk);
        }
        Ok((crate::hex(&hash.finalize()), bytes))
    }

    /// Removes the object, its manifest, and an upload in progress with its journal; absent ones are fine.
    /// The upload goes first: should that fail, its journal is still there for the next try.
    pub async fn delete(&self, name: &str) -> Result<()> {
        self.delete_all(&[name.to_string()]).await
    }

    /// [`Self::delete`] for each of `names`; the files go in one bulk request (S3's DeleteObjects), where one
    /// each would be three per name.
    pub async fn delete_all(&self, names: &[String]) -> Result<()> {
        for name in names {
            if let Some(journal) = self.journal(name).await? {
                self.abort_upload(name, &journal.upload_id).await?;
            }
        }
        let files: Vec<_> = names
            .iter()
            .flat_map(|name| {
                [
                    format!("{name}.manifest.json"),
                    name.clone(),
                    journal_name(name),
                ]
            })
            .map(|file| Ok(self.path(&file)))
            .collect();
        let mut deleted = self
            .store
            .delete_stream(futures::stream::iter(files).boxed());
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.error(e)),
            }
        }
        Ok(())
    }

    /// Removes the journal of `name`'s upload, once the upload is complete.
    pub async fn delete_journal(&self, name: &str) -> Result<()> {
        self.delete_file(&journal_name(name)).await
    }

    async fn delete_file(&self, file: &str) -> Result<()> {
        match self.store.delete(&self.path(file)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }

    pub(crate) fn error(&self, e: object_store::Error) -> Error {
        Error::Staging {
            url: self.base_url.clone(),
            detail: e.to_string(),
        }
    }
}

fn journal_name(name: &str) -> String {
    format!("{name}.upload.json")
}

/// `options` that also trust the CAs in `pem`, a private CA's bundle.
fn trusting(
    mut options: ClientOptions,
    pem: Option<&str>,
    fail: &dyn Fn(String) -> Error,
) -> Result<ClientOptions> {
    let Some(pem) = pem else {
        return Ok(options);
    };
    let certs = Certificate::from_pem_bundle(pem.as_bytes())
        .map_err(|e| fail(format!("caBundle does not parse: {e}")))?;
    for cert in certs {
        options = options.with_root_certificate(cert);
    }
    Ok(options)
}

#[cfg(test)]
impl Staging {
    /// `file://` staging in `dir`.
    pub(crate) fn in_dir(dir: &std::path::Path) -> Self {
        Self::open(&StagingSpec {
            url: format!("file://{}", dir.display()),
            credentials_dir: None,
            endpoint: None,
            region: None,
            ca_bundle: None,
        })
        .expect("file:// staging opens")
    }

    /// This staging with its multipart uploads going through `parts` (a wrapper that counts or fails them).
    pub(crate) fn with_parts(self, parts: Arc<dyn MultipartStore>) -> Self {
        Self { parts, ..self }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_s3_request_has_no_deadline_only_a_stall_limit() {
        use object_store::ClientConfigKey;
        let options = s3_client_options();
        assert_eq!(options.get_config_value(&ClientConfigKey::Timeout), None);
        assert!(
            options
                .get_config_value(&ClientConfigKey::ReadTimeout)
                .is_some()
        );
        assert!(
            options
                .get_config_value(&ClientConfigKey::ConnectTimeout)
                .is_some()
        );
    }

    use super::*;

    const GIB: u64 = 1 << 30;
    const TIB: u64 = 1 << 40;

    fn parts(size: u64, plan: PartPlan) -> u64 {
        size.div_ceil(plan.part_bytes)
    }

    #[test]
    fn a_store_serves_other_folders_of_its_bucket_only() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let spec = StagingSpec {
            url: "s3://bucket".into(),
            credentials_dir: None,
            endpoint: Some("http://127.0.0.1:9".into()),
            region: None,
            ca_bundle: None,
        };
        let root = Staging::open_with_keys(&spec, "a".into(), "b".into()).unwrap();
        let folder = root.within("s3://bucket/ns/vm-1/").unwrap();
        assert_eq!(
            folder.url_of("disk-0.raw"),
            "s3://bucket/ns/vm-1/disk-0.raw"
        );
        assert_eq!(folder.path("disk-0.raw").as_ref(), "ns/vm-1/disk-0.raw");
        assert!(root.within("s3://other/ns").is_none());
        assert!(root.within("file:///tmp/x").is_none());
    }

    #[test]
    fn parts_grow_with_the_disk_and_stay_under_s3s_limit() {
        let small = PartPlan::for_size(GIB).unwrap();
        assert_eq!(small.part_bytes, 16 * MIB);
        assert_eq!((parts(GIB, small), small.in_flight), (64, 4));

        // 156 GiB: 9,984 parts of 16 MiB were allowed, but only just; 18 MiB parts keep to the target.
        let size = 156 * GIB;
        let plan = PartPlan::for_size(size).unwrap();
        assert_eq!(plan.part_bytes, 18 * MIB);
        assert_eq!(parts(size, plan), 8875);

        let size = 2 * TIB;
        let plan = PartPlan::for_size(size).unwrap();
        assert_eq!(plan.part_bytes, 234 * MIB);
        assert_eq!((parts(size, plan), plan.in_flight), (8963, 2));
        assert_eq!(plan.memory_bytes(), 468 * MIB);

        // The largest object: exactly 9,000 parts of 5 GiB.
        let plan = PartPlan::for_size(MAX_STAGED_BYTES).unwrap();
        assert_eq!(plan.part_bytes, MAX_PART_BYTES);
        assert_eq!(parts(MAX_STAGED_BYTES, plan), TARGET_PARTS);
        assert_eq!(PartPlan::for_size(0).unwrap().part_bytes, MIN_PART_BYTES);
    }

    #[test]
    fn every_size_is_whole_mebibytes_within_the_limits() {
        for size in [
            1,
            MIB + 1,
            141 * GIB,
            157 * GIB + 3,
            10 * TIB + 7,
            43 * TIB,
            MAX_STAGED_BYTES,
        ] {
            let plan = PartPlan::for_size(size).unwrap();
            assert_eq!(plan.part_bytes % MIB, 0, "{size}");
            assert!(
                (MIN_PART_BYTES..=MAX_PART_BYTES).contains(&plan.part_bytes),
                "{size}"
            );
            assert!(parts(size, plan) <= TARGET_PARTS, "{size}");
        }
    }

    #[test]
    fn a_disk_over_the_limit_is_refused_with_its_name_size_and_the_limit() {
        assert_eq!(PartPlan::for_size(60 * TIB), None);
        assert_eq!(PartPlan::for_size(MAX_STAGED_BYTES + 1), None);
        let e = PartPlan::of("disk 2 ([ds] big/big.vmdk)", 60 * TIB).unwrap_err();
        assert_eq!(e.reason(), ferry_types::Reason::DiskTooLargeToStage);
        assert_eq!(e.class(), ferry_types::ErrorClass::Permanent);
        assert_eq!(
            e.to_string(),
            "disk 2 ([ds] big/big.vmdk) is 60.0 TiB (65970697666560 bytes): S3 staging uploads at most 9000 \
             parts of 5 GiB per disk, 43.9 TiB (48318382080000 bytes)"
        );
    }
}
