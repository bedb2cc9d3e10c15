//! Loop devices: how the lab's provisioner serves Block claims on the real node. A file becomes a block device
//! (`losetup`), a `local` PV names the device, and the kubelet maps it into the pod. The kernel says which file
//! backs each device (`/sys/block/loopN/loop/backing_file`), so finding a lab's devices needs no record of them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// Every loop device and the file behind it.
fn attached() -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return vec![];
    };
    let mut found: Vec<(PathBuf, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|e| {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let backing = backing.trim_end().trim_end_matches(" (deleted)");
            Some((
                Path::new("/dev").join(e.file_name()),
                PathBuf::from(backing),
            ))
        })
        .collect();
    found.sort();
    found
}

/// The loop devices backed by files under `dir`.
pub fn attached_under(dir: &Path) -> Vec<PathBuf> {
    attached()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(dir))
        .map(|(device, _)| device)
        .collect()
}

/// The loop device backed by `file`: the one already attached, or a new one.
pub fn attach(file: &Path) -> Result<PathBuf> {
    if let Some((device, _)) = attached().into_iter().find(|(_, b)| b == file) {
        return Ok(device);
    }
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(file)
        .output()
        .context("running losetup")?;
    anyhow::ensure!(
        out.status.success(),
        "losetup --find --show {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Detaches `device` if a file under `dir` backs it; a device of anything else is left alone.
pub fn detach_if_under(device: &Path, dir: &Path) -> Result<()> {
    if !attached_under(dir).iter().any(|d| d == device) {
        return Ok(());
    }
    let out = Command::new("losetup")
        .arg("--detach")
        .arg(device)
        .output()
        .context("running losetup")?;
    anyhow::ensure!(
        out.status.success(),
        "losetup --detach {}: {}",
        device.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
