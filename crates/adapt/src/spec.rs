//! What `ferry adapt` is asked to do: the source VM as discovery recorded it, and for each disk where its copy
//! is and what it must hash to before anything touches it. The controller passes it as JSON; it holds no secret.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::domain::{Bus, Disk, Domain, Firmware, Format, Nic};

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
    /// The virtio-win drivers (an ISO or a directory) for a Windows guest; none for Linux guests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio_win: Option<PathBuf>,
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

    /// The disk whose overlay is `device`'s disk in the appliance (`/dev/sdb1` is disk 1): virt-v2v's appliance
    /// names the disks `sda`, `sdb`, … in the domain's order, whatever their bus.
    pub fn disk_of_device(&self, device: &str) -> Option<usize> {
        let name = Path::new(device).file_name()?.to_str()?;
        let letters: String = name
            .strip_prefix("sd")
            .or_else(|| name.strip_prefix("vd"))?
            .chars()
            .take_while(|c| c.is_ascii_lowercase())
            .collect();
        let mut index = 0usize;
        for c in letters.bytes() {
            index = index * 26 + usize::from(c - b'a') + 1;
        }
        let index = index.checked_sub(1)?;
        (index < self.disks.len()).then_some(index)
    }
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
        }
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
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(AdaptSpec::parse(&text).unwrap(), spec);
        assert!(AdaptSpec::parse(&serde_json::to_string(&spec_with_no_disks()).unwrap()).is_err());
    }

    fn spec_with_no_disks() -> AdaptSpec {
        spec(0)
    }
}
