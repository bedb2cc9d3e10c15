//! Disk images for the lab, tests and benchmarks: deterministic, incompressible, never-zero data, and
//! monolithicFlat VMDKs made from it with qemu-img.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// Writes `bytes` (whole MiB) of xorshift data seeded by `seed`; returns its sha256.
pub fn write_pattern(path: &Path, bytes: u64, seed: u64) -> Result<String> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut hash = Sha256::new();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ seed;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..bytes.div_ceil(block.len() as u64) {
        for word in block.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&(state | 1).to_le_bytes());
        }
        hash.update(&block);
        out.write_all(&block)?;
    }
    out.flush()?;
    Ok(hex(&hash.finalize()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_file(path: &Path) -> Result<String> {
    use std::io::Read;
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (mut hash, mut buf) = (Sha256::new(), vec![0u8; 1 << 20]);
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(&hash.finalize()));
        }
        hash.update(&buf[..n]);
    }
}

/// A monolithicFlat VMDK: `<stem>.vmdk` (descriptor) and `<stem>-flat.vmdk` (the raw bytes).
pub struct FlatVmdk {
    pub descriptor: PathBuf,
    pub extent: PathBuf,
    pub sha256: String,
    pub bytes: u64,
}

/// Turns a raw image into a monolithicFlat VMDK beside it, and removes the raw file.
pub fn raw_to_flat_vmdk(raw: &Path, stem: &str, sha256: String, bytes: u64) -> Result<FlatVmdk> {
    let dir = raw.parent().context("a raw image in a directory")?;
    let descriptor = dir.join(format!("{stem}.vmdk"));
    qemu_img(
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "vmdk",
            "-o",
            "subformat=monolithicFlat",
        ],
        &[raw, &descriptor],
    )?;
    std::fs::remove_file(raw)?;
    Ok(FlatVmdk {
        descriptor,
        extent: dir.join(format!("{stem}-flat.vmdk")),
        sha256,
        bytes,
    })
}

pub fn make_flat_vmdk(dir: &Path, stem: &str, bytes: u64, seed: u64) -> Result<FlatVmdk> {
    let raw = dir.join(format!("{stem}.raw"));
    let sha256 = write_pattern(&raw, bytes, seed)?;
    raw_to_flat_vmdk(&raw, stem, sha256, bytes)
}

/// Runs qemu-img (Debian qemu-utils) and fails with its stderr.
pub fn qemu_img(args: &[&str], paths: &[&Path]) -> Result<()> {
    let output = std::process::Command::new("qemu-img")
        .args(args)
        .args(paths)
        .output()
        .context("running qemu-img (Debian qemu-utils; hack/setup.sh installs it)")?;
    if !output.status.success() {
        bail!(
            "qemu-img {args:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Whether every byte is zero (the CDI stand-in leaves holes for such chunks). The data path has its own: a
/// product crate must not depend on the lab's.
pub fn is_zero(bytes: &[u8]) -> bool {
    const ZEROS: [u8; 4096] = [0; 4096];
    bytes.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_all_zero_bytes_are_zero() {
        use super::is_zero;
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 65_537]));
        let mut chunk = vec![0u8; 65_537];
        chunk[65_536] = 1;
        assert!(!is_zero(&chunk), "a byte in the last, partial page");
        chunk[65_536] = 0;
        chunk[4_000] = 0x80;
        assert!(!is_zero(&chunk), "a byte in a whole page");
    }
}
