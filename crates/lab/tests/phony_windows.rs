//! The phony Windows guests as libguestfs inspects them, the way virt-v2v will: each is Windows of its version,
//! 64-bit, with its product name, hostname and drive C:, and its firmware as its partitions say. The fake drivers
//! are on an ISO that lists as the real one does.

use std::process::Command;

use ferry_lab::windows::phony::ensure_phony_windows;
use ferry_lab::windows::{ALL, PhonyWindows, WIN2K22_HIBERNATED};

/// guestfish's answers, one per line, for `commands` run on `disk` read-only after inspection.
fn inspect(disk: &std::path::Path, commands: &str) -> Vec<String> {
    let output = Command::new("guestfish")
        .args(["--ro", "-a"])
        .arg(disk)
        .arg("-i")
        .env("LIBGUESTFS_BACKEND", "direct")
        .env("LIBGUESTFS_BACKEND_SETTINGS", "force_tcg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(commands.as_bytes())?;
            child.wait_with_output()
        })
        .expect("guestfish runs");
    assert!(
        output.status.success(),
        "guestfish on {}: {}",
        disk.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn expected_osinfo(guest: &PhonyWindows) -> &'static str {
    // libguestfs 1.48 names every Windows 10 client win10, Windows 11 included; 1.50 and later name it win11.
    match guest.server() {
        true => "win2k22",
        false => "win10|win11",
    }
}

#[test]
fn libguestfs_inspects_each_phony_windows_guest_as_its_version() {
    let fixtures = ensure_phony_windows(None).unwrap();
    for guest in ALL {
        let root = if guest.firmware == ferry_api::Firmware::Efi {
            "/dev/sda2"
        } else {
            "/dev/sda1"
        };
        let answers = inspect(
            &fixtures.disk(&guest),
            &format!(
                "inspect-get-type {root}\ninspect-get-arch {root}\ninspect-get-major-version {root}\n\
                 inspect-get-product-name {root}\ninspect-get-product-variant {root}\n\
                 inspect-get-osinfo {root}\ninspect-get-hostname {root}\ninspect-get-windows-systemroot {root}\n\
                 inspect-get-drive-mappings {root}\nis-file /hiberfil.sys\n"
            ),
        );
        assert_eq!(
            answers[..5],
            [
                "windows",
                "x86_64",
                "10",
                guest.product_name,
                guest.installation_type
            ],
            "{guest:?}"
        );
        assert!(
            expected_osinfo(&guest).split('|').any(|o| o == answers[5]),
            "{guest:?}: {answers:?}"
        );
        assert_eq!(answers[6], guest.name);
        assert_eq!(answers[7], "/Windows");
        assert_eq!(answers[8], format!("C: {root}"), "{guest:?}: {answers:?}");
        assert_eq!(answers[9], (guest == WIN2K22_HIBERNATED).to_string());
    }
    let listing = Command::new("xorriso")
        .args(["-indev"])
        .arg(fixtures.virtio_win.join("virtio-win.iso"))
        .args(["-find", "/", "-type", "f"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for path in [
        "/viostor/2k22/amd64/viostor.sys",
        "/NetKVM/w11/amd64/netkvm.inf",
        "/guest-agent/qemu-ga-x86_64.msi",
    ] {
        assert!(
            listing.contains(&format!("'{path}'")),
            "{path} in {listing}"
        );
    }
    assert!(fixtures.first_boot_tool.join("rhsrvany.exe").is_file());
}
