//! sha256 on a thread of its own, so hashing overlaps the network reads instead of adding to them; its state can
//! be saved at any byte and restored by a later process, so a resumed upload still hashes the whole disk.

use bytes::Bytes;
use sha2::digest::common::hazmat::{SerializableState, SerializedState};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

enum Feed {
    Bytes(Bytes),
    /// Many chunks in one message: one wake-up of the thread for all of them.
    Batch(Vec<Bytes>),
    /// Asks for the state after every byte fed before.
    Mark(oneshot::Sender<String>),
}

pub(crate) struct Hasher {
    feed: std::sync::mpsc::SyncSender<Feed>,
    thread: std::thread::JoinHandle<String>,
}

impl Hasher {
    pub(crate) fn start() -> Self {
        Self::resume(Sha256::new())
    }

    /// Goes on from `hash`, a state [`restore`]d.
    pub(crate) fn resume(mut hash: Sha256) -> Self {
        let (feed, incoming) = std::sync::mpsc::sync_channel::<Feed>(64);
        let thread = std::thread::spawn(move || {
            for item in incoming {
                match item {
                    Feed::Bytes(chunk) => hash.update(&chunk),
                    Feed::Batch(chunks) => chunks.iter().for_each(|c| hash.update(c)),
                    Feed::Mark(reply) => {
                        let _ = reply.send(save(&hash));
                    }
                }
            }
            crate::hex(&hash.finalize())
        });
        Self { feed, thread }
    }

    pub(crate) fn update(&self, chunk: Bytes) {
        // Blocks (the caller's thread) only when the hasher is 64 messages behind, which bounds memory.
        let _ = self.feed.send(Feed::Bytes(chunk));
    }

    /// As [`Self::update`] for each chunk, in order.
    pub(crate) fn update_batch(&self, chunks: Vec<Bytes>) {
        let _ = self.feed.send(Feed::Batch(chunks));
    }

    /// The state (as [`save`] writes it) after the bytes given so far, once the thread has hashed them.
    pub(crate) fn mark(&self) -> oneshot::Receiver<String> {
        let (reply, state) = oneshot::channel();
        let _ = self.feed.send(Feed::Mark(reply));
        state
    }

    /// The hex sha256 of every byte given (and of those before the state it resumed from).
    pub(crate) fn finish(self) -> String {
        drop(self.feed);
        self.thread.join().unwrap_or_default()
    }
}

/// `hash`'s state as hex: sha2's serialized state, the partial block included, so any byte is a place to stop.
pub(crate) fn save(hash: &Sha256) -> String {
    crate::hex(hash.serialize().as_slice())
}

/// The state [`save`] wrote; `None` for anything else.
pub(crate) fn restore(hex: &str) -> Option<Sha256> {
    let bytes = crate::unhex(hex)?;
    let state = SerializedState::<Sha256>::try_from(bytes.as_slice()).ok()?;
    Sha256::deserialize(&state).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn a_hash_resumed_from_its_saved_state_equals_one_pass() {
        let data = sample(3 << 20);
        let one_pass = crate::hex(&Sha256::digest(&data));
        // At a part boundary (whole MiB, so whole blocks), and mid-block.
        for cut in [1 << 20, (1 << 20) + 17] {
            let first = Hasher::start();
            first.update(Bytes::copy_from_slice(&data[..cut]));
            let state = first.mark().blocking_recv().unwrap();
            drop(first.finish());

            let second = Hasher::resume(restore(&state).unwrap());
            second.update(Bytes::copy_from_slice(&data[cut..]));
            assert_eq!(second.finish(), one_pass, "cut at {cut}");
        }
    }

    #[test]
    fn only_a_saved_state_restores() {
        assert!(restore(&save(&Sha256::new())).is_some());
        assert!(restore("").is_none());
        assert!(restore("zz").is_none());
        assert!(restore(&"00".repeat(7)).is_none());
    }
}
