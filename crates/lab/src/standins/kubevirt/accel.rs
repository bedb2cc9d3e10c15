//! KVM or software emulation for the lab's guests. `/dev/kvm` opening is not enough: on some hosts (nested
//! virtualisation) KVM guests hang or QEMU aborts, and on one here a boot sector ran under KVM while a Linux
//! kernel hung right after GRUB. So the lab's Debian guest must reach systemd under `-accel kvm -cpu max` first
//! (a boot sector its marker when no Debian image was built); the answer is cached for the process.
//! `FERRY_LAB_ACCEL=tcg|kvm` decides instead.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::domain::Accel;
use crate::control_plane::process::{self, Lifetime, ProcessSpec};

const MARKER: &str = "FERRY-KVM-PROBE";
/// A boot sector reaches its marker in well under a second with working KVM, even on a loaded host.
const PROBE_TIMEOUT: Duration = Duration::from_secs(8);
/// What systemd prints on the Debian guest's console once the kernel mounted its root.
const LINUX_MARKER: &str = "Welcome to Debian";
/// Seconds with working KVM; software emulation takes minutes to get there.
const LINUX_PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// The accelerator for this process's guests: the override, else the probe's answer (computed once).
pub fn detect(scratch: &Path) -> Accel {
    static ACCEL: OnceLock<Accel> = OnceLock::new();
    *ACCEL.get_or_init(|| {
        let accel = match std::env::var("FERRY_LAB_ACCEL").as_deref() {
            Ok("kvm") => Accel::Kvm,
            Ok("tcg") => Accel::Tcg,
            _ => match kvm_boots(scratch) {
                Ok(true) => Accel::Kvm,
                Ok(false) => Accel::Tcg,
                Err(e) => {
                    tracing::info!("KVM probe failed, guests use TCG: {e:#}");
                    Accel::Tcg
                }
            },
        };
        tracing::info!("lab guests run with {accel:?}");
        accel
    })
}

/// True when a boot-sector guest prints its marker under KVM within the timeout.
fn kvm_boots(scratch: &Path) -> anyhow::Result<bool> {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return Ok(false);
    }
    let dir = scratch.join(format!("kvm-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = boot_probe(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn boot_probe(dir: &Path) -> anyhow::Result<bool> {
    let (disk, format, marker, timeout) = match crate::vsphere::guest_image::cached_guest_images() {
        // An overlay: the cached image is shared and must not change.
        Some(images) => {
            let overlay = dir.join("probe.qcow2");
            crate::disks::qemu_img(
                &["create", "-q", "-f", "qcow2", "-F", "raw", "-b"],
                &[&images.bios.root, &overlay],
            )?;
            (overlay, "qcow2", LINUX_MARKER, LINUX_PROBE_TIMEOUT)
        }
        None => {
            let disk = dir.join("probe.img");
            crate::vsphere::bootdisk::make_boot_disk(&disk, 1 << 20, MARKER)?;
            (disk, "raw", MARKER, PROBE_TIMEOUT)
        }
    };
    let serial = dir.join("probe.serial");
    let spec = ProcessSpec {
        name: "qemu-kvm-probe".into(),
        program: "qemu-system-x86_64".into(),
        args: [
            "-machine",
            "q35,accel=kvm",
            "-cpu",
            "max",
            "-m",
            "512",
            "-nodefaults",
            "-display",
            "none",
            "-drive",
            &format!("if=none,id=d0,format={format},file={}", disk.display()),
            "-device",
            "ide-hd,bus=ide.0,drive=d0",
            "-serial",
            &format!("file:{}", serial.display()),
        ]
        .map(String::from)
        .to_vec(),
        env: vec![],
    };
    let record = process::start(&spec, &dir.join("probe.log"), Lifetime::TiedToThisProcess)?;
    let deadline = Instant::now() + timeout;
    let booted = loop {
        let text = std::fs::read(&serial).unwrap_or_default();
        if String::from_utf8_lossy(&text).contains(marker) {
            break true;
        }
        if !record.is_alive(&serial) || Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    process::stop(&record, Duration::from_secs(2))?;
    Ok(booted)
}
