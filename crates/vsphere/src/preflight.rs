//! Preflight reads of a disk's files through `/folder`, with the same datacenter path and session the
//! conversion will use: a wrong `dcPath`, a missing file or a disk Ferry cannot read shows here, before any
//! power change, instead of in the conversion after the VM was powered off.

use std::time::Duration;

use crate::datastore::{DatastorePath, Download};
use crate::error::{Error, Result};
use crate::file_lock::{Readability, probe_read};
use crate::session::Session;
use crate::vmdk::{Descriptor, Refusal};

/// A descriptor is a few hundred bytes; a larger "descriptor" is a binary sparse disk.
const DESCRIPTOR_LIMIT: usize = 64 * 1024;

/// What preflight found for one disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskCheck {
    /// One raw file of `bytes` bytes, readable through `/folder`.
    Readable { extent: DatastorePath, bytes: u64 },
    /// One raw file a running VM holds (vCenter answers a server error for it), so its length is the
    /// descriptor's: the copy reads it after power-off, or a snapshot's frozen base.
    Held { extent: DatastorePath, bytes: u64 },
    /// A disk Ferry must not copy, and why.
    Refused(Refusal),
}

/// Reads `disk_file`'s descriptor, judges it, and for a flat disk opens its extent to see that it is there and
/// as long as the descriptor says, unless a running VM holds it.
pub async fn check_disk(session: &Session, datacenter: &str, disk_file: &str) -> Result<DiskCheck> {
    let path = datastore_path(disk_file)?;
    let descriptor = read_descriptor(session, datacenter, &path).await?;
    if let Some(refusal) = descriptor.refusal() {
        return Ok(DiskCheck::Refused(refusal));
    }
    let extent = descriptor.flat_extent(disk_file)?;
    let extent_path = path.sibling(&extent.file);
    let expected = extent.sectors * 512;
    let probe = probe_read(session, datacenter, &extent_path, 1, Duration::ZERO).await?;
    if let Readability::Locked { .. } = probe {
        return Ok(DiskCheck::Held {
            extent: extent_path,
            bytes: expected,
        });
    }
    let download = Download::open(session, datacenter, &extent_path, 0).await?;
    if let Some(found) = download.total()
        && found != expected
    {
        return Err(Error::UnsupportedDisk {
            file: disk_file.to_string(),
            reason: format!(
                "its extent {extent_path} holds {found} bytes where the descriptor says {expected}"
            ),
        });
    }
    Ok(DiskCheck::Readable {
        extent: extent_path,
        bytes: expected,
    })
}

/// The parsed descriptor of `file`.
pub async fn read_descriptor(
    session: &Session,
    datacenter: &str,
    file: &DatastorePath,
) -> Result<Descriptor> {
    let mut download = Download::open(session, datacenter, file, 0).await?;
    let mut text = Vec::new();
    while let Some(chunk) = download.next_chunk().await? {
        text.extend_from_slice(&chunk);
        if text.len() > DESCRIPTOR_LIMIT {
            return Err(Error::UnsupportedDisk {
                file: file.to_string(),
                reason: "the descriptor is larger than 64 KiB: a monolithic sparse disk?".into(),
            });
        }
    }
    Descriptor::parse(&String::from_utf8_lossy(&text))
}

pub(crate) fn datastore_path(disk_file: &str) -> Result<DatastorePath> {
    DatastorePath::parse(disk_file).ok_or_else(|| Error::UnsupportedDisk {
        file: disk_file.to_string(),
        reason: "not a datastore path".into(),
    })
}
