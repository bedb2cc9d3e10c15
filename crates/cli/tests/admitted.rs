//! Every shape of VirtualMachine Ferry builds is admitted by KubeVirt v1.9.0's own webhooks in the lab
//! (`tools/kubevirt-admission`): each device model, each firmware (BIOS, EFI, EFI with Secure Boot), each disk bus
//! the source can have, and NICs on the pod network and on a multus network. Created as a dry run: the API server
//! calls every webhook and stores nothing. The migrations of the other test binaries cover the DataVolumes.

use ferry_api::{Firmware, SourceDisk, SourceNic, SourceVmStatus, VirtualMachineMigration};
use ferry_controller::surface::build::virtual_machine;
use ferry_testkit::TestLab;
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use serde_json::json;

fn migration(ns: &str, devices: &str) -> VirtualMachineMigration {
    let mut vmm: VirtualMachineMigration = serde_json::from_value(json!({
        "apiVersion": ferry_api::API_VERSION, "kind": "VirtualMachineMigration",
        "metadata": {"name": format!("shape-{}", devices.to_ascii_lowercase()), "namespace": ns,
            "uid": "0b6c3c1e-0000-4000-8000-000000000001"},
        "spec": {
            "source": {"providerRef": {"name": "vc"}, "vm": {"name": "web"}},
            "target": {"networks": [{"source": "VM Network", "pod": {}},
                                    {"source": "dmz", "multus": {"networkName": "net/dmz"}}],
                       "devices": devices},
        },
    }))
    .expect("a migration");
    vmm.metadata.namespace = Some(ns.into());
    vmm
}

fn source(firmware: Option<Firmware>, secure_boot: bool) -> SourceVmStatus {
    let disk = |key, bus: &str| SourceDisk {
        key,
        bus: Some(bus.into()),
        uuid: Some(format!("6000C29a-0000-0000-0000-00000000{key:04}")),
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    let nic = |mac: &str, network: &str, model: &str| SourceNic {
        mac: mac.into(),
        network: network.into(),
        model: Some(model.into()),
        ip_addresses: vec![],
    };
    SourceVmStatus {
        cpus: 4,
        cores_per_socket: 2,
        memory_mib: 3072,
        firmware,
        secure_boot,
        disks: vec![
            disk(2000, "scsi"),
            disk(3000, "sata"),
            disk(3001, "ide"),
            disk(2001, "nvme"),
        ],
        boot_order: vec![3000],
        nics: vec![
            nic("00:50:56:aa:00:01", "VM Network", "VirtualVmxnet3"),
            nic("00:50:56:aa:00:02", "dmz", "VirtualE1000e"),
            nic("00:50:56:aa:00:03", "dmz", "VirtualE1000"),
        ],
        ..Default::default()
    }
}

#[tokio::test]
async fn every_vm_shape_ferry_builds_is_admitted_by_kubevirts_webhooks() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("admitted").await;
    let vms = Api::<DynamicObject>::namespaced_with(
        lab.client().await,
        ns.name(),
        &ferry_api::foreign::vm_resource(),
    );
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut admitted = 0;
    for devices in ["Compatibility", "Virtio", "Source"] {
        for (firmware, secure_boot) in [
            (None, false),
            (Some(Firmware::Bios), false),
            (Some(Firmware::Efi), false),
            (Some(Firmware::Efi), true),
        ] {
            let vm = virtual_machine(
                &migration(ns.name(), devices),
                &source(firmware, secure_boot),
            );
            let stored = vms.create(&dry_run, &vm).await.unwrap_or_else(|e| {
                panic!("{devices} devices, {firmware:?} (Secure Boot {secure_boot}) refused: {e}")
            });
            // Admitted as built: the mutator only adds (firmware serial and UUID, machine type).
            assert!(
                ferry_kube::apply::is_subset(&vm.data["spec"], &stored.data["spec"]),
                "{devices}/{firmware:?}: stored {:#} differs from built {:#}",
                stored.data["spec"],
                vm.data["spec"]
            );
            admitted += 1;
        }
    }
    assert_eq!(admitted, 12);

    // The dry runs did reach the webhooks: one with a malformed MAC is refused with KubeVirt's message.
    let mut bad = virtual_machine(&migration(ns.name(), "Virtio"), &source(None, false));
    bad.data["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["macAddress"] =
        json!("00:50:56:zz:00:01");
    let refused = vms
        .create(&dry_run, &bad)
        .await
        .expect_err("a malformed MAC is refused");
    assert!(
        refused.to_string().contains("MAC address"),
        "KubeVirt's message: {refused}"
    );
}
