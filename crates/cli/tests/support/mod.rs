//! What the migration tests share: one lab with its stand-ins and one controller per test binary, as in a cluster.

#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use ferry_api::keys::uid_selector;
use ferry_api::{Phase, VirtualMachineMigration};
use ferry_testkit::TestLab;
use ferry_testkit::migration::ControllerProcess;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Mutex;

pub fn ferry() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ferry"))
}

pub async fn lab() -> &'static TestLab {
    TestLab::shared_with_standins(ferry()).await
}

/// The one controller of this test binary.
pub async fn controller() -> &'static Mutex<ControllerProcess> {
    static CONTROLLER: tokio::sync::OnceCell<Mutex<ControllerProcess>> =
        tokio::sync::OnceCell::const_new();
    CONTROLLER
        .get_or_init(|| async {
            Mutex::new(
                ControllerProcess::start(lab().await, ferry())
                    .await
                    .expect("starting ferry controller"),
            )
        })
        .await
}

/// A namespace with the Provider and Secrets, and a client for it.
pub async fn setup(prefix: &str) -> (Client, ferry_testkit::TestNamespace) {
    let lab = lab().await;
    controller().await;
    let ns = lab.namespace(prefix).await;
    let client = lab.client().await;
    // Every pod Ferry creates must pass the restricted Pod Security level: the API server enforces it here.
    let label = serde_json::json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            ns.name(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&label),
        )
        .await
        .unwrap();
    ferry_testkit::migration::create_provider(&client, lab, ns.name())
        .await
        .unwrap();
    (client, ns)
}

pub fn migrations(client: &Client, ns: &str) -> Api<VirtualMachineMigration> {
    Api::namespaced(client.clone(), ns)
}

/// Merges `warm` into the migration's `spec.warm`, as a person asking for the cutover would.
pub async fn patch_warm(client: &Client, ns: &str, name: &str, warm: serde_json::Value) {
    let patch = serde_json::json!({"spec": {"warm": warm}});
    migrations(client, ns)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// Applies the lab's migration `name` of source VM `vm` in `ns`, then waits until it Succeeded.
pub async fn migrate_until_succeeded(
    client: &Client,
    ns: &str,
    name: &str,
    vm: &str,
    timeout: Duration,
) -> VirtualMachineMigration {
    let manifest = ferry_testkit::migration::migration(lab().await, ns, name, vm);
    ferry_testkit::migration::apply(client, ns, manifest)
        .await
        .unwrap();
    wait_for_phase(client, ns, name, Phase::Succeeded, timeout).await
}

/// Waits for `phase`, failing early with the whole status when the migration ends elsewhere.
pub async fn wait_for_phase(
    client: &Client,
    ns: &str,
    name: &str,
    phase: Phase,
    timeout: Duration,
) -> VirtualMachineMigration {
    let api = migrations(client, ns);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let vmm = api.get(name).await.unwrap();
        let now = vmm.status.as_ref().and_then(|s| s.phase);
        if now == Some(phase) {
            return vmm;
        }
        let ended = now.is_some_and(|p| p.is_terminal());
        if ended || std::time::Instant::now() > deadline {
            let controller = controller().await.lock().await.logs();
            let tail: Vec<&str> = controller.lines().rev().take(40).collect();
            panic!(
                "{ns}/{name} is {now:?}, not {phase:?}; status: {}\ncontroller log (last lines, newest first):\n{}",
                serde_json::to_string_pretty(&vmm.status).unwrap(),
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The kinds a migration creates and labels with its UID: its children, their pods and volumes.
pub const CHILD_KINDS: [(&str, &str, &str); 5] = [
    ("batch", "v1", "Job"),
    ("", "v1", "Pod"),
    ("cdi.kubevirt.io", "v1beta1", "DataVolume"),
    ("", "v1", "PersistentVolumeClaim"),
    ("kubevirt.io", "v1", "VirtualMachine"),
];

/// The objects of [`CHILD_KINDS`] in `ns` still labelled with `uid`, as `Kind name`.
pub async fn children_left(client: &Client, ns: &str, uid: &str) -> Vec<String> {
    let mut left = Vec::new();
    for (group, version, kind) in CHILD_KINDS {
        for name in labelled(client, ns, &resource(group, version, kind), uid).await {
            left.push(format!("{kind} {name}"));
        }
    }
    left
}

/// SIGKILLs the controller `kills` times and restarts it, each after a pseudo-random pause of `base` plus up to
/// `spread` (seeded by `FERRY_RESTART_SEED`, else `seed`, so a failure can be replayed), printing where
/// migration `name` was at each.
pub async fn kill_controller_at_random(
    client: &Client,
    ns: &str,
    name: &str,
    kills: u32,
    (base, spread): (Duration, Duration),
    seed: u64,
) {
    let mut seed: u64 = std::env::var("FERRY_RESTART_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    println!("restart seed {seed}");
    for kill in 0..kills {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pause = base + Duration::from_millis((seed >> 33) % spread.as_millis() as u64);
        tokio::time::sleep(pause).await;
        let phase = migrations(client, ns)
            .get(name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase);
        println!("controller kill {kill} after {pause:?}, at {phase:?}");
        controller().await.lock().await.restart().await.unwrap();
    }
}

/// Names of the objects of `resource` in `ns` that carry the migration's UID label.
pub async fn labelled(
    client: &Client,
    ns: &str,
    resource: &kube::core::ApiResource,
    uid: &str,
) -> Vec<String> {
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, resource)
        .list(&ListParams::default().labels(&uid_selector(uid)))
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .collect()
}

/// A Multus network in `ns` as a user makes one for VMs: a Linux bridge without IPAM (the guest keeps its own
/// address). With `segment` (subnet, router), the lab's KubeVirt stand-in gives the bridge that subnet and a router
/// that answers on it.
pub async fn create_bridge_network(
    client: &Client,
    ns: &str,
    name: &str,
    segment: Option<(&str, &str)>,
) {
    use ferry_lab::standins::kubevirt::multus::{GATEWAY_ANNOTATION, SUBNET_ANNOTATION};
    let config = serde_json::json!({"cniVersion": "0.3.1", "name": name, "type": "bridge",
        "bridge": format!("br-{name}"), "ipam": {}});
    let mut nad = serde_json::json!({
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name}, "spec": {"config": config.to_string()}});
    if let Some((subnet, gateway)) = segment {
        nad["metadata"]["annotations"] =
            serde_json::json!({(SUBNET_ANNOTATION): subnet, (GATEWAY_ANNOTATION): gateway});
    }
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ferry_api::foreign::nad_resource())
        .create(&Default::default(), &serde_json::from_value(nad).unwrap())
        .await
        .unwrap();
}

pub fn resource(group: &str, version: &str, kind: &str) -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, kind))
}

/// A session to the lab's vcsim and the managed object of `vm`.
pub async fn source_vm(vm: &str) -> (ferry_vsphere::Session, ferry_vsphere::MoRef) {
    let vcsim = lab().await.state().vcsim.clone().unwrap();
    let session =
        ferry_vsphere::Session::connect(vcsim.connect_config(Duration::from_secs(30)).unwrap())
            .await
            .unwrap();
    let moref =
        ferry_vsphere::inventory::find_vm(&session, &ferry_vsphere::VmSelector::Name(vm.into()))
            .await
            .unwrap();
    (session, moref)
}

pub async fn source_power(vm: &str) -> ferry_api::PowerState {
    let (session, moref) = source_vm(vm).await;
    ferry_vsphere::power::current_power_state(&session, &moref)
        .await
        .unwrap()
}

pub async fn set_source_power(vm: &str, on: bool) {
    let (session, moref) = source_vm(vm).await;
    if on {
        ferry_vsphere::power::power_on(&session, &moref, Duration::from_secs(60))
            .await
            .unwrap();
    } else {
        ferry_vsphere::power::power_off(&session, &moref, Duration::from_secs(60))
            .await
            .unwrap();
    }
}

/// Tests that touch one source VM's power take turns.
pub async fn source_lock(vm: &str) -> tokio::sync::OwnedMutexGuard<()> {
    static LOCKS: std::sync::Mutex<Vec<(String, std::sync::Arc<Mutex<()>>)>> =
        std::sync::Mutex::new(Vec::new());
    let lock = {
        let mut locks = LOCKS.lock().unwrap();
        match locks.iter().find(|(name, _)| name == vm) {
            Some((_, lock)) => lock.clone(),
            None => {
                let lock = std::sync::Arc::new(Mutex::new(()));
                locks.push((vm.to_string(), lock.clone()));
                lock
            }
        }
    };
    lock.lock_owned().await
}

/// The staged objects of a migration that are still in the lab's MinIO.
pub async fn staged_objects(ns: &str, name: &str, uid: &str, disks: usize) -> Vec<String> {
    let staging = lab().await.state().staging.clone().unwrap();
    let store = ferry_datapath::staging::Staging::open(&ferry_datapath::spec::StagingSpec {
        url: format!("{}/{ns}/{name}-{uid}", staging.url("migrations")),
        credentials_dir: Some(staging.credentials_dir.clone()),
        endpoint: Some(staging.endpoint.clone()),
        region: None,
        ca_bundle: staging.ca_bundle().unwrap(),
    })
    .unwrap();
    let mut found = Vec::new();
    for i in 0..disks {
        for object in [
            format!("disk-{i}.raw"),
            format!("disk-{i}.qcow2"),
            format!("disk-{i}.raw.manifest.json"),
            format!("disk-{i}.raw.upload.json"),
        ] {
            if store.head(&object).await.unwrap().is_some() {
                found.push(object);
            }
        }
    }
    found
}

/// Writes the controller's ServiceAccount made in `ns`, from the API server's audit log.
pub async fn writes_in(ns: &str) -> usize {
    lab()
        .await
        .audit_requests_by(ferry_testkit::migration::SERVICE_ACCOUNT)
        .iter()
        .filter(|r| r.is_write() && r.namespace == ns)
        .count()
}

/// The image file behind a DataVolume: its PVC's hostPath PV holds `disk.img` (CDI's layout in the lab).
pub async fn volume_image(client: &Client, ns: &str, dv: &str) -> std::path::PathBuf {
    ferry_lab::volumes::volume_image(client, ns, dv)
        .await
        .unwrap()
}

/// The serial console of the lab guest that ran `vm` in `ns` (the KubeVirt stand-in keeps it after the VMI).
pub async fn guest_console(_client: &Client, ns: &str, vm: &str) -> String {
    let dir = lab().await.dir().join("standin-kubevirt");
    let prefix = format!("{ns}_{vm}_");
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.starts_with(&prefix) && name.ends_with(".serial")
        })
        .map(|e| String::from_utf8_lossy(&std::fs::read(e.path()).unwrap_or_default()).to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// vSphere's names for a VM's disk files: `<vm>.vmdk`, then `<vm>_1.vmdk`, ...
pub fn disk_stem(vm: &str, index: usize) -> String {
    match index {
        0 => vm.to_string(),
        i => format!("{vm}_{i}"),
    }
}

/// Creates VM `vm` in the lab's vcsim, powered on, with one disk per size in `sizes_mib` on one PVSCSI
/// controller; the first disk boots and prints the VM's marker, the others hold a pattern. Returns each disk's
/// file stem and sha256. The files live under `dir` (in the lab's directory, removed with the lab).
pub async fn seed_vm(dir: &Path, vm: &str, sizes_mib: &[u64]) -> Vec<(String, String)> {
    seed_vm_on(dir, vm, sizes_mib, ferry_lab::vsphere::linux_vms::HOST).await
}

/// [`seed_vm`] on ESXi host `host` (`DC0_H0`, or a cluster's `DC0_C0_H0`).
pub async fn seed_vm_on(
    dir: &Path,
    vm: &str,
    sizes_mib: &[u64],
    host: &str,
) -> Vec<(String, String)> {
    std::fs::create_dir_all(dir).unwrap();
    let mut disks = Vec::new();
    for (i, mib) in sizes_mib.iter().enumerate() {
        let stem = disk_stem(vm, i);
        let raw = dir.join(format!("{stem}.raw"));
        let sha = if i == 0 {
            ferry_lab::vsphere::bootdisk::make_boot_disk(
                &raw,
                mib << 20,
                &ferry_lab::vsphere::demo::marker(vm),
            )
        } else {
            ferry_lab::disks::write_pattern(&raw, mib << 20, 100 + i as u64)
        }
        .unwrap();
        disks.push(ferry_lab::disks::raw_to_flat_vmdk(&raw, &stem, sha, mib << 20).unwrap());
    }
    provision_seeded_on(vm, &disks, host).await;
    (0..sizes_mib.len())
        .map(|i| disk_stem(vm, i))
        .zip(disks.into_iter().map(|d| d.sha256))
        .collect()
}

/// Creates VM `vm` in the lab's vcsim, powered on, with `disks` on one PVSCSI controller.
pub async fn provision_seeded(vm: &str, disks: &[ferry_lab::disks::FlatVmdk]) {
    provision_seeded_on(vm, disks, ferry_lab::vsphere::linux_vms::HOST).await
}

/// [`provision_seeded`] on ESXi host `host`.
pub async fn provision_seeded_on(vm: &str, disks: &[ferry_lab::disks::FlatVmdk], host: &str) {
    let vcsim = lab().await.state().vcsim.clone().unwrap();
    ferry_lab::vsphere::linux_vms::seed_flat_vm(&vcsim, vm, disks, host)
        .await
        .unwrap();
}

/// Gives the lab's VM `vm` the instance UUID `uuid` (as a VM removed and another registered under its moref
/// would look); returns the one it had.
pub async fn set_instance_uuid(vm: &str, uuid: &str) -> String {
    let (session, moref) = source_vm(vm).await;
    let before = ferry_vsphere::inventory::instance_uuid(&session, &moref)
        .await
        .unwrap()
        .expect("vcsim gives every VM an instance UUID");
    let spec = format!("<spec><instanceUuid>{uuid}</instanceUuid></spec>");
    let answer = session
        .call("ReconfigVM_Task", &moref, &spec)
        .await
        .unwrap();
    let task = answer
        .child("returnval")
        .and_then(ferry_vsphere::MoRef::from_element)
        .expect("a task");
    ferry_vsphere::power::wait_task(&session, &task, Duration::from_secs(60))
        .await
        .unwrap();
    before
}

/// Moves the lab's VM `vm` into the VM folder `folder` beside it (created when absent).
pub async fn move_to_folder(vm: &str, folder: &str) {
    use ferry_vsphere::inventory::{VmSelector, find_vm};
    let vcsim = lab().await.state().vcsim.clone().unwrap();
    let session =
        ferry_vsphere::Session::connect(vcsim.connect_config(Duration::from_secs(60)).unwrap())
            .await
            .unwrap();
    let moref = find_vm(&session, &VmSelector::Name(vm.into()))
        .await
        .unwrap();
    ferry_vsphere::provision::move_into_folder(&session, &moref, folder)
        .await
        .unwrap();
    session.logout().await;
}

/// The first `bytes` of `path`, hashed.
pub fn sha256_prefix(path: &Path, bytes: u64) -> String {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let (mut hash, mut buf) = (Sha256::new(), vec![0u8; 1 << 20]);
    let mut from = std::fs::File::open(path).unwrap().take(bytes);
    loop {
        let n = from.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    ferry_lab::disks::hex(&hash.finalize())
}
