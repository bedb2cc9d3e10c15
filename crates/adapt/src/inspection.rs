//! The guest virt-v2v found. With `-v` it prints its inspection as `i_<field> = <value>` lines (`i_root`,
//! `i_type`, `i_distro`, …) before it converts: 2.2 (Debian 12) ends the block with `i_firmware`, 2.6 (Debian 13,
//! the worker image) has no firmware line but `i_drive_mappings`. `virt-v2v-in-place` before 2.8 has no other
//! machine-readable output, and `virt-v2v-inspector` would run the whole conversion a second time.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    /// The root file system's device in the appliance, for example `/dev/sda1`.
    pub root: String,
    /// `linux`, `windows`, …
    pub kind: String,
    /// `debian`, `rhel`, `windows`, …
    pub distro: String,
    /// libosinfo's id, for example `debian12` or `win2k19`.
    pub osinfo: String,
    pub arch: String,
    pub major_version: u32,
    pub minor_version: u32,
    /// As the guest names itself; for Debian only its version (`12.15`).
    pub product_name: String,
    pub firmware: GuestFirmware,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuestFirmware {
    #[default]
    Unknown,
    Bios,
    Uefi,
}

impl Inspection {
    /// The last inspection printed in `log` (virt-v2v's `-v` output); none when it never got that far.
    pub fn from_log(log: &str) -> Option<Inspection> {
        let mut found = None;
        let mut current: Option<Inspection> = None;
        for line in log.lines() {
            let Some((key, value)) = line.split_once(" = ") else {
                continue;
            };
            let Some(field) = key.strip_prefix("i_") else {
                continue;
            };
            let value = value.trim();
            if field == "root" {
                found = current.take().filter(Inspection::complete).or(found);
                current = Some(Inspection {
                    root: value.into(),
                    ..Default::default()
                });
                continue;
            }
            let Some(inspection) = current.as_mut() else {
                continue;
            };
            match field {
                "type" => inspection.kind = value.into(),
                "distro" => inspection.distro = value.into(),
                "osinfo" => inspection.osinfo = value.into(),
                "arch" => inspection.arch = value.into(),
                "major_version" => inspection.major_version = value.parse().unwrap_or_default(),
                "minor_version" => inspection.minor_version = value.parse().unwrap_or_default(),
                "product_name" => inspection.product_name = value.into(),
                "firmware" => {
                    inspection.firmware = if value.starts_with("UEFI") {
                        GuestFirmware::Uefi
                    } else if value.starts_with("BIOS") {
                        GuestFirmware::Bios
                    } else {
                        GuestFirmware::Unknown
                    }
                }
                _ => {}
            }
        }
        current.filter(Inspection::complete).or(found)
    }

    /// A block cut short (the run died while printing it) has no guest type.
    fn complete(&self) -> bool {
        !self.kind.is_empty()
    }

    pub fn is_windows(&self) -> bool {
        self.kind == "windows"
    }

    /// For people: `Debian 12.15 (x86_64)`, or the guest's own product name when it has one.
    pub fn describe(&self) -> String {
        let name = if self.product_name.chars().any(char::is_alphabetic) {
            self.product_name.clone()
        } else {
            let mut distro = self.distro.clone();
            if let Some(first) = distro.get_mut(0..1) {
                first.make_ascii_uppercase();
            }
            format!("{distro} {}.{}", self.major_version, self.minor_version)
        };
        format!("{name} ({})", self.arch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As virt-v2v-in-place 2.2.0 printed it for the lab's Debian 12 BIOS guest, between libguestfs traces.
    const DEBIAN: &str = "libguestfs: trace: v2v: inspect_get_distro = \"debian\"
i_root = /dev/sda1
i_type = linux
i_distro = debian
i_osinfo = debian12
i_arch = x86_64
i_major_version = 12
i_minor_version = 15
i_package_format = deb
i_package_management = apt
i_product_name = 12.15
i_product_variant = unknown
i_firmware = BIOS
i_windows_systemroot = 
i_windows_software_hive = 
i_windows_system_hive = 
i_windows_current_control_set = 

libguestfs: trace: v2v: mountpoints
[ 433.0] Converting 12.15 to run on KVM
";

    #[test]
    fn the_inspection_block_of_a_debian_guest_is_read() {
        let inspection = Inspection::from_log(DEBIAN).unwrap();
        assert_eq!(
            inspection,
            Inspection {
                root: "/dev/sda1".into(),
                kind: "linux".into(),
                distro: "debian".into(),
                osinfo: "debian12".into(),
                arch: "x86_64".into(),
                major_version: 12,
                minor_version: 15,
                product_name: "12.15".into(),
                firmware: GuestFirmware::Bios,
            }
        );
        assert_eq!(inspection.describe(), "Debian 12.15 (x86_64)");
        assert!(!inspection.is_windows());
    }

    #[test]
    fn the_block_of_virt_v2v_2_6_has_no_firmware_line() {
        let log = "i_root = /dev/sda1\ni_type = linux\ni_distro = debian\ni_osinfo = debian12\n\
                   i_arch = x86_64\ni_major_version = 12\ni_minor_version = 15\ni_package_format = deb\n\
                   i_package_management = apt\ni_product_name = 12.15\ni_product_variant = unknown\n\
                   i_windows_systemroot = \ni_windows_software_hive = \ni_windows_system_hive = \n\
                   i_windows_current_control_set = \ni_drive_mappings = \n";
        let inspection = Inspection::from_log(log).unwrap();
        assert_eq!(inspection.osinfo, "debian12");
        assert_eq!(inspection.firmware, GuestFirmware::Unknown);
        assert_eq!(inspection.describe(), "Debian 12.15 (x86_64)");
    }

    #[test]
    fn the_last_block_wins_and_a_log_without_one_has_none() {
        let windows = "i_root = /dev/sda2\ni_type = windows\ni_distro = windows\ni_arch = x86_64\n\
                       i_major_version = 10\ni_minor_version = 0\n\
                       i_product_name = Windows Server 2019 Standard\ni_firmware = UEFI [/dev/sda1]\n";
        let both = format!("{DEBIAN}{windows}");
        let inspection = Inspection::from_log(&both).unwrap();
        assert!(inspection.is_windows());
        assert_eq!(inspection.firmware, GuestFirmware::Uefi);
        assert_eq!(
            inspection.describe(),
            "Windows Server 2019 Standard (x86_64)"
        );
        assert_eq!(Inspection::from_log("libguestfs: trace: launch\n"), None);
        // A root line alone (the run died mid-block) is not an inspection.
        assert_eq!(Inspection::from_log("i_root = /dev/sda1\n"), None);
    }
}
