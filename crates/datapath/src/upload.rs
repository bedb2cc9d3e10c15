//! A raw disk's multipart upload, which a later Job attempt resumes. object_store 0.14 cannot list an upload's
//! parts, so the upload keeps a journal beside the object ([`UploadJournal`]): the upload's id, the parts finished
//! in a row from the first, and the sha256 state after them. An attempt that dies (pod evicted, OOM, node lost)
//! leaves the upload and its journal; the next one reads the journal, restarts the download where those parts
//! end, and uploads only the parts after them. A part that was in flight is simply sent again: S3 keeps the last
//! upload of a part number.
//!
//! Only raw resumes: a qcow2's encoder state (`qcow2_upload.rs`) dies with the pod, so a new attempt reads the
//! source again anyway.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use object_store::PutPayloadMut;
use object_store::multipart::PartId;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinSet};

use crate::error::{Error, Result};
use crate::hash::{self, Hasher};
use crate::staging::{PartPlan, SourceIdentity, Staging, UploadJournal};

/// What is uploaded: a journal resumes only for the same object of the same source, cut in the same parts.
pub(crate) struct Target<'a> {
    pub name: &'a str,
    pub source: &'a SourceIdentity,
    pub format: &'a str,
    pub bytes: u64,
    pub plan: PartPlan,
}

impl Target<'_> {
    fn matches(&self, journal: &UploadJournal) -> bool {
        journal.source == *self.source
            && journal.format == self.format
            && journal.object_bytes == self.bytes
            && journal.part_bytes == self.plan.part_bytes
    }
}

/// A part's index and how its upload ended.
type Sent = (usize, object_store::Result<PartId>);

/// An upload in progress: bytes go in with [`Upload::push`], in order from [`Upload::offset`]; each full part
/// is sent while the next fills, `plan.in_flight` at most (the one filling included, as before).
pub(crate) struct Upload<'a> {
    staging: &'a Staging,
    name: String,
    in_flight: usize,
    journal: UploadJournal,
    resumed: bool,
    hasher: Hasher,
    /// The part filling, and its index.
    buffer: PutPayloadMut,
    next: usize,
    tasks: JoinSet<Sent>,
    /// Parts finished while one before them is still in flight.
    waiting: BTreeMap<usize, PartId>,
    /// The hash state at the end of each part sent, once the hasher gets there.
    states: HashMap<usize, oneshot::Receiver<String>>,
}

impl<'a> Upload<'a> {
    /// Goes on with the upload of `target` a journal describes; otherwise starts a new one, aborting the upload
    /// of a journal that describes something else.
    pub(crate) async fn open(staging: &'a Staging, target: &Target<'_>) -> Result<Self> {
        match staging.journal(target.name).await? {
            Some(journal) if target.matches(&journal) => {
                if let Some(hash) = hash::restore(&journal.sha256_state) {
                    return Ok(Self::new(staging, target, journal, hash, true));
                }
                tracing::warn!(
                    object = target.name,
                    "the upload journal's hash state does not restore; uploading again from byte 0"
                );
                let _ = staging.abort_upload(target.name, &journal.upload_id).await;
            }
            Some(other) => {
                tracing::info!(
                    object = target.name,
                    "an unfinished upload of another source, format or part size is there; aborting it"
                );
                let _ = staging.abort_upload(target.name, &other.upload_id).await;
            }
            None => {}
        }
        Self::fresh(staging, target).await
    }

    /// A new upload from byte 0, its journal written before any part so it is findable (to resume, or to abort)
    /// from the start.
    pub(crate) async fn fresh(staging: &'a Staging, target: &Target<'_>) -> Result<Self> {
        let upload_id = staging.create_upload(target.name).await?;
        let hash = Sha256::new();
        let journal = UploadJournal {
            source: target.source.clone(),
            format: target.format.to_string(),
            object_bytes: target.bytes,
            part_bytes: target.plan.part_bytes,
            upload_id,
            parts: Vec::new(),
            sha256_state: hash::save(&hash),
        };
        staging.write_journal(target.name, &journal).await?;
        Ok(Self::new(staging, target, journal, hash, false))
    }

    fn new(
        staging: &'a Staging,
        target: &Target<'_>,
        journal: UploadJournal,
        hash: Sha256,
        resumed: bool,
    ) -> Self {
        Self {
            staging,
            name: target.name.to_string(),
            in_flight: target.plan.in_flight.max(1),
            next: journal.parts.len(),
            journal,
            resumed,
            hasher: Hasher::resume(hash),
            buffer: PutPayloadMut::new(),
            tasks: JoinSet::new(),
            waiting: BTreeMap::new(),
            states: HashMap::new(),
        }
    }

    /// Whether an earlier attempt's upload goes on.
    pub(crate) fn resumed(&self) -> bool {
        self.resumed
    }

    /// Where the bytes still to upload start: the end of the parts already staged.
    pub(crate) fn offset(&self) -> u64 {
        self.journal.offset()
    }

    /// (parts already staged when opened or so far, parts of the whole object)
    pub(crate) fn parts(&self) -> (usize, u64) {
        (self.journal.parts.len(), self.journal.part_count())
    }

    /// Hashes `chunk` and adds it to the part filling; a full part is sent, after waiting for room.
    pub(crate) async fn push(&mut self, mut chunk: Bytes) -> Result<()> {
        self.record_finished().await?;
        self.settle(self.in_flight - 1).await?;
        let part_bytes = self.journal.part_bytes as usize;
        while !chunk.is_empty() {
            let room = part_bytes - self.buffer.content_length();
            let piece = chunk.split_to(room.min(chunk.len()));
            // Piece by piece, so a part's mark falls exactly on its last byte.
            self.hasher.update(piece.clone());
            self.buffer.push(piece);
            if self.buffer.content_length() == part_bytes {
                self.send_part();
            }
        }
        Ok(())
    }

    /// Sends the last part, waits for every part, completes the upload; returns the sha256 of the whole object.
    pub(crate) async fn finish(mut self) -> Result<String> {
        if !self.buffer.is_empty() {
            self.send_part();
        }
        self.settle(0).await?;
        let (done, expected) = self.parts();
        if done as u64 != expected {
            return Err(Error::Staging {
                url: self.staging.url_of(&self.name),
                detail: format!("{done} of {expected} parts uploaded"),
            });
        }
        let parts = self
            .journal
            .parts
            .iter()
            .map(|id| PartId {
                content_id: id.clone(),
            })
            .collect();
        self.staging
            .complete_upload(&self.name, &self.journal.upload_id, parts)
            .await?;
        Ok(self.hasher.finish())
    }

    fn send_part(&mut self) {
        let payload = std::mem::take(&mut self.buffer).freeze();
        let index = self.next;
        self.next += 1;
        self.states.insert(index, self.hasher.mark());
        let (parts, path, id) = (
            self.staging.parts(),
            self.staging.path(&self.name),
            self.journal.upload_id.clone(),
        );
        self.tasks
            .spawn(async move { (index, parts.put_part(&path, &id, index, payload).await) });
    }

    /// Waits until at most `tasks` parts are in flight, recording each that ends.
    async fn settle(&mut self, tasks: usize) -> Result<()> {
        while self.tasks.len() > tasks {
            match self.tasks.join_next().await {
                Some(joined) => self.record(joined).await?,
                None => break,
            }
        }
        Ok(())
    }

    /// Records the parts that ended already, so the journal keeps up while the download is slower.
    async fn record_finished(&mut self) -> Result<()> {
        while let Some(joined) = self.tasks.try_join_next() {
            self.record(joined).await?;
        }
        Ok(())
    }

    /// Takes a finished part; when the run of finished parts from the first grows, rewrites the journal.
    async fn record(&mut self, joined: Result<Sent, JoinError>) -> Result<()> {
        let (index, sent) = joined.map_err(|e| Error::Staging {
            url: self.staging.url_of(&self.name),
            detail: format!("a part's upload stopped: {e}"),
        })?;
        let part = sent.map_err(|e| self.staging.upload_error(&self.name, e))?;
        self.waiting.insert(index, part);
        let before = self.journal.parts.len();
        while let Some(part) = self.waiting.remove(&self.journal.parts.len()) {
            self.journal.parts.push(part.content_id);
        }
        let after = self.journal.parts.len();
        if after == before {
            return Ok(());
        }
        let mut last = None;
        for i in before..after {
            last = self.states.remove(&i);
        }
        let state = match last {
            Some(state) => state.await.ok(),
            None => None,
        };
        self.journal.sha256_state = state.ok_or_else(|| Error::Staging {
            url: self.staging.url_of(&self.name),
            detail: "the hasher stopped".into(),
        })?;
        self.staging.write_journal(&self.name, &self.journal).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use object_store::multipart::MultipartStore;
    use object_store::path::Path;
    use object_store::{MultipartId, PutPayload, PutResult};

    use super::*;

    const PART: u64 = 1 << 20;
    const NAME: &str = "disk-0.raw";

    /// Counts the parts sent through it; from part `fail_from` on, fails each once the parts before it are in.
    struct Parts {
        inner: Arc<dyn MultipartStore>,
        sent: Mutex<Vec<usize>>,
        done: AtomicUsize,
        fail_from: usize,
    }

    #[async_trait]
    impl MultipartStore for Parts {
        async fn create_multipart(&self, path: &Path) -> object_store::Result<MultipartId> {
            self.inner.create_multipart(path).await
        }

        async fn put_part(
            &self,
            path: &Path,
            id: &MultipartId,
            part_idx: usize,
            data: PutPayload,
        ) -> object_store::Result<PartId> {
            self.sent.lock().unwrap().push(part_idx);
            if part_idx >= self.fail_from {
                while self.done.load(Ordering::SeqCst) < self.fail_from {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                return Err(object_store::Error::Generic {
                    store: "test",
                    source: "the pod died".into(),
                });
            }
            let part = self.inner.put_part(path, id, part_idx, data).await?;
            self.done.fetch_add(1, Ordering::SeqCst);
            Ok(part)
        }

        async fn complete_multipart(
            &self,
            path: &Path,
            id: &MultipartId,
            parts: Vec<PartId>,
        ) -> object_store::Result<PutResult> {
            self.inner.complete_multipart(path, id, parts).await
        }

        async fn abort_multipart(&self, path: &Path, id: &MultipartId) -> object_store::Result<()> {
            self.inner.abort_multipart(path, id).await
        }
    }

    /// `staging` with its parts counted, failing from part `fail_from` on.
    fn counted(dir: &std::path::Path, fail_from: usize) -> (Staging, Arc<Parts>) {
        let plain = Staging::in_dir(dir);
        let parts = Arc::new(Parts {
            inner: plain.parts(),
            sent: Mutex::default(),
            done: AtomicUsize::new(0),
            fail_from,
        });
        (plain.with_parts(parts.clone()), parts)
    }

    fn source() -> SourceIdentity {
        SourceIdentity {
            vm_uuid: "4210".into(),
            disk_file: "[ds] vm/vm.vmdk".into(),
            capacity_bytes: 6 * PART,
        }
    }

    /// 5.5 parts: the last one is short.
    fn disk() -> Vec<u8> {
        (0..(5 * PART + PART / 2) as usize)
            .map(|i| (i * 7 % 253) as u8)
            .collect()
    }

    fn target<'a>(source: &'a SourceIdentity, bytes: u64, part_bytes: u64) -> Target<'a> {
        Target {
            name: NAME,
            source,
            format: "raw",
            bytes,
            plan: PartPlan {
                part_bytes,
                in_flight: 2,
            },
        }
    }

    /// Pushes `data` from the upload's offset in uneven chunks, then finishes it.
    async fn upload_rest(mut upload: Upload<'_>, data: &[u8]) -> Result<String> {
        for chunk in data[upload.offset() as usize..].chunks(100_000) {
            upload.push(Bytes::copy_from_slice(chunk)).await?;
        }
        upload.finish().await
    }

    fn sent(parts: &Parts) -> Vec<usize> {
        let mut sent = parts.sent.lock().unwrap().clone();
        sent.sort();
        sent
    }

    #[tokio::test]
    async fn an_upload_that_died_after_three_parts_resumes_with_the_fourth() {
        let dir = tempfile::tempdir().unwrap();
        let (data, source) = (disk(), source());
        let target = target(&source, data.len() as u64, PART);

        let (first, parts) = counted(dir.path(), 3);
        let upload = Upload::open(&first, &target).await.unwrap();
        assert!(!upload.resumed());
        let died = upload_rest(upload, &data).await.unwrap_err();
        assert!(died.to_string().contains("the pod died"), "{died}");
        let journal = first.journal(NAME).await.unwrap().unwrap();
        assert_eq!(journal.parts.len(), 3, "{journal:?}");
        assert!(sent(&parts).starts_with(&[0, 1, 2, 3]));
        assert_eq!(
            first.head(NAME).await.unwrap(),
            None,
            "no object before it is whole"
        );

        let (second, parts) = counted(dir.path(), usize::MAX);
        let upload = Upload::open(&second, &target).await.unwrap();
        assert!(upload.resumed());
        assert_eq!((upload.offset(), upload.parts()), (3 * PART, (3, 6)));
        let sha = upload_rest(upload, &data).await.unwrap();
        assert_eq!(sent(&parts), [3, 4, 5], "only the missing parts");
        assert_eq!(sha, crate::hex(&Sha256::digest(&data)));
        assert_eq!(std::fs::read(dir.path().join(NAME)).unwrap(), data);
        assert!(!dir.path().join(format!("{NAME}.parts")).exists());

        second.delete_journal(NAME).await.unwrap();
        assert_eq!(second.journal(NAME).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_journal_round_trips_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging::in_dir(dir.path());
        let journal = UploadJournal {
            source: source(),
            format: "raw".into(),
            object_bytes: 5 * PART + 1,
            part_bytes: PART,
            upload_id: "u-1".into(),
            parts: vec!["\"etag-0\"".into(), "\"etag-1\"".into()],
            sha256_state: hash::save(&Sha256::new()),
        };
        assert_eq!((journal.offset(), journal.part_count()), (2 * PART, 6));
        staging.write_journal(NAME, &journal).await.unwrap();
        assert_eq!(staging.journal(NAME).await.unwrap(), Some(journal));
        let text = std::fs::read_to_string(dir.path().join("disk-0.raw.upload.json")).unwrap();
        assert!(text.contains("\"uploadId\": \"u-1\""), "{text}");
    }

    #[tokio::test]
    async fn a_journal_of_other_parts_is_aborted_and_the_upload_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let (data, source) = (disk(), source());
        let (staging, _) = counted(dir.path(), 2);
        let upload = Upload::open(&staging, &target(&source, data.len() as u64, PART))
            .await
            .unwrap();
        upload_rest(upload, &data).await.unwrap_err();
        let old = staging.journal(NAME).await.unwrap().unwrap();

        let (staging, parts) = counted(dir.path(), usize::MAX);
        let other = target(&source, data.len() as u64, 2 * PART);
        let upload = Upload::open(&staging, &other).await.unwrap();
        assert!(!upload.resumed());
        assert_eq!(upload.offset(), 0);
        let sha = upload_rest(upload, &data).await.unwrap();
        assert_eq!(sent(&parts), [0, 1, 2]);
        assert_eq!(sha, crate::hex(&Sha256::digest(&data)));
        let gone = staging.abort_upload(NAME, &old.upload_id).await;
        assert!(gone.is_ok());
        assert_eq!(
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.ends_with(".parts"))
                .count(),
            0,
            "the old upload's parts are gone"
        );
    }

    #[tokio::test]
    async fn a_lost_upload_is_told_apart_and_deleting_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (data, source) = (disk(), source());
        let target = target(&source, data.len() as u64, PART);
        let (staging, _) = counted(dir.path(), 2);
        upload_rest(Upload::open(&staging, &target).await.unwrap(), &data)
            .await
            .unwrap_err();
        let journal = staging.journal(NAME).await.unwrap().unwrap();

        // Aborted behind the journal's back, as a bucket's lifecycle rule would.
        staging
            .abort_upload(NAME, &journal.upload_id)
            .await
            .unwrap();
        let (staging, _) = counted(dir.path(), usize::MAX);
        let upload = Upload::open(&staging, &target).await.unwrap();
        assert!(upload.resumed());
        let lost = upload_rest(upload, &data).await.unwrap_err();
        assert!(matches!(lost, Error::UploadGone { .. }), "{lost}");

        // A new upload that dies too, then the controller's cleanup: the upload and its journal go.
        let (staging, _) = counted(dir.path(), 2);
        upload_rest(Upload::fresh(&staging, &target).await.unwrap(), &data)
            .await
            .unwrap_err();
        assert!(staging.journal(NAME).await.unwrap().is_some());
        staging.delete(NAME).await.unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing is left"
        );
    }
}
