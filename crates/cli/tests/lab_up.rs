//! `ferry lab up` as a person runs it: the stand-ins run as processes, a VirtualMachine over a DataVolume holding
//! a demo disk boots and prints its marker, and `ferry lab down` leaves no QEMU, agent or other lab process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_lab::standins::kubevirt::{MARKER_ANNOTATION, vm_resource, vmi_resource};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Runs `ferry lab down` however the test ends.
struct LabGuard(PathBuf);

impl Drop for LabGuard {
    fn drop(&mut self) {
        let _ = ferry(&["lab", "down", "--dir"], &self.0);
    }
}

fn ferry(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .arg(dir)
        .output()
        .unwrap()
}

#[tokio::test]
async fn lab_up_runs_the_stand_ins_and_a_demo_vm_boots_from_a_data_volume() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("lab");
    let guard = LabGuard(dir.clone());
    let up = ferry(&["lab", "up", "--dir"], &dir);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let state = ferry_lab::LabState::load(&dir.canonicalize().unwrap())
        .unwrap()
        .unwrap();
    let client = state.client().await.unwrap();

    // The demo disk, served over http, becomes a DataVolume; a VM boots from it.
    let disk = work.path().join("demo.img");
    let marker = ferry_lab::vsphere::demo::marker("lab-up-test");
    ferry_lab::vsphere::bootdisk::make_boot_disk(&disk, 16 << 20, &marker).unwrap();
    let server = ferry_testkit::http::FileServer::start(disk, None).await;
    let dvs = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        "default",
        &ferry_lab::standins::cdi::dv_resource(),
    );
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "demo-disk"},
        "spec": {"source": {"http": {"url": server.url("demo.img")}}, "storage": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}}});
    dvs.patch("demo-disk", &PatchParams::apply("test"), &Patch::Apply(&dv))
        .await
        .unwrap();
    let vms = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &vm_resource());
    let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "demo"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}, "memory": {"guest": "32Mi"}},
            "volumes": [{"name": "root", "dataVolume": {"name": "demo-disk"}}]}}}});
    vms.patch("demo", &PatchParams::apply("test"), &Patch::Apply(&vm))
        .await
        .unwrap();

    let vmis = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &vmi_resource());
    let started = Instant::now();
    loop {
        let vmi = vmis.get_opt("demo").await.unwrap();
        if let Some(seen) = vmi
            .as_ref()
            .and_then(|v| v.annotations().get(MARKER_ANNOTATION).cloned())
        {
            assert_eq!(seen, marker);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no guest marker within 60 s: {vmi:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!(
        "guest marker seen {:.1} s after the DataVolume was created",
        started.elapsed().as_secs_f64()
    );
    let serial = std::fs::read_dir(dir.join("standin-kubevirt"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "serial"))
        .expect("a serial log");
    assert!(
        std::fs::read_to_string(serial).unwrap().contains(&marker),
        "QEMU really ran the boot sector"
    );
    assert!(
        ferry_testkit::processes_mentioning(&dir)
            .iter()
            .any(|c| c.contains("qemu-system-x86_64")),
        "QEMU runs"
    );

    drop(server);
    let down = ferry(&["lab", "down", "--dir"], &dir);
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    let left = ferry_testkit::processes_mentioning(&dir);
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(guard);
}
