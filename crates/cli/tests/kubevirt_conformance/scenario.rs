//! The conformance scenarios: what each VM is (the source Ferry would have discovered, the disks it gets) and
//! how far it goes before it is observed.

use std::path::PathBuf;
use std::time::Duration;

use ferry_api::{Firmware, SourceDisk, SourceNic, SourceVmStatus, VirtualMachineMigration};
use serde_json::{Value, json};

/// What the console may show, in the order a boot would print it.
pub const LANDMARKS: [&str; 4] = [
    "No bootable device",
    "Gave up waiting for root",
    "ALERT!",
    "FERRY-GUEST-READY",
];
/// How long a guest that shows nothing is watched once it runs.
const QUIET_GUEST: Duration = Duration::from_secs(45);

/// The images the scenarios boot.
pub struct Images {
    pub bios: PathBuf,
    pub efi: PathBuf,
    /// The data disk both Debian guests mount at `/data`.
    pub data: PathBuf,
    /// A 4 MiB disk whose boot sector prints its marker on the serial port.
    pub marker_disk: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scenario {
    /// The Debian BIOS guest on Ferry's default (compatibility) devices.
    Bios,
    EfiSecureBoot,
    /// Twelve disks on SATA, the first of them booting.
    TwelveSata,
    /// One blank disk.
    NoBootableDisk,
    /// The Debian BIOS guest on virtio, without the drivers for it.
    UnadaptedVirtio,
    /// A NIC on a Multus network whose NetworkAttachmentDefinition does not exist.
    MissingNetwork,
}

pub enum Content {
    Image(PathBuf),
    Blank,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [
        Scenario::Bios,
        Scenario::EfiSecureBoot,
        Scenario::TwelveSata,
        Scenario::NoBootableDisk,
        Scenario::UnadaptedVirtio,
        Scenario::MissingNetwork,
    ];

    /// Also the VM's name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Bios => "bios",
            Scenario::EfiSecureBoot => "efi-secure-boot",
            Scenario::TwelveSata => "twelve-sata",
            Scenario::NoBootableDisk => "no-bootable-disk",
            Scenario::UnadaptedVirtio => "unadapted-virtio",
            Scenario::MissingNetwork => "missing-network",
        }
    }

    pub fn disks(self, images: &Images) -> Vec<Content> {
        match self {
            // The Debian guests mount their data disk at boot.
            Scenario::Bios | Scenario::UnadaptedVirtio => vec![
                Content::Image(images.bios.clone()),
                Content::Image(images.data.clone()),
            ],
            Scenario::EfiSecureBoot => vec![
                Content::Image(images.efi.clone()),
                Content::Image(images.data.clone()),
            ],
            Scenario::TwelveSata => std::iter::once(Content::Image(images.marker_disk.clone()))
                .chain((1..12).map(|_| Content::Blank))
                .collect(),
            Scenario::NoBootableDisk => vec![Content::Blank],
            Scenario::MissingNetwork => vec![Content::Image(images.marker_disk.clone())],
        }
    }

    /// The migration Ferry would have for it, and what discovery would have recorded of its source.
    pub fn migration(self, ns: &str, disks: usize) -> (VirtualMachineMigration, SourceVmStatus) {
        let mut target = json!({"networks": [{"source": "VM Network", "pod": {}}]});
        if self == Scenario::MissingNetwork {
            target = json!({"networks": [{"source": "VM Network", "multus": {"networkName": "absent"}}]});
        }
        if self == Scenario::UnadaptedVirtio {
            target["devices"] = "Virtio".into();
        }
        let spec = json!({"source": {"providerRef": {"name": "vcenter"}, "vm": {"name": self.name()}},
                          "target": target});
        let mut vmm =
            VirtualMachineMigration::new(self.name(), serde_json::from_value(spec).unwrap());
        vmm.metadata.namespace = Some(ns.into());
        vmm.metadata.uid = Some(format!("kubevirt-conformance-{}", self.name()));
        let debian = matches!(
            self,
            Scenario::Bios | Scenario::EfiSecureBoot | Scenario::UnadaptedVirtio
        );
        let (firmware, secure_boot) = match self {
            Scenario::EfiSecureBoot => (Firmware::Efi, true),
            _ => (Firmware::Bios, false),
        };
        let source = SourceVmStatus {
            cpus: if debian { 2 } else { 1 },
            cores_per_socket: if self == Scenario::Bios { 2 } else { 1 },
            memory_mib: if debian { 1024 } else { 256 },
            firmware: Some(firmware),
            secure_boot,
            disks: (0..disks as i32)
                .map(|i| SourceDisk {
                    key: 2000 + i,
                    bus: Some("scsi".into()),
                    ..Default::default()
                })
                .collect(),
            nics: vec![SourceNic {
                mac: "00:50:56:a0:00:01".into(),
                network: "VM Network".into(),
                model: Some("vmxnet3".into()),
                ip_addresses: vec![],
            }],
            boot_order: vec![2000],
            ..Default::default()
        };
        (vmm, source)
    }

    /// Whether the VM is halted before it is deleted; else it is deleted while it runs.
    pub fn halts_before_deletion(self) -> bool {
        matches!(
            self,
            Scenario::Bios | Scenario::EfiSecureBoot | Scenario::TwelveSata
        )
    }

    /// Whether the scenario has come as far as it goes: the guest's agent answers with its OS and address, or
    /// the console shows where the boot stops, or a guest that prints nothing has run for a while.
    pub fn arrived(self, vmi: &Value, console: &[String], running_for: Option<Duration>) -> bool {
        let shows = |landmark: &str| console.iter().any(|l| l == landmark);
        match self {
            Scenario::Bios | Scenario::EfiSecureBoot => {
                condition_is(vmi, "AgentConnected", "True")
                    && vmi["status"]["guestOSInfo"]["prettyName"].is_string()
                    && vmi["status"]["interfaces"]
                        .as_array()
                        .is_some_and(|is| is.iter().any(|i| i["ipAddress"].is_string()))
                    && shows("FERRY-GUEST-READY")
            }
            Scenario::TwelveSata => {
                condition_is(vmi, "Ready", "True") && shows("FERRY-GUEST-READY")
            }
            Scenario::UnadaptedVirtio => condition_is(vmi, "Ready", "True") && shows("ALERT!"),
            Scenario::NoBootableDisk => {
                condition_is(vmi, "Ready", "True") && running_for.is_some_and(|t| t >= QUIET_GUEST)
            }
            // No launcher pod, and virt-controller says why.
            Scenario::MissingNetwork => condition_is(vmi, "Synchronized", "False"),
        }
    }
}

fn condition_is(object: &Value, type_: &str, status: &str) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == type_ && c["status"] == status)
    })
}
