//! Migrations end to end against the lab: the real control plane, vcsim, MinIO staging, the stand-ins, and
//! `ferry controller` running as its deploy/ ServiceAccount under deploy/ RBAC.

mod support;

use std::time::Duration;

use ferry_api::{Phase, PowerState};
use ferry_testkit::migration;
use kube::api::{DeleteParams, DynamicObject};
use kube::{Api, ResourceExt};
use support::*;

async fn migrate_and_hand_over(vm: &str, name: &str, disks: usize) {
    let _source = source_lock(vm).await;
    let (client, ns) = setup(name).await;
    let lab = lab().await;
    set_source_power(vm, true).await;
    migration::apply(&client, ns.name(), migration::migration(lab, ns.name(), name, vm)).await.unwrap();
    let done = wait_for_phase(&client, ns.name(), name, Phase::Succeeded, Duration::from_secs(600)).await;
    let status = done.status.clone().unwrap();
    let uid = done.uid().unwrap();

    for kind in ["SourceDiscovered", "Validated", "DiskConverted", "DiskImported", "VMCreated", "VMStarted", "GuestReady", "Ready"] {
        let c = status.conditions.iter().find(|c| c.type_ == kind).unwrap_or_else(|| panic!("no {kind}"));
        assert_eq!(c.status, "True", "{kind}: {c:?}");
        assert_eq!(c.observed_generation, done.metadata.generation);
    }
    assert_eq!(status.conditions.last().unwrap().type_, "Ready", "Ready comes last");
    assert_eq!(status.disks.len(), disks);
    for disk in &status.disks {
        assert!(disk.verified, "disk {} not verified: {disk:?}", disk.index);
        assert_eq!(disk.sha256.as_ref().map(String::len), Some(64));
    }
    assert!(status.progress.as_deref().unwrap_or_default().starts_with("100%"), "{:?}", status.progress);
    let power = status.power.clone().unwrap();
    assert_eq!(power.original, Some(PowerState::PoweredOn));
    assert_eq!(source_power(vm).await, PowerState::PoweredOff, "the source ends powered off");

    // The guest printed its marker on the booted VM's serial port.
    let vmi = Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &resource("kubevirt.io", "v1", "VirtualMachineInstance"))
        .get(name)
        .await
        .unwrap();
    let marker = vmi.annotations().get("lab.ferry.dev/serial-marker").cloned().unwrap_or_default();
    assert!(marker.contains(&format!("FERRY-GUEST-READY {vm}")), "marker: {marker:?}");

    // Handed over: deleting the migration leaves the VM and its disks, and no Job or staged object.
    migrations(&client, ns.name()).delete(name, &DeleteParams::default()).await.unwrap();
    ferry_testkit::eventually("the migration to be deleted", Duration::from_secs(60), || async {
        migrations(&client, ns.name()).get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let vms = Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &resource("kubevirt.io", "v1", "VirtualMachine"));
    let vm_object = vms.get(name).await.expect("the migrated VM stays");
    assert!(vm_object.owner_references().is_empty());
    let dvs = Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &resource("cdi.kubevirt.io", "v1beta1", "DataVolume"));
    for i in 0..disks {
        dvs.get(&format!("{name}-disk-{i}")).await.expect("the imported disks stay");
    }
    assert!(labelled(&client, ns.name(), &resource("batch", "v1", "Job"), &uid).await.is_empty());
    assert!(staged_objects(ns.name(), name, &uid, disks).await.is_empty(), "staged objects remain");
}

#[tokio::test]
async fn a_single_disk_vm_migrates_boots_and_is_handed_over() {
    migrate_and_hand_over("DC0_H0_VM0", "single", 1).await;
}

#[tokio::test]
async fn the_three_disk_demo_vm_migrates_boots_and_is_handed_over() {
    migrate_and_hand_over("DC0_H0_VM1", "three", 3).await;
}
