//! virt-launcher's converter, for the lab: a VMI spec becomes the QEMU machine KubeVirt would define through
//! libvirt (q35, each disk on its bus, each NIC with its model and MAC, SeaBIOS or OVMF, the guest agent's
//! channel). Pure: the paths it needs come in as a [`Launch`]; what KubeVirt's admission would refuse is an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::pci::Layout;

/// The guest agent's virtio-serial port name; KubeVirt adds it to every VMI.
pub const AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";
/// The lab's largest guest. The machine has 2 cores and 24 GiB for everything the lab and its tests run, so a
/// migrated 16 GiB VM gets this much; what the guest is told it has changes, its disks do not.
pub const MAX_MEMORY_MIB: u64 = 2048;
const MIN_MEMORY_MIB: u64 = 16;
/// KubeVirt's default masquerade network (`vmNetworkCIDR`): the gateway takes .1, the guest .2.
const DEFAULT_VM_CIDR: &str = "10.0.2.0/24";
/// An AHCI controller (ich9-ahci) has six ports: q35's built-in one is `ide.0` to `ide.5`; libvirt adds another
/// controller for each further six SATA disks (KubeVirt v1.9.0 boots twelve, seen on the real node).
const SATA_PORTS: usize = 6;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bus {
    Virtio,
    Scsi,
    Sata,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub name: String,
    pub bus: Bus,
    pub boot_order: Option<u32>,
    pub serial: Option<String>,
    /// The PVC behind the disk's volume (`dataVolume` or `persistentVolumeClaim`).
    pub claim: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Network {
    /// The pod network (masquerade or bridge binding): QEMU user networking shaped like KubeVirt's masquerade.
    Pod {
        gateway: String,
        guest: String,
        cidr: String,
    },
    /// A Multus network, by the `networkName` the VMI gives; once its NetworkAttachmentDefinition is read
    /// (`multus::attach`), the lab segment it names, else none: the NIC then sits on a segment of its own.
    Multus {
        network_name: String,
        bridge: Option<Bridge>,
    },
}

/// A lab segment with a router: QEMU's user network on `cidr`, answering as `gateway`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bridge {
    pub cidr: String,
    pub gateway: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    /// The QEMU device: `virtio-net-pci`, `e1000e`, ...
    pub device: &'static str,
    pub mac: String,
    pub boot_order: Option<u32>,
    pub network: Network,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS, QEMU's default.
    Bios,
    Efi {
        secure_boot: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub sockets: u32,
    pub cores: u32,
    pub threads: u32,
}

impl Topology {
    pub fn vcpus(&self) -> u32 {
        self.sockets * self.cores * self.threads
    }
}

/// The machine of one VMI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    pub machine: &'static str,
    pub firmware: Firmware,
    pub smm: bool,
    pub cpu: Topology,
    pub memory_mib: u64,
    pub disks: Vec<Disk>,
    pub nics: Vec<Nic>,
    /// `rebootPolicy: Terminate`: a guest reboot ends the domain instead of restarting it.
    pub reboot_terminates: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

/// Debian's OVMF builds (package `ovmf`).
pub struct Ovmf;

impl Ovmf {
    const DIR: &str = "/usr/share/OVMF";

    /// The code and the variable-store template: with Secure Boot, the SMM build and Microsoft's keys enrolled.
    pub fn files(secure_boot: bool) -> (PathBuf, PathBuf) {
        let dir = Path::new(Self::DIR);
        if secure_boot {
            (
                dir.join("OVMF_CODE_4M.secboot.fd"),
                dir.join("OVMF_VARS_4M.ms.fd"),
            )
        } else {
            (dir.join("OVMF_CODE_4M.fd"), dir.join("OVMF_VARS_4M.fd"))
        }
    }
}

/// Where a started domain finds its files.
pub struct Launch<'a> {
    pub name: &'a str,
    pub accel: Accel,
    /// The image of each disk, by disk name.
    pub images: &'a BTreeMap<String, PathBuf>,
    /// COM1.
    pub serial_log: &'a Path,
    pub agent_socket: &'a Path,
    pub qmp_socket: &'a Path,
    /// This VMI's copy of the OVMF variable store (EFI only).
    pub efi_vars: &'a Path,
}

fn str_at<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value[key].as_str().filter(|s| !s.is_empty())
}

fn u32_at(value: &Value, key: &str) -> Result<Option<u32>, String> {
    match &value[key] {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| format!("{key} must be a positive integer, not {v}")),
    }
}

/// A Kubernetes quantity in bytes (rounded up, as `Quantity.Value()` does): `128Mi`, `1.5Gi`, `2G`, `1e9`.
pub fn parse_quantity(quantity: &str) -> Option<u128> {
    let q = quantity.trim();
    let number_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(number_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = |s: &str| -> Option<u128> {
        if s.is_empty() {
            Some(0)
        } else if s.bytes().all(|b| b.is_ascii_digit()) && s.len() <= 30 {
            s.parse().ok()
        } else {
            None
        }
    };
    // The value is mantissa / 10^scale × multiplier / divisor.
    let mantissa = digits(whole)? * 10u128.pow(fraction.len() as u32) + digits(fraction)?;
    let scale = 10u128.pow(fraction.len() as u32);
    let (multiplier, divisor): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        exponent if exponent.starts_with(['e', 'E']) => {
            let e: i32 = exponent[1..].parse().ok()?;
            if e >= 0 {
                (10u128.checked_pow(e as u32)?, 1)
            } else {
                (1, 10u128.checked_pow(e.unsigned_abs())?)
            }
        }
        _ => return None,
    };
    let numerator = mantissa.checked_mul(multiplier)?;
    Some(numerator.div_ceil(scale.checked_mul(divisor)?))
}

/// KubeVirt's guest memory: `memory.guest`, else the memory request; clamped to the lab's range.
fn memory_mib(domain: &Value) -> Result<u64, String> {
    let quantity = str_at(&domain["memory"], "guest")
        .or(str_at(&domain["resources"]["requests"], "memory"))
        .or(str_at(&domain["resources"]["limits"], "memory"))
        .ok_or("no memory requested: set spec.domain.memory.guest or resources.requests.memory")?;
    let bytes = parse_quantity(quantity)
        .ok_or_else(|| format!("memory {quantity:?} is not a Kubernetes quantity"))?;
    let mib = u64::try_from(bytes.div_ceil(1 << 20)).unwrap_or(u64::MAX);
    Ok(mib.clamp(MIN_MEMORY_MIB, MAX_MEMORY_MIB))
}

fn topology(domain: &Value) -> Result<Topology, String> {
    let cpu = &domain["cpu"];
    Ok(Topology {
        sockets: u32_at(cpu, "sockets")?.unwrap_or(1),
        cores: u32_at(cpu, "cores")?.unwrap_or(1),
        threads: u32_at(cpu, "threads")?.unwrap_or(1),
    })
}

/// Secure Boot is on unless `secureBoot: false` (KubeVirt's amd64 default), and needs SMM (its admission).
fn firmware(domain: &Value) -> Result<(Firmware, bool), String> {
    let smm = &domain["features"]["smm"];
    let smm = smm.is_object() && smm["enabled"] != false;
    let bootloader = &domain["firmware"]["bootloader"];
    if !bootloader["efi"].is_object() {
        return Ok((Firmware::Bios, smm));
    }
    let secure_boot = bootloader["efi"]["secureBoot"] != false;
    if secure_boot && !smm {
        return Err(
            "EFI SecureBoot is enabled (the default when efi.secureBoot is not false), and SecureBoot requires SMM, \
             which is disabled: set spec.domain.features.smm"
                .into(),
        );
    }
    Ok((Firmware::Efi { secure_boot }, smm))
}

fn disks(spec: &Value) -> Result<Vec<Disk>, String> {
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let entries = spec["domain"]["devices"]["disks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut disks = vec![];
    for entry in &entries {
        let name = str_at(entry, "name").ok_or("a disk has no name")?;
        let Some(target) = entry["disk"].as_object() else {
            return Err(format!(
                "disk {name}: only `disk` devices are supported by the lab (not cdrom or lun)"
            ));
        };
        // An empty bus is SATA on amd64: KubeVirt's defaulting webhook, since every guest has an AHCI driver.
        let bus = match target.get("bus").and_then(Value::as_str).unwrap_or("") {
            "virtio" => Bus::Virtio,
            "scsi" => Bus::Scsi,
            "sata" | "" => Bus::Sata,
            other => {
                return Err(format!(
                    "disk {name}: bus {other:?} is not supported on q35"
                ));
            }
        };
        let volume = volumes
            .iter()
            .find(|v| v["name"] == name)
            .ok_or_else(|| format!("disk {name} has no volume of that name"))?;
        let claim = str_at(&volume["dataVolume"], "name")
            .or(str_at(&volume["persistentVolumeClaim"], "claimName"))
            .ok_or_else(|| {
                format!("volume {name}: only dataVolume and persistentVolumeClaim volumes are supported by the lab")
            })?;
        disks.push(Disk {
            name: name.to_string(),
            bus,
            boot_order: u32_at(entry, "bootOrder")?,
            serial: str_at(entry, "serial").map(str::to_string),
            claim: claim.to_string(),
        });
    }
    Ok(disks)
}

fn nic_device(model: &str) -> Option<&'static str> {
    Some(match model {
        "" | "virtio" => "virtio-net-pci",
        "e1000" => "e1000",
        "e1000e" => "e1000e",
        "igb" => "igb",
        "ne2k_pci" => "ne2k_pci",
        "pcnet" => "pcnet",
        "rtl8139" => "rtl8139",
        _ => return None,
    })
}

/// libvirt's pick when a NIC has no `macAddress`: its 52:54:00 prefix; here stable for one VMI (its uid).
pub fn generated_mac(vmi_uid: &str, nic: &str) -> String {
    let digest = Sha256::digest(format!("{vmi_uid}/{nic}").as_bytes());
    format!(
        "52:54:00:{:02x}:{:02x}:{:02x}",
        digest[0], digest[1], digest[2]
    )
}

/// The gateway (first address) and the guest's address (second) of an IPv4 /N network.
fn masquerade_addresses(cidr: &str) -> Result<(String, String), String> {
    let bad = || format!("vmNetworkCIDR {cidr:?} is not an IPv4 network");
    let (address, prefix) = cidr.split_once('/').ok_or_else(bad)?;
    let address: std::net::Ipv4Addr = address.parse().map_err(|_| bad())?;
    let prefix: u32 = prefix.parse().map_err(|_| bad())?;
    if !(1..=30).contains(&prefix) {
        return Err(bad());
    }
    let network = u32::from(address) & (u32::MAX << (32 - prefix));
    let at = |n: u32| std::net::Ipv4Addr::from(network + n).to_string();
    Ok((at(1), at(2)))
}

fn nics(spec: &Value, vmi_uid: &str) -> Result<Vec<Nic>, String> {
    let mut interfaces = spec["domain"]["devices"]["interfaces"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut networks = spec["networks"].as_array().cloned().unwrap_or_default();
    // `autoattachPodInterface`: a VMI without interfaces or networks gets one on the pod network (bridge binding).
    if interfaces.is_empty()
        && networks.is_empty()
        && spec["domain"]["devices"]["autoattachPodInterface"] != false
    {
        interfaces.push(serde_json::json!({"name": "default", "bridge": {}}));
        networks.push(serde_json::json!({"name": "default", "pod": {}}));
    }
    let mut nics = vec![];
    for interface in &interfaces {
        let name = str_at(interface, "name").ok_or("an interface has no name")?;
        let network = networks
            .iter()
            .find(|n| n["name"] == name)
            .ok_or_else(|| format!("failed to find network {name}"))?;
        let model = interface["model"].as_str().unwrap_or("");
        let device = nic_device(model)
            .ok_or_else(|| format!("interface {name}: model {model:?} is not supported"))?;
        let network = if network["pod"].is_object() {
            let cidr = str_at(&network["pod"], "vmNetworkCIDR").unwrap_or(DEFAULT_VM_CIDR);
            let (gateway, guest) = masquerade_addresses(cidr)?;
            Network::Pod {
                gateway,
                guest,
                cidr: cidr.to_string(),
            }
        } else if let Some(network_name) = str_at(&network["multus"], "networkName") {
            Network::Multus {
                network_name: network_name.to_string(),
                bridge: None,
            }
        } else {
            return Err(format!("network {name}: neither pod nor multus"));
        };
        let on_pod = |n: &Network| matches!(n, Network::Pod { .. });
        if on_pod(&network) && nics.iter().any(|n: &Nic| on_pod(&n.network)) {
            return Err("more than one interface on the pod network".into());
        }
        nics.push(Nic {
            name: name.to_string(),
            device,
            mac: str_at(interface, "macAddress")
                .map(str::to_ascii_lowercase)
                .unwrap_or_else(|| generated_mac(vmi_uid, name)),
            boot_order: u32_at(interface, "bootOrder")?,
            network,
        });
    }
    Ok(nics)
}

impl Domain {
    /// The domain of a VMI `spec`, or why KubeVirt (or the lab) would not run it.
    pub fn from_vmi(spec: &Value, vmi_uid: &str) -> Result<Self, String> {
        let domain = &spec["domain"];
        let (firmware, smm) = firmware(domain)?;
        // Every q35 flavour (`pc-q35-rhel9.6.0`, ...) is the lab QEMU's q35.
        let machine = match str_at(&domain["machine"], "type").unwrap_or("q35") {
            m if m == "q35" || m.starts_with("pc-q35") => "q35",
            other => {
                return Err(format!(
                    "machine type {other:?} is not supported (q35 only)"
                ));
            }
        };
        Ok(Self {
            machine,
            firmware,
            smm,
            cpu: topology(domain)?,
            memory_mib: memory_mib(domain)?,
            disks: disks(spec)?,
            nics: nics(spec, vmi_uid)?,
            reboot_terminates: domain["rebootPolicy"] == "Terminate",
        })
    }

    /// QEMU's argv (without the program) for this domain.
    pub fn qemu_args(&self, launch: &Launch<'_>) -> Result<Vec<String>, String> {
        let mut args: Vec<String> = vec![];
        let mut add = |items: &[&str]| args.extend(items.iter().map(|s| s.to_string()));
        let secure = matches!(self.firmware, Firmware::Efi { secure_boot: true });
        let mut machine = format!("{},accel={}", self.machine, accel_name(launch.accel));
        if self.smm || secure {
            machine.push_str(",smm=on");
        }
        add(&["-name", &format!("guest={}", escape(launch.name))]);
        add(&["-machine", &machine]);
        // `max`, never `host`: it works under TCG and KVM alike (`host` aborts on some hosts).
        add(&["-cpu", "max"]);
        let cpu = self.cpu;
        add(&[
            "-smp",
            &format!(
                "{},sockets={},cores={},threads={}",
                cpu.vcpus(),
                cpu.sockets,
                cpu.cores,
                cpu.threads
            ),
        ]);
        add(&["-m", &self.memory_mib.to_string()]);
        add(&["-nodefaults", "-display", "none", "-no-user-config"]);
        // The domain stays after a guest poweroff, so the stand-in tells a shutdown (Succeeded) from a crash.
        add(&["-no-shutdown"]);
        if self.reboot_terminates {
            add(&["-no-reboot"]);
        }
        if let Firmware::Efi { secure_boot } = self.firmware {
            let (code, _) = Ovmf::files(secure_boot);
            if secure_boot {
                add(&["-global", "driver=cfi.pflash01,property=secure,value=on"]);
            }
            add(&[
                "-drive",
                &format!(
                    "if=pflash,format=raw,unit=0,readonly=on,file={}",
                    escape_path(&code)
                ),
            ]);
            add(&[
                "-drive",
                &format!(
                    "if=pflash,format=raw,unit=1,file={}",
                    escape_path(launch.efi_vars)
                ),
            ]);
        }
        add(&["-serial", &format!("file:{}", launch.serial_log.display())]);
        add(&[
            "-qmp",
            &format!("unix:{},server=on,wait=off", escape_path(launch.qmp_socket)),
        ]);
        let sata_disks = self.disks.iter().filter(|d| d.bus == Bus::Sata).count();
        let extra_ahci = sata_disks.div_ceil(SATA_PORTS).saturating_sub(1);
        let virtio_disks = self.disks.iter().filter(|d| d.bus == Bus::Virtio).count();
        let layout = Layout::new(self.nics.len(), virtio_disks, extra_ahci > 0);
        for controller in &layout.controllers {
            add(&["-device", controller]);
        }
        // libvirt puts a second AHCI controller, a conventional PCI device, on the bridge.
        if let Some(bridge) = &layout.bridge {
            for controller in 1..=extra_ahci {
                add(&[
                    "-device",
                    &format!("ich9-ahci,id=sata{controller},bus={bridge},addr={controller:#x}"),
                ]);
            }
        }
        // KubeVirt gives every domain a virtio-scsi controller, SCSI disks or not, and a balloon.
        add(&[
            "-device",
            &format!("virtio-scsi-pci,id=scsi0,bus={}", layout.scsi),
        ]);
        add(&[
            "-device",
            &format!("virtio-balloon-pci,id=balloon0,bus={}", layout.balloon),
        ]);
        let mut virtio_buses = layout.virtio_disks.iter();
        let (mut scsi_unit, mut sata_port) = (0, 0);
        for disk in &self.disks {
            let image = launch
                .images
                .get(&disk.name)
                .ok_or_else(|| format!("disk {} has no image", disk.name))?;
            let id = format!("ua-{}", escape(&disk.name));
            add(&[
                "-drive",
                &format!(
                    "if=none,id=drive-{id},file={},format=raw,discard=unmap",
                    escape_path(image)
                ),
            ]);
            let mut device = match disk.bus {
                Bus::Virtio => format!(
                    "virtio-blk-pci,drive=drive-{id},id={id},bus={}",
                    virtio_buses.next().expect("a port per virtio disk")
                ),
                Bus::Scsi => {
                    scsi_unit += 1;
                    format!(
                        "scsi-hd,bus=scsi0.0,channel=0,scsi-id={},lun=0,drive=drive-{id},id={id}",
                        scsi_unit - 1
                    )
                }
                Bus::Sata => {
                    let (controller, port) = (sata_port / SATA_PORTS, sata_port % SATA_PORTS);
                    sata_port += 1;
                    let bus = match controller {
                        0 => format!("ide.{port}"),
                        _ => format!("sata{controller}.{port}"),
                    };
                    format!("ide-hd,bus={bus},drive=drive-{id},id={id}")
                }
            };
            if let Some(serial) = &disk.serial {
                device.push_str(&format!(",serial={}", escape(serial)));
            }
            if let Some(order) = disk.boot_order {
                device.push_str(&format!(",bootindex={order}"));
            }
            add(&["-device", &device]);
        }
        for (i, nic) in self.nics.iter().enumerate() {
            let netdev = match &nic.network {
                // No route out of the lab (`restrict=on`); the guest still gets its DHCP lease.
                Network::Pod {
                    gateway,
                    guest,
                    cidr,
                } => format!(
                    "user,id=net{i},net={cidr},host={gateway},dhcpstart={guest},restrict=on"
                ),
                // A bridge whose router answers; QEMU's DHCP server is there too, unused by static guests.
                Network::Multus {
                    bridge: Some(Bridge { cidr, gateway }),
                    ..
                } => format!("user,id=net{i},net={cidr},host={gateway},restrict=on"),
                Network::Multus { bridge: None, .. } => format!("hubport,id=net{i},hubid={i}"),
            };
            add(&["-netdev", &netdev]);
            let mut device = format!(
                "{},netdev=net{i},id=ua-{},mac={},bus={}",
                nic.device,
                escape(&nic.name),
                nic.mac,
                layout.nics[i]
            );
            // As KubeVirt: a NIC that is no boot device gets no option ROM.
            match nic.boot_order {
                Some(order) => device.push_str(&format!(",bootindex={order}")),
                None => device.push_str(",romfile="),
            }
            add(&["-device", &device]);
        }
        add(&[
            "-device",
            &format!("virtio-serial-pci,id=virtio-serial0,bus={}", layout.serial),
        ]);
        add(&[
            "-chardev",
            &format!(
                "socket,id=charchannel0,path={},server=on,wait=off",
                escape_path(launch.agent_socket)
            ),
        ]);
        add(&[
            "-device",
            &format!(
                "virtserialport,bus=virtio-serial0.0,nr=1,chardev=charchannel0,id=channel0,name={AGENT_CHANNEL}"
            ),
        ]);
        Ok(args)
    }
}

fn accel_name(accel: Accel) -> &'static str {
    match accel {
        Accel::Kvm => "kvm",
        Accel::Tcg => "tcg",
    }
}

/// A value inside a QEMU option list, where a comma is written twice.
fn escape(value: &str) -> String {
    value.replace(',', ",,")
}

fn escape_path(path: &Path) -> String {
    escape(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(domain: Value, volumes: Value, networks: Value) -> Value {
        json!({"domain": domain, "volumes": volumes, "networks": networks})
    }

    fn args_of(domain: &Domain) -> Vec<String> {
        let images: BTreeMap<String, PathBuf> = domain
            .disks
            .iter()
            .map(|d| (d.name.clone(), PathBuf::from(format!("/v/{}.img", d.name))))
            .collect();
        domain
            .qemu_args(&Launch {
                name: "ns_vm",
                accel: Accel::Tcg,
                images: &images,
                serial_log: Path::new("/s/com1"),
                agent_socket: Path::new("/s/qga"),
                qmp_socket: Path::new("/s/qmp"),
                efi_vars: Path::new("/s/VARS.fd"),
            })
            .unwrap()
    }

    /// The value following each `flag`.
    fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn quantities_parse_as_kubernetes_does() {
        for (text, bytes) in [
            ("128Mi", 128u128 << 20),
            ("1Gi", 1 << 30),
            ("1.5Gi", 3 << 29),
            ("2G", 2_000_000_000),
            ("512M", 512_000_000),
            ("1e9", 1_000_000_000),
            ("1E3", 1000),
            ("64Ki", 65536),
            ("1500m", 2),
            ("100", 100),
            ("+1k", 1000),
        ] {
            assert_eq!(parse_quantity(text), Some(bytes), "{text}");
        }
        for bad in ["", "Mi", "1.2.3Gi", "-1Gi", "12Q", "1 Gi", "ten"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
    }

    #[test]
    fn memory_comes_from_guest_or_requests_and_is_clamped() {
        let memory = |domain: Value| memory_mib(&domain);
        assert_eq!(memory(json!({"memory": {"guest": "512Mi"}})), Ok(512));
        assert_eq!(
            memory(json!({"resources": {"requests": {"memory": "1G"}}})),
            Ok(954)
        );
        assert_eq!(
            memory(
                json!({"memory": {"guest": "256Mi"}, "resources": {"requests": {"memory": "1Gi"}}})
            ),
            Ok(256)
        );
        assert_eq!(
            memory(json!({"memory": {"guest": "16Gi"}})),
            Ok(MAX_MEMORY_MIB)
        );
        assert_eq!(
            memory(json!({"memory": {"guest": "1Mi"}})),
            Ok(MIN_MEMORY_MIB)
        );
        assert!(memory(json!({})).unwrap_err().contains("no memory"));
        assert!(memory(json!({"memory": {"guest": "lots"}})).is_err());
    }

    #[test]
    fn sata_disks_past_six_go_on_another_ahci_controller_as_libvirt_adds_one() {
        let names: Vec<String> = (0..8).map(|i| format!("d{i}")).collect();
        let disks: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "disk": {"bus": "sata"}}))
            .collect();
        let volumes: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "dataVolume": {"name": n}}))
            .collect();
        let spec = vmi(
            json!({"memory": {"guest": "64Mi"}, "devices": {"disks": disks}}),
            json!(volumes),
            json!([]),
        );
        let args = args_of(&Domain::from_vmi(&spec, "uid-1").unwrap());
        let devices = values(&args, "-device");
        assert_eq!(
            devices
                .iter()
                .filter(|d| d.starts_with("ich9-ahci"))
                .collect::<Vec<_>>(),
            [&"ich9-ahci,id=sata1,bus=pci-bridge,addr=0x1"]
        );
        assert!(devices.contains(&"ide-hd,bus=ide.5,drive=drive-ua-d5,id=ua-d5"));
        assert!(devices.contains(&"ide-hd,bus=sata1.0,drive=drive-ua-d6,id=ua-d6"));
        assert!(devices.contains(&"ide-hd,bus=sata1.1,drive=drive-ua-d7,id=ua-d7"));
    }

    #[test]
    fn each_bus_gets_its_device_with_boot_order_and_serial() {
        let spec = vmi(
            json!({"memory": {"guest": "64Mi"}, "devices": {"disks": [
                {"name": "root", "disk": {"bus": "scsi"}, "bootOrder": 1, "serial": "6000c29,a"},
                {"name": "data", "disk": {"bus": "scsi"}},
                {"name": "fast", "disk": {"bus": "virtio"}, "serial": "v1"},
                {"name": "old", "disk": {"bus": "sata"}, "bootOrder": 2},
                {"name": "plain", "disk": {}}]}}),
            json!([{"name": "root", "dataVolume": {"name": "dv-root"}},
                   {"name": "data", "persistentVolumeClaim": {"claimName": "pvc-data"}},
                   {"name": "fast", "dataVolume": {"name": "dv-fast"}},
                   {"name": "old", "dataVolume": {"name": "dv-old"}},
                   {"name": "plain", "dataVolume": {"name": "dv-plain"}}]),
            json!([]),
        );
        let domain = Domain::from_vmi(&spec, "uid-1").unwrap();
        assert_eq!(
            domain
                .disks
                .iter()
                .map(|d| d.claim.as_str())
                .collect::<Vec<_>>(),
            ["dv-root", "pvc-data", "dv-fast", "dv-old", "dv-plain"]
        );
        assert_eq!(domain.disks[4].bus, Bus::Sata, "an empty bus is SATA");
        let args = args_of(&domain);
        let devices = values(&args, "-device");
        assert_eq!(
            devices
                .iter()
                .filter(|d| d.starts_with("virtio-scsi-pci"))
                .count(),
            1,
            "one virtio-scsi controller for all SCSI disks"
        );
        assert!(devices.contains(
            &"scsi-hd,bus=scsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-ua-root,id=ua-root,serial=6000c29,,a,bootindex=1"
        ));
        assert!(devices.contains(
            &"scsi-hd,bus=scsi0.0,channel=0,scsi-id=1,lun=0,drive=drive-ua-data,id=ua-data"
        ));
        assert!(
            devices.contains(&"virtio-blk-pci,drive=drive-ua-fast,id=ua-fast,bus=pci.7,serial=v1")
        );
        assert!(devices.contains(&"ide-hd,bus=ide.0,drive=drive-ua-old,id=ua-old,bootindex=2"));
        assert!(devices.contains(&"ide-hd,bus=ide.1,drive=drive-ua-plain,id=ua-plain"));
        assert!(
            values(&args, "-drive")
                .contains(&"if=none,id=drive-ua-root,file=/v/root.img,format=raw,discard=unmap")
        );
    }

    #[test]
    fn unsupported_disks_and_volumes_are_refused() {
        let with = |disk: Value, volume: Value| {
            Domain::from_vmi(
                &vmi(
                    json!({"memory": {"guest": "64Mi"}, "devices": {"disks": [disk]}}),
                    json!([volume]),
                    json!([]),
                ),
                "u",
            )
            .unwrap_err()
        };
        let dv = json!({"name": "d", "dataVolume": {"name": "x"}});
        assert!(with(json!({"name": "d", "disk": {"bus": "ide"}}), dv.clone()).contains("ide"));
        assert!(with(json!({"name": "d", "cdrom": {}}), dv).contains("cdrom"));
        assert!(
            with(
                json!({"name": "d", "disk": {}}),
                json!({"name": "d", "containerDisk": {}})
            )
            .contains("dataVolume")
        );
        assert!(
            with(json!({"name": "d", "disk": {}}), json!({"name": "other"})).contains("no volume")
        );
    }

    #[test]
    fn nics_get_their_model_mac_and_network() {
        let spec = vmi(
            json!({"memory": {"guest": "64Mi"}, "devices": {"interfaces": [
                {"name": "pod", "masquerade": {}, "model": "e1000e", "macAddress": "00:50:56:AB:CD:EF"},
                {"name": "dmz", "bridge": {}, "bootOrder": 3}]}}),
            json!([]),
            json!([{"name": "pod", "pod": {}}, {"name": "dmz", "multus": {"networkName": "net/dmz"}}]),
        );
        let domain = Domain::from_vmi(&spec, "uid-7").unwrap();
        assert_eq!(domain.nics[0].device, "e1000e");
        assert_eq!(domain.nics[0].mac, "00:50:56:ab:cd:ef");
        assert_eq!(
            domain.nics[1].device, "virtio-net-pci",
            "virtio is the default model"
        );
        assert_eq!(domain.nics[1].mac, generated_mac("uid-7", "dmz"));
        assert!(domain.nics[1].mac.starts_with("52:54:00:"));
        assert_ne!(
            generated_mac("uid-8", "dmz"),
            domain.nics[1].mac,
            "a new VMI, a new MAC"
        );
        let args = args_of(&domain);
        assert_eq!(
            values(&args, "-netdev"),
            [
                "user,id=net0,net=10.0.2.0/24,host=10.0.2.1,dhcpstart=10.0.2.2,restrict=on",
                "hubport,id=net1,hubid=1"
            ]
        );
        // Attached to a NAD that names a lab segment: its gateway answers on the guest's own subnet.
        let mut bridged = domain.clone();
        bridged.nics[1].network = Network::Multus {
            network_name: "net/dmz".into(),
            bridge: Some(Bridge {
                cidr: "192.168.50.0/24".into(),
                gateway: "192.168.50.1".into(),
            }),
        };
        assert_eq!(
            values(&args_of(&bridged), "-netdev")[1],
            "user,id=net1,net=192.168.50.0/24,host=192.168.50.1,restrict=on"
        );
        let devices = values(&args, "-device");
        assert!(
            devices
                .contains(&"e1000e,netdev=net0,id=ua-pod,mac=00:50:56:ab:cd:ef,bus=pci.1,romfile=")
        );
        assert!(
            devices.contains(
                &format!(
                    "virtio-net-pci,netdev=net1,id=ua-dmz,mac={},bus=pci.2,bootindex=3",
                    domain.nics[1].mac
                )
                .as_str()
            )
        );

        let custom = vmi(
            json!({"memory": {"guest": "64Mi"}, "devices": {"interfaces": [{"name": "p", "masquerade": {}}]}}),
            json!([]),
            json!([{"name": "p", "pod": {"vmNetworkCIDR": "10.11.12.0/24"}}]),
        );
        let nic = &Domain::from_vmi(&custom, "u").unwrap().nics[0];
        assert_eq!(
            nic.network,
            Network::Pod {
                gateway: "10.11.12.1".into(),
                guest: "10.11.12.2".into(),
                cidr: "10.11.12.0/24".into()
            }
        );
        let unknown = vmi(
            json!({"memory": {"guest": "64Mi"}, "devices": {"interfaces": [{"name": "p", "model": "vmxnet3", "masquerade": {}}]}}),
            json!([]),
            json!([{"name": "p", "pod": {}}]),
        );
        assert!(
            Domain::from_vmi(&unknown, "u")
                .unwrap_err()
                .contains("vmxnet3")
        );
        let orphan = vmi(
            json!({"memory": {"guest": "64Mi"}, "devices": {"interfaces": [{"name": "p", "masquerade": {}}]}}),
            json!([]),
            json!([]),
        );
        assert!(
            Domain::from_vmi(&orphan, "u")
                .unwrap_err()
                .contains("network p")
        );
    }

    #[test]
    fn a_vmi_without_interfaces_gets_the_pod_network() {
        let domain = Domain::from_vmi(
            &vmi(json!({"memory": {"guest": "64Mi"}}), json!([]), json!([])),
            "u",
        )
        .unwrap();
        assert_eq!(domain.nics.len(), 1);
        assert_eq!(domain.nics[0].name, "default");
        assert!(matches!(domain.nics[0].network, Network::Pod { .. }));
    }

    #[test]
    fn firmware_is_seabios_or_ovmf_with_secure_boot_by_default() {
        let domain_with = |domain: Value| Domain::from_vmi(&vmi(domain, json!([]), json!([])), "u");
        let bios = domain_with(json!({"memory": {"guest": "64Mi"}})).unwrap();
        assert_eq!(bios.firmware, Firmware::Bios);
        assert_eq!(bios.machine, "q35");
        let args = args_of(&bios);
        assert!(!args.iter().any(|a| a.contains("pflash")));
        assert_eq!(values(&args, "-machine"), ["q35,accel=tcg"]);

        let efi = domain_with(json!({"memory": {"guest": "64Mi"},
            "firmware": {"bootloader": {"efi": {"secureBoot": false}}}}))
        .unwrap();
        assert_eq!(efi.firmware, Firmware::Efi { secure_boot: false });
        let args = args_of(&efi);
        assert_eq!(
            values(&args, "-drive")[..2],
            [
                "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
                "if=pflash,format=raw,unit=1,file=/s/VARS.fd"
            ]
        );
        assert!(!args.iter().any(|a| a.contains("property=secure")));

        // KubeVirt: efi without secureBoot means Secure Boot, which its admission refuses without SMM.
        let refused = domain_with(
            json!({"memory": {"guest": "64Mi"}, "firmware": {"bootloader": {"efi": {}}}}),
        );
        assert!(refused.unwrap_err().contains("SMM"));
        let secure = domain_with(json!({"memory": {"guest": "64Mi"}, "features": {"smm": {}},
            "firmware": {"bootloader": {"efi": {}}}}))
        .unwrap();
        assert_eq!(secure.firmware, Firmware::Efi { secure_boot: true });
        let args = args_of(&secure);
        assert_eq!(values(&args, "-machine"), ["q35,accel=tcg,smm=on"]);
        assert!(values(&args, "-global").contains(&"driver=cfi.pflash01,property=secure,value=on"));
        assert!(values(&args, "-drive")[0].ends_with("OVMF_CODE_4M.secboot.fd"));
        assert_eq!(
            Ovmf::files(true).1,
            Path::new("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
        );
        assert!(
            domain_with(
                json!({"memory": {"guest": "64Mi"}, "machine": {"type": "pc-i440fx-2.12"}})
            )
            .is_err()
        );
        assert_eq!(
            domain_with(
                json!({"memory": {"guest": "64Mi"}, "machine": {"type": "pc-q35-rhel9.6.0"}})
            )
            .unwrap()
            .machine,
            "q35"
        );
    }

    #[test]
    fn cpu_topology_becomes_smp_and_the_agent_channel_is_always_there() {
        let domain = Domain::from_vmi(
            &vmi(
                json!({"memory": {"guest": "64Mi"}, "cpu": {"sockets": 3, "cores": 2}}),
                json!([]),
                json!([]),
            ),
            "u",
        )
        .unwrap();
        let args = args_of(&domain);
        assert_eq!(values(&args, "-smp"), ["6,sockets=3,cores=2,threads=1"]);
        assert_eq!(values(&args, "-cpu"), ["max"]);
        assert!(values(&args, "-device").contains(
            &"virtserialport,bus=virtio-serial0.0,nr=1,chardev=charchannel0,id=channel0,name=org.qemu.guest_agent.0"
        ));
        assert!(
            values(&args, "-chardev")
                .contains(&"socket,id=charchannel0,path=/s/qga,server=on,wait=off")
        );
        assert!(args.contains(&"-no-shutdown".to_string()));
        let bad = vmi(
            json!({"memory": {"guest": "64Mi"}, "cpu": {"cores": 0}}),
            json!([]),
            json!([]),
        );
        assert!(Domain::from_vmi(&bad, "u").is_err());
    }
}
