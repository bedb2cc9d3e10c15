//! The KubeVirt VirtualMachine: the source's shape (CPU, memory, firmware), its disks in boot order over the
//! imported DataVolumes, and its NICs with their MACs on the mapped networks, created with the requested run
//! strategy (the Starting checkpoint sets it again only if someone changed it).

use ferry_api::{
    AdaptationStatus, DeviceModel, Firmware, GuestAdaptation, RunStrategy, SourceDisk,
    SourceVmStatus, VirtualMachineMigration,
};
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::children;

/// The devices the guest gets: as asked, else compatibility devices unless guest adaptation gives it virtio
/// drivers (Forklift's default when it skips conversion, "to ensure bootability").
pub fn device_model(vmm: &VirtualMachineMigration) -> DeviceModel {
    vmm.spec
        .target
        .devices
        .unwrap_or(match vmm.spec.conversion.guest_adaptation {
            GuestAdaptation::VirtV2v => DeviceModel::Virtio,
            GuestAdaptation::None => DeviceModel::Compatibility,
        })
}

/// KubeVirt's disk bus. In `Source` mode SCSI stays SCSI, which in KubeVirt is virtio-scsi: the guest needs that
/// driver, not its LSI Logic or PVSCSI one.
fn disk_bus(devices: DeviceModel, source_bus: Option<&str>) -> &'static str {
    match (devices, source_bus) {
        (DeviceModel::Compatibility, _) => "sata",
        (DeviceModel::Virtio, _) => "virtio",
        (DeviceModel::Source, Some("scsi")) => "scsi",
        (DeviceModel::Source, Some("sata") | Some("ide")) => "sata",
        (DeviceModel::Source, _) => "virtio",
    }
}

/// KubeVirt's NIC model; vmxnet3 has none, so `Source` gives it virtio.
fn nic_model(devices: DeviceModel, source_model: Option<&str>) -> &'static str {
    match (devices, source_model.map(|m| m.to_ascii_lowercase())) {
        (DeviceModel::Compatibility, _) => "e1000e",
        (DeviceModel::Virtio, _) => "virtio",
        (DeviceModel::Source, Some(m)) if m.ends_with("e1000e") => "e1000e",
        (DeviceModel::Source, Some(m)) if m.ends_with("e1000") => "e1000",
        (DeviceModel::Source, _) => "virtio",
    }
}

/// (sockets, cores): the source's split when its cores divide its vCPUs, else one core per socket, so the guest
/// never gets more vCPUs than it had.
pub fn cpu_topology(cpus: i32, cores_per_socket: i32) -> (i32, i32) {
    let (cpus, cores) = (cpus.max(1), cores_per_socket.max(1));
    if cpus % cores == 0 {
        (cpus / cores, cores)
    } else {
        (cpus, 1)
    }
}

/// Each disk's `bootOrder`: the source's boot order over its disks when it has one, else the first disk.
pub fn boot_orders(source: &SourceVmStatus) -> Vec<Option<u32>> {
    let mut orders = vec![None; source.disks.len()];
    let mut next = 1;
    for key in &source.boot_order {
        if let Some(i) = source.disks.iter().position(|d| d.key == *key)
            && orders[i].is_none()
        {
            orders[i] = Some(next);
            next += 1;
        }
    }
    if next == 1
        && let Some(first) = orders.first_mut()
    {
        *first = Some(1);
    }
    orders
}

/// A disk's serial: its vSphere UUID without dashes (what a VMware guest sees with `disk.EnableUUID`), else one
/// derived from the migration, stable across retries. KubeVirt accepts `[A-Za-z0-9_.+-]`, at most 256.
pub fn disk_serial(vmm: &VirtualMachineMigration, index: usize, disk: &SourceDisk) -> String {
    let from_uuid: String = disk
        .uuid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if from_uuid.is_empty() {
        let seed = format!("{}/{index}", children::uid(vmm));
        format!("ferry-{:016x}", ferry_api::names::fnv1a(seed.as_bytes()))
    } else {
        from_uuid
    }
}

/// The bootloader, and the features it needs: KubeVirt requires SMM for Secure Boot, and defaults an `efi`
/// without `secureBoot` to on, so it is always said.
fn firmware(source: &SourceVmStatus) -> (Value, Value) {
    match source.firmware {
        Some(Firmware::Efi) if source.secure_boot => (
            json!({"efi": {"secureBoot": true}}),
            json!({"smm": {"enabled": true}}),
        ),
        Some(Firmware::Efi) => (json!({"efi": {"secureBoot": false}}), json!({})),
        _ => (json!({"bios": {}}), json!({})),
    }
}

/// The devices: a source with a vTPM gets a persistent one (KubeVirt keeps its state in a volume of its own, so
/// what the guest seals to it survives restarts); it starts empty.
fn domain_devices(disks: Vec<Value>, interfaces: Vec<Value>, source: &SourceVmStatus) -> Value {
    let mut devices = json!({"disks": disks, "interfaces": interfaces});
    if source.vtpm {
        devices["tpm"] = json!({"persistent": true});
    }
    devices
}

/// Whether vSphere calls the guest Windows (its guest ID: `windows2019srvNext_64Guest`, `windows11_64Guest`).
pub fn is_windows(source: &SourceVmStatus) -> bool {
    source
        .guest_os
        .as_deref()
        .is_some_and(|id| id.to_ascii_lowercase().starts_with("win"))
}

/// What a Windows guest's domain adds, as KubeVirt's own Windows example and virt-v2v's KubeVirt output give
/// it: Hyper-V enlightenments Windows uses when it finds them (relaxed timing, a virtual APIC, spinlock
/// notification), no HPET, Hyper-V's reference clock, a PIT that delays missed ticks and an RTC that catches up.
/// The RTC keeps UTC, as virt-v2v's KubeVirt output sets it, unless the guest keeps local time in `timezone`.
fn windows_domain(features: &mut Value, timezone: Option<&str>) -> Value {
    if let Some(features) = features.as_object_mut() {
        features.insert("acpi".into(), json!({}));
        features.insert("apic".into(), json!({}));
        features.insert(
            "hyperv".into(),
            json!({"relaxed": {}, "vapic": {}, "spinlocks": {"spinlocks": 8191}}),
        );
    }
    let timers = json!({
        "hpet": {"present": false},
        "hyperv": {},
        "pit": {"tickPolicy": "delay"},
        "rtc": {"tickPolicy": "catchup"},
    });
    match timezone {
        Some(zone) => json!({"timezone": zone, "timer": timers}),
        None => json!({"utc": {}, "timer": timers}),
    }
}

/// The IANA zone an adapted guest keeps its clock in, when it keeps local time in a zone that has one.
fn guest_timezone(adaptation: Option<&AdaptationStatus>) -> Option<&str> {
    adaptation
        .and_then(|a| a.clock.as_ref())
        .map(|c| c.timezone.as_str())
        .filter(|zone| !zone.is_empty())
}

/// The VM for the guest as adaptation left it: what vSphere left unsaid taken from virt-v2v's inspection
/// ([`as_adapted`]), and a Windows guest that keeps local time running in its own zone (KubeVirt's
/// `clock.timezone`, an RTC in local time) instead of UTC.
pub fn adapted_virtual_machine(
    vmm: &VirtualMachineMigration,
    source: SourceVmStatus,
    adaptation: Option<&AdaptationStatus>,
) -> DynamicObject {
    let source = as_adapted(source, adaptation);
    build_virtual_machine(vmm, &source, guest_timezone(adaptation))
}

/// The source as the adapted guest boots: what vSphere left unsaid (no boot order, no firmware) is taken from
/// virt-v2v's inspection (the disk holding the root file system; the firmware the guest was installed for).
fn as_adapted(mut source: SourceVmStatus, adaptation: Option<&AdaptationStatus>) -> SourceVmStatus {
    let Some(adaptation) = adaptation else {
        return source;
    };
    if source.boot_order.is_empty()
        && let Some(disk) = adaptation
            .boot_disk
            .and_then(|i| source.disks.get(i.max(0) as usize))
    {
        source.boot_order = vec![disk.key];
    }
    if source.firmware.is_none() {
        source.firmware = match adaptation.firmware.as_str() {
            "UEFI" => Some(Firmware::Efi),
            "BIOS" => Some(Firmware::Bios),
            _ => None,
        };
    }
    source
}

/// `mib` MiB as Kubernetes writes a binary quantity back: in the largest unit that divides it (1024Mi is `1Gi`).
/// KubeVirt's webhooks return the VM in that form, so a VM built with any other would differ from its stored
/// self forever.
pub fn memory_quantity(mib: i64) -> String {
    if mib == 0 {
        return "0".into();
    }
    let (mut value, mut unit) = (mib, 0);
    const UNITS: [&str; 5] = ["Mi", "Gi", "Ti", "Pi", "Ei"];
    while value % 1024 == 0 && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    format!("{value}{}", UNITS[unit])
}

pub fn run_strategy(strategy: RunStrategy) -> &'static str {
    match strategy {
        RunStrategy::Always => "Always",
        RunStrategy::Halted => "Halted",
    }
}

/// The VM with the source's shape, as no adaptation changed it.
pub fn virtual_machine(vmm: &VirtualMachineMigration, source: &SourceVmStatus) -> DynamicObject {
    build_virtual_machine(vmm, source, None)
}

fn build_virtual_machine(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    timezone: Option<&str>,
) -> DynamicObject {
    let name = children::vm_name(vmm);
    let devices = device_model(vmm);
    let boot = boot_orders(source);
    let (mut disks, mut volumes) = (vec![], vec![]);
    for (i, disk) in source.disks.iter().enumerate() {
        let volume = format!("disk-{i}");
        let bus = disk_bus(devices, disk.bus.as_deref());
        let serial = disk_serial(vmm, i, disk);
        let mut entry = json!({"name": volume, "disk": {"bus": bus}, "serial": serial});
        if let Some(order) = boot[i] {
            entry["bootOrder"] = json!(order);
        }
        disks.push(entry);
        volumes.push(
            json!({"name": volume, "dataVolume": {"name": children::data_volume(vmm, i as i32)}}),
        );
    }
    let (mut interfaces, mut networks) = (vec![], vec![]);
    for (i, nic) in source.nics.iter().enumerate() {
        let Some(mapping) = crate::maps::networks(vmm)
            .iter()
            .find(|m| m.source == nic.network)
        else {
            continue;
        };
        let net = format!("nic-{i}");
        let (binding, network): (Value, Value) = if mapping.pod.is_some() {
            (json!({"masquerade": {}}), json!({"name": net, "pod": {}}))
        } else if let Some(multus) = &mapping.multus {
            (
                json!({"bridge": {}}),
                json!({"name": net, "multus": {"networkName": multus.network_name}}),
            )
        } else {
            continue;
        };
        let mut interface = json!({"name": net, "macAddress": nic.mac, "model": nic_model(devices, nic.model.as_deref())});
        if let (Some(a), Value::Object(b)) = (interface.as_object_mut(), binding) {
            a.extend(b);
        }
        interfaces.push(interface);
        networks.push(network);
    }
    let (sockets, cores) = cpu_topology(source.cpus, source.cores_per_socket);
    let (bootloader, mut features) = firmware(source);
    let clock = is_windows(source).then(|| windows_domain(&mut features, timezone));
    let object = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {
            "name": name,
            "namespace": vmm.namespace(),
            "labels": children::labels(vmm, "vm"),
            "ownerReferences": [children::owner(vmm)],
        },
        "spec": {
            // Created with the run strategy asked for: the Starting checkpoint then only watches the VMI come
            // up, and one write less per migration.
            "runStrategy": run_strategy(vmm.spec.target.run_strategy),
            "template": {
                "metadata": {"labels": {"kubevirt.io/vm": name}},
                "spec": {
                    "domain": {
                        "cpu": {"sockets": sockets, "cores": cores, "threads": 1},
                        "memory": {"guest": memory_quantity(source.memory_mib)},
                        "resources": {"requests": {"memory": memory_quantity(source.memory_mib)}},
                        "firmware": {"bootloader": bootloader},
                        "features": features,
                        "devices": domain_devices(disks, interfaces, source),
                    },
                    "networks": networks,
                    "volumes": volumes,
                },
            },
        },
    });
    let mut object = object;
    if let Some(clock) = clock {
        object["spec"]["template"]["spec"]["domain"]["clock"] = clock;
    }
    if features.as_object().is_some_and(|f| f.is_empty())
        && let Some(domain) = object["spec"]["template"]["spec"]["domain"].as_object_mut()
    {
        domain.remove("features");
    }
    serde_json::from_value(object).expect("a VM built from known fields")
}

/// The fields of a stored VM that must match the built one (the run strategy is the Starting checkpoint's).
pub fn shape(vm: &DynamicObject) -> &Value {
    &vm.data["spec"]["template"]
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::{SourceDisk, SourceNic};

    #[test]
    fn the_vm_has_the_source_shape_and_mapped_nics_only() {
        let mut vmm = VirtualMachineMigration::new("web", serde_json::from_value(json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "web"}},
            "target": {"networks": [{"source": "VM Network", "pod": {}}, {"source": "backup", "ignored": {}},
                                    {"source": "dmz", "multus": {"networkName": "net/dmz"}}],
                       "devices": "Source"},
            "staging": {"url": "s3://b/p"}})).unwrap());
        vmm.metadata.uid = Some("uid-1".into());
        vmm.metadata.namespace = Some("ns".into());
        let source = SourceVmStatus {
            cpus: 4,
            cores_per_socket: 2,
            memory_mib: 2048,
            firmware: Some(Firmware::Efi),
            disks: vec![
                SourceDisk {
                    bus: Some("scsi".into()),
                    ..Default::default()
                },
                SourceDisk::default(),
            ],
            nics: vec![
                SourceNic {
                    mac: "00:50:56:00:00:01".into(),
                    network: "VM Network".into(),
                    model: Some("vmxnet3".into()),
                    ip_addresses: vec![],
                },
                SourceNic {
                    mac: "00:50:56:00:00:02".into(),
                    network: "backup".into(),
                    model: None,
                    ip_addresses: vec![],
                },
                SourceNic {
                    mac: "00:50:56:00:00:03".into(),
                    network: "dmz".into(),
                    model: Some("e1000e".into()),
                    ip_addresses: vec![],
                },
            ],
            ..Default::default()
        };
        let vm = virtual_machine(&vmm, &source);
        let spec = &vm.data["spec"]["template"]["spec"];
        assert_eq!(
            spec["domain"]["cpu"],
            json!({"sockets": 2, "cores": 2, "threads": 1})
        );
        assert_eq!(spec["domain"]["memory"]["guest"], "2Gi");
        assert!(spec["domain"]["firmware"]["bootloader"]["efi"].is_object());
        assert_eq!(
            spec["domain"]["devices"]["disks"][0],
            json!({"name": "disk-0", "disk": {"bus": "scsi"}, "bootOrder": 1, "serial": disk_serial(&vmm, 0, &source.disks[0])})
        );
        assert!(
            spec["domain"]["devices"]["disks"][1]
                .get("bootOrder")
                .is_none()
        );
        assert_eq!(
            spec["domain"]["firmware"]["bootloader"]["efi"]["secureBoot"],
            false
        );
        assert!(spec["domain"].get("features").is_none());
        assert_eq!(spec["volumes"][1]["dataVolume"]["name"], "web-disk-1");
        let nics = spec["domain"]["devices"]["interfaces"].as_array().unwrap();
        assert_eq!(nics.len(), 2);
        assert_eq!(nics[0]["macAddress"], "00:50:56:00:00:01");
        assert_eq!(nics[0]["model"], "virtio");
        assert!(nics[0]["masquerade"].is_object());
        assert_eq!(nics[1]["model"], "e1000e");
        assert_eq!(spec["networks"][1]["multus"]["networkName"], "net/dmz");
        assert_eq!(vm.data["spec"]["runStrategy"], "Always");
        assert_eq!(
            vm.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
    }

    fn migration(extra_spec: Value) -> VirtualMachineMigration {
        let mut spec = json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "web"}},
            "target": {"networks": [{"source": "VM Network", "pod": {}}]},
            "staging": {"url": "s3://b/p"}});
        if let (Some(a), Value::Object(b)) = (spec.as_object_mut(), extra_spec) {
            a.extend(b);
        }
        let mut vmm = VirtualMachineMigration::new("web", serde_json::from_value(spec).unwrap());
        vmm.metadata.uid = Some("uid-1".into());
        vmm.metadata.namespace = Some("ns".into());
        vmm
    }

    fn linux_source() -> SourceVmStatus {
        SourceVmStatus {
            cpus: 2,
            cores_per_socket: 1,
            memory_mib: 1024,
            disks: ["data", "root"]
                .iter()
                .enumerate()
                .map(|(i, _)| SourceDisk {
                    key: 2000 + i as i32,
                    bus: Some("scsi".into()),
                    uuid: Some(format!("6000C29a-0000-0000-0000-00000000000{i}")),
                    ..Default::default()
                })
                .collect(),
            nics: vec![SourceNic {
                mac: "00:50:56:00:00:01".into(),
                network: "VM Network".into(),
                model: Some("vmxnet3".into()),
                ip_addresses: vec![],
            }],
            ..Default::default()
        }
    }

    fn devices_of(vm: &DynamicObject) -> (Vec<String>, Vec<String>) {
        let devices = &vm.data["spec"]["template"]["spec"]["domain"]["devices"];
        let strings = |list: &Value, field: &str| {
            list.as_array()
                .unwrap()
                .iter()
                .map(|d| d.pointer(field).unwrap().as_str().unwrap().to_string())
                .collect()
        };
        (
            strings(&devices["disks"], "/disk/bus"),
            strings(&devices["interfaces"], "/model"),
        )
    }

    #[test]
    fn devices_per_mode() {
        let source = linux_source();
        let cases = [
            (json!({}), "sata", "e1000e"),
            (
                json!({"conversion": {"guestAdaptation": "VirtV2v"}}),
                "virtio",
                "virtio",
            ),
            (
                json!({"target": {"networks": [{"source": "VM Network", "pod": {}}], "devices": "Compatibility"},
                    "conversion": {"guestAdaptation": "VirtV2v"}}),
                "sata",
                "e1000e",
            ),
            (
                json!({"target": {"networks": [{"source": "VM Network", "pod": {}}], "devices": "Virtio"}}),
                "virtio",
                "virtio",
            ),
            (
                json!({"target": {"networks": [{"source": "VM Network", "pod": {}}], "devices": "Source"}}),
                "scsi",
                "virtio",
            ),
        ];
        for (spec, bus, nic) in cases {
            let vm = virtual_machine(&migration(spec.clone()), &source);
            assert_eq!(
                devices_of(&vm),
                (vec![bus.to_string(); 2], vec![nic.to_string()]),
                "{spec}"
            );
        }
        let mut ide_e1000 = linux_source();
        ide_e1000.disks[0].bus = Some("ide".into());
        ide_e1000.disks[1].bus = Some("nvme".into());
        ide_e1000.nics[0].model = Some("VirtualE1000".into());
        let source_mode = migration(
            json!({"target": {"networks": [{"source": "VM Network", "pod": {}}], "devices": "Source"}}),
        );
        assert_eq!(
            devices_of(&virtual_machine(&source_mode, &ide_e1000)),
            (vec!["sata".into(), "virtio".into()], vec!["e1000".into()])
        );
    }

    #[test]
    fn cpu_topology_never_adds_vcpus() {
        // (vCPUs, cores per socket) -> (sockets, cores)
        let table = [
            ((1, 1), (1, 1)),
            ((4, 2), (2, 2)),
            ((8, 8), (1, 8)),
            ((6, 4), (6, 1)),
            ((6, 3), (2, 3)),
            ((3, 2), (3, 1)),
            ((0, 0), (1, 1)),
        ];
        for ((cpus, cores), expected) in table {
            let (sockets, per_socket) = cpu_topology(cpus, cores);
            assert_eq!(
                (sockets, per_socket),
                expected,
                "{cpus} vCPUs, {cores} per socket"
            );
            assert!(sockets * per_socket <= cpus.max(1));
        }
    }

    #[test]
    fn the_boot_disk_follows_the_source_boot_order() {
        let mut source = linux_source();
        assert_eq!(boot_orders(&source), vec![Some(1), None]);
        source.boot_order = vec![2001];
        assert_eq!(boot_orders(&source), vec![None, Some(1)]);
        source.boot_order = vec![9999, 2001, 2000, 2001];
        assert_eq!(boot_orders(&source), vec![Some(2), Some(1)]);
        source.boot_order = vec![9999];
        assert_eq!(boot_orders(&source), vec![Some(1), None]);
        source.disks.clear();
        assert!(boot_orders(&source).is_empty());
    }

    #[test]
    fn serials_come_from_the_disk_uuid_or_the_migration() {
        let vmm = migration(json!({}));
        let source = linux_source();
        assert_eq!(
            disk_serial(&vmm, 0, &source.disks[0]),
            "6000c29a000000000000000000000000"
        );
        let anonymous = SourceDisk::default();
        let derived = disk_serial(&vmm, 1, &anonymous);
        assert_eq!(derived, disk_serial(&vmm, 1, &anonymous));
        assert_ne!(derived, disk_serial(&vmm, 2, &anonymous));
        for serial in [derived, disk_serial(&vmm, 0, &source.disks[0])] {
            assert!(serial.len() <= 256);
            assert!(
                serial
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
            );
        }
    }

    #[test]
    fn memory_is_written_as_kubernetes_writes_it_back() {
        assert_eq!(memory_quantity(32), "32Mi");
        assert_eq!(memory_quantity(1024), "1Gi");
        assert_eq!(memory_quantity(1536), "1536Mi");
        assert_eq!(memory_quantity(4096), "4Gi");
        assert_eq!(memory_quantity(1024 * 1024), "1Ti");
        assert_eq!(memory_quantity(0), "0");
    }

    #[test]
    fn secure_boot_follows_the_source_with_smm() {
        let vmm = migration(json!({}));
        let mut source = linux_source();
        source.firmware = Some(Firmware::Efi);
        source.secure_boot = true;
        let vm = virtual_machine(&vmm, &source);
        let domain = &vm.data["spec"]["template"]["spec"]["domain"];
        assert_eq!(
            domain["firmware"]["bootloader"],
            json!({"efi": {"secureBoot": true}})
        );
        assert_eq!(domain["features"], json!({"smm": {"enabled": true}}));
        source.firmware = Some(Firmware::Bios);
        let vm = virtual_machine(&vmm, &source);
        let domain = &vm.data["spec"]["template"]["spec"]["domain"];
        assert_eq!(domain["firmware"]["bootloader"], json!({"bios": {}}));
    }

    #[test]
    fn a_windows_guest_gets_hyper_v_and_windows_timers_and_a_linux_guest_none() {
        let mut source = linux_source();
        let linux = virtual_machine(&migration(json!({})), &source);
        assert!(
            linux.data["spec"]["template"]["spec"]["domain"]
                .get("clock")
                .is_none()
        );
        source.guest_os = Some("windows11_64Guest".into());
        source.firmware = Some(Firmware::Efi);
        source.secure_boot = true;
        let vm = virtual_machine(&migration(json!({})), &source);
        let domain = &vm.data["spec"]["template"]["spec"]["domain"];
        assert_eq!(domain["clock"]["utc"], json!({}));
        assert_eq!(domain["clock"]["timer"]["hpet"], json!({"present": false}));
        assert_eq!(domain["clock"]["timer"]["rtc"]["tickPolicy"], "catchup");
        assert_eq!(domain["features"]["hyperv"]["spinlocks"]["spinlocks"], 8191);
        assert_eq!(
            domain["features"]["smm"],
            json!({"enabled": true}),
            "Secure Boot keeps SMM"
        );
        assert_eq!(
            domain["firmware"]["bootloader"],
            json!({"efi": {"secureBoot": true}})
        );
        assert!(domain["devices"].get("tpm").is_none(), "no vTPM in vSphere");
        source.vtpm = true;
        let vm = virtual_machine(&migration(json!({})), &source);
        assert_eq!(
            vm.data["spec"]["template"]["spec"]["domain"]["devices"]["tpm"],
            json!({"persistent": true})
        );
    }

    #[test]
    fn a_windows_guest_in_local_time_runs_in_its_zone_and_every_other_vm_as_built() {
        use ferry_api::{GuestClockStatus, GuestRtc};
        let mut source = linux_source();
        source.guest_os = Some("windows2019srvNext_64Guest".into());
        let vmm = migration(json!({}));
        let built = virtual_machine(&vmm, &source);
        let clock_of = |adaptation: Option<&AdaptationStatus>| {
            adapted_virtual_machine(&vmm, source.clone(), adaptation).data["spec"]["template"]["spec"]
                ["domain"]["clock"]
                .clone()
        };
        let adaptation = |rtc, windows_zone: &str, timezone: &str| AdaptationStatus {
            clock: Some(GuestClockStatus {
                rtc,
                windows_zone: windows_zone.into(),
                timezone: timezone.into(),
            }),
            ..Default::default()
        };
        let berlin = clock_of(Some(&adaptation(
            GuestRtc::LocalTime,
            "W. Europe Standard Time",
            "Europe/Berlin",
        )));
        assert_eq!(berlin["timezone"], "Europe/Berlin");
        assert!(berlin.get("utc").is_none(), "KubeVirt takes one offset");
        assert_eq!(berlin["timer"]["rtc"]["tickPolicy"], "catchup");
        let built_clock = &built.data["spec"]["template"]["spec"]["domain"]["clock"];
        for unchanged in [
            None,
            Some(adaptation(GuestRtc::Utc, "", "")),
            Some(adaptation(GuestRtc::LocalTime, "Mars Standard Time", "")),
        ] {
            assert_eq!(&clock_of(unchanged.as_ref()), built_clock);
        }
        let linux = virtual_machine(&vmm, &linux_source());
        let local = adaptation(GuestRtc::LocalTime, "x", "Europe/Berlin");
        assert_eq!(
            adapted_virtual_machine(&vmm, linux_source(), Some(&local)).data,
            linux.data,
            "a VM without a Windows clock gets none"
        );
    }

    #[test]
    fn what_vsphere_left_unsaid_is_taken_from_the_adaptation() {
        let disk = |key| SourceDisk {
            key,
            ..Default::default()
        };
        let source = SourceVmStatus {
            disks: vec![disk(2000), disk(2001)],
            ..Default::default()
        };
        let adaptation = AdaptationStatus {
            boot_disk: Some(1),
            firmware: "UEFI".into(),
            ..Default::default()
        };
        let adapted = as_adapted(source.clone(), Some(&adaptation));
        assert_eq!(adapted.boot_order, [2001]);
        assert_eq!(boot_orders(&adapted), [None, Some(1)]);
        assert_eq!(adapted.firmware, Some(Firmware::Efi));
        assert_eq!(as_adapted(source.clone(), None), source);
        // What vSphere said stands.
        let said = SourceVmStatus {
            boot_order: vec![2000],
            firmware: Some(Firmware::Bios),
            ..source
        };
        assert_eq!(as_adapted(said.clone(), Some(&adaptation)), said);
    }
}
