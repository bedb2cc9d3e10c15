//! The libvirt domain `virt-v2v-in-place -i libvirtxml` reads: the source VM as discovery recorded it (memory,
//! vCPUs, firmware, NICs with their MACs), with each disk pointing at the copy to adapt. virt-v2v reads only part
//! of libvirt's format (`input/parse_libvirt_xml.ml`): memory in KiB whatever its unit says, the firmware from
//! `os/@firmware`, a disk's bus from `target/@bus`, its format from `driver/@type`.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    pub memory_mib: u64,
    pub cpus: u32,
    pub firmware: Firmware,
    /// In the source's order: disk `i` of the VM is the `i`th here.
    pub disks: Vec<Disk>,
    pub nics: Vec<Nic>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Firmware {
    Bios,
    Efi,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub path: PathBuf,
    /// A block device (a Block volume) rather than a file.
    pub block: bool,
    pub format: Format,
    pub bus: Bus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Raw,
    Qcow2,
}

/// The bus the disk had on the source; virt-v2v uses it to map device names (`/dev/sda` to `/dev/vda`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bus {
    Scsi,
    Sata,
    Ide,
}

impl Bus {
    /// vSphere's controller kinds as discovery records them (`scsi`, `sata`, `ide`, `nvme`). virt-v2v 2.x knows no
    /// NVMe source bus, so an NVMe disk is described as SCSI: only the device name virt-v2v maps from differs.
    pub fn from_source(bus: Option<&str>) -> Bus {
        match bus {
            Some("sata") => Bus::Sata,
            Some("ide") => Bus::Ide,
            _ => Bus::Scsi,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Bus::Scsi => "scsi",
            Bus::Sata => "sata",
            Bus::Ide => "ide",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Bus::Scsi | Bus::Sata => "sd",
            Bus::Ide => "hd",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    pub mac: String,
    pub network: String,
    /// vSphere's adapter type (`vmxnet3`, `e1000e`); virt-v2v replaces it either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl Domain {
    pub fn to_xml(&self) -> String {
        let mut xml = String::new();
        let firmware = match self.firmware {
            Firmware::Bios => "bios",
            Firmware::Efi => "efi",
        };
        let _ = writeln!(xml, "<domain type='kvm'>");
        let _ = writeln!(xml, "  <name>{}</name>", escape(&self.name));
        let _ = writeln!(xml, "  <memory>{}</memory>", self.memory_mib * 1024);
        let _ = writeln!(xml, "  <vcpu>{}</vcpu>", self.cpus.max(1));
        let _ = writeln!(xml, "  <os firmware='{firmware}'>");
        let _ = writeln!(xml, "    <type arch='x86_64'>hvm</type>");
        let _ = writeln!(xml, "  </os>");
        let _ = writeln!(xml, "  <features><acpi/><apic/></features>");
        let _ = writeln!(xml, "  <devices>");
        for (disk, dev) in self.disks.iter().zip(device_names(&self.disks)) {
            let (kind, source) = if disk.block {
                ("block", "dev")
            } else {
                ("file", "file")
            };
            let format = match disk.format {
                Format::Raw => "raw",
                Format::Qcow2 => "qcow2",
            };
            let path = escape(&disk.path.to_string_lossy());
            let _ = writeln!(xml, "    <disk type='{kind}' device='disk'>");
            let _ = writeln!(xml, "      <driver name='qemu' type='{format}'/>");
            let _ = writeln!(xml, "      <source {source}='{path}'/>");
            let _ = writeln!(xml, "      <target dev='{dev}' bus='{}'/>", disk.bus.name());
            let _ = writeln!(xml, "    </disk>");
        }
        for nic in &self.nics {
            let _ = writeln!(xml, "    <interface type='network'>");
            let _ = writeln!(xml, "      <mac address='{}'/>", escape(&nic.mac));
            let _ = writeln!(xml, "      <source network='{}'/>", escape(&nic.network));
            if let Some(model) = &nic.model {
                let _ = writeln!(xml, "      <model type='{}'/>", escape(model));
            }
            let _ = writeln!(xml, "    </interface>");
        }
        let _ = writeln!(xml, "  </devices>");
        let _ = writeln!(xml, "</domain>");
        xml
    }
}

/// `sda`, `sdb`, … per name prefix, in disk order: SCSI and SATA disks share `sd`, as a Linux guest names them.
fn device_names(disks: &[Disk]) -> Vec<String> {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    disks
        .iter()
        .map(|disk| {
            let prefix = disk.bus.prefix();
            let n = counts.entry(prefix).or_default();
            let name = format!("{prefix}{}", letters(*n));
            *n += 1;
            name
        })
        .collect()
}

/// 0 → `a`, 25 → `z`, 26 → `aa`: the kernel's disk suffixes.
fn letters(mut n: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'a' + (n % 26) as u8);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII")
}

/// Text and attribute values (single-quoted) with XML's five special characters escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(path: &str, block: bool, bus: Bus) -> Disk {
        Disk {
            path: path.into(),
            block,
            format: if block { Format::Raw } else { Format::Qcow2 },
            bus,
        }
    }

    #[test]
    fn the_domain_names_disks_by_bus_and_keeps_their_order_and_the_macs() {
        let domain = Domain {
            name: "web <01> & 'db'".into(),
            memory_mib: 2048,
            cpus: 2,
            firmware: Firmware::Efi,
            disks: vec![
                disk("/scratch/disk-0.qcow2", false, Bus::Scsi),
                disk("/dev/ferry-disk-1", true, Bus::Sata),
                disk("/scratch/disk-2.qcow2", false, Bus::Ide),
            ],
            nics: vec![Nic {
                mac: "00:50:56:aa:bb:cc".into(),
                network: "VM Network".into(),
                model: Some("vmxnet3".into()),
            }],
        };
        let xml = domain.to_xml();
        assert!(
            xml.contains("<name>web &lt;01&gt; &amp; &apos;db&apos;</name>"),
            "{xml}"
        );
        // KiB, whatever a unit attribute would say: virt-v2v ignores it.
        assert!(xml.contains("<memory>2097152</memory>"), "{xml}");
        assert!(xml.contains("<os firmware='efi'>"), "{xml}");
        let targets: Vec<&str> = xml
            .lines()
            .filter(|l| l.contains("<target "))
            .map(str::trim)
            .collect();
        assert_eq!(
            targets,
            [
                "<target dev='sda' bus='scsi'/>",
                "<target dev='sdb' bus='sata'/>",
                "<target dev='hda' bus='ide'/>"
            ]
        );
        assert!(
            xml.contains("<disk type='block' device='disk'>\n      <driver name='qemu' type='raw'/>\n      <source dev='/dev/ferry-disk-1'/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<source file='/scratch/disk-0.qcow2'/>"),
            "{xml}"
        );
        assert!(xml.contains("<mac address='00:50:56:aa:bb:cc'/>"), "{xml}");
        assert!(xml.contains("<source network='VM Network'/>"), "{xml}");
    }

    #[test]
    fn disk_suffixes_go_past_z_as_the_kernel_names_them() {
        assert_eq!(letters(0), "a");
        assert_eq!(letters(25), "z");
        assert_eq!(letters(26), "aa");
        assert_eq!(letters(27), "ab");
        assert_eq!(letters(701), "zz");
        assert_eq!(letters(702), "aaa");
    }

    #[test]
    fn vsphere_controllers_map_to_the_buses_virt_v2v_knows() {
        assert_eq!(Bus::from_source(Some("sata")), Bus::Sata);
        assert_eq!(Bus::from_source(Some("ide")), Bus::Ide);
        assert_eq!(Bus::from_source(Some("scsi")), Bus::Scsi);
        assert_eq!(Bus::from_source(Some("nvme")), Bus::Scsi);
        assert_eq!(Bus::from_source(None), Bus::Scsi);
    }
}
