//! What virt-v2v left in an adapted phony Windows volume, read back with guestfish and hivexsh: the drivers of the
//! guest's version in `Windows\Drivers\VirtIO`, the block driver in `System32\drivers` with its service
//! (`Start=0`, boot-time) and its virtio-blk PCI IDs in the device database the hive has (CriticalDeviceDatabase or
//! DriverDatabase), and the first-boot service with its scripts (the guest agent's MSI, VMware Tools' removal).
//! Assertions hold for virt-v2v 2.2 and later: 2.2 adds SUBSYS to the PCI IDs and later ones do not; later ones
//! also install the drivers with pnputil at first boot.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

use super::{PhonyWindows, drivers};

/// What no lab can check, for the demo and the docs.
pub const UNPROVEN: [&str; 3] = [
    "that Windows boots from virtio-blk with these drivers (the phony guest has no kernel)",
    "that the first-boot service runs its scripts and installs the agent (it is a fake rhsrvany.exe)",
    "that the QEMU guest agent then answers",
];

const FIRSTBOOT: &str = "/Program Files/Guestfs/Firstboot";

/// Reads the adapted system disk `disk` of `guest` and returns what was found, one line each; an error names
/// what is missing.
pub fn adapted_volume(disk: &Path, guest: &PhonyWindows) -> Result<Vec<String>> {
    let scratch = tempfile::tempdir()?;
    let system = scratch.path().join("SYSTEM");
    let answers = guestfish(
        disk,
        &format!(
            "ls /Windows/Drivers/VirtIO\necho ---\ncat /Windows/Drivers/VirtIO/viostor.sys\necho ---\n\
             is-file /Windows/System32/drivers/viostor.sys\necho ---\nls \"{FIRSTBOOT}/scripts\"\necho ---\n\
             cat \"{FIRSTBOOT}/rhsrvany.exe\"\necho ---\ndownload /Windows/System32/config/SYSTEM {}\n",
            system.display()
        ),
    )?;
    let parts: Vec<&str> = answers.split("---\n").collect();
    let [copied, viostor, in_system32, scripts, tool, ..] = parts[..] else {
        bail!("guestfish answered {answers:?}");
    };
    let mut found = vec![];

    let wanted = [
        "viostor.sys",
        "viostor.inf",
        "vioscsi.sys",
        "netkvm.sys",
        "netkvm.inf",
        "balloon.inf",
    ];
    let missing: Vec<&str> = wanted
        .into_iter()
        .filter(|d| !copied.lines().any(|l| l == *d))
        .collect();
    ensure!(
        missing.is_empty(),
        "{} missing from Windows\\Drivers\\VirtIO, which holds {copied:?}",
        missing.join(", ")
    );
    // Windows 11 is `win10` to libguestfs 1.48 (Debian 12) and `win11` to later ones: either version's drivers.
    let versions: &[&str] = if guest.server() {
        &["2k22"]
    } else {
        &["w10", "w11"]
    };
    let version = versions
        .iter()
        .find(|v| {
            viostor.trim() == drivers::marker(&format!("viostor/{v}/amd64/viostor.sys")).trim()
        })
        .with_context(|| {
            format!(
                "Windows\\Drivers\\VirtIO\\viostor.sys is not the {} driver: {viostor:?}",
                versions.join(" or ")
            )
        })?;
    found.push(format!(
        "Windows\\Drivers\\VirtIO: viostor, vioscsi, netkvm, balloon, … for {version} ({} files)",
        copied.lines().count()
    ));
    ensure!(
        in_system32.trim() == "true",
        "viostor.sys is not in System32\\drivers"
    );
    found.push("System32\\drivers\\viostor.sys".into());

    let service = hivexsh(&system, "cd \\ControlSet001\\Services\\viostor\nlsval\n")?;
    ensure!(
        service.contains("\"Start\"=dword:00000000") && service.contains("SCSI miniport"),
        "viostor's service is not a boot-time SCSI miniport: {service}"
    );
    found.push(
        "SYSTEM ControlSet001\\Services\\viostor: Start=0 (boot), Group SCSI miniport".into(),
    );
    let (database, ids) = if guest.driver_database {
        let inf = hivexsh(
            &system,
            "cd \\DriverDatabase\\DriverInfFiles\\guestor.inf\nlsval\n",
        )?;
        ensure!(
            inf.contains("Configurations"),
            "DriverDatabase\\DriverInfFiles\\guestor.inf: {inf}"
        );
        (
            "DriverDatabase\\DeviceIds\\PCI",
            hivexsh(&system, "cd \\DriverDatabase\\DeviceIds\\PCI\nls\n")?,
        )
    } else {
        (
            "ControlSet001\\Control\\CriticalDeviceDatabase",
            hivexsh(
                &system,
                "cd \\ControlSet001\\Control\\CriticalDeviceDatabase\nls\n",
            )?,
        )
    };
    for id in ["VEN_1AF4&DEV_1001", "VEN_1AF4&DEV_1042"] {
        ensure!(
            ids.lines().any(|l| l.contains(id)),
            "{id} (virtio-blk) is not in {database}: {ids}"
        );
    }
    found.push(format!(
        "SYSTEM {database}: virtio-blk's legacy and modern PCI IDs"
    ));

    ensure!(
        tool.contains("fake rhsrvany.exe"),
        "{FIRSTBOOT}/rhsrvany.exe is not the tool given: {tool:?}"
    );
    let firstboot = hivexsh(&system, "cd \\ControlSet001\\Services\\firstboot\nlsval\n")?;
    ensure!(
        firstboot.contains("rhsrvany.exe -s firstboot")
            && firstboot.contains("\"Start\"=dword:00000002"),
        "the first-boot service is not rhsrvany, started automatically: {firstboot}"
    );
    found.push("SYSTEM ControlSet001\\Services\\firstboot: rhsrvany.exe, automatic".into());
    for script in ["qemu-ga", "uninstall-VMware-Tools"] {
        ensure!(
            scripts
                .lines()
                .any(|l| l.contains(script) && l.ends_with(".bat")),
            "no first-boot script for {script} in {scripts:?}"
        );
    }
    found.push(format!(
        "first-boot scripts: {}",
        scripts.lines().collect::<Vec<_>>().join(", ")
    ));
    Ok(found)
}

fn guestfish(disk: &Path, commands: &str) -> Result<String> {
    let mut command = Command::new("guestfish");
    command
        .args(["--ro", "--format=raw", "-a"])
        .arg(disk)
        .arg("-i")
        .env("LIBGUESTFS_BACKEND", "direct");
    if std::env::var_os("LIBGUESTFS_BACKEND_SETTINGS").is_none() {
        command.env("LIBGUESTFS_BACKEND_SETTINGS", "force_tcg");
    }
    with_stdin(&mut command, commands).context("guestfish (Debian guestfish)")
}

fn hivexsh(hive: &Path, commands: &str) -> Result<String> {
    with_stdin(Command::new("hivexsh").arg(hive), commands).context("hivexsh (Debian libhivex-bin)")
}

fn with_stdin(command: &mut Command, input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().unwrap().write_all(input.as_bytes())?;
    let output = child.wait_with_output()?;
    ensure!(
        output.status.success(),
        "{:?} failed: {}",
        command.get_program(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
