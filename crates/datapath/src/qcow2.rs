//! A qcow2 (version 3) made in one pass, for an upload that cannot seek back: data clusters in guest order, zero
//! clusters left unallocated, each L2 table right after the data it maps, then the L1 table, the refcount table
//! and the refcount blocks. Only the header, at byte 0, depends on the end (where those tables landed), so the
//! writer holds the first bytes of the object back and puts [`Finished::header`] into them last. Every cluster
//! of the file is used exactly once, so every refcount is 1. Pure: bytes in, bytes out.

use bytes::Bytes;

pub const CLUSTER_BITS: u32 = 16;
pub const CLUSTER: usize = 1 << CLUSTER_BITS;
/// Entries of an L2 table: one cluster of 8-byte entries.
const L2_ENTRIES: u64 = CLUSTER as u64 / 8;
/// 16-bit refcounts, as qemu-img makes them.
const REFCOUNT_ORDER: u32 = 4;
const REFCOUNTS_PER_BLOCK: u64 = CLUSTER as u64 / 2;
const OFFSETS_PER_CLUSTER: u64 = CLUSTER as u64 / 8;
/// Set on L1 and L2 entries whose cluster has refcount 1 (all of them here): qemu may write in place.
const COPIED: u64 = 1 << 63;
const MAGIC: u32 = 0x5146_49fb;
static ZEROS: [u8; CLUSTER] = [0; CLUSTER];
/// The version 3 header without the optional compression type; extensions end at once (zeros follow).
pub const HEADER_LENGTH: usize = 104;

/// Encodes a disk of `virtual_size` bytes given cluster by cluster, in order.
pub struct Encoder {
    virtual_size: u64,
    /// Guest clusters taken so far.
    taken: u64,
    /// The object's length so far: where the next cluster it emits lands.
    host: u64,
    /// The L2 table of the range in progress: entries for the clusters taken in it.
    l2: Vec<u64>,
    l2_has_data: bool,
    l1: Vec<u64>,
    data_clusters: u64,
}

/// The end of the object, and the header that goes into its first bytes.
pub struct Finished {
    /// Bytes that follow what [`Encoder::cluster`] emitted.
    pub tail: Vec<Bytes>,
    /// Overwrites the object's first bytes (the first cluster, which the encoder leaves as zeros).
    pub header: [u8; HEADER_LENGTH],
    /// The whole object's length.
    pub bytes: u64,
    /// Clusters holding data (the rest of the disk reads as zeros).
    pub data_clusters: u64,
}

impl Encoder {
    /// An encoder whose object starts with one cluster reserved for the header.
    pub fn new(virtual_size: u64) -> Self {
        Self {
            virtual_size,
            taken: 0,
            host: CLUSTER as u64,
            l2: Vec::new(),
            l2_has_data: false,
            l1: Vec::new(),
            data_clusters: 0,
        }
    }

    /// The first cluster of the object: reserved for the header, zeros until [`Finished::header`] is known.
    pub fn header_cluster() -> Bytes {
        Bytes::from_static(&ZEROS)
    }

    /// The length the next guest cluster must have: [`CLUSTER`], less for the last one of an odd-sized disk.
    pub fn next_len(&self) -> usize {
        let at = self.taken * CLUSTER as u64;
        (self.virtual_size.saturating_sub(at)).min(CLUSTER as u64) as usize
    }

    /// Takes the next guest cluster ([`Self::next_len`] bytes, in pieces as they arrived) and returns what to
    /// append to the object: the pieces if they hold data (padded to a whole cluster), and the range's L2 table
    /// once its last cluster is in.
    pub fn cluster(&mut self, mut pieces: Vec<Bytes>) -> Vec<Bytes> {
        let len: usize = pieces.iter().map(Bytes::len).sum();
        assert_eq!(len, self.next_len(), "a guest cluster out of step");
        if pieces.iter().all(|p| crate::direct::is_zero(p)) {
            pieces.clear();
            self.l2.push(0);
        } else {
            self.l2.push(self.host | COPIED);
            self.l2_has_data = true;
            self.data_clusters += 1;
            self.host += CLUSTER as u64;
            if len < CLUSTER {
                pieces.push(Bytes::from_static(&ZEROS[len..]));
            }
        }
        self.taken += 1;
        let range_full = self.l2.len() as u64 == L2_ENTRIES;
        if range_full || self.taken * CLUSTER as u64 >= self.virtual_size {
            pieces.extend(self.end_range());
        }
        pieces
    }

    /// Closes the range in progress: its L2 table if it mapped any data, else an empty L1 entry.
    fn end_range(&mut self) -> Option<Bytes> {
        let entries = std::mem::take(&mut self.l2);
        if !std::mem::take(&mut self.l2_has_data) {
            self.l1.push(0);
            return None;
        }
        self.l1.push(self.host | COPIED);
        self.host += CLUSTER as u64;
        Some(table(&entries, CLUSTER))
    }

    /// Ends the object: the L1 table, the refcount table and blocks after everything emitted so far.
    /// Panics if fewer clusters were taken than the disk has.
    pub fn finish(self) -> Finished {
        let guest_clusters = self.virtual_size.div_ceil(CLUSTER as u64);
        assert_eq!(self.taken, guest_clusters, "the disk ended early");
        let l1_size = guest_clusters.div_ceil(L2_ENTRIES);
        debug_assert_eq!(self.l1.len() as u64, l1_size);
        let l1_offset = self.host;
        let l1_clusters = (l1_size * 8).div_ceil(CLUSTER as u64).max(1);
        let used = l1_offset / CLUSTER as u64 + l1_clusters;
        let (table_clusters, blocks) = refcount_layout(used);
        let table_offset = used * CLUSTER as u64;
        let blocks_offset = table_offset + table_clusters * CLUSTER as u64;
        let total = used + table_clusters + blocks;

        let mut tail = vec![table(&self.l1, (l1_clusters as usize) * CLUSTER)];
        let block_offsets: Vec<u64> = (0..blocks)
            .map(|b| blocks_offset + b * CLUSTER as u64)
            .collect();
        tail.push(table(&block_offsets, table_clusters as usize * CLUSTER));
        // Every block but the last counts only used clusters: one buffer shared by all of them, so a disk of
        // tens of TiB (thousands of blocks) does not hold each in memory.
        let full = refcount_block(REFCOUNTS_PER_BLOCK as usize);
        for b in 0..blocks {
            let count = total
                .saturating_sub(b * REFCOUNTS_PER_BLOCK)
                .min(REFCOUNTS_PER_BLOCK);
            tail.push(if count == REFCOUNTS_PER_BLOCK {
                full.clone()
            } else {
                refcount_block(count as usize)
            });
        }
        Finished {
            tail,
            header: header(
                self.virtual_size,
                l1_size as u32,
                l1_offset,
                table_offset,
                table_clusters as u32,
            ),
            bytes: total * CLUSTER as u64,
            data_clusters: self.data_clusters,
        }
    }
}

/// Refcount table clusters and refcount blocks for a file of `used` clusters plus themselves.
fn refcount_layout(used: u64) -> (u64, u64) {
    let (mut table, mut blocks) = (1u64, 1u64);
    loop {
        let total = used + table + blocks;
        let need_blocks = total.div_ceil(REFCOUNTS_PER_BLOCK);
        let need_table = need_blocks.div_ceil(OFFSETS_PER_CLUSTER);
        if need_blocks <= blocks && need_table <= table {
            return (table, blocks);
        }
        (table, blocks) = (need_table.max(table), need_blocks.max(blocks));
    }
}

/// A refcount block whose first `count` clusters are used once.
fn refcount_block(count: usize) -> Bytes {
    let mut block = vec![0u8; CLUSTER];
    for entry in block.chunks_exact_mut(2).take(count) {
        entry.copy_from_slice(&1u16.to_be_bytes());
    }
    Bytes::from(block)
}

/// Big-endian 8-byte entries, zero-padded to `len` bytes.
fn table(entries: &[u64], len: usize) -> Bytes {
    let mut out = vec![0u8; len];
    for (slot, entry) in out.chunks_exact_mut(8).zip(entries) {
        slot.copy_from_slice(&entry.to_be_bytes());
    }
    Bytes::from(out)
}

fn header(
    size: u64,
    l1_size: u32,
    l1_offset: u64,
    refcount_table_offset: u64,
    refcount_table_clusters: u32,
) -> [u8; HEADER_LENGTH] {
    let mut h = [0u8; HEADER_LENGTH];
    let mut put = |at: usize, bytes: &[u8]| h[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, &MAGIC.to_be_bytes());
    put(4, &3u32.to_be_bytes());
    // 8: no backing file (offset, then size at 16)
    put(20, &CLUSTER_BITS.to_be_bytes());
    put(24, &size.to_be_bytes());
    // 32: no encryption
    put(36, &l1_size.to_be_bytes());
    put(40, &l1_offset.to_be_bytes());
    put(48, &refcount_table_offset.to_be_bytes());
    put(56, &refcount_table_clusters.to_be_bytes());
    // 60: no snapshots (count, then offset at 64); 72, 80, 88: no incompatible, compatible or autoclear features
    put(96, &REFCOUNT_ORDER.to_be_bytes());
    put(100, &(HEADER_LENGTH as u32).to_be_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Encodes `disk` into a file the way the upload lays it out, header last.
    fn encode(disk: &[u8]) -> (Vec<u8>, Finished) {
        let mut encoder = Encoder::new(disk.len() as u64);
        let mut object = Encoder::header_cluster().to_vec();
        let mut at = 0;
        while at < disk.len() {
            let len = encoder.next_len();
            // Two pieces, as a cluster straddling two chunks arrives.
            let half = len / 2;
            let pieces = vec![
                Bytes::copy_from_slice(&disk[at..at + half]),
                Bytes::copy_from_slice(&disk[at + half..at + len]),
            ];
            for piece in encoder.cluster(pieces) {
                object.extend_from_slice(&piece);
            }
            at += len;
        }
        let finished = encoder.finish();
        for piece in &finished.tail {
            object.extend_from_slice(piece);
        }
        object[..HEADER_LENGTH].copy_from_slice(&finished.header);
        (object, finished)
    }

    fn qemu_img(args: &[&str]) -> std::process::Output {
        std::process::Command::new("qemu-img")
            .args(args)
            .output()
            .expect("qemu-img (Debian qemu-utils)")
    }

    /// A disk of `len` bytes: data at the given cluster indexes (a distinct byte pattern each), zeros elsewhere.
    fn disk(len: usize, data_clusters: &[usize]) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        for &c in data_clusters {
            let start = c * CLUSTER;
            let end = (start + CLUSTER).min(len);
            for (i, b) in bytes[start..end].iter_mut().enumerate() {
                *b = (i as u8) ^ (c as u8) | 1;
            }
        }
        bytes
    }

    /// qemu-img finds the image consistent and reading the same bytes as the disk.
    fn check_against_qemu(disk: &[u8]) -> Finished {
        let dir = tempfile::tempdir().unwrap();
        let (object, finished) = encode(disk);
        assert_eq!(object.len() as u64, finished.bytes);
        let (image, raw) = (dir.path().join("d.qcow2"), dir.path().join("d.raw"));
        std::fs::write(&image, &object).unwrap();
        std::fs::File::create(&raw)
            .unwrap()
            .write_all(disk)
            .unwrap();
        let image = image.to_str().unwrap();
        let check = qemu_img(&["check", "-f", "qcow2", image]);
        assert!(
            check.status.success(),
            "qemu-img check: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let compare = qemu_img(&[
            "compare",
            "-f",
            "qcow2",
            "-F",
            "raw",
            image,
            raw.to_str().unwrap(),
        ]);
        assert!(
            compare.status.success(),
            "qemu-img compare: {}{}",
            String::from_utf8_lossy(&compare.stdout),
            String::from_utf8_lossy(&compare.stderr)
        );
        let info = qemu_img(&["info", "--output=json", image]);
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        assert_eq!(info["virtual-size"], disk.len() as u64);
        assert_eq!(info["format-specific"]["data"]["compat"], "1.1");
        finished
    }

    #[test]
    fn qemu_reads_a_sparse_disk_as_written_and_finds_no_leak_or_error() {
        // Three L2 ranges (512 MiB each) are too many for a unit test; clusters spread over one and a bit.
        let len = (L2_ENTRIES as usize + 40) * CLUSTER;
        let data = [0, 1, 7, L2_ENTRIES as usize - 1, L2_ENTRIES as usize + 3];
        let finished = check_against_qemu(&disk(len, &data));
        assert_eq!(finished.data_clusters, data.len() as u64);
        // Header, five data clusters, two L2 tables, the L1, the refcount table and one block.
        assert_eq!(finished.bytes, (1 + 5 + 2 + 1 + 1 + 1) * CLUSTER as u64);
    }

    #[test]
    fn an_odd_sized_disk_ends_in_a_padded_cluster() {
        let len = 5 * CLUSTER + 4096 + 512;
        check_against_qemu(&disk(len, &[2, 5]));
    }

    #[test]
    fn a_disk_of_zeros_is_only_metadata_and_a_range_without_data_has_no_l2() {
        let finished = check_against_qemu(&vec![0u8; 3 * CLUSTER]);
        assert_eq!(finished.data_clusters, 0);
        assert_eq!(finished.bytes, 4 * CLUSTER as u64, "header, L1, refcounts");
    }

    #[test]
    fn a_file_past_one_refcount_block_checks_clean() {
        use std::os::unix::fs::FileExt;
        // 2 GiB and a bit of data: more clusters than one refcount block counts, so the shared full block and a
        // partial last one both appear. Data clusters are left as holes in the file (qemu-img check reads only
        // the metadata), so this costs a few MiB of disk.
        let clusters = REFCOUNTS_PER_BLOCK + 100;
        let data = Bytes::from(vec![7u8; CLUSTER]);
        let mut encoder = Encoder::new(clusters * CLUSTER as u64);
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("big.qcow2");
        let file = std::fs::File::create(&image).unwrap();
        let mut at = CLUSTER as u64;
        let write = |piece: &Bytes, at: &mut u64| {
            if piece.as_ptr() != data.as_ptr() {
                file.write_all_at(piece, *at).unwrap();
            }
            *at += piece.len() as u64;
        };
        for _ in 0..clusters {
            for piece in encoder.cluster(vec![data.clone()]) {
                write(&piece, &mut at);
            }
        }
        let finished = encoder.finish();
        for piece in &finished.tail {
            write(piece, &mut at);
        }
        file.write_all_at(&finished.header, 0).unwrap();
        file.set_len(at).unwrap();
        assert_eq!(at, finished.bytes);
        let check = qemu_img(&["check", "-f", "qcow2", image.to_str().unwrap()]);
        assert!(
            check.status.success(),
            "qemu-img check: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }

    #[test]
    fn refcounts_grow_blocks_and_table_clusters_when_the_file_needs_them() {
        assert_eq!(refcount_layout(10), (1, 1));
        // One block counts 32,768 clusters (2 GiB): the table and block themselves count too.
        assert_eq!(refcount_layout(REFCOUNTS_PER_BLOCK - 2), (1, 1));
        assert_eq!(refcount_layout(REFCOUNTS_PER_BLOCK - 1), (1, 2));
        // 8,192 blocks fill one table cluster.
        let (table, blocks) = refcount_layout(OFFSETS_PER_CLUSTER * REFCOUNTS_PER_BLOCK);
        assert_eq!((table, blocks), (2, OFFSETS_PER_CLUSTER + 1));
    }
}
