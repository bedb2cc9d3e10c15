//! Writing into a volume CDI allocated: opened as CDI left it (never created, truncated or resized), locked
//! against a second writer, data blocks written and runs of zeros punched (so stale bytes of an earlier attempt
//! or a recycled device cannot survive), then synced. The full copy writes from byte 0; a warm migration's delta
//! writes its changed areas, each where it lies.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use rustix::fs::{Advice, FallocateFlags, FlockOperation, SeekFrom};

use crate::direct::{is_zero, volume_error};
use crate::error::{Error, Result};
use crate::spec::VolumeSpec;

/// Zero runs are found, and data written, in blocks of this size (a multiple of any file system's block).
const BLOCK: usize = 64 << 10;
/// Written data is handed to writeback in steps of this size.
const WRITEBACK_EVERY: u64 = 64 << 20;
/// Data blocks in a row are written with one call up to this size.
const WRITE_AT_MOST: usize = 4 << 20;

/// An open volume, checked large enough for the disk.
pub(crate) struct Target {
    file: File,
    path: PathBuf,
    /// Whether punching holes still works here; once refused, zeros are written.
    punch: bool,
    /// Written data from here on has not been handed to writeback yet.
    unflushed_from: u64,
}

impl Target {
    /// Opens the volume as CDI left it (never created, truncated or resized, since its size is CDI's), checked
    /// to hold `size` bytes, the source disk's.
    pub(crate) fn open(volume: &VolumeSpec, index: u32, size: u64) -> Result<Self> {
        let path = volume.path.clone();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::DiskImageMissing {
                    index,
                    path: path.display().to_string(),
                },
                _ => volume_error(&path, e.to_string()),
            })?;
        let capacity = rustix::fs::seek(&file, SeekFrom::End(0))
            .map_err(|e| volume_error(&path, format!("finding its size: {e}")))?;
        if capacity < size {
            return Err(Error::VolumeTooSmall {
                index,
                path: path.display().to_string(),
                size: capacity,
                needed: size,
            });
        }
        if !volume.block {
            // Two writers on one image would interleave; a pod of an earlier attempt may still be running.
            rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive)
                .map_err(|e| volume_error(&path, format!("another writer holds it ({e})")))?;
        }
        Ok(Self {
            file,
            path,
            punch: true,
            unflushed_from: 0,
        })
    }

    /// Writes each piece at its offset, then syncs once the stream reached `end`: data blocks are written,
    /// zero blocks punched. Blocks are cut from where each range starts (a piece that does not continue the
    /// one before starts a range). Returns the bytes of data written.
    pub(crate) fn write_from(
        mut self,
        mut pieces: tokio::sync::mpsc::Receiver<(u64, Bytes)>,
        end: u64,
    ) -> Result<u64> {
        // A block that straddles chunks is gathered here; whole blocks inside a chunk are sliced, not copied.
        let mut partial = BytesMut::new();
        let mut run = Run::default();
        let mut offset = 0u64;
        let mut written = 0u64;
        while let Some((at, mut chunk)) = pieces.blocking_recv() {
            if at != offset + partial.len() as u64 {
                if !partial.is_empty() {
                    written += self.take(&mut run, offset, partial.split().freeze())?;
                }
                written += self.flush(&mut run)?;
                offset = at;
            }
            if !partial.is_empty() {
                let take = (BLOCK - partial.len()).min(chunk.len());
                partial.extend_from_slice(&chunk.split_to(take));
                if partial.len() < BLOCK {
                    continue;
                }
                written += self.take(&mut run, offset, partial.split().freeze())?;
                offset += BLOCK as u64;
            }
            while chunk.len() >= BLOCK {
                written += self.take(&mut run, offset, chunk.split_to(BLOCK))?;
                offset += BLOCK as u64;
            }
            partial.extend_from_slice(&chunk);
        }
        if !partial.is_empty() {
            let len = partial.len() as u64;
            written += self.take(&mut run, offset, partial.freeze())?;
            offset += len;
        }
        written += self.flush(&mut run)?;
        if offset < end {
            // The source ended early; the caller reports the short read, nothing here counts.
            return Ok(written);
        }
        rustix::fs::fdatasync(&self.file)
            .map_err(|e| volume_error(&self.path, format!("syncing: {e}")))?;
        Ok(written)
    }

    /// Adds one block at `offset` to the run in progress, flushing the run when the block's kind differs.
    fn take(&mut self, run: &mut Run, offset: u64, block: Bytes) -> Result<u64> {
        let zero = is_zero(&block);
        let mut written = 0;
        if run.len() > 0 && (run.zero != zero || run.data_len >= WRITE_AT_MOST as u64) {
            written = self.flush(run)?;
        }
        if run.len() == 0 {
            run.start = offset;
            run.zero = zero;
        }
        if zero {
            run.zeros += block.len() as u64;
        } else {
            run.data_len += block.len() as u64;
            run.data.push(block);
        }
        Ok(written)
    }

    fn flush(&mut self, run: &mut Run) -> Result<u64> {
        let done = std::mem::take(run);
        if done.zero {
            self.zero(done.start, done.zeros)?;
            return Ok(0);
        }
        write_all_vectored_at(&self.file, &done.data, done.start)
            .map_err(|e| volume_error(&self.path, format!("at byte {}: {e}", done.start)))?;
        let end = done.start + done.data_len;
        if end - self.unflushed_from >= WRITEBACK_EVERY {
            // Starts writeback of what is written so far (DONTNEED writes dirty pages back and keeps them until
            // they are clean): the disk works while the download goes on, the final fdatasync has little
            // left, and the pod's page cache stays small.
            let len = std::num::NonZeroU64::new(end - self.unflushed_from);
            let _ = rustix::fs::fadvise(&self.file, self.unflushed_from, len, Advice::DontNeed);
            self.unflushed_from = end;
        }
        Ok(done.data_len)
    }

    /// Makes `len` bytes at `offset` read as zeros: a hole (files; a discard on thin block devices), else
    /// zeros written.
    fn zero(&mut self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if self.punch {
            let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            match rustix::fs::fallocate(&self.file, punch, offset, len) {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) => {
                    tracing::info!(path = %self.path.display(), "holes cannot be punched here; writing zeros");
                    self.punch = false;
                }
                Err(e) => return Err(volume_error(&self.path, format!("punching a hole: {e}"))),
            }
        }
        let zeros = vec![0u8; WRITE_AT_MOST];
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(zeros.len() as u64) as usize;
            self.file
                .write_all_at(&zeros[..n], at)
                .map_err(|e| volume_error(&self.path, format!("at byte {at}: {e}")))?;
            at += n as u64;
        }
        Ok(())
    }
}

/// Blocks of one kind in a row, from `start`.
#[derive(Default)]
struct Run {
    start: u64,
    zero: bool,
    zeros: u64,
    data: Vec<Bytes>,
    data_len: u64,
}

impl Run {
    fn len(&self) -> u64 {
        self.zeros + self.data_len
    }
}

/// Writes `blocks` one after the other from `offset`, in as few calls as the kernel takes them.
fn write_all_vectored_at(file: &File, blocks: &[Bytes], mut offset: u64) -> std::io::Result<()> {
    let (mut first, mut skip) = (0, 0);
    while first < blocks.len() {
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&blocks[first][skip..])
            .chain(blocks[first + 1..].iter().map(|b| &b[..]))
            .map(std::io::IoSlice::new)
            .collect();
        let mut n = rustix::io::pwritev(file, &slices, offset)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        offset += n as u64;
        while n > 0 {
            let left = blocks[first].len() - skip;
            if n < left {
                skip += n;
                n = 0;
            } else {
                n -= left;
                first += 1;
                skip = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::direct::{ReadBack, read_back};
    use std::os::unix::fs::MetadataExt;

    fn sha(bytes: &[u8]) -> String {
        use sha2::Digest;
        crate::hex(&sha2::Sha256::digest(bytes))
    }

    /// A disk of `blocks` 64 KiB blocks, `data` of them (every 10th from the start) random, the rest zeros.
    fn disk(blocks: usize, data: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; blocks * BLOCK];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for b in (0..blocks).step_by(10).take(data) {
            for byte in &mut bytes[b * BLOCK..(b + 1) * BLOCK] {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *byte = seed as u8 | 1;
            }
        }
        bytes
    }

    fn write(target: Target, source: &[u8], chunk: usize) -> Result<u64> {
        let (tx, rx) = tokio::sync::mpsc::channel(source.len() / chunk + 2);
        for (i, piece) in source.chunks(chunk).enumerate() {
            tx.try_send(((i * chunk) as u64, Bytes::copy_from_slice(piece)))
                .unwrap();
        }
        drop(tx);
        target.write_from(rx, source.len() as u64)
    }

    #[test]
    fn zeros_become_holes_stale_bytes_go_and_the_read_back_matches() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        // CDI's blank image: sparse and larger than the disk, with stale bytes a dead attempt left.
        let source = disk(200, 5);
        let file = File::create(&image).unwrap();
        file.set_len(source.len() as u64 + (1 << 20)).unwrap();
        file.write_all_at(&[0xAB; 8192], 20 * BLOCK as u64 + 7)
            .unwrap();
        drop(file);
        let volume = VolumeSpec {
            index: 0,
            path: image.clone(),
            block: false,
        };
        let target = Target::open(&volume, 0, source.len() as u64).unwrap();
        // Chunks that do not line up with the blocks.
        let written = write(target, &source, 100_000).unwrap();
        assert_eq!(
            written,
            5 * BLOCK as u64,
            "only the data blocks are written"
        );
        let allocated = std::fs::metadata(&image).unwrap().blocks() * 512;
        assert!(
            allocated <= 6 * BLOCK as u64,
            "{allocated} bytes allocated: the zeros stayed holes"
        );
        let (got, mode) = read_back(&image, source.len() as u64).unwrap();
        assert_eq!(got, sha(&source));
        // tmpfs refuses O_DIRECT; the read-back says how it read.
        assert!(matches!(mode, ReadBack::Direct | ReadBack::Buffered));
        // Only the disk's size counts: the image is larger.
        assert_eq!(
            std::fs::metadata(&image).unwrap().len(),
            source.len() as u64 + (1 << 20)
        );
    }

    #[test]
    fn a_short_or_missing_image_is_refused_before_any_write() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let volume = VolumeSpec {
            index: 3,
            path: image.clone(),
            block: false,
        };
        let e = Target::open(&volume, 3, 1 << 20).err().unwrap();
        assert_eq!(e.reason(), "DiskImageMissing");
        File::create(&image).unwrap().set_len(1 << 19).unwrap();
        let e = Target::open(&volume, 3, 1 << 20).err().unwrap();
        assert_eq!(
            (e.reason().as_str(), e.class()),
            ("VolumeTooSmall", ferry_types::ErrorClass::Permanent)
        );
        assert!(e.to_string().contains("filesystemOverhead"), "{e}");
        assert_eq!(
            std::fs::metadata(&image).unwrap().len(),
            1 << 19,
            "untouched"
        );
    }

    #[test]
    fn a_second_writer_on_one_image_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        File::create(&image).unwrap().set_len(1 << 20).unwrap();
        let volume = VolumeSpec {
            index: 0,
            path: image,
            block: false,
        };
        let first = Target::open(&volume, 0, 1 << 20).unwrap();
        let e = Target::open(&volume, 0, 1 << 20).err().unwrap();
        assert_eq!(e.reason(), "VolumeWriteFailed");
        drop(first);
        assert!(Target::open(&volume, 0, 1 << 20).is_ok());
    }

    #[test]
    fn a_read_back_of_changed_bytes_differs() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let source = disk(30, 3);
        std::fs::write(&image, &source).unwrap();
        assert_eq!(
            read_back(&image, source.len() as u64).unwrap().0,
            sha(&source)
        );
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap();
        file.write_all_at(&[1], 15 * BLOCK as u64).unwrap();
        assert_ne!(
            read_back(&image, source.len() as u64).unwrap().0,
            sha(&source)
        );
        let e = read_back(&image, source.len() as u64 + 1).unwrap_err();
        assert_eq!(e.reason(), "ShortRead");
    }
}
