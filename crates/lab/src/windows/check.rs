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

/// Where virt-v2v writes the script that gives a NIC its static address: 2.2 in `%SystemRoot%\Temp`, later ones
/// in the first-boot directory.
const STATIC_IP_SCRIPTS: [&str; 2] = [
    "/Windows/Temp/v2vnetcf.ps1",
    "/Program Files/Guestfs/Firstboot/Temp/network-configure.ps1",
];

/// The MAC whose static address the migration asked virt-v2v to keep (`preserveStaticIPs`, and an address VMware
/// Tools reported as configured by hand), as the volume check expects it.
pub fn static_mac(migration: &ferry_api::VirtualMachineMigration) -> Option<String> {
    if !migration.spec.conversion.preserve_static_ips {
        return None;
    }
    let source = migration.status.as_ref()?.source.as_ref()?;
    source
        .nics
        .iter()
        .find(|n| n.ip_addresses.iter().any(|a| a.is_static()))
        .map(|n| n.mac.clone())
}

/// Reads the adapted system disk `disk` of `guest` and returns what was found, one line each; an error names
/// what is missing. With `static_mac`, the first-boot script must give that NIC the address VMware Tools reported
/// (with the lab's gateway and DNS server); without, there must be none.
pub fn adapted_volume(
    disk: &Path,
    guest: &PhonyWindows,
    static_mac: Option<&str>,
) -> Result<Vec<String>> {
    let scratch = tempfile::tempdir()?;
    let system = scratch.path().join("SYSTEM");
    let answers = guestfish(
        disk,
        &format!(
            "ls /Windows/Drivers/VirtIO\necho ---\ncat /Windows/Drivers/VirtIO/viostor.sys\necho ---\n\
             is-file /Windows/System32/drivers/viostor.sys\necho ---\nls \"{FIRSTBOOT}/scripts\"\necho ---\n\
             cat \"{FIRSTBOOT}/rhsrvany.exe\"\necho ---\ndownload /Windows/System32/config/SYSTEM {}\n\
             echo ---\n-cat \"{}\"\necho ---\n-cat \"{}\"\necho ---\n",
            system.display(),
            STATIC_IP_SCRIPTS[0],
            STATIC_IP_SCRIPTS[1],
        ),
    )?;
    let parts: Vec<&str> = answers.split("---\n").collect();
    let [
        copied,
        viostor,
        in_system32,
        scripts,
        tool,
        _,
        older_ip,
        newer_ip,
        ..,
    ] = parts[..]
    else {
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
    let ip_script = [older_ip, newer_ip]
        .into_iter()
        .find(|text| !text.trim().is_empty());
    match (static_mac, ip_script) {
        (Some(mac), Some(script)) => {
            ensure!(
                scripts
                    .lines()
                    .any(|l| l.contains("v2vnetcf") || l.contains("network-configure")),
                "no first-boot script runs the static-address script: {scripts:?}"
            );
            found.push(static_ip_script(script, mac, guest)?);
        }
        (Some(mac), None) => bail!(
            "no script gives {mac} its static address: neither {} exists",
            STATIC_IP_SCRIPTS.join(" nor ")
        ),
        (None, Some(script)) => bail!("a static address was not asked for, and yet: {script}"),
        (None, None) => {}
    }
    Ok(found)
}

/// What the script that gives NIC `mac` its static address says, or what it lacks.
fn static_ip_script(script: &str, mac: &str, guest: &PhonyWindows) -> Result<String> {
    let address = guest.tools_address;
    let text = script.to_ascii_lowercase();
    let dashed = mac.to_ascii_lowercase().replace(':', "-");
    let wanted = [
        dashed.as_str(),
        address.address,
        super::TOOLS_GATEWAY,
        super::TOOLS_DNS,
        &format!("-prefixlength {}", address.prefix_length),
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|w| !text.contains(w))
        .collect();
    ensure!(
        missing.is_empty(),
        "the static-address script lacks {}: {script}",
        missing.join(", ")
    );
    Ok(format!(
        "static address script: {dashed} gets {}/{} via {}, DNS {}",
        address.address,
        address.prefix_length,
        super::TOOLS_GATEWAY,
        super::TOOLS_DNS
    ))
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
