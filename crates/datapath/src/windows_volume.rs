//! One file read out of a Windows guest's NTFS partition on a raw volume, without an appliance: the partition
//! table (MBR or GPT) gives the partition's start, and the `ntfs` crate walks the file system from there, matching
//! names the way Windows does (case-insensitively, by the volume's own upcase table). The volume is only read.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use ntfs::Ntfs;
use ntfs::indexes::NtfsFileNameIndex;

const SECTOR: u64 = 512;
/// Larger than any registry hive Windows writes (SYSTEM is tens of MiB).
const MAX_FILE_BYTES: u64 = 512 << 20;

/// The contents of `path` (components from the root, for example `["Windows", "System32", "config",
/// "SYSTEM"]`) on partition `partition` (1-based, as libguestfs numbers `/dev/sda1`) of the raw disk `disk`.
pub fn read_file(disk: &Path, partition: u32, path: &[&str]) -> io::Result<Vec<u8>> {
    let mut file = File::open(disk)?;
    let start = partition_offset(&mut file, partition)?;
    let mut fs = BufReader::new(Window { inner: file, start });
    let mut ntfs = Ntfs::new(&mut fs).map_err(ntfs_error("the partition is not NTFS"))?;
    ntfs.read_upcase_table(&mut fs)
        .map_err(ntfs_error("$UpCase"))?;
    let mut current = ntfs.root_directory(&mut fs).map_err(ntfs_error("root"))?;
    for name in path {
        let next = {
            let index = current.directory_index(&mut fs).map_err(ntfs_error(name))?;
            let mut finder = index.finder();
            let entry = NtfsFileNameIndex::find(&mut finder, &ntfs, &mut fs, name)
                .ok_or_else(|| not_found(path, name))?
                .map_err(ntfs_error(name))?;
            entry.to_file(&ntfs, &mut fs).map_err(ntfs_error(name))?
        };
        current = next;
    }
    let item = current
        .data(&mut fs, "")
        .ok_or_else(|| not_found(path, "$DATA"))?
        .map_err(ntfs_error("$DATA"))?;
    let attribute = item.to_attribute().map_err(ntfs_error("$DATA"))?;
    if attribute.value_length() > MAX_FILE_BYTES {
        return Err(io::Error::other(format!(
            "{} is {} bytes, more than this reader takes",
            path.join("/"),
            attribute.value_length()
        )));
    }
    let mut bytes = Vec::with_capacity(attribute.value_length() as usize);
    attribute
        .value(&mut fs)
        .map_err(ntfs_error("$DATA"))?
        .attach(&mut fs)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Where partition `number` starts, in bytes: an MBR's primary slot, or a GPT entry behind a protective MBR.
fn partition_offset<R: Read + Seek>(disk: &mut R, number: u32) -> io::Result<u64> {
    let mbr = read_at(disk, 0, SECTOR as usize)?;
    if mbr[510..512] != [0x55, 0xAA] {
        return Err(io::Error::other("the disk has no partition table"));
    }
    let slot = |i: usize| &mbr[446 + 16 * i..446 + 16 * (i + 1)];
    if slot(0)[4] == 0xEE {
        return gpt_partition_offset(disk, number);
    }
    let entry = (1..=4)
        .contains(&number)
        .then(|| slot(number as usize - 1))
        .filter(|entry| entry[4] != 0)
        .ok_or_else(|| io::Error::other(format!("the MBR has no primary partition {number}")))?;
    Ok(u64::from(le32(&entry[8..12])) * SECTOR)
}

fn gpt_partition_offset<R: Read + Seek>(disk: &mut R, number: u32) -> io::Result<u64> {
    let header = read_at(disk, SECTOR, SECTOR as usize)?;
    if &header[0..8] != b"EFI PART" {
        return Err(io::Error::other("a protective MBR without a GPT header"));
    }
    let entries_lba = le64(&header[72..80]);
    let count = le32(&header[80..84]);
    let entry_size = u64::from(le32(&header[84..88]));
    if number == 0 || number > count || entry_size < 128 {
        return Err(io::Error::other(format!(
            "the GPT has no partition {number}"
        )));
    }
    let entry = read_at(
        disk,
        entries_lba * SECTOR + u64::from(number - 1) * entry_size,
        128,
    )?;
    if entry[0..16].iter().all(|b| *b == 0) {
        return Err(io::Error::other(format!("GPT entry {number} is unused")));
    }
    Ok(le64(&entry[32..40]) * SECTOR)
}

fn read_at<R: Read + Seek>(disk: &mut R, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; len];
    disk.seek(SeekFrom::Start(offset))?;
    disk.read_exact(&mut buf)?;
    Ok(buf)
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

fn ntfs_error(what: &str) -> impl Fn(ntfs::NtfsError) -> io::Error + '_ {
    move |e| io::Error::other(format!("{what}: {e}"))
}

fn not_found(path: &[&str], name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} has no {name}", path.join("/")),
    )
}

/// The partition as a device of its own: offsets count from its first byte.
struct Window<R> {
    inner: R,
    start: u64,
}

impl<R: Read> Read for Window<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<R: Seek> Seek for Window<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let absolute = match pos {
            SeekFrom::Start(n) => self.inner.seek(SeekFrom::Start(self.start + n))?,
            SeekFrom::Current(n) => self.inner.seek(SeekFrom::Current(n))?,
            SeekFrom::End(_) => return Err(io::Error::other("a partition has no known end")),
        };
        absolute
            .checked_sub(self.start)
            .ok_or_else(|| io::Error::other("seek before the partition's start"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn mbr_with(slots: &[(u8, u32)]) -> Vec<u8> {
        let mut disk = vec![0u8; 4096];
        for (i, (kind, start)) in slots.iter().enumerate() {
            let at = 446 + 16 * i;
            disk[at + 4] = *kind;
            disk[at + 8..at + 12].copy_from_slice(&start.to_le_bytes());
        }
        disk[510] = 0x55;
        disk[511] = 0xAA;
        disk
    }

    #[test]
    fn an_mbr_primary_partition_starts_at_its_lba() {
        let mut disk = Cursor::new(mbr_with(&[(0x07, 2048), (0x07, 1_026_048)]));
        assert_eq!(partition_offset(&mut disk, 1).unwrap(), 2048 * 512);
        assert_eq!(partition_offset(&mut disk, 2).unwrap(), 1_026_048 * 512);
        assert!(partition_offset(&mut disk, 3).is_err(), "an empty slot");
        assert!(
            partition_offset(&mut disk, 5).is_err(),
            "no logical partitions"
        );
    }

    #[test]
    fn a_gpt_entry_is_found_behind_the_protective_mbr() {
        let mut disk = mbr_with(&[(0xEE, 1)]);
        disk.resize(64 * 1024, 0);
        disk[512..520].copy_from_slice(b"EFI PART");
        disk[512 + 72..512 + 80].copy_from_slice(&2u64.to_le_bytes());
        disk[512 + 80..512 + 84].copy_from_slice(&128u32.to_le_bytes());
        disk[512 + 84..512 + 88].copy_from_slice(&128u32.to_le_bytes());
        let second = 2 * 512 + 128;
        disk[second] = 0xA2; // any type GUID that is not zero
        disk[second + 32..second + 40].copy_from_slice(&411_648u64.to_le_bytes());
        let mut disk = Cursor::new(disk);
        assert_eq!(partition_offset(&mut disk, 2).unwrap(), 411_648 * 512);
        assert!(partition_offset(&mut disk, 1).is_err(), "an unused entry");
        assert!(partition_offset(&mut disk, 129).is_err(), "past the table");
    }

    #[test]
    fn a_disk_without_a_partition_table_is_an_error() {
        let mut disk = Cursor::new(vec![0u8; 4096]);
        assert!(partition_offset(&mut disk, 1).is_err());
    }

    #[test]
    fn the_window_counts_from_the_partitions_start() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut window = Window {
            inner: Cursor::new(bytes),
            start: 100,
        };
        assert_eq!(window.seek(SeekFrom::Start(5)).unwrap(), 5);
        let mut one = [0u8; 1];
        window.read_exact(&mut one).unwrap();
        assert_eq!(one[0], 105);
        assert_eq!(window.seek(SeekFrom::Current(-1)).unwrap(), 5);
    }
}
