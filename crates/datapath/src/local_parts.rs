//! Multipart uploads for `file://` staging, which object_store's `LocalFileSystem` does not offer as a
//! [`MultipartStore`] (only its in-process `put_multipart`, whose upload a new process cannot reopen). Like S3's,
//! an upload outlives the process that started it: each part is a file `<object>.parts/<id>/<index>`, and
//! completing it concatenates them into the object, which appears whole, by a rename.

use std::io::Write;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use object_store::local::LocalFileSystem;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{MultipartId, PutPayload, PutResult};

const STORE: &str = "LocalParts";

#[derive(Debug)]
pub struct LocalParts {
    files: Arc<LocalFileSystem>,
}

impl LocalParts {
    pub fn new(files: Arc<LocalFileSystem>) -> Self {
        Self { files }
    }

    /// The directory of upload `id` of `location`.
    fn dir(&self, location: &Path, id: &str) -> object_store::Result<PathBuf> {
        let object = self.files.path_to_filesystem(location)?;
        Ok(PathBuf::from(format!("{}.parts", object.display())).join(id))
    }

    /// The directory of a live upload: a missing one answers `NotFound`, as S3 answers NoSuchUpload.
    fn live_dir(&self, location: &Path, id: &str) -> object_store::Result<PathBuf> {
        let dir = self.dir(location, id)?;
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(object_store::Error::NotFound {
                path: location.to_string(),
                source: format!("no upload {id}").into(),
            })
        }
    }
}

#[async_trait]
impl MultipartStore for LocalParts {
    async fn create_multipart(&self, path: &Path) -> object_store::Result<MultipartId> {
        let id = fresh_id();
        let dir = self.dir(path, &id)?;
        blocking(move || std::fs::create_dir_all(&dir))
            .await
            .map_err(generic)?;
        Ok(id)
    }

    async fn put_part(
        &self,
        path: &Path,
        id: &MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> object_store::Result<PartId> {
        let dir = self.live_dir(path, id)?;
        let len = data.content_length();
        blocking(move || {
            // Written aside and renamed, so a part file is always whole.
            let partial = dir.join(format!("{part_idx}.partial"));
            let mut file = std::fs::File::create(&partial)?;
            for chunk in &data {
                file.write_all(chunk)?;
            }
            drop(file);
            std::fs::rename(&partial, dir.join(part_idx.to_string()))
        })
        .await
        .map_err(generic)?;
        // The part's length: enough to tell, on completion, that the file is the part that was sent.
        Ok(PartId {
            content_id: len.to_string(),
        })
    }

    async fn complete_multipart(
        &self,
        path: &Path,
        id: &MultipartId,
        parts: Vec<PartId>,
    ) -> object_store::Result<PutResult> {
        let dir = self.live_dir(path, id)?;
        let object = self.files.path_to_filesystem(path)?;
        let location = path.to_string();
        blocking(move || concatenate(&dir, &parts, &object))
            .await
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    object_store::Error::NotFound {
                        path: location,
                        source: e.into(),
                    }
                } else {
                    generic(e)
                }
            })?;
        Ok(PutResult {
            e_tag: None,
            version: None,
            extensions: Default::default(),
        })
    }

    async fn abort_multipart(&self, path: &Path, id: &MultipartId) -> object_store::Result<()> {
        let dir = self.live_dir(path, id)?;
        blocking(move || {
            std::fs::remove_dir_all(&dir)?;
            // The object's `.parts` directory goes with its last upload.
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir(parent);
            }
            Ok(())
        })
        .await
        .map_err(generic)
    }
}

/// Appends the parts, in order, to a file in the upload's directory, then renames it to the object.
fn concatenate(dir: &FsPath, parts: &[PartId], object: &FsPath) -> std::io::Result<()> {
    let whole = dir.join("object");
    let mut out = std::fs::File::create(&whole)?;
    for (index, part) in parts.iter().enumerate() {
        let mut file = std::fs::File::open(dir.join(index.to_string()))?;
        let len = file.metadata()?.len();
        if len.to_string() != part.content_id {
            return Err(std::io::Error::other(format!(
                "part {index} holds {len} bytes, {} were sent",
                part.content_id
            )));
        }
        std::io::copy(&mut file, &mut out)?;
    }
    out.sync_all()?;
    drop(out);
    if let Some(parent) = object.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::rename(&whole, object)?;
    std::fs::remove_dir_all(dir)?;
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
    Ok(())
}

/// Unique among this host's processes and their uploads.
fn fresh_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{nanos:x}-{:x}-{:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

fn generic(e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: Box::new(e),
    }
}
