//! The KubeVirt VirtualMachine: the source's shape (CPU, memory, firmware), its disks in boot order over the
//! imported DataVolumes, and its NICs with their MACs on the mapped networks, created with the requested run
//! strategy (the Starting checkpoint sets it again only if someone changed it).

use ferry_api::{Firmware, RunStrategy, SourceVmStatus, VirtualMachineMigration};
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::children;

/// KubeVirt's disk bus for a vSphere controller bus: the guest keeps the driver it boots with.
fn disk_bus(bus: Option<&str>) -> &'static str {
    match bus {
        Some("scsi") => "scsi",
        Some("sata") | Some("ide") => "sata",
        _ => "virtio",
    }
}

/// KubeVirt's NIC model for a vSphere adapter; vmxnet3 has no KubeVirt model, virtio is the fast default.
fn nic_model(model: Option<&str>) -> &'static str {
    match model.map(|m| m.to_ascii_lowercase()) {
        Some(m) if m.ends_with("e1000e") => "e1000e",
        Some(m) if m.ends_with("e1000") => "e1000",
        _ => "virtio",
    }
}

pub fn run_strategy(strategy: RunStrategy) -> &'static str {
    match strategy {
        RunStrategy::Always => "Always",
        RunStrategy::Halted => "Halted",
    }
}

pub fn virtual_machine(vmm: &VirtualMachineMigration, source: &SourceVmStatus) -> DynamicObject {
    let name = children::vm_name(vmm);
    let (mut disks, mut volumes) = (vec![], vec![]);
    for (i, disk) in source.disks.iter().enumerate() {
        let volume = format!("disk-{i}");
        let mut entry = json!({"name": volume, "disk": {"bus": disk_bus(disk.bus.as_deref())}});
        if i == 0 {
            entry["bootOrder"] = json!(1);
        }
        disks.push(entry);
        volumes.push(
            json!({"name": volume, "dataVolume": {"name": children::data_volume(vmm, i as i32)}}),
        );
    }
    let (mut interfaces, mut networks) = (vec![], vec![]);
    for (i, nic) in source.nics.iter().enumerate() {
        let Some(mapping) = vmm
            .spec
            .target
            .networks
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
        let mut interface =
            json!({"name": net, "macAddress": nic.mac, "model": nic_model(nic.model.as_deref())});
        if let (Some(a), Value::Object(b)) = (interface.as_object_mut(), binding) {
            a.extend(b);
        }
        interfaces.push(interface);
        networks.push(network);
    }
    let cores = source.cores_per_socket.max(1);
    let sockets = (source.cpus.max(1) + cores - 1) / cores;
    let bootloader = match source.firmware {
        Some(Firmware::Efi) => json!({"efi": {"secureBoot": false}}),
        _ => json!({"bios": {}}),
    };
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
                        "memory": {"guest": format!("{}Mi", source.memory_mib)},
                        "resources": {"requests": {"memory": format!("{}Mi", source.memory_mib)}},
                        "firmware": {"bootloader": bootloader},
                        "devices": {"disks": disks, "interfaces": interfaces},
                    },
                    "networks": networks,
                    "volumes": volumes,
                },
            },
        },
    });
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
                                    {"source": "dmz", "multus": {"networkName": "net/dmz"}}]},
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
                },
                SourceNic {
                    mac: "00:50:56:00:00:02".into(),
                    network: "backup".into(),
                    model: None,
                },
                SourceNic {
                    mac: "00:50:56:00:00:03".into(),
                    network: "dmz".into(),
                    model: Some("e1000e".into()),
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
        assert_eq!(spec["domain"]["memory"]["guest"], "2048Mi");
        assert!(spec["domain"]["firmware"]["bootloader"]["efi"].is_object());
        assert_eq!(
            spec["domain"]["devices"]["disks"][0],
            json!({"name": "disk-0", "disk": {"bus": "scsi"}, "bootOrder": 1})
        );
        assert_eq!(spec["volumes"][1]["dataVolume"]["name"], "web-disk-1");
        let nics = spec["domain"]["devices"]["interfaces"].as_array().unwrap();
        assert_eq!(nics.len(), 2);
        assert_eq!(nics[0]["macAddress"], "00:50:56:00:00:01");
        assert!(nics[0]["masquerade"].is_object());
        assert_eq!(nics[1]["model"], "e1000e");
        assert_eq!(spec["networks"][1]["multus"]["networkName"], "net/dmz");
        assert_eq!(vm.data["spec"]["runStrategy"], "Always");
        assert_eq!(
            vm.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
    }
}
