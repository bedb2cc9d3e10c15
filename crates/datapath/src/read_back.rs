//! Reading a written volume back past the page cache (O_DIRECT, or buffered after dropping the cache where a file
//! system refuses it) into the sha256 the source was hashed to. Holes (SEEK_DATA) hash as the zeros they read as
//! without being read; over the source's long zero runs the hash is not even computed again: a read-back that
//! reaches a run's start in the source's state, and finds the volume zero over it, takes the source's state at
//! the run's end.

use std::path::{Path, PathBuf};

use rustix::fd::OwnedFd;
use rustix::fs::{OFlags, SeekFrom};
use sha2::{Digest, Sha256};

use crate::direct::{ReadBack, is_zero, volume_error};
use crate::error::{Error, Result};
use crate::zero_runs::{ZeroRun, resume, state};

/// Buffers for O_DIRECT are aligned to this (the largest logical block size in use).
const ALIGN: usize = 4096;
const READ_AT_ONCE: usize = 4 << 20;
/// Areas shorter than this are read back on the calling thread.
const SMALL_AREA: u64 = 8 << 20;
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// The sha256 of the first `size` bytes of `path`, every byte hashed.
pub fn read_back(path: &Path, size: u64) -> Result<(String, ReadBack)> {
    read_back_over(path, size, &[])
}

/// The sha256 of the first `size` bytes of `path`, skipping the hashing of `runs` (the source's zero runs, in
/// order) where the volume is zero over them. Once a run does not match, every byte after it is hashed, so a
/// volume that differs from the source still gets the digest it really has.
pub(crate) fn read_back_over(
    path: &Path,
    size: u64,
    runs: &[ZeroRun],
) -> Result<(String, ReadBack)> {
    let mut volume = Volume::open(path)?;
    let length = rustix::fs::seek(&volume.fd, SeekFrom::End(0))
        .map_err(|e| volume.error("finding its size", e))?;
    if length < size {
        return Err(Error::ShortRead {
            index: 0,
            got: length,
            expected: size,
        });
    }
    let (mut hash, mut pos) = (Sha256::new(), 0u64);
    for run in runs.iter().filter(|r| r.end <= size) {
        if run.start < pos {
            continue;
        }
        volume.hash(&mut hash, pos, run.start)?;
        pos = run.start;
        if state(&hash) != run.before || !volume.is_zero(run.start, run.end)? {
            break;
        }
        match resume(&run.after) {
            Some(after) => {
                hash = after;
                pos = run.end;
            }
            None => break,
        }
    }
    volume.hash(&mut hash, pos, size)?;
    Ok((crate::hex(&hash.finalize()), volume.mode))
}

/// The sha256 of `areas` of `path` read one after the other (a warm migration's delta, read back).
pub(crate) fn read_back_ranges(
    path: &Path,
    areas: &[ferry_vsphere::cbt::Area],
) -> Result<(String, ReadBack)> {
    let mut volume = Volume::open(path)?;
    let mut hash = Sha256::new();
    let mut buf = Aligned::new();
    for area in areas {
        if area.length >= SMALL_AREA {
            volume.hash(&mut hash, area.start, area.end())?;
            continue;
        }
        // A small area (CBT's are often one 64 KiB block): read here, without a reading thread to start.
        let mut pos = area.start;
        while pos < area.end() {
            let n = volume.read_into(&mut buf, pos, area.end())?;
            hash.update(&*buf.get(n));
            pos += n as u64;
        }
    }
    Ok((crate::hex(&hash.finalize()), volume.mode))
}

/// A volume open for reading back.
struct Volume {
    fd: OwnedFd,
    path: PathBuf,
    mode: ReadBack,
}

/// A buffer of [`READ_AT_ONCE`] bytes aligned for O_DIRECT.
struct Aligned {
    storage: Vec<u8>,
    skew: usize,
}

impl Aligned {
    fn new() -> Self {
        let storage = vec![0u8; READ_AT_ONCE + ALIGN];
        let skew = (ALIGN - storage.as_ptr() as usize % ALIGN) % ALIGN;
        Self { storage, skew }
    }

    fn get(&mut self, len: usize) -> &mut [u8] {
        &mut self.storage[self.skew..self.skew + len]
    }
}

/// What the reading thread hands the hashing one, in order.
enum Piece {
    Zeros(u64),
    Data(Aligned, usize),
}

impl Volume {
    fn open(path: &Path) -> Result<Self> {
        let direct = OFlags::RDONLY | OFlags::DIRECT | OFlags::CLOEXEC;
        let (fd, mode) = match rustix::fs::open(path, direct, rustix::fs::Mode::empty()) {
            Ok(fd) => (fd, ReadBack::Direct),
            Err(rustix::io::Errno::INVAL) => (buffered(path)?, ReadBack::Buffered),
            Err(e) => return Err(volume_error(path, format!("opening to read back: {e}"))),
        };
        Ok(Self {
            fd,
            path: path.to_path_buf(),
            mode,
        })
    }

    fn error(&self, what: &str, e: rustix::io::Errno) -> Error {
        volume_error(&self.path, format!("{what}: {e}"))
    }

    /// Where the next data at or after `pos` starts and where it ends, both within `..end` (`end` if none).
    fn next_data(&self, pos: u64, end: u64) -> (u64, u64) {
        let data = match rustix::fs::seek(&self.fd, SeekFrom::Data(pos)) {
            Ok(at) => at.min(end),
            Err(rustix::io::Errno::NXIO) => end,
            // No SEEK_DATA here (a block device): all of it is data.
            Err(_) => pos,
        };
        if data >= end {
            return (end, end);
        }
        let hole = match rustix::fs::seek(&self.fd, SeekFrom::Hole(data)) {
            Ok(at) => at.clamp(data + 1, end),
            Err(_) => end,
        };
        (data, hole)
    }

    /// Reads up to [`READ_AT_ONCE`] bytes of `pos..end` into `buf`; at least one. Returns how many.
    fn read_into(&mut self, buf: &mut Aligned, pos: u64, end: u64) -> Result<usize> {
        let want = (end - pos).min(READ_AT_ONCE as u64) as usize;
        let aligned = want.next_multiple_of(ALIGN);
        loop {
            match rustix::io::pread(&self.fd, buf.get(aligned), pos) {
                Ok(0) => {
                    return Err(Error::ShortRead {
                        index: 0,
                        got: pos,
                        expected: end,
                    });
                }
                Ok(n) => return Ok(n.min(want)),
                Err(rustix::io::Errno::INVAL) if self.mode == ReadBack::Direct => {
                    // An offset or length this file system will not read directly.
                    self.mode = ReadBack::Buffered;
                    self.fd = buffered(&self.path)?;
                }
                Err(e) => return Err(self.error(&format!("reading at byte {pos}"), e)),
            }
        }
    }

    /// Hashes `from..to` as the volume reads: holes as zeros, without reading them. One thread reads while
    /// this one hashes, so the device and the CPU work at once.
    fn hash(&mut self, hash: &mut Sha256, from: u64, to: u64) -> Result<()> {
        let path = self.path.clone();
        let (full, pieces) = std::sync::mpsc::sync_channel::<Piece>(2);
        let (empty, buffers) = std::sync::mpsc::sync_channel::<Aligned>(3);
        for _ in 0..3 {
            let _ = empty.send(Aligned::new());
        }
        std::thread::scope(|scope| {
            let reader = scope.spawn(move || -> Result<()> {
                let mut pos = from;
                while pos < to {
                    let (data, hole) = self.next_data(pos, to);
                    if data > pos && full.send(Piece::Zeros(data - pos)).is_err() {
                        return Ok(());
                    }
                    pos = data;
                    while pos < hole {
                        let Ok(mut buf) = buffers.recv() else {
                            return Ok(());
                        };
                        let n = self.read_into(&mut buf, pos, hole)?;
                        pos += n as u64;
                        if full.send(Piece::Data(buf, n)).is_err() {
                            return Ok(());
                        }
                    }
                }
                Ok(())
            });
            for piece in pieces {
                match piece {
                    Piece::Zeros(len) => hash_zeros(hash, len),
                    Piece::Data(mut buf, n) => {
                        hash.update(&*buf.get(n));
                        let _ = empty.send(buf);
                    }
                }
            }
            reader
                .join()
                .unwrap_or_else(|_| Err(volume_error(&path, "the reading thread panicked")))
        })
    }

    /// Whether `from..to` reads as zeros: holes are, data is read and looked at.
    fn is_zero(&mut self, from: u64, to: u64) -> Result<bool> {
        let mut pos = from;
        while pos < to {
            let (data, hole) = self.next_data(pos, to);
            pos = data;
            // Data inside a zero run is rare (a Block device that cannot discard): a buffer only then.
            let mut buf = (pos < hole).then(Aligned::new);
            while let Some(buf) = buf.as_mut().filter(|_| pos < hole) {
                let n = self.read_into(buf, pos, hole)?;
                if !is_zero(buf.get(n)) {
                    return Ok(false);
                }
                pos += n as u64;
            }
        }
        Ok(true)
    }
}

/// Opens `path` for buffered reading after dropping its cached pages (already synced, so they can go).
fn buffered(path: &Path) -> Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, rustix::fs::Mode::empty())
        .map_err(|e| volume_error(path, format!("opening to read back: {e}")))?;
    let _ = rustix::fs::fadvise(&fd, 0, None, rustix::fs::Advice::DontNeed);
    Ok(fd)
}

fn hash_zeros(hash: &mut Sha256, mut len: u64) {
    while len > 0 {
        let n = len.min(ZEROS.len() as u64) as usize;
        hash.update(&ZEROS[..n]);
        len -= n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zero_runs::ZeroRunHasher;
    use std::os::unix::fs::FileExt;

    /// 6 MiB: data, a 3 MiB zero run, data.
    fn source() -> Vec<u8> {
        let mut bytes = vec![0u8; 6 << 20];
        bytes[..1 << 20].fill(3);
        bytes[4 << 20..].fill(5);
        bytes
    }

    fn runs(bytes: &[u8]) -> (String, Vec<ZeroRun>) {
        let mut hasher = ZeroRunHasher::default();
        hasher.update(bytes);
        hasher.finish()
    }

    #[test]
    fn over_a_zero_run_the_read_back_resumes_from_the_source_state_and_still_proves_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let bytes = source();
        let (sha, runs) = runs(&bytes);
        assert_eq!(runs.len(), 1);
        std::fs::write(&image, &bytes).unwrap();
        assert_eq!(
            read_back_over(&image, bytes.len() as u64, &runs).unwrap().0,
            sha
        );

        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap();
        // A stale byte inside the run: the run does not match, so it is hashed and the digest differs.
        file.write_all_at(&[1], 2 << 20).unwrap();
        let (stale, _) = read_back_over(&image, bytes.len() as u64, &runs).unwrap();
        assert_ne!(stale, sha);
        assert_eq!(stale, read_back(&image, bytes.len() as u64).unwrap().0);
        // A changed byte before the run: the state at the run's start differs, and so does the digest.
        file.write_all_at(&[0], 2 << 20).unwrap();
        file.write_all_at(&[9], 100).unwrap();
        let (changed, _) = read_back_over(&image, bytes.len() as u64, &runs).unwrap();
        assert_ne!(changed, sha);
        assert_eq!(changed, read_back(&image, bytes.len() as u64).unwrap().0);
        // And after it.
        file.write_all_at(&[3], 100).unwrap();
        file.write_all_at(&[9], (5 << 20) + 1).unwrap();
        assert_ne!(
            read_back_over(&image, bytes.len() as u64, &runs).unwrap().0,
            sha
        );
    }
}
