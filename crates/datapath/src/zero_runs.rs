//! The source's sha256 with its long runs of zeros marked: the hash state where each run starts and where it
//! ends. A read-back that reaches a run's start in the same state, and finds the volume zero over the run, goes
//! on from the run's end state without hashing the zeros again; its final digest still proves every byte.

use bytes::Bytes;
use sha2::digest::common::hazmat::SerializableState;
use sha2::{Digest, Sha256};

/// Zeros are found in blocks of this size on a grid from byte 0 (O_DIRECT reads align to it too).
pub const GRAIN: u64 = 4096;
/// Shorter runs are hashed again: marking them would cost more than it saves.
const MIN_RUN: u64 = 1 << 20;

/// Bytes `start..end` of the source are zeros; `before` and `after` are sha256's serialized state there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZeroRun {
    pub start: u64,
    pub end: u64,
    pub before: Vec<u8>,
    pub after: Vec<u8>,
}

/// sha256 over a stream, marking its zero runs of at least [`MIN_RUN`] on the [`GRAIN`] grid.
#[derive(Default)]
pub struct ZeroRunHasher {
    hash: Sha256,
    offset: u64,
    /// The grid block in progress, when a chunk ended inside one.
    partial: Vec<u8>,
    /// The run in progress: where it began and the state there.
    open: Option<(u64, Vec<u8>)>,
    runs: Vec<ZeroRun>,
}

impl ZeroRunHasher {
    pub fn update(&mut self, mut bytes: &[u8]) {
        if !self.partial.is_empty() {
            let need = GRAIN as usize - self.partial.len();
            let take = need.min(bytes.len());
            self.partial.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.partial.len() < GRAIN as usize {
                return;
            }
            let block = std::mem::take(&mut self.partial);
            self.block(&block);
        }
        let whole = bytes.len() / GRAIN as usize * GRAIN as usize;
        for block in bytes[..whole].chunks_exact(GRAIN as usize) {
            self.block(block);
        }
        self.partial.extend_from_slice(&bytes[whole..]);
    }

    /// The hex digest and the zero runs, in order.
    pub fn finish(mut self) -> (String, Vec<ZeroRun>) {
        let tail = std::mem::take(&mut self.partial);
        if !tail.is_empty() {
            // A last block shorter than the grid is always hashed again.
            self.close_run();
            self.hash.update(&tail);
            self.offset += tail.len() as u64;
        }
        self.close_run();
        (crate::hex(&self.hash.finalize()), self.runs)
    }

    fn block(&mut self, block: &[u8]) {
        let zero = crate::direct::is_zero(block);
        match (zero, self.open.is_some()) {
            (true, false) => self.open = Some((self.offset, state(&self.hash))),
            (false, true) => self.close_run(),
            _ => {}
        }
        self.hash.update(block);
        self.offset += block.len() as u64;
    }

    fn close_run(&mut self) {
        if let Some((start, before)) = self.open.take()
            && self.offset - start >= MIN_RUN
        {
            self.runs.push(ZeroRun {
                start,
                end: self.offset,
                before,
                after: state(&self.hash),
            });
        }
    }
}

pub fn state(hash: &Sha256) -> Vec<u8> {
    hash.serialize().as_slice().to_vec()
}

pub fn resume(state: &[u8]) -> Option<Sha256> {
    let state = sha2::digest::common::hazmat::SerializedState::<Sha256>::try_from(state).ok()?;
    Sha256::deserialize(&state).ok()
}

/// A [`ZeroRunHasher`] on a thread of its own, so hashing overlaps the network reads.
pub struct ZeroRunThread {
    feed: std::sync::mpsc::SyncSender<Bytes>,
    thread: std::thread::JoinHandle<(String, Vec<ZeroRun>)>,
}

impl ZeroRunThread {
    pub fn start() -> Self {
        let (feed, incoming) = std::sync::mpsc::sync_channel::<Bytes>(64);
        let thread = std::thread::spawn(move || {
            let mut hasher = ZeroRunHasher::default();
            for chunk in incoming {
                hasher.update(&chunk);
            }
            hasher.finish()
        });
        Self { feed, thread }
    }

    pub fn update(&self, chunk: Bytes) {
        let _ = self.feed.send(chunk);
    }

    pub fn finish(self) -> (String, Vec<ZeroRun>) {
        drop(self.feed);
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> Vec<u8> {
        let mut bytes = vec![0u8; 5 << 20];
        // Data, a 2 MiB run, a 512 KiB gap (too short to mark), data, then zeros to the end (a run).
        bytes[..(1 << 20) + 5].fill(7);
        bytes[(3 << 20) + 100] = 1;
        bytes[(3 << 20) + (600 << 10)] = 2;
        bytes
    }

    #[test]
    fn the_digest_is_sha256_whatever_the_chunking_and_long_runs_are_marked() {
        let bytes = disk();
        let expected = crate::hex(&Sha256::digest(&bytes));
        for chunk in [1, 1000, 4096, 65_537, 1 << 20] {
            let mut hasher = ZeroRunHasher::default();
            for piece in bytes.chunks(chunk.min(bytes.len())) {
                hasher.update(piece);
            }
            let (digest, runs) = hasher.finish();
            assert_eq!(digest, expected, "chunks of {chunk}");
            let spans: Vec<_> = runs.iter().map(|r| (r.start, r.end)).collect();
            let after_data = (1 << 20) + 4096;
            let tail = (3 << 20) + (600 << 10) + 4096;
            assert_eq!(
                spans,
                [(after_data, 3 << 20), (tail, 5 << 20)],
                "chunks of {chunk}"
            );
            // Each run's states are sha256's at its ends.
            for run in &runs {
                let mut at_start = Sha256::new();
                at_start.update(&bytes[..run.start as usize]);
                assert_eq!(run.before, state(&at_start));
                let mut resumed = resume(&run.before).unwrap();
                resumed.update(&bytes[run.start as usize..run.end as usize]);
                assert_eq!(run.after, state(&resumed));
            }
        }
    }

    #[test]
    fn a_disk_of_data_has_no_runs_and_a_disk_of_zeros_one() {
        let mut hasher = ZeroRunHasher::default();
        hasher.update(&[9u8; 3 << 20]);
        assert!(hasher.finish().1.is_empty());
        let mut hasher = ZeroRunHasher::default();
        hasher.update(&vec![0u8; (2 << 20) + 10]);
        let (_, runs) = hasher.finish();
        assert_eq!(
            runs.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>(),
            [(0, 2 << 20)]
        );
    }
}
