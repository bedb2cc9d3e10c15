//! The staging store (object_store: `file://` or `s3://`). Each object gets a manifest written after its data,
//! so a manifest proves a complete object, and a partial upload never shows under the object's name.

use std::sync::Arc;

use ferry_types::DiskFormat;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::spec::{StagingSpec, read_secret};

/// Multipart part size: large enough for S3's 10,000-part limit on 150 GiB disks, small enough to stream.
pub const PART_BYTES: usize = 16 << 20;

/// What was staged, from which source disk. Stored beside the object as `<name>.manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StagedObject {
    pub url: String,
    pub format: String,
    /// sha256 of the object's bytes.
    pub object_sha256: String,
    pub object_bytes: u64,
    /// sha256 of the disk's raw content: what the imported disk must hash to.
    pub source_sha256: String,
    pub source_bytes: u64,
    pub source: SourceIdentity,
    /// The store's entity tag when written; a different one later means the object was replaced.
    #[serde(default)]
    pub e_tag: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SourceIdentity {
    pub vm_uuid: String,
    pub disk_file: String,
    pub capacity_bytes: u64,
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

pub struct Staging {
    store: Arc<dyn ObjectStore>,
    base_url: String,
    prefix: Path,
}

impl Staging {
    pub fn open(spec: &StagingSpec) -> Result<Self> {
        Self::open_with(spec, None)
    }

    /// Opens s3 staging with keys held in memory (the controller reads them from a Secret, never from files).
    pub fn open_with_keys(
        spec: &StagingSpec,
        access_key: String,
        secret_key: String,
    ) -> Result<Self> {
        Self::open_with(spec, Some((access_key, secret_key)))
    }

    fn open_with(spec: &StagingSpec, keys: Option<(String, String)>) -> Result<Self> {
        let url = spec.url.trim_end_matches('/').to_string();
        let fail = |detail: String| Error::Staging {
            url: url.clone(),
            detail,
        };
        if let Some(dir) = url.strip_prefix("file://") {
            std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
            let store = LocalFileSystem::new_with_prefix(dir).map_err(|e| fail(e.to_string()))?;
            return Ok(Self {
                store: Arc::new(store),
                base_url: url.clone(),
                prefix: Path::default(),
            });
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
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
                // The manifest's sha256 already proves the content; signing each part would hash every byte again.
                .with_unsigned_payload(true);
            if let Some(endpoint) = &spec.endpoint {
                builder = builder
                    .with_endpoint(endpoint)
                    .with_allow_http(endpoint.starts_with("http://"));
            }
            let store = builder.build().map_err(|e| fail(e.to_string()))?;
            return Ok(Self {
                store: Arc::new(store),
                base_url: url.clone(),
                prefix: Path::from(prefix),
            });
        }
        Err(Error::Spec(format!(
            "staging url {url} must start with file:// or s3://"
        )))
    }

    fn path(&self, name: &str) -> Path {
        self.prefix.clone().join(name)
    }

    /// The object's URL, as the CDI stand-in or a real CDI importer reads it.
    pub fn url_of(&self, name: &str) -> String {
        format!("{}/{name}", self.base_url)
    }

    pub async fn manifest(&self, name: &str) -> Result<Option<StagedObject>> {
        match self
            .store
            .get(&self.path(&format!("{name}.manifest.json")))
            .await
        {
            Ok(found) => {
                let bytes = found.bytes().await.map_err(|e| self.error(e))?;
                Ok(serde_json::from_slice(&bytes).ok())
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(e)),
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

    /// A streaming upload to `name`; the object appears only when it is finished.
    pub async fn writer(&self, name: &str) -> Result<WriteMultipart> {
        let upload = self
            .store
            .put_multipart(&self.path(name))
            .await
            .map_err(|e| self.error(e))?;
        Ok(WriteMultipart::new_with_chunk_size(upload, PART_BYTES))
    }

    pub async fn write_manifest(&self, name: &str, manifest: &StagedObject) -> Result<()> {
        let body = serde_json::to_vec_pretty(manifest).map_err(|e| Error::Spec(e.to_string()))?;
        self.store
            .put(
                &self.path(&format!("{name}.manifest.json")),
                PutPayload::from(body),
            )
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
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

    /// Removes the object and its manifest; absent ones are fine.
    pub async fn delete(&self, name: &str) -> Result<()> {
        for path in [self.path(&format!("{name}.manifest.json")), self.path(name)] {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.error(e)),
            }
        }
        Ok(())
    }

    pub(crate) fn error(&self, e: object_store::Error) -> Error {
        Error::Staging {
            url: self.base_url.clone(),
            detail: e.to_string(),
        }
    }
}
