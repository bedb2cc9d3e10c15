//! What `ferry adapt` is asked to do: the source VM as discovery recorded it, and for each disk where its copy
//! is and what it must hash to before anything touches it. The controller passes it as JSON; it holds no secret.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::domain::{Bus, Disk, Domain, Firmware, Format, Nic};
use crate::failure::AdaptationFailure;
use crate::inspection::Inspection;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdaptSpec {
    pub name: String,
    pub memory_mib: u64,
    pub cpus: u32,
    pub firmware: Firmware,
    /// In the VM's order.
    pub disks: Vec<AdaptDisk>,
    pub nics: Vec<Nic>,
    /// Where the overlays, virt-v2v's log and libguestfs's appliance cache go (an emptyDir).
    pub scratch: PathBuf,
    /// The virtio-win drivers (an ISO or a directory) for a Windows guest, virt-v2v's `VIRTIO_WIN`; none when
    /// the migration names none (`conversion.virtioWin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio_win: Option<PathBuf>,
    /// The first-boot tool for a Windows guest, `rhsrvany.exe` or `pvvxsvc.exe` or the directory holding it
    /// (virt-v2v's `VIRT_TOOLS_DATA_DIR`); none when the migration names none (`conversion.firstBootTool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_boot_tool: Option<PathBuf>,
    /// The static addresses a Windows guest's NICs get back at first boot (`conversion.preserveStaticIPs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub static_ips: Vec<StaticIp>,
    /// For a Linux guest: its NICs, whose names inside the guest are kept by MAC before virt-v2v runs
    /// ([`crate::interface_names`]); none for a guest whose names are not Ferry's to keep (Windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_interface_names: Option<Vec<crate::interface_names::SourceNic>>,
}

/// One address virt-v2v's first boot gives the NIC with this MAC: `--mac MAC:ip:ADDRESS,GATEWAY,PREFIX,DNS...`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticIp {
    pub mac: String,
    pub address: String,
    pub prefix_length: u8,
    /// virt-v2v takes the prefix and name servers only after a gateway: without one, only the address is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_servers: Vec<String>,
}

impl StaticIp {
    /// virt-v2v's `--mac` value, or why it would refuse it (its own checks: six hex pairs, addresses of hex
    /// digits, `:` and `.`, a prefix up to 128).
    pub fn mac_option(&self) -> Result<String, String> {
        let hex_pairs = self.mac.split(':').collect::<Vec<_>>();
        if hex_pairs.len() != 6
            || !hex_pairs
                .iter()
                .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
        {
            return Err(format!("{:?} is not a MAC address", self.mac));
        }
        let plain = |a: &str| {
            !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        };
        let addresses = std::iter::once(&self.address)
            .chain(&self.gateway)
            .chain(&self.dns_servers);
        if let Some(bad) = addresses.into_iter().find(|a| !plain(a)) {
            return Err(format!("{bad:?} is not an IP address"));
        }
        if self.prefix_length > 128 {
            return Err(format!("prefix length {} is over 128", self.prefix_length));
        }
        let mut value = format!("{}:ip:{}", self.mac.to_ascii_lowercase(), self.address);
        if let Some(gateway) = &self.gateway {
            value += &format!(",{gateway},{}", self.prefix_length);
            for server in &self.dns_servers {
                value += &format!(",{server}");
            }
        }
        Ok(value)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdaptDisk {
    /// The volume: `disk.img` on a filesystem volume, or the block device.
    pub path: PathBuf,
    pub block: bool,
    pub bus: Bus,
    /// The disk's size; a volume may be larger, and only these bytes are the disk.
    pub size_bytes: u64,
    /// The source's sha256, recorded when the copy was verified: a volume that no longer hashes to it was
    /// changed (adapted already, or torn) and is never adapted again.
    pub source_sha256: String,
}

impl AdaptSpec {
    pub fn parse(text: &str) -> Result<Self, String> {
        let spec: AdaptSpec = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if spec.disks.is_empty() {
            return Err("no disks to adapt".into());
        }
        Ok(spec)
    }

    /// The overlay virt-v2v writes for disk `index`, so the volume changes only when the whole run succeeded.
    pub fn overlay(&self, index: usize) -> PathBuf {
        self.scratch.join(format!("disk-{index}.qcow2"))
    }

    /// The domain virt-v2v reads: each disk is its overlay (whose backing file is the volume).
    pub fn domain(&self) -> Domain {
        Domain {
            name: self.name.clone(),
            memory_mib: self.memory_mib,
            cpus: self.cpus,
            firmware: self.firmware,
            disks: (0..self.disks.len())
                .map(|i| Disk {
                    path: self.overlay(i),
                    block: false,
                    format: Format::Qcow2,
                    bus: self.disks[i].bus,
                })
                .collect(),
            nics: self.nics.clone(),
        }
    }

    /// What a virt-v2v run on this spec means, before anything is committed: a Windows guest given no drivers
    /// or no first-boot tool is refused whatever virt-v2v made of it (it would look in its own default places,
    /// which the worker image does not fill, and newer virt-v2v installs every driver at first boot), and
    /// otherwise virt-v2v's own words decide ([`AdaptationFailure::of_run`]).
    pub fn verdict(&self, output: &str, exited_ok: bool) -> Option<(AdaptationFailure, String)> {
        if let Some(windows) = Inspection::from_log(output).filter(Inspection::is_windows) {
            if self.virtio_win.is_none() {
                return Some((
                    AdaptationFailure::MissingDrivers,
                    format!(
                        "virt-v2v found {}, and the migration names no virtio-win drivers for it: set \
                         spec.conversion.virtioWin to the PersistentVolumeClaim or image holding the virtio-win ISO",
                        windows.describe()
                    ),
                ));
            }
            if self.first_boot_tool.is_none() {
                return Some((
                    AdaptationFailure::MissingFirstBootTool,
                    format!(
                        "virt-v2v found {}, and the migration names no first-boot tool for it: set \
                         spec.conversion.firstBootTool to the PersistentVolumeClaim or image holding rhsrvany.exe",
                        windows.describe()
                    ),
                ));
            }
        }
        AdaptationFailure::of_run(output, exited_ok)
    }

    /// The disk whose overlay is `device`'s disk in the appliance (`/dev/sdb1` is disk 1): virt-v2v's appliance
    /// names the disks `sda`, `sdb`, … in the domain's order, whatever their bus.
    pub fn disk_of_device(&self, device: &str) -> Option<usize> {
        let (letters, _) = appliance_device(device)?;
        let mut index = 0usize;
        for c in letters.bytes() {
            index = index * 26 + usize::from(c - b'a') + 1;
        }
        let index = index.checked_sub(1)?;
        (index < self.disks.len()).then_some(index)
    }

    /// The partition number in a device name as virt-v2v's appliance names it (`/dev/sda2` is 2); `None` for a
    /// whole disk or a logical volume.
    pub fn partition_of_device(device: &str) -> Option<u32> {
        let (letters, digits) = appliance_device(device)?;
        (!letters.is_empty() && !digits.is_empty())
            .then(|| digits.parse().ok())
            .flatten()
    }
}

/// A device name as libguestfs's appliance gives it, `/dev/sdab3` or `/dev/vda`, split into its disk letters
/// (`ab`) and what follows them (`3`, or nothing for the whole disk); `None` for anything else.
fn appliance_device(device: &str) -> Option<(&str, &str)> {
    let name = Path::new(device).file_name()?.to_str()?;
    let rest = name
        .strip_prefix("sd")
        .or_else(|| name.strip_prefix("vd"))?;
    let digits = rest.trim_start_matches(|c: char| c.is_ascii_lowercase());
    Some((&rest[..rest.len() - digits.len()], digits))
}

/// Where virt-v2v finds the drivers (`VIRTIO_WIN`) in what the Job mounted at `named`: a file is the ISO; a
/// directory that holds nothing but one ISO image, through directories that each hold only one entry, stands for
/// that ISO (a KubeVirt container disk holds `disk/<name>.iso`; a PersistentVolumeClaim may hold one ISO beside
/// `lost+found`); any other directory is unpacked drivers. Missing: what is there instead, for the person to fix
/// `conversion.virtioWin.path`.
pub fn virtio_win_source(named: &Path) -> Result<PathBuf, String> {
    let metadata = std::fs::metadata(named).map_err(|e| {
        format!(
            "the virtio-win drivers named by spec.conversion.virtioWin are not at {} ({e}){}",
            named.display(),
            listing(named.ancestors().skip(1).find(|p| p.is_dir()))
        )
    })?;
    if !metadata.is_dir() {
        return Ok(named.to_path_buf());
    }
    let mut dir = named.to_path_buf();
    // Bounded: a container disk's is two levels deep.
    for _ in 0..4 {
        let Ok(names) = entries(&dir) else { break };
        let [only] = names.as_slice() else { break };
        let next = dir.join(only);
        if next.is_dir() {
            dir = next;
        } else if is_iso9660(&next) {
            return Ok(next);
        } else {
            break;
        }
    }
    Ok(named.to_path_buf())
}

/// The first-boot tool's names, in the order virt-v2v looks for them (libguestfs-common `mlcustomize/firstboot.ml`).
pub const FIRST_BOOT_TOOLS: [&str; 2] = ["rhsrvany.exe", "pvvxsvc.exe"];

/// The directory virt-v2v finds the first-boot tool in (`VIRT_TOOLS_DATA_DIR`), from what the Job mounted at
/// `named`: the tool itself, or a directory holding it. Missing: what is there instead, for the person to fix
/// `conversion.firstBootTool`.
pub fn first_boot_tool_dir(named: &Path) -> Result<PathBuf, String> {
    let holds_tool = |dir: &Path| FIRST_BOOT_TOOLS.iter().any(|tool| dir.join(tool).is_file());
    let found = if named.is_dir() {
        holds_tool(named).then(|| named.to_path_buf())
    } else {
        let name = named
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        named
            .parent()
            .filter(|_| named.is_file() && FIRST_BOOT_TOOLS.contains(&name))
            .map(Path::to_path_buf)
    };
    found.ok_or_else(|| {
        format!(
            "the first-boot tool named by spec.conversion.firstBootTool is not at {}: it must be {} or a \
             directory holding one of them{}",
            named.display(),
            FIRST_BOOT_TOOLS.join(" or "),
            listing(named.ancestors().find(|p| p.is_dir()))
        )
    })
}

/// `; DIR holds a, b and N more`, for a message about a file that is not where it was named.
fn listing(dir: Option<&Path>) -> String {
    let Some(dir) = dir else {
        return String::new();
    };
    let names = entries(dir).unwrap_or_default();
    const SHOWN: usize = 12;
    let more = match names.len().saturating_sub(SHOWN) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "; {} holds {}{more}",
        dir.display(),
        if names.is_empty() {
            "nothing".into()
        } else {
            names[..names.len().min(SHOWN)].join(", ")
        }
    )
}

/// A directory's entries, sorted, without what a file system or a volume adds by itself.
fn entries(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name != "lost+found" && !name.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

/// ISO 9660's first volume descriptor, at sector 16, starts with `CD001` after its type byte.
fn is_iso9660(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut magic = [0u8; 5];
    std::fs::File::open(path)
        .and_then(|mut file| {
            file.seek(SeekFrom::Start(16 * 2048 + 1))?;
            file.read_exact(&mut magic)
        })
        .is_ok_and(|()| &magic == b"CD001")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(disks: usize) -> AdaptSpec {
        AdaptSpec {
            name: "web".into(),
            memory_mib: 1024,
            cpus: 2,
            firmware: Firmware::Bios,
            disks: (0..disks)
                .map(|i| AdaptDisk {
                    path: format!("/disks/{i}/disk.img").into(),
                    block: i == 1,
                    bus: Bus::Scsi,
                    size_bytes: 1 << 30,
                    source_sha256: "ab".into(),
                })
                .collect(),
            nics: vec![],
            scratch: "/scratch".into(),
            virtio_win: None,
            first_boot_tool: None,
            static_ips: vec![],
            keep_interface_names: None,
        }
    }

    #[test]
    fn a_static_ip_becomes_virt_v2vs_mac_option_and_nothing_else() {
        let mut ip = StaticIp {
            mac: "00:50:56:AA:BB:CC".into(),
            address: "192.168.122.50".into(),
            prefix_length: 24,
            gateway: Some("192.168.122.1".into()),
            dns_servers: vec!["192.168.122.2".into(), "192.168.122.3".into()],
        };
        assert_eq!(
            ip.mac_option().unwrap(),
            "00:50:56:aa:bb:cc:ip:192.168.122.50,192.168.122.1,24,192.168.122.2,192.168.122.3"
        );
        ip.gateway = None;
        assert_eq!(
            ip.mac_option().unwrap(),
            "00:50:56:aa:bb:cc:ip:192.168.122.50",
            "virt-v2v reads the prefix only after a gateway"
        );
        ip.address = "fd00::50".into();
        assert!(ip.mac_option().is_ok());
        ip.address = "10.0.0.1,evil".into();
        assert!(ip.mac_option().unwrap_err().contains("not an IP address"));
        ip.address = "10.0.0.1".into();
        ip.mac = "00:50:56:aa:bb".into();
        assert!(ip.mac_option().unwrap_err().contains("not a MAC address"));
    }

    #[test]
    fn virt_v2v_reads_overlays_and_the_root_device_names_its_disk() {
        let spec = spec(3);
        let domain = spec.domain();
        assert_eq!(domain.disks[1].path, Path::new("/scratch/disk-1.qcow2"));
        assert!(
            domain
                .disks
                .iter()
                .all(|d| !d.block && d.format == Format::Qcow2)
        );
        assert!(
            domain
                .to_xml()
                .contains("<source file='/scratch/disk-1.qcow2'/>")
        );
        assert_eq!(spec.disk_of_device("/dev/sda1"), Some(0));
        assert_eq!(spec.disk_of_device("/dev/sdc"), Some(2));
        assert_eq!(spec.disk_of_device("/dev/sdd1"), None, "no fourth disk");
        assert_eq!(spec.disk_of_device("/dev/mapper/vg-root"), None);
        assert_eq!(AdaptSpec::partition_of_device("/dev/sda2"), Some(2));
        assert_eq!(AdaptSpec::partition_of_device("/dev/sdab12"), Some(12));
        assert_eq!(AdaptSpec::partition_of_device("/dev/sdc"), None);
        assert_eq!(AdaptSpec::partition_of_device("/dev/mapper/vg-root"), None);
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(AdaptSpec::parse(&text).unwrap(), spec);
        assert!(AdaptSpec::parse(&serde_json::to_string(&spec_with_no_disks()).unwrap()).is_err());
    }

    fn spec_with_no_disks() -> AdaptSpec {
        spec(0)
    }

    #[test]
    fn a_windows_guest_given_no_drivers_is_refused_before_the_commit() {
        let windows = "i_root = /dev/sda2\ni_type = windows\ni_distro = windows\ni_osinfo = win2k22\n\
                       i_arch = x86_64\ni_major_version = 10\ni_minor_version = 0\n\
                       i_product_name = Windows Server 2022 Standard\n[  60.0] Converting Windows Server 2022 \
                       Standard to run on KVM\n[  90.0] Finishing off\n";
        let (class, message) = spec(1).verdict(windows, true).unwrap();
        assert_eq!(class, AdaptationFailure::MissingDrivers);
        assert!(
            message.starts_with("virt-v2v found Windows Server 2022 Standard (x86_64)")
                && message.contains("spec.conversion.virtioWin"),
            "{message}"
        );
        let mut given = spec(1);
        given.virtio_win = Some("/run/ferry/virtio-win/disk/virtio-win.iso".into());
        let (class, message) = given.verdict(windows, true).unwrap();
        assert_eq!(class, AdaptationFailure::MissingFirstBootTool);
        assert!(
            message.contains("spec.conversion.firstBootTool"),
            "{message}"
        );
        given.first_boot_tool = Some("/run/ferry/first-boot-tool".into());
        assert_eq!(
            given.verdict(windows, true),
            None,
            "drivers and first-boot tool given, and installed"
        );
        let no_tool = format!(
            "{windows}virt-v2v-in-place: error: One of rhsrvany.exe or pvvxsvc.exe is missing in \
             /usr/share/virt-tools.  One of them is required in order to install Windows firstboot scripts.  \
             You can get one by building rhsrvany (https://github.com/rwmjones/rhsrvany)\n"
        );
        assert_eq!(
            given.verdict(&no_tool, false).unwrap().0,
            AdaptationFailure::MissingFirstBootTool,
            "virt-v2v's own words for a directory without the tool"
        );
        let linux = windows.replace("= windows", "= linux");
        assert_eq!(
            spec(1).verdict(&linux, true),
            None,
            "a Linux guest needs none"
        );
        // With drivers given, virt-v2v's own verdict stands.
        let unusable = format!(
            "{windows}virt-v2v-in-place: warning: there is no virtio network driver for this version of \
             Windows (10.0 x86_64).  virt-v2v looks for this driver in /run/ferry/virtio-win\n\n"
        );
        assert_eq!(
            given.verdict(&unusable, true).unwrap().0,
            AdaptationFailure::MissingDrivers
        );
    }

    fn iso(path: &Path) {
        let mut bytes = vec![0u8; 17 * 2048];
        bytes[16 * 2048..16 * 2048 + 6].copy_from_slice(b"\x01CD001");
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn the_drivers_are_the_iso_a_volume_holds_alone_or_its_directory() {
        let root = tempfile::tempdir().unwrap();
        let mount = root.path();
        // A KubeVirt container disk: disk/<whatever the ISO is called>.
        std::fs::create_dir(mount.join("disk")).unwrap();
        iso(&mount.join("disk/virtio-win-0.1.266.iso"));
        let found = mount.join("disk/virtio-win-0.1.266.iso");
        assert_eq!(virtio_win_source(mount).unwrap(), found);
        assert_eq!(virtio_win_source(&mount.join("disk")).unwrap(), found);
        assert_eq!(virtio_win_source(&found).unwrap(), found);
        // Named but absent: what is there, so the path can be corrected.
        let missing = virtio_win_source(&mount.join("disk/virtio-win.iso")).unwrap_err();
        assert!(
            missing.contains("spec.conversion.virtioWin")
                && missing.contains("not at")
                && missing.ends_with("holds virtio-win-0.1.266.iso"),
            "{missing}"
        );

        // A claim with one ISO beside lost+found.
        let claim = tempfile::tempdir().unwrap();
        std::fs::create_dir(claim.path().join("lost+found")).unwrap();
        iso(&claim.path().join("virtio-win.iso"));
        assert_eq!(
            virtio_win_source(claim.path()).unwrap(),
            claim.path().join("virtio-win.iso")
        );

        // Unpacked drivers, and a lone file that is no ISO: the directory itself, for virt-v2v to search.
        let unpacked = tempfile::tempdir().unwrap();
        for dir in ["viostor/2k22/amd64", "NetKVM/2k22/amd64"] {
            std::fs::create_dir_all(unpacked.path().join(dir)).unwrap();
        }
        assert_eq!(virtio_win_source(unpacked.path()).unwrap(), unpacked.path());
        let lone = tempfile::tempdir().unwrap();
        std::fs::write(lone.path().join("drivers.zip"), b"PK").unwrap();
        assert_eq!(virtio_win_source(lone.path()).unwrap(), lone.path());
    }
}

#[cfg(test)]
mod first_boot_tool {
    use super::*;

    #[test]
    fn the_tool_or_a_directory_holding_it_names_virt_v2vs_directory() {
        let dir = tempfile::tempdir().unwrap();
        let tools = dir.path().join("virt-tools");
        std::fs::create_dir(&tools).unwrap();
        std::fs::write(tools.join("README"), "").unwrap();
        let missing = first_boot_tool_dir(&tools).unwrap_err();
        assert!(
            missing.contains("rhsrvany.exe or pvvxsvc.exe") && missing.contains("holds README"),
            "{missing}"
        );
        std::fs::write(tools.join("pvvxsvc.exe"), "").unwrap();
        assert_eq!(first_boot_tool_dir(&tools).unwrap(), tools);
        assert_eq!(
            first_boot_tool_dir(&tools.join("pvvxsvc.exe")).unwrap(),
            tools
        );
        let other = first_boot_tool_dir(&tools.join("README")).unwrap_err();
        assert!(other.contains("spec.conversion.firstBootTool"), "{other}");
        assert!(first_boot_tool_dir(&dir.path().join("nothing")).is_err());
    }
}
