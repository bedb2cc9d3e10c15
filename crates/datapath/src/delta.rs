//! A warm migration's delta: the areas Changed Block Tracking lists as written between two snapshots, read from
//! the newer snapshot's frozen base with bounded Range GETs and written where they lie in the volume (zeros
//! punched, as the full copy does). Then the volume is synced and the same areas read back past the page cache;
//! only a read-back that hashes to what was read counts. What this proves: the volume holds, over those areas,
//! the bytes the source held at the snapshot; the rest of the volume is what earlier rounds proved.

use ferry_vsphere::Session;
use ferry_vsphere::cbt::Area;
use ferry_vsphere::datastore::{DatastorePath, Download};

use crate::direct::{ReadBack, blocking, volume_error};
use crate::error::{Error, Result};
use crate::hash::Hasher;
use crate::progress::Progress;
use crate::read_back::read_back_ranges;
use crate::spec::VolumeSpec;
use crate::volume_writer::Target;

/// One disk's delta written into its volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenDelta {
    pub index: u32,
    pub areas: usize,
    pub bytes_read: u64,
    /// Bytes of data written; zero blocks were punched instead.
    pub bytes_written: u64,
    /// The sha256 of the areas' bytes one after the other, as read from the source and read back.
    pub areas_sha256: String,
    pub read_back: ReadBack,
}

/// One disk's changes to copy: the flat file they are read from (a snapshot's frozen base, or the base of a
/// powered-off VM), the disk's size, and the areas, ordered and disjoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedDisk {
    pub index: u32,
    pub extent: DatastorePath,
    pub size: u64,
    pub areas: Vec<Area>,
}

/// Copies the changed areas of one disk into its volume.
pub async fn write_areas(
    session: &Session,
    datacenter: &str,
    disk: &ChangedDisk,
    volume: &VolumeSpec,
    progress: &Progress,
) -> Result<WrittenDelta> {
    let (index, areas, disk_size, extent) = (disk.index, &disk.areas, disk.size, &disk.extent);
    if let Some(bad) = areas.windows(2).find(|w| w[1].start < w[0].end()) {
        return Err(Error::Spec(format!(
            "disk {index}: changed areas out of order at byte {}",
            bad[1].start
        )));
    }
    if let Some(last) = areas.last().filter(|a| a.end() > disk_size) {
        return Err(Error::Spec(format!(
            "disk {index}: a changed area ends at byte {}, past the disk's {disk_size}",
            last.end()
        )));
    }
    let total: u64 = areas.iter().map(|a| a.length).sum();
    let target = {
        let volume = volume.clone();
        blocking(move || Target::open(&volume, index, disk_size)).await?
    };
    let end = areas.last().map_or(0, Area::end);
    let (pieces, received) = tokio::sync::mpsc::channel(16);
    let writer = tokio::task::spawn_blocking(move || target.write_from(received, end));
    let hasher = Hasher::start();
    let mut read = 0u64;
    let mut copied = Ok(());
    'areas: for area in areas {
        let mut download =
            Download::open_range(session, datacenter, extent, area.start..area.end()).await?;
        while let Some(chunk) = download.next_chunk().await? {
            hasher.update(chunk.clone());
            let at = download.offset() - chunk.len() as u64;
            read += chunk.len() as u64;
            if pieces.send((at, chunk)).await.is_err() {
                break 'areas; // the writer failed: its error is the one to report
            }
            progress.bytes(index, read, total);
        }
        if download.offset() != area.end() {
            copied = Err(Error::ShortRead {
                index,
                got: download.offset(),
                expected: area.end(),
            });
            break;
        }
    }
    drop(pieces);
    let bytes_written = writer
        .await
        .map_err(|e| volume_error(&volume.path, e.to_string()))??;
    copied?;
    let source_sha256 = hasher.finish();
    let (path, ranges) = (volume.path.clone(), areas.clone());
    let (sha256, read_back) = blocking(move || read_back_ranges(&path, &ranges)).await?;
    if sha256 != source_sha256 {
        return Err(Error::ChecksumMismatch {
            what: format!(
                "the changed areas of disk {index} read back from {}",
                volume.path.display()
            ),
            expected: source_sha256,
            actual: sha256,
        });
    }
    progress.done(index, total);
    Ok(WrittenDelta {
        index,
        areas: areas.len(),
        bytes_read: read,
        bytes_written,
        areas_sha256: sha256,
        read_back,
    })
}
