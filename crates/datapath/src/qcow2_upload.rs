//! A qcow2 staged as it is made: the download is hashed, cut into clusters and encoded ([`crate::qcow2`]) while
//! the parts upload, so reading the source, encoding and uploading overlap and nothing touches a local disk.
//! The first part holds the header, which is known only at the end: it stays in memory and is sent last (S3
//! orders parts by number, not by arrival). Not resumable: a new attempt reads the source again, after aborting
//! the upload the dead one left (found through its journal, which exists only for that).

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use object_store::multipart::PartId;
use object_store::{MultipartId, PutPayloadMut};
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::hash::Hasher;
use crate::qcow2::{CLUSTER, Encoder, HEADER_LENGTH};
use crate::staging::{PartPlan, SourceIdentity, Staging, UploadJournal};

/// Bytes handed to the hasher at once; 64 batches queued at most (16 MiB).
const HASH_BATCH: usize = 256 << 10;

/// What one disk's streamed qcow2 came to.
pub(crate) struct Streamed {
    pub source_sha256: String,
    pub object_bytes: u64,
    pub data_clusters: u64,
}

/// Streams `chunks` (the source disk, `size` bytes from byte 0) into the qcow2 object `name`.
pub(crate) struct Qcow2Upload<'a> {
    parts: Parts<'a>,
    encoder: Encoder,
    hasher: Hasher,
    /// Pieces of the next guest cluster, sliced from the chunks it straddles (never copied).
    pending: Vec<Bytes>,
    pending_len: usize,
    /// Chunks not yet handed to the hasher: a download's chunks are small, and the thread wakes once a batch.
    unhashed: Vec<Bytes>,
    unhashed_len: usize,
    received: u64,
    size: u64,
    index: u32,
}

impl<'a> Qcow2Upload<'a> {
    /// Starts the upload, after aborting one a dead attempt left.
    pub(crate) async fn start(
        staging: &'a Staging,
        name: &str,
        source: &SourceIdentity,
        index: u32,
        size: u64,
    ) -> Result<Self> {
        // At most the disk padded to whole clusters, plus its tables (8 bytes per cluster mapped, 2 per cluster
        // counted) and a few clusters.
        let bound = size.next_multiple_of(CLUSTER as u64) + size / 4096 + (4 << 20);
        let plan = PartPlan::of(name, bound)?;
        if let Some(left) = staging.journal(name).await? {
            tracing::info!(
                object = name,
                "aborting the unfinished upload an earlier attempt left"
            );
            staging.abort_upload(name, &left.upload_id).await?;
        }
        let id = staging.create_upload(name).await?;
        let journal = UploadJournal {
            source: source.clone(),
            format: "qcow2".into(),
            object_bytes: bound,
            part_bytes: plan.part_bytes,
            upload_id: id.clone(),
            parts: Vec::new(),
            sha256_state: String::new(),
        };
        staging.write_journal(name, &journal).await?;
        let mut parts = Parts::new(staging, name, id, plan);
        parts.push(Encoder::header_cluster()).await?;
        Ok(Self {
            parts,
            encoder: Encoder::new(size),
            hasher: Hasher::start(),
            pending: Vec::new(),
            pending_len: 0,
            unhashed: Vec::new(),
            unhashed_len: 0,
            received: 0,
            size,
            index,
        })
    }

    /// Takes the next bytes of the source.
    pub(crate) async fn push(&mut self, mut chunk: Bytes) -> Result<()> {
        self.received += chunk.len() as u64;
        if self.received > self.size {
            return Err(Error::ShortRead {
                index: self.index,
                got: self.received,
                expected: self.size,
            });
        }
        self.unhashed_len += chunk.len();
        self.unhashed.push(chunk.clone());
        if self.unhashed_len >= HASH_BATCH {
            self.unhashed_len = 0;
            self.hasher.update_batch(std::mem::take(&mut self.unhashed));
        }
        while !chunk.is_empty() {
            let want = self.encoder.next_len() - self.pending_len;
            let piece = chunk.split_to(want.min(chunk.len()));
            self.pending_len += piece.len();
            self.pending.push(piece);
            if self.pending_len == self.encoder.next_len() {
                self.pending_len = 0;
                let cluster = std::mem::take(&mut self.pending);
                for out in self.encoder.cluster(cluster) {
                    self.parts.push(out).await?;
                }
            }
        }
        Ok(())
    }

    /// Writes the tables, the header into the first part, sends it and completes the upload. Fails without
    /// completing, and aborts the upload, when the source ended before `size` bytes or a part failed.
    pub(crate) async fn finish(self) -> Result<Streamed> {
        let Self {
            mut parts,
            encoder,
            hasher,
            unhashed,
            received,
            size,
            index,
            ..
        } = self;
        let outcome = async {
            if received != size {
                return Err(Error::ShortRead {
                    index,
                    got: received,
                    expected: size,
                });
            }
            let finished = encoder.finish();
            for piece in finished.tail {
                parts.push(piece).await?;
            }
            let object_bytes = parts.finish(&finished.header).await?;
            debug_assert_eq!(object_bytes, finished.bytes);
            Ok((object_bytes, finished.data_clusters))
        }
        .await;
        hasher.update_batch(unhashed);
        match outcome {
            Ok((object_bytes, data_clusters)) => Ok(Streamed {
                source_sha256: hasher.finish(),
                object_bytes,
                data_clusters,
            }),
            Err(e) => {
                parts.abort().await;
                Err(e)
            }
        }
    }

    /// Drops the upload and its journal after a failure, so nothing of it stays in the store.
    pub(crate) async fn abort(mut self) {
        self.parts.abort().await;
    }
}

/// A multipart upload whose first part is held back until [`Parts::finish`].
struct Parts<'a> {
    staging: &'a Staging,
    name: String,
    id: MultipartId,
    part_bytes: usize,
    in_flight: usize,
    first: BytesMut,
    filling: PutPayloadMut,
    next: usize,
    bytes: u64,
    tasks: JoinSet<(usize, object_store::Result<PartId>)>,
    sent: BTreeMap<usize, PartId>,
}

impl<'a> Parts<'a> {
    fn new(staging: &'a Staging, name: &str, id: MultipartId, plan: PartPlan) -> Self {
        Self {
            staging,
            name: name.to_string(),
            id,
            part_bytes: plan.part_bytes as usize,
            in_flight: plan.in_flight.max(1),
            first: BytesMut::with_capacity(plan.part_bytes as usize),
            filling: PutPayloadMut::new(),
            next: 1,
            bytes: 0,
            tasks: JoinSet::new(),
            sent: BTreeMap::new(),
        }
    }

    async fn push(&mut self, mut piece: Bytes) -> Result<()> {
        self.bytes += piece.len() as u64;
        if self.first.len() < self.part_bytes {
            let take = (self.part_bytes - self.first.len()).min(piece.len());
            self.first.extend_from_slice(&piece.split_to(take));
        }
        while !piece.is_empty() {
            let room = self.part_bytes - self.filling.content_length();
            self.filling.push(piece.split_to(room.min(piece.len())));
            if self.filling.content_length() == self.part_bytes {
                // As a raw upload: `in_flight` parts at most, the held first one on top (the Job's memory
                // limit counts it).
                self.settle(self.in_flight - 1).await?;
                self.send_filling();
            }
        }
        Ok(())
    }

    async fn finish(&mut self, header: &[u8; HEADER_LENGTH]) -> Result<u64> {
        if self.filling.content_length() > 0 {
            self.send_filling();
        }
        self.first[..HEADER_LENGTH].copy_from_slice(header);
        let first = std::mem::take(&mut self.first).freeze();
        self.send(0, first.into());
        self.settle(0).await?;
        let parts: Vec<PartId> = std::mem::take(&mut self.sent).into_values().collect();
        if parts.len() != self.next {
            return Err(Error::Staging {
                url: self.staging.url_of(&self.name),
                detail: format!("{} of {} parts uploaded", parts.len(), self.next),
            });
        }
        self.staging
            .complete_upload(&self.name, &self.id, parts)
            .await?;
        if let Err(e) = self.staging.delete_journal(&self.name).await {
            tracing::warn!(object = %self.name, "removing the finished upload's journal: {e}");
        }
        Ok(self.bytes)
    }

    fn send_filling(&mut self) {
        let payload = std::mem::take(&mut self.filling).freeze();
        let index = self.next;
        self.next += 1;
        self.send(index, payload);
    }

    fn send(&mut self, index: usize, payload: object_store::PutPayload) {
        let (parts, path, id) = (
            self.staging.parts(),
            self.staging.path(&self.name),
            self.id.clone(),
        );
        self.tasks
            .spawn(async move { (index, parts.put_part(&path, &id, index, payload).await) });
    }

    /// Waits until at most `tasks` parts are in flight.
    async fn settle(&mut self, tasks: usize) -> Result<()> {
        while self.tasks.len() > tasks {
            let Some(joined) = self.tasks.join_next().await else {
                break;
            };
            let (index, sent) = joined.map_err(|e| Error::Staging {
                url: self.staging.url_of(&self.name),
                detail: format!("a part's upload stopped: {e}"),
            })?;
            let part = sent.map_err(|e| self.staging.upload_error(&self.name, e))?;
            self.sent.insert(index, part);
        }
        Ok(())
    }

    async fn abort(&mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        if let Err(e) = self.staging.abort_upload(&self.name, &self.id).await {
            tracing::warn!(object = %self.name, "aborting the upload: {e}");
            return;
        }
        let _ = self.staging.delete_journal(&self.name).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    const NAME: &str = "disk-0.qcow2";

    fn source() -> SourceIdentity {
        SourceIdentity {
            vm_uuid: "4210".into(),
            disk_file: "[ds] vm/vm.vmdk".into(),
            capacity_bytes: 0,
        }
    }

    /// 40 MiB and a bit: data in the first 8 MiB, zeros, data again from 24 MiB, so the object spans more than
    /// one 16 MiB part and its first part (the held one) holds data as well as the header.
    fn disk() -> Vec<u8> {
        // A VMDK extent is whole 512-byte sectors, not always whole clusters.
        let len = (40 << 20) + 25 * 512;
        (0..len)
            .map(|i| match i >> 20 {
                8..24 => 0,
                _ => (i * 7 % 253) as u8 | 1,
            })
            .collect()
    }

    #[tokio::test]
    async fn the_object_is_a_qcow2_qemu_checks_clean_and_reads_as_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = Staging::in_dir(dir.path());
        let data = disk();
        let mut upload = Qcow2Upload::start(&store, NAME, &source(), 0, data.len() as u64)
            .await
            .unwrap();
        assert!(
            store.journal(NAME).await.unwrap().is_some(),
            "findable to abort"
        );
        for chunk in data.chunks(100_000) {
            upload.push(Bytes::copy_from_slice(chunk)).await.unwrap();
        }
        let streamed = upload.finish().await.unwrap();
        assert_eq!(streamed.source_sha256, crate::hex(&Sha256::digest(&data)));
        let object = dir.path().join(NAME);
        assert_eq!(
            std::fs::metadata(&object).unwrap().len(),
            streamed.object_bytes
        );
        // 16 MiB of zeros are not in it.
        assert!(streamed.object_bytes < data.len() as u64 - (15 << 20));
        assert_eq!(store.journal(NAME).await.unwrap(), None);
        assert!(!dir.path().join(format!("{NAME}.parts")).exists());

        let raw = dir.path().join("disk.raw");
        std::fs::write(&raw, &data).unwrap();
        for args in [
            vec!["check", "-f", "qcow2", object.to_str().unwrap()],
            vec![
                "compare",
                "-f",
                "qcow2",
                "-F",
                "raw",
                object.to_str().unwrap(),
                raw.to_str().unwrap(),
            ],
        ] {
            let out = std::process::Command::new("qemu-img")
                .args(&args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "qemu-img {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[tokio::test]
    async fn a_short_source_completes_nothing_and_a_dead_attempt_is_aborted_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let store = Staging::in_dir(dir.path());
        let data = disk();
        let size = data.len() as u64;

        let mut short = Qcow2Upload::start(&store, NAME, &source(), 2, size)
            .await
            .unwrap();
        short
            .push(Bytes::copy_from_slice(&data[..30 << 20]))
            .await
            .unwrap();
        let e = short.finish().await.err().unwrap();
        assert_eq!(e.reason(), "ShortRead", "{e}");
        assert!(e.to_string().contains("disk 2"), "{e}");
        assert!(!dir.path().join(NAME).exists());
        assert!(!dir.path().join(format!("{NAME}.parts")).exists());
        assert_eq!(store.journal(NAME).await.unwrap(), None);

        // An attempt that dies leaves its upload and journal; the next one aborts that upload first.
        let mut dead = Qcow2Upload::start(&store, NAME, &source(), 0, size)
            .await
            .unwrap();
        dead.push(Bytes::copy_from_slice(&data[..20 << 20]))
            .await
            .unwrap();
        let left = store.journal(NAME).await.unwrap().unwrap().upload_id;
        std::mem::forget(dead);
        let parts = dir.path().join(format!("{NAME}.parts"));
        assert!(parts.join(&left).exists());
        let next = Qcow2Upload::start(&store, NAME, &source(), 0, size)
            .await
            .unwrap();
        assert!(!parts.join(&left).exists(), "the dead upload is aborted");
        next.abort().await;
        assert!(!parts.exists());
        assert_eq!(store.journal(NAME).await.unwrap(), None);
    }
}
