//! The demo disk really boots: QEMU (software emulation) runs its boot sector, which prints the marker on COM1.

use std::time::{Duration, Instant};

#[test]
fn the_demo_disk_boots_in_qemu_and_prints_its_marker() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("demo.img");
    let sha =
        ferry_lab::vsphere::bootdisk::make_boot_disk(&disk, 8 << 20, "FERRY-DEMO-OK").unwrap();
    assert_eq!(sha.len(), 64);
    let serial = dir.path().join("serial.log");
    let mut qemu = std::process::Command::new("qemu-system-x86_64")
        .args([
            "-machine",
            "accel=tcg",
            "-m",
            "32",
            "-display",
            "none",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .arg("-drive")
        .arg(format!("file={},format=raw,if=ide", disk.display()))
        .arg("-serial")
        .arg(format!("file:{}", serial.display()))
        .spawn()
        .expect("qemu-system-x86_64 (Debian qemu-system-x86) is installed by hack/setup.sh");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = false;
    while Instant::now() < deadline {
        if std::fs::read_to_string(&serial)
            .unwrap_or_default()
            .contains("FERRY-DEMO-OK")
        {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = qemu.kill();
    let _ = qemu.wait();
    assert!(
        seen,
        "no marker on the serial port: {:?}",
        std::fs::read_to_string(&serial)
    );
}
