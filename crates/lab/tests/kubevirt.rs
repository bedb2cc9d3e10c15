//! The KubeVirt stand-in against the lab's real API server: a VirtualMachine over a PVC holding the demo disk
//! runs, its guest really boots in QEMU and prints the marker, and `runStrategy: Halted` stops it.

use std::time::{Duration, Instant};

use ferry_lab::standins::kubevirt::{self, MARKER_ANNOTATION, READY_MARKER};
use ferry_testkit::{Background, TestLab, eventually};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

#[tokio::test]
async fn a_vm_boots_its_disk_in_qemu_and_halting_stops_it() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("kubevirt").await;
    let client = lab.client().await;
    let work = tempfile::tempdir().unwrap();
    let volume_dir = work.path().join("pv");
    std::fs::create_dir_all(&volume_dir).unwrap();
    let marker = format!("{READY_MARKER} kubevirt-test");
    ferry_lab::bootdisk::make_boot_disk(&volume_dir.join("disk.img"), 8 << 20, &marker).unwrap();

    // A hostPath PV pre-bound to the claim, as the CDI stand-in will make them; the real binder binds them.
    let pv_name = format!("{}-boot", ns.name());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "lab-hostpath",
                 "hostPath": {"path": volume_dir.display().to_string()},
                 "claimRef": {"namespace": ns.name(), "name": "boot"}},
    }))
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "boot"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "lab-hostpath", "resources": {"requests": {"storage": "8Mi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();

    let state = work.path().join("guests");
    let (standin_client, ns_name, standin_state) =
        (client.clone(), ns.name().to_string(), state.clone());
    let standin = Background::spawn(move |shutdown| async move {
        kubevirt::run(
            standin_client,
            Some(&ns_name),
            &standin_state,
            kubevirt::Boot::Qemu,
            shutdown,
        )
        .await
    });

    let vms =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &kubevirt::vm_resource());
    let vmis =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &kubevirt::vmi_resource());
    let vm = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "demo"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "boot", "disk": {"bus": "virtio"}}]}, "memory": {"guest": "32Mi"}},
            "volumes": [{"name": "boot", "persistentVolumeClaim": {"claimName": "boot"}}]}}},
    });
    vms.patch("demo", &PatchParams::apply("test"), &Patch::Apply(&vm))
        .await
        .unwrap();

    let started = Instant::now();
    let vmi = eventually("VMI Ready", Duration::from_secs(60), || async {
        vmis.get_opt("demo").await.unwrap().filter(|v| {
            v.data["status"]["conditions"].as_array().is_some_and(|cs| {
                ["Ready", "AgentConnected"]
                    .iter()
                    .all(|t| cs.iter().any(|c| c["type"] == *t && c["status"] == "True"))
            })
        })
    })
    .await;
    eprintln!(
        "VMI ready {:.1} s after the VM was created",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        vmi.annotations().get(MARKER_ANNOTATION),
        Some(&marker),
        "the marker came from the guest's serial port"
    );
    assert_eq!(vmi.data["status"]["phase"], "Running");
    eventually("VM Running", Duration::from_secs(30), || async {
        let vm = vms.get("demo").await.unwrap();
        (vm.data["status"]["printableStatus"] == "Running" && vm.data["status"]["ready"] == true)
            .then_some(())
    })
    .await;
    assert!(
        !ferry_testkit::processes_mentioning(&state).is_empty(),
        "QEMU runs"
    );

    // Halting deletes the VMI, and the stand-in stops QEMU before letting it go.
    let halt = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "demo"},
        "spec": {"runStrategy": "Halted", "template": vm["spec"]["template"].clone()}});
    vms.patch("demo", &PatchParams::apply("test"), &Patch::Apply(&halt))
        .await
        .unwrap();
    eventually("VMI gone", Duration::from_secs(60), || async {
        vmis.get_opt("demo").await.unwrap().is_none().then_some(())
    })
    .await;
    eventually("VM Stopped", Duration::from_secs(30), || async {
        (vms.get("demo").await.unwrap().data["status"]["printableStatus"] == "Stopped")
            .then_some(())
    })
    .await;
    assert!(
        ferry_testkit::processes_mentioning(&state).is_empty(),
        "QEMU still runs after the VMI went away"
    );

    standin.stop().await;
    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
}
