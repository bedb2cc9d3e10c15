//! Test disks, from the lab's disk maker; these panic instead of returning errors.

use std::path::Path;

pub use ferry_lab::disks::{FlatVmdk, hex};

pub fn write_pattern(path: &Path, bytes: u64, seed: u64) -> String {
    ferry_lab::disks::write_pattern(path, bytes, seed).unwrap()
}

pub fn sha256_file(path: &Path) -> String {
    ferry_lab::disks::sha256_file(path).unwrap()
}

pub fn make_flat_vmdk(dir: &Path, stem: &str, bytes: u64, seed: u64) -> FlatVmdk {
    ferry_lab::disks::make_flat_vmdk(dir, stem, bytes, seed).unwrap()
}

pub fn qemu_img(args: &[&str], paths: &[&Path]) {
    ferry_lab::disks::qemu_img(args, paths).unwrap()
}
