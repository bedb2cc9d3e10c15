//! Builds the phony Windows disks, the fake drivers and the fake first-boot tool once per recipe, in the guest
//! image cache: the hives come from [`super::hive`] and [`super::registry`] through hivexregedit, the disks from
//! one guestfish session (libguestfs's appliance formats NTFS with ntfs-3g's mkntfs). The recipe's hash is
//! taken over everything written, so a change to any of it builds them again. A build takes about a minute of
//! software emulation.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use ferry_api::Firmware;
use sha2::{Digest, Sha256};

use super::{ALL, PhonyWindows, drivers, hive, registry};

/// Raised when what is built changes in a way the inputs below do not show.
const RECIPE_VERSION: &str = "phony-windows 1";
/// Each disk: sparse; virt-v2v wants 100 MB free on a Windows system volume.
const DISK_MIB: u64 = 512;
/// An EFI guest's system partition: sectors 2048 to this one (100 MiB).
const ESP_LAST_SECTOR: u64 = 206_847;

/// What a build leaves in its directory.
#[derive(Clone, Debug)]
pub struct PhonyFixtures {
    pub dir: PathBuf,
    /// virt-v2v's drivers for every version the real ISO has (`virtio-win.iso`), and a directory holding an
    /// ISO with Windows Server 2019's drivers only.
    pub virtio_win: PathBuf,
    pub virtio_win_2k19_only: PathBuf,
    /// The directory holding `rhsrvany.exe` (virt-v2v's `VIRT_TOOLS_DATA_DIR`).
    pub first_boot_tool: PathBuf,
}

impl PhonyFixtures {
    /// The raw disk of `guest`.
    pub fn disk(&self, guest: &PhonyWindows) -> PathBuf {
        self.dir.join(format!("{}.raw", guest.name))
    }

    /// The raw disk of a hibernated `guest` once it was booted and shut down fully: the same guest, its
    /// hibernation file gone.
    pub fn shut_down_disk(&self, guest: &PhonyWindows) -> PathBuf {
        self.dir.join(format!("{}-shut-down.raw", guest.name))
    }
}

/// Every disk a build writes: each guest's as it is found, and a hibernated one's after a full shutdown too, with
/// its file's stem and whether it holds a hibernation image.
fn images() -> Vec<(PhonyWindows, String, bool)> {
    let mut images: Vec<_> = ALL
        .iter()
        .map(|g| (*g, g.name.to_string(), g.hibernated))
        .collect();
    for guest in ALL.iter().filter(|g| g.hibernated) {
        images.push((*guest, format!("{}-shut-down", guest.name), false));
    }
    images
}

/// Returns the cached fixtures, building them first if the recipe changed. Concurrent callers wait on a lock.
pub fn ensure_phony_windows(cache_root: Option<&Path>) -> Result<PhonyFixtures> {
    let root = match cache_root {
        Some(root) => root.to_path_buf(),
        None => crate::vsphere::guest_image::default_cache_root()?,
    };
    let dir = root.join(format!("windows-{}", recipe_hash()));
    let fixtures = PhonyFixtures {
        virtio_win: dir.join("virtio-win"),
        virtio_win_2k19_only: dir.join("virtio-win-2k19"),
        first_boot_tool: dir.join("virt-tools"),
        dir: dir.clone(),
    };
    let done = dir.join("done");
    if done.exists() {
        return Ok(fixtures);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let lock = std::fs::File::create(root.join(".windows.lock"))?;
    lock.lock()
        .with_context(|| format!("locking {}/.windows.lock", root.display()))?;
    if done.exists() {
        return Ok(fixtures);
    }
    let tmp = root.join(format!(".windows-{}.tmp", recipe_hash()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    build(&tmp)
        .with_context(|| format!("building the phony Windows guests in {}", tmp.display()))?;
    std::fs::write(tmp.join("done"), recipe())?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)?;
    Ok(fixtures)
}

/// The first 16 hex digits of the recipe's sha256.
pub fn recipe_hash() -> String {
    crate::disks::hex(&Sha256::digest(recipe().as_bytes()))[..16].to_string()
}

/// Everything a build writes, as text.
fn recipe() -> String {
    let mut text = format!("{RECIPE_VERSION}\n{}\n", guestfish_script(Path::new("/")));
    for guest in ALL {
        text += &format!(
            "{guest:?}\n{}\n{}\n",
            registry::software(&guest),
            registry::system(&guest)
        );
    }
    text += &format!("{:?}\n{:?}\n", hive::empty_hive(), pe32_plus());
    text += &format!("{:?}\n", drivers::EVERY_VERSION);
    text += &drivers::marker("x");
    text
}

fn build(dir: &Path) -> Result<()> {
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    for guest in ALL {
        for (hive_name, reg, prefix) in [
            (
                "SOFTWARE",
                registry::software(&guest),
                r"HKEY_LOCAL_MACHINE\SOFTWARE",
            ),
            (
                "SYSTEM",
                registry::system(&guest),
                r"HKEY_LOCAL_MACHINE\SYSTEM",
            ),
        ] {
            let hive = work.join(format!("{}-{hive_name}", guest.name));
            build_hive(&hive, &reg, prefix)?;
        }
    }
    std::fs::write(work.join("cmd.exe"), pe32_plus())?;
    std::fs::write(work.join("BCD"), hive::empty_hive())?;
    std::fs::write(work.join("hiberfil.sys"), hibernation_file())?;
    let script = work.join("build.guestfish");
    std::fs::write(&script, guestfish_script(dir))?;
    let mut guestfish = Command::new("guestfish");
    guestfish
        .args(["--rw", "-f"])
        .arg(&script)
        .current_dir(&work)
        .env("LIBGUESTFS_BACKEND", "direct")
        .env("TMPDIR", &work);
    if std::env::var_os("LIBGUESTFS_BACKEND_SETTINGS").is_none() {
        // KVM may open and still not run libguestfs's appliance: emulation always does.
        guestfish.env("LIBGUESTFS_BACKEND_SETTINGS", "force_tcg");
    }
    run(&mut guestfish).context("guestfish (Debian guestfish; hack/setup.sh installs it)")?;
    for (guest, stem, _) in images() {
        if guest.firmware == Firmware::Bios {
            write_mbr_signature(&dir.join(format!("{stem}.raw")))?;
        }
    }

    drivers::write_tree(&work.join("tree-all"), drivers::EVERY_VERSION)?;
    drivers::write_tree(&work.join("tree-2k19"), &["2k19"])?;
    for (tree, out) in [("tree-all", "virtio-win"), ("tree-2k19", "virtio-win-2k19")] {
        std::fs::create_dir_all(dir.join(out))?;
        drivers::write_iso(&work.join(tree), &dir.join(out).join("virtio-win.iso"))?;
    }
    drivers::write_first_boot_tool(&dir.join("virt-tools"))?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// One guestfish session for every disk, which are `/dev/sda`, `/dev/sdb`, … in [`images`]' order. Files are
/// uploaded from the work directory (`work/<guest>-SOFTWARE`, …), disks written to `dir`.
fn guestfish_script(dir: &Path) -> String {
    let mut script = String::new();
    for (_, stem, _) in images() {
        script += &format!(
            "sparse \"{}\" {DISK_MIB}M\n",
            dir.join(format!("{stem}.raw")).display()
        );
    }
    script += "run\n";
    for (index, (guest, _, hibernated)) in images().iter().enumerate() {
        let device = format!("/dev/sd{}", (b'a' + index as u8) as char);
        let windows = match guest.firmware {
            Firmware::Efi => {
                script += &format!(
                    "part-init {device} gpt\n\
                     part-add {device} p 2048 {ESP_LAST_SECTOR}\n\
                     part-add {device} p {} -64\n\
                     part-set-gpt-type {device} 1 C12A7328-F81F-11D2-BA4B-00A0C93EC93B\n\
                     part-set-gpt-type {device} 2 EBD0A0A2-B9E5-4433-87C0-68B6B72699C7\n\
                     part-set-gpt-guid {device} 2 {}\n\
                     mkfs vfat {device}1\n\
                     mount {device}1 /\n\
                     mkdir-p /EFI/Boot\n\
                     mkdir-p /EFI/Microsoft/Boot\n\
                     upload cmd.exe /EFI/Boot/bootx64.efi\n\
                     upload cmd.exe /EFI/Microsoft/Boot/bootmgfw.efi\n\
                     upload BCD /EFI/Microsoft/Boot/BCD\n\
                     umount-all\n",
                    ESP_LAST_SECTOR + 1,
                    registry::WINDOWS_PARTITION_GUID
                );
                format!("{device}2")
            }
            _ => {
                script += &format!(
                    "part-init {device} mbr\n\
                     part-add {device} p {} -1\n\
                     part-set-mbr-id {device} 1 0x07\n\
                     part-set-bootable {device} 1 true\n",
                    registry::BIOS_PARTITION_OFFSET / 512
                );
                format!("{device}1")
            }
        };
        script += &format!(
            "mkfs ntfs {windows}\n\
             mount {windows} /\n\
             mkdir-p /Windows/System32/config\n\
             mkdir-p /Windows/System32/drivers\n\
             mkdir-p /Windows/Temp\n\
             mkdir-p \"/Program Files/VMware/VMware Tools\"\n\
             mkdir-p /Users\n\
             upload {name}-SOFTWARE /Windows/System32/config/SOFTWARE\n\
             upload {name}-SYSTEM /Windows/System32/config/SYSTEM\n\
             upload cmd.exe /Windows/System32/cmd.exe\n\
             upload cmd.exe \"/Program Files/VMware/VMware Tools/vmtoolsd.exe\"\n",
            name = guest.name
        );
        if *hibernated {
            script += "upload hiberfil.sys /hiberfil.sys\n";
        }
        script += "umount-all\n";
    }
    script
}

/// The smallest file libmagic reads as `PE32+ executable (console) x86-64, for MS Windows`: libguestfs takes a
/// Windows guest's architecture from its `cmd.exe` that way.
pub fn pe32_plus() -> Vec<u8> {
    let mut pe = vec![0u8; 512];
    pe[..2].copy_from_slice(b"MZ");
    pe[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
    pe[0x40..0x44].copy_from_slice(b"PE\0\0");
    // COFF: x86-64, no sections, an optional header of 240 bytes, an executable for large addresses.
    pe[0x44..0x46].copy_from_slice(&0x8664u16.to_le_bytes());
    pe[0x54..0x56].copy_from_slice(&0xf0u16.to_le_bytes());
    pe[0x56..0x58].copy_from_slice(&0x22u16.to_le_bytes());
    // The optional header's magic: PE32+.
    pe[0x58..0x5a].copy_from_slice(&0x20bu16.to_le_bytes());
    // Subsystem: the console.
    pe[0x58 + 68..0x58 + 70].copy_from_slice(&3u16.to_le_bytes());
    pe
}

/// A hibernation file as Windows leaves it while hibernated (or after a Fast Startup shutdown): its image's
/// signature first, and more than the 4 KiB ntfs-3g looks at.
fn hibernation_file() -> Vec<u8> {
    let mut file = vec![0u8; 64 * 1024];
    file[..4].copy_from_slice(b"HIBR");
    file
}

/// A BIOS guest's MBR signature, which `MountedDevices` names drive C: by.
fn write_mbr_signature(disk: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(disk)?;
    file.write_all_at(&registry::MBR_SIGNATURE.to_le_bytes(), 0x1b8)?;
    Ok(())
}

/// A hive at `hive` holding the keys of `.reg` text whose keys start with `prefix`, through hivexregedit.
fn build_hive(hive: &Path, reg: &str, prefix: &str) -> Result<()> {
    let text = hive.with_extension("reg");
    std::fs::write(hive, hive::empty_hive())?;
    std::fs::write(&text, reg)?;
    run(Command::new("hivexregedit")
        .arg("--merge")
        .arg(hive)
        .args(["--prefix", prefix])
        .arg(&text))
    .context("hivexregedit (Debian libwin-hivex-perl; hack/setup.sh installs it)")
}

fn run(command: &mut Command) -> Result<()> {
    let output = command.output()?;
    if !output.status.success() {
        bail!(
            "{:?} failed ({}): {}{}",
            command.get_program(),
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::windows::{WIN2K22, WIN11};
    use ferry_adapt::clock::GuestClock;

    /// The phony SYSTEM hives, as hivexregedit writes them, read the way the worker reads an adapted guest's.
    #[test]
    fn each_guests_clock_reads_back_from_its_system_hive() {
        let dir = tempfile::tempdir().unwrap();
        for (guest, expected) in [
            (
                WIN2K22,
                GuestClock::LocalTime {
                    windows_zone: "W. Europe Standard Time".into(),
                },
            ),
            (WIN11, GuestClock::Utc),
        ] {
            let path = dir.path().join(guest.name);
            build_hive(
                &path,
                &registry::system(&guest),
                r"HKEY_LOCAL_MACHINE\SYSTEM",
            )
            .unwrap();
            let clock = GuestClock::from_system_hive(&std::fs::read(&path).unwrap()).unwrap();
            assert_eq!(clock, expected, "{}", guest.name);
        }
        assert!(
            GuestClock::from_system_hive(&hive::empty_hive()).is_ok_and(|c| c
                == GuestClock::LocalTime {
                    windows_zone: String::new()
                }),
            "a hive without TimeZoneInformation is Windows' default, local time"
        );
    }
}
