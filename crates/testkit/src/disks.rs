//! Test disks: deterministic, incompressible, never-zero data, and monolithicFlat VMDKs made from it by qemu-img.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Writes `bytes` (a multiple of 1 MiB) of xorshift data; returns its sha256.
pub fn write_pattern(path: &Path, bytes: u64, seed: u64) -> String {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut hash = Sha256::new();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ seed;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..bytes / block.len() as u64 {
        for word in block.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&(state | 1).to_le_bytes());
        }
        hash.update(&block);
        out.write_all(&block).unwrap();
    }
    out.flush().unwrap();
    hex(&hash.finalize())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a local file.
pub fn sha256_file(path: &Path) -> String {
    use std::io::Read;
    let mut file = std::fs::File::open(path).unwrap();
    let (mut hash, mut buf) = (Sha256::new(), vec![0u8; 1 << 20]);
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            return hex(&hash.finalize());
        }
        hash.update(&buf[..n]);
    }
}

/// A monolithicFlat VMDK `<stem>.vmdk` + `<stem>-flat.vmdk` in `dir`, as `qemu-img convert` writes it.
pub struct FlatVmdk {
    pub descriptor: PathBuf,
    pub extent: PathBuf,
    pub sha256: String,
    pub bytes: u64,
}

pub fn make_flat_vmdk(dir: &Path, stem: &str, bytes: u64, seed: u64) -> FlatVmdk {
    let raw = dir.join(format!("{stem}.raw"));
    let sha256 = write_pattern(&raw, bytes, seed);
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
        &[&raw, &descriptor],
    );
    std::fs::remove_file(&raw).unwrap();
    FlatVmdk {
        descriptor,
        extent: dir.join(format!("{stem}-flat.vmdk")),
        sha256,
        bytes,
    }
}

/// Runs qemu-img (Debian qemu-utils, installed by hack/setup.sh) and panics with its stderr on failure.
pub fn qemu_img(args: &[&str], paths: &[&Path]) {
    let output = std::process::Command::new("qemu-img")
        .args(args)
        .args(paths)
        .output()
        .expect("qemu-img is installed by hack/setup.sh");
    assert!(
        output.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
