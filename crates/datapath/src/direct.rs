//! The direct path: each disk is read once from the datastore, hashed in the same pass, and written into the
//! blank volume CDI allocated for it (`disk.img` on a Filesystem volume, the device on a Block one). Runs of
//! zeros are punched, not written, so a file stays sparse and stale bytes of an earlier attempt or a recycled
//! device cannot survive. Then the volume is synced and read back past the page cache (O_DIRECT), and only a
//! read-back that hashes to the source counts.

use std::path::Path;

use bytes::Bytes;
use ferry_vsphere::Session;
use ferry_vsphere::datastore::{Download, FlatDisk, flat_disk};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::progress::Progress;
pub use crate::read_back::read_back;
use crate::read_back::read_back_over;
use crate::spec::{ConvertSpec, DiskSpec};
use crate::volume_writer::Target;
use crate::zero_runs::ZeroRunThread;

/// How a volume was read back: past the page cache, or (where O_DIRECT is refused, as on tmpfs) through it
/// after dropping the cached pages.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ReadBack {
    Direct,
    Buffered,
}

/// One disk written into its volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenDisk {
    pub index: u32,
    /// The source's sha256, which the volume's first `bytes_read` bytes were read back to match.
    pub sha256: String,
    pub bytes_read: u64,
    /// Bytes of data written; runs of zeros were punched instead.
    pub bytes_written: u64,
    pub read_back: ReadBack,
}

/// Writes every disk of `spec` into its volume, `spec.parallel` at a time.
pub async fn write_all(spec: &ConvertSpec, progress: &Progress) -> Result<Vec<WrittenDisk>> {
    with_source(spec, async |session| {
        let writes = spec
            .disks
            .iter()
            .map(|disk| write_disk(session, spec, disk, progress));
        each_disk(spec.parallel, writes, |w| w.index).await
    })
    .await
}

/// Runs `work` in a session on the source the spec names, once it is shown to be that VM, kept alive while
/// `work` runs and logged out after, whatever `work` ends with.
pub(crate) async fn with_source<T>(
    spec: &ConvertSpec,
    work: impl AsyncFnOnce(&Session) -> Result<T>,
) -> Result<T> {
    let session = crate::convert::connect(spec).await?;
    let keepalive = spec
        .transfer
        .keepalive()
        .map(|every| session.keep_alive_every(every));
    let result = match crate::source_check::confirm(&session, spec).await {
        Ok(()) => work(&session).await,
        Err(e) => Err(e),
    };
    drop(keepalive);
    session.logout().await;
    result
}

/// Runs one future per disk, `parallel` at a time, and gives their results in the disks' order.
pub(crate) async fn each_disk<T>(
    parallel: usize,
    work: impl Iterator<Item = impl Future<Output = Result<T>>>,
    index: fn(&T) -> u32,
) -> Result<Vec<T>> {
    let mut done: Vec<T> = futures::stream::iter(work)
        .buffer_unordered(parallel.max(1))
        .try_collect()
        .await?;
    done.sort_by_key(index);
    Ok(done)
}

pub(crate) async fn write_disk(
    session: &Session,
    spec: &ConvertSpec,
    disk: &DiskSpec,
    progress: &Progress,
) -> Result<WrittenDisk> {
    let flat = flat_disk(session, &spec.source.datacenter, &disk.file).await?;
    write_flat(session, spec, disk, &flat, progress).await
}

/// [`write_disk`] of a disk whose flat extent is resolved already.
pub(crate) async fn write_flat(
    session: &Session,
    spec: &ConvertSpec,
    disk: &DiskSpec,
    flat: &FlatDisk,
    progress: &Progress,
) -> Result<WrittenDisk> {
    let volume = spec
        .volume(disk.index)
        .ok_or_else(|| Error::Spec(format!("disk {} has no volume", disk.index)))?
        .clone();
    if flat.size == 0 && disk.capacity_bytes > 0 {
        return Err(Error::EmptyDisk {
            index: disk.index,
            file: disk.file.clone(),
            capacity: disk.capacity_bytes,
        });
    }
    let size = flat.size;
    let target = {
        let (volume, index) = (volume.clone(), disk.index);
        blocking(move || Target::open(&volume, index, size)).await?
    };
    let (chunks, received) = tokio::sync::mpsc::channel::<(u64, Bytes)>(16);
    let writer = tokio::task::spawn_blocking(move || target.write_from(received, size));
    let hasher = ZeroRunThread::start();
    let started = std::time::Instant::now();
    let mut download = Download::open(session, &spec.source.datacenter, &flat.extent, 0).await?;
    while let Some(chunk) = download.next_chunk().await? {
        hasher.update(chunk.clone());
        let at = download.offset() - chunk.len() as u64;
        if chunks.send((at, chunk)).await.is_err() {
            // The writer failed: its error is the one to report.
            break;
        }
        progress.bytes(disk.index, download.offset(), size);
    }
    drop(chunks);
    let bytes_written = writer
        .await
        .map_err(|e| volume_error(&volume.path, e.to_string()))??;
    let (source_sha256, zero_runs) = hasher.finish();
    if download.offset() != size {
        return Err(Error::ShortRead {
            index: disk.index,
            got: download.offset(),
            expected: size,
        });
    }
    let path = volume.path.clone();
    let write_pass = started.elapsed();
    let (sha256, read_back) = blocking(move || read_back_over(&path, size, &zero_runs)).await?;
    tracing::info!(
        disk = disk.index,
        bytes = size,
        data_bytes = bytes_written,
        write_pass_s = write_pass.as_secs_f64(),
        read_back_s = (started.elapsed() - write_pass).as_secs_f64(),
        process_cpu_s = crate::memory::cpu_seconds().unwrap_or(f64::NAN),
        "written, synced and read back"
    );
    if sha256 != source_sha256 {
        return Err(Error::ChecksumMismatch {
            what: format!(
                "disk {} read back from {}",
                disk.index,
                volume.path.display()
            ),
            expected: source_sha256,
            actual: sha256,
        });
    }
    progress.done(disk.index, size);
    Ok(WrittenDisk {
        index: disk.index,
        sha256,
        bytes_read: size,
        bytes_written,
        read_back,
    })
}

pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Volume {
            path: String::new(),
            detail: format!("the I/O thread ended: {e}"),
        })?
}

pub(crate) fn volume_error(path: &Path, detail: impl Into<String>) -> Error {
    Error::Volume {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Whether every byte is zero: compared a page at a time with a page of zeros, which is libc's `memcmp`, fast in
/// any build (a loop over words ran at a tenth of the speed in the unoptimized builds the tests use).
pub fn is_zero(bytes: &[u8]) -> bool {
    const ZEROS: [u8; 4096] = [0; 4096];
    bytes.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_all_zero_bytes_are_zero() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 65_537]));
        let mut chunk = vec![0u8; 65_537];
        chunk[65_536] = 1;
        assert!(!is_zero(&chunk), "a byte in the last, partial page");
        chunk[65_536] = 0;
        chunk[4_000] = 0x80;
        assert!(!is_zero(&chunk), "a byte in a whole page");
    }
}
