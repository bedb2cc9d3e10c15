//! Fake virtio-win drivers and a fake first-boot tool, laid out as the real ones are. virt-v2v picks drivers by
//! their paths (`viostor/2k22/amd64/viostor.sys`) and copies them without reading them, and it only checks that
//! `rhsrvany.exe` exists before copying it into the guest; so each file holds one line that names it, which a test
//! finds again in the adapted guest.

use std::path::Path;

use anyhow::{Context, Result};

/// The real ISO's driver directories and the files of each, for every Windows version it has drivers for.
const DRIVERS: [(&str, &[&str]); 6] = [
    ("viostor", &["viostor.cat", "viostor.inf", "viostor.sys"]),
    ("vioscsi", &["vioscsi.cat", "vioscsi.inf", "vioscsi.sys"]),
    ("NetKVM", &["netkvm.cat", "netkvm.inf", "netkvm.sys"]),
    ("Balloon", &["balloon.cat", "balloon.inf", "balloon.sys"]),
    ("vioserial", &["vioser.cat", "vioser.inf", "vioser.sys"]),
    ("qemufwcfg", &["qemufwcfg.cat", "qemufwcfg.inf"]),
];

/// The real ISO's names for Windows versions (`2k22` is Server 2022, `w11` Windows 11).
pub const EVERY_VERSION: &[&str] = &["2k16", "2k19", "2k22", "w10", "w11"];

/// The QEMU guest agent's installers, at the ISO's root directory `guest-agent`.
const AGENT_MSIS: [&str; 2] = ["qemu-ga-x86_64.msi", "qemu-ga-i386.msi"];

/// The one line a fake file holds.
pub fn marker(relative: &str) -> String {
    format!("ferry phony virtio-win file {relative}\n")
}

/// Writes a virtio-win tree with drivers for `versions` (amd64 only) and the guest agent's MSIs under `dir`.
pub fn write_tree(dir: &Path, versions: &[&str]) -> Result<()> {
    let mut files = vec![];
    for (driver, names) in DRIVERS {
        for version in versions {
            for name in names {
                files.push(format!("{driver}/{version}/amd64/{name}"));
            }
        }
    }
    files.extend(AGENT_MSIS.map(|msi| format!("guest-agent/{msi}")));
    for relative in files {
        let path = dir.join(&relative);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, marker(&relative))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Packs `tree` into an ISO 9660 image with Joliet and Rock Ridge names, as the real one is (xorriso).
pub fn write_iso(tree: &Path, iso: &Path) -> Result<()> {
    let output = std::process::Command::new("xorriso")
        .args([
            "-as",
            "mkisofs",
            "-quiet",
            "-J",
            "-r",
            "-V",
            "virtio-win",
            "-o",
        ])
        .arg(iso)
        .arg(tree)
        .output()
        .context("running xorriso (Debian xorriso; hack/setup.sh installs it)")?;
    anyhow::ensure!(
        output.status.success(),
        "xorriso: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// The first-boot tool virt-v2v installs Windows first-boot scripts with, named as RHEL's mingw32-srvany ships
/// it. Never run: the phony guests do not boot.
pub const FIRST_BOOT_TOOL: &str = "rhsrvany.exe";

pub fn write_first_boot_tool(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join(FIRST_BOOT_TOOL),
        "This is Ferry's lab's fake rhsrvany.exe: virt-v2v copies it into phony Windows guests, which never run it.\n",
    )?;
    Ok(())
}
