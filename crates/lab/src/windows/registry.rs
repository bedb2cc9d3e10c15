//! The phony guests' registry as `.reg` text for `hivexregedit --merge`: what libguestfs's inspection reads
//! (product, version, build, installation type, the current control set, the hostname, drive letters), what
//! virt-v2v edits (CrashControl, DevicePath, the control set's services and device databases), and VMware Tools
//! installed as its MSI installs it. hivexregedit creates a key only under one that exists, so every level is
//! listed, parents first.

use std::fmt::Write;

use super::PhonyWindows;

/// The MBR disk signature of a BIOS guest, and the GPT GUID of an EFI guest's Windows partition: drive C: in
/// `MountedDevices` names them.
pub const MBR_SIGNATURE: u32 = 0x4652_5259;
pub const WINDOWS_PARTITION_GUID: &str = "5A1E3C2B-7D4F-4E8A-9B6C-0D1E2F3A4B5C";
/// Where a BIOS guest's Windows partition starts (sector 2048).
pub const BIOS_PARTITION_OFFSET: u64 = 1 << 20;
/// VMware Tools' MSI product code (12.x, 64-bit), under which its Uninstall entry is registered.
pub const VMWARE_TOOLS_PRODUCT: &str = "{FE2F6A2C-196E-4210-9C04-2B1BC21F07EF}";

const SOFTWARE: &str = r"HKEY_LOCAL_MACHINE\SOFTWARE";
const SYSTEM: &str = r"HKEY_LOCAL_MACHINE\SYSTEM";

/// The SOFTWARE hive, with the prefix `HKEY_LOCAL_MACHINE\SOFTWARE`.
pub fn software(guest: &PhonyWindows) -> String {
    let mut reg = Reg::new(SOFTWARE);
    reg.key(r"Microsoft");
    reg.key(r"Microsoft\Windows NT");
    reg.key(r"Microsoft\Windows NT\CurrentVersion");
    reg.string("ProductName", guest.product_name);
    reg.string("EditionID", guest.edition_id);
    reg.string("InstallationType", guest.installation_type);
    // Windows 10 and later keep 6.3 in CurrentVersion for old programs, and the real version in the numbers.
    reg.string("CurrentVersion", "6.3");
    reg.dword("CurrentMajorVersionNumber", 10);
    reg.dword("CurrentMinorVersionNumber", 0);
    reg.string("CurrentBuildNumber", guest.build);
    reg.string("CurrentBuild", guest.build);
    reg.string("SystemRoot", r"C:\Windows");
    reg.key(r"Microsoft\Windows");
    reg.key(r"Microsoft\Windows\CurrentVersion");
    reg.expand_string("DevicePath", r"%SystemRoot%\inf");
    reg.key(r"Microsoft\Windows\CurrentVersion\Uninstall");
    let tools = format!(r"Microsoft\Windows\CurrentVersion\Uninstall\{VMWARE_TOOLS_PRODUCT}");
    reg.key(&tools);
    reg.string("DisplayName", "VMware Tools");
    reg.string("DisplayVersion", "12.4.0.23259341");
    reg.string("Publisher", "VMware, Inc.");
    reg.expand_string(
        "UninstallString",
        &format!("MsiExec.exe /I{VMWARE_TOOLS_PRODUCT}"),
    );
    reg.string("InstallLocation", r"C:\Program Files\VMware\VMware Tools\");
    reg.text
}

/// The SYSTEM hive, with the prefix `HKEY_LOCAL_MACHINE\SYSTEM`.
pub fn system(guest: &PhonyWindows) -> String {
    let mut reg = Reg::new(SYSTEM);
    reg.key("Select");
    reg.dword("Current", 1);
    reg.dword("Default", 1);
    reg.dword("Failed", 0);
    reg.dword("LastKnownGood", 2);
    reg.key("MountedDevices");
    reg.binary(r"\DosDevices\C:", &drive_c(guest));
    reg.key("ControlSet001");
    reg.key(r"ControlSet001\Control");
    reg.key(r"ControlSet001\Control\CrashControl");
    reg.dword("AutoReboot", 1);
    reg.key(r"ControlSet001\Control\TimeZoneInformation");
    reg.string("TimeZoneKeyName", guest.time_zone);
    if guest.rtc_utc {
        reg.dword("RealTimeIsUniversal", 1);
    }
    if !guest.driver_database {
        reg.key(r"ControlSet001\Control\CriticalDeviceDatabase");
    }
    reg.key(r"ControlSet001\Services");
    for (service, image) in [
        ("pvscsi", r"System32\drivers\pvscsi.sys"),
        ("vmxnet3ndis6", r"System32\drivers\vmxnet3.sys"),
        (
            "VMTools",
            r#""C:\Program Files\VMware\VMware Tools\vmtoolsd.exe""#,
        ),
    ] {
        reg.key(&format!(r"ControlSet001\Services\{service}"));
        reg.expand_string("ImagePath", image);
        reg.dword("Start", if service == "VMTools" { 2 } else { 0 });
    }
    reg.key(r"ControlSet001\Services\Tcpip");
    reg.key(r"ControlSet001\Services\Tcpip\Parameters");
    reg.string("Hostname", guest.name);
    reg.string("NV Hostname", guest.name);
    if guest.driver_database {
        reg.key("DriverDatabase");
        reg.key(r"DriverDatabase\DeviceIds");
        reg.key(r"DriverDatabase\DriverInfFiles");
        reg.key(r"DriverDatabase\DriverPackages");
    }
    reg.text
}

/// `MountedDevices`' value for drive C: the MBR signature and the partition's byte offset on a BIOS guest, or
/// `DMIO:ID:` and the GPT partition's GUID (in Windows' byte order) on an EFI one.
fn drive_c(guest: &PhonyWindows) -> Vec<u8> {
    match guest.firmware {
        ferry_api::Firmware::Efi => {
            let mut value = b"DMIO:ID:".to_vec();
            value.extend(guid_bytes(WINDOWS_PARTITION_GUID));
            value
        }
        _ => {
            let mut value = MBR_SIGNATURE.to_le_bytes().to_vec();
            value.extend(BIOS_PARTITION_OFFSET.to_le_bytes());
            value
        }
    }
}

/// A GUID as Windows stores it: the first three groups little-endian, the rest as written.
fn guid_bytes(guid: &str) -> Vec<u8> {
    let groups: Vec<&str> = guid.split('-').collect();
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("a hex GUID"))
            .collect()
    };
    let mut bytes = vec![];
    for group in &groups[..3] {
        bytes.extend(hex(group).into_iter().rev());
    }
    bytes.extend(hex(groups[3]));
    bytes.extend(hex(groups[4]));
    bytes
}

/// `.reg` text for one hive, keys given relative to its prefix.
struct Reg {
    prefix: &'static str,
    text: String,
}

impl Reg {
    fn new(prefix: &'static str) -> Self {
        Self {
            prefix,
            text: "Windows Registry Editor Version 5.00\n".into(),
        }
    }

    fn key(&mut self, path: &str) {
        let _ = write!(self.text, "\n[{}\\{path}]\n", self.prefix);
    }

    fn string(&mut self, name: &str, value: &str) {
        let _ = writeln!(self.text, "{}=str(1):{}", quoted(name), quoted(value));
    }

    /// REG_EXPAND_SZ: UTF-16LE with its terminating NUL.
    fn expand_string(&mut self, name: &str, value: &str) {
        let bytes: Vec<u8> = value
            .encode_utf16()
            .chain([0])
            .flat_map(u16::to_le_bytes)
            .collect();
        let _ = writeln!(self.text, "{}=hex(2):{}", quoted(name), hex_list(&bytes));
    }

    fn dword(&mut self, name: &str, value: u32) {
        let _ = writeln!(self.text, "{}=dword:{value:08x}", quoted(name));
    }

    fn binary(&mut self, name: &str, value: &[u8]) {
        let _ = writeln!(self.text, "{}=hex(3):{}", quoted(name), hex_list(value));
    }
}

fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', r"\\").replace('"', "\\\""))
}

fn hex_list(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::windows::{WIN2K22, WIN11};

    #[test]
    fn drive_c_names_the_partition_as_windows_does() {
        assert_eq!(
            drive_c(&WIN2K22),
            [0x59, 0x52, 0x52, 0x46, 0, 0, 0x10, 0, 0, 0, 0, 0]
        );
        let efi = drive_c(&WIN11);
        assert_eq!(&efi[..8], b"DMIO:ID:");
        assert_eq!(&efi[8..12], [0x2b, 0x3c, 0x1e, 0x5a]);
        assert_eq!(&efi[16..], [0x9b, 0x6c, 0x0d, 0x1e, 0x2f, 0x3a, 0x4b, 0x5c]);
    }

    #[test]
    fn every_key_is_listed_after_its_parent() {
        for text in [software(&WIN2K22), system(&WIN11), system(&WIN2K22)] {
            let keys: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix('[')?.strip_suffix(']'))
                .collect();
            for (i, key) in keys.iter().enumerate() {
                let (parent, _) = key.rsplit_once('\\').unwrap();
                assert!(
                    parent == SOFTWARE || parent == SYSTEM || keys[..i].contains(&parent),
                    "{key} before its parent"
                );
            }
        }
        assert!(system(&WIN11).contains(r"[HKEY_LOCAL_MACHINE\SYSTEM\DriverDatabase]"));
        assert!(!system(&WIN2K22).contains("DriverDatabase"));
        assert!(software(&WIN2K22).contains(r#""UninstallString"=hex(2):4d,00,73,00"#));
    }
}
