//! The KubeVirt stand-in against the lab's real API server and real QEMU: a VM's VMI waits for all its
//! volumes, runs its domain (SATA boot disk, e1000e NIC, the agent channel), is Ready without any agent, and
//! records the boot sector's console line; a killed domain fails its VMI and `Always` starts a new one;
//! `Halted` stops it. EFI with Secure Boot runs OVMF's secure build, and KubeVirt's own webhook refuses it without
//! SMM; a VMI the lab cannot run fails and backs off. The guest agent client is tested against Debian's real
//! qemu-ga.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ferry_lab::standins::kubevirt::agent::{self, Agent};
use ferry_lab::standins::kubevirt::{self, MARKER_ANNOTATION, READY_MARKER};
use ferry_testkit::{Background, TestLab, eventually};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// A hostPath PV pre-bound to claim `name`, as the CDI stand-in makes them; the real binder binds them.
/// Returns the PV's name (cluster-scoped: the test deletes it).
async fn volume(client: &Client, ns: &str, name: &str, dir: &Path) -> String {
    let pv_name = format!("{ns}-{name}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "lab-hostpath",
                 "hostPath": {"path": dir.display().to_string()},
                 "claimRef": {"namespace": ns, "name": name}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "lab-hostpath", "resources": {"requests": {"storage": "8Mi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
    pv_name
}

fn condition(vmi: &DynamicObject, type_: &str) -> Option<String> {
    vmi.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str().map(str::to_string))
}

/// Deletes the PVs when the test ends, passed or not. With kubectl: a client cannot be used from `drop`,
/// its connection lives on the test's runtime.
struct Volumes(&'static TestLab, Vec<String>);

impl Drop for Volumes {
    fn drop(&mut self) {
        if !self.1.is_empty() {
            let _ = self
                .0
                .kubectl()
                .args(["delete", "pv", "--ignore-not-found", "--wait=false"])
                .args(&self.1)
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
}

fn start_standin(lab: &TestLab, client: &Client, ns: &str, state: &Path) -> Background {
    let (client, ns, state) = (client.clone(), ns.to_string(), state.to_path_buf());
    let kubeconfig = lab.state().kubeconfig.clone();
    Background::spawn(move |shutdown| async move {
        let identities = kubevirt::Identities::impersonated(&kubeconfig).await?;
        kubevirt::run(
            client,
            identities,
            Some(&ns),
            &state,
            kubevirt::Boot::Qemu,
            shutdown,
        )
        .await
    })
}

#[tokio::test]
async fn a_vm_runs_its_domain_restarts_after_a_crash_and_halting_stops_it() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("kubevirt").await;
    let client = lab.client().await;
    let work = tempfile::tempdir().unwrap();
    let (boot_dir, data_dir) = (work.path().join("boot"), work.path().join("data"));
    std::fs::create_dir_all(&boot_dir).unwrap();
    std::fs::create_dir_all(&data_dir).unwrap();
    let marker = format!("{READY_MARKER} kubevirt-test");
    ferry_lab::vsphere::bootdisk::make_boot_disk(&boot_dir.join("disk.img"), 8 << 20, &marker)
        .unwrap();
    let mut volumes = Volumes(lab, vec![]);
    volumes
        .1
        .push(volume(&client, ns.name(), "boot", &boot_dir).await);

    let state = work.path().join("guests");
    let standin = start_standin(lab, &client, ns.name(), &state);
    let vms =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &kubevirt::vm_resource());
    let vmis =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &kubevirt::vmi_resource());
    let template = json!({"spec": {
        "domain": {"devices": {
                "disks": [{"name": "boot", "disk": {"bus": "sata"}, "bootOrder": 1, "serial": "boot-0"},
                          {"name": "data", "disk": {"bus": "virtio"}, "serial": "data-1"}],
                "interfaces": [{"name": "nic-0", "masquerade": {}, "model": "e1000e", "macAddress": "00:50:56:aa:bb:cc"}]},
            "cpu": {"sockets": 1, "cores": 2, "threads": 1},
            "memory": {"guest": "32Mi"}},
        "networks": [{"name": "nic-0", "pod": {}}],
        "volumes": [{"name": "boot", "persistentVolumeClaim": {"claimName": "boot"}},
                    {"name": "data", "dataVolume": {"name": "data"}}]}});
    let vm = |strategy: &str| {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "demo"},
               "spec": {"runStrategy": strategy, "template": template}})
    };
    vms.patch(
        "demo",
        &PatchParams::apply("test"),
        &Patch::Apply(&vm("Always")),
    )
    .await
    .unwrap();

    // The data disk's claim does not exist yet: the VMI waits, saying so. (It may first
    // say the boot claim is not bound yet: the PV controller binds it on its own time.)
    eventually(
        "VMI Scheduling, waiting for the data claim",
        Duration::from_secs(30),
        || async {
            vmis.get_opt("demo").await.unwrap().filter(|v| {
                v.data["status"]["phase"] == "Scheduling"
                    && v.data["status"]["conditions"]
                        .to_string()
                        .contains("PVC data does not exist yet")
            })
        },
    )
    .await;
    ferry_lab::disks::write_pattern(&data_dir.join("disk.img"), 1 << 20, 7).unwrap();
    volumes
        .1
        .push(volume(&client, ns.name(), "data", &data_dir).await);

    let started = Instant::now();
    let vmi = eventually("VMI Running and Ready", Duration::from_secs(60), || async {
        vmis.get_opt("demo")
            .await
            .unwrap()
            .filter(|v| condition(v, "Ready").as_deref() == Some("True"))
    })
    .await;
    eprintln!(
        "VMI Ready {:.1} s after both volumes existed",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(vmi.data["status"]["phase"], "Running");
    // The NIC on the pod network shows the pod's address, as KubeVirt shows a masquerade NIC's.
    let pod = ferry_lab::standins::kubevirt::pod_address(&vmi.uid().unwrap());
    assert_eq!(
        vmi.data["status"]["interfaces"],
        json!([{"name": "nic-0", "mac": "00:50:56:aa:bb:cc", "infoSource": "domain", "queueCount": 1, "linkState": "up",
                "podInterfaceName": "eth0", "ipAddress": pod, "ipAddresses": [pod]}])
    );
    let qemu = ferry_testkit::processes_mentioning(&state);
    assert_eq!(qemu.len(), 1, "one domain: {qemu:?}");
    for device in [
        "ide-hd,bus=ide.0,drive=drive-ua-boot,id=ua-boot,serial=boot-0,bootindex=1",
        // On root ports as libvirt lays them out: the NIC first, then three kept for NIC hotplug, virtio-scsi,
        // virtio-serial, the virtio disk.
        "virtio-blk-pci,drive=drive-ua-data,id=ua-data,bus=pci.7,serial=data-1",
        "e1000e,netdev=net0,id=ua-nic-0,mac=00:50:56:aa:bb:cc,bus=pci.1",
        "name=org.qemu.guest_agent.0",
        "2,sockets=1,cores=2,threads=1",
    ] {
        assert!(qemu[0].contains(device), "{device} in {}", qemu[0]);
    }
    // The boot sector booted from the SATA disk; its console line is recorded, and it is no agent.
    let vmi = eventually("marker recorded", Duration::from_secs(60), || async {
        vmis.get_opt("demo")
            .await
            .unwrap()
            .filter(|v| v.annotations().contains_key(MARKER_ANNOTATION))
    })
    .await;
    assert_eq!(vmi.annotations().get(MARKER_ANNOTATION), Some(&marker));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let vmi = vmis.get("demo").await.unwrap();
    assert_eq!(
        condition(&vmi, "AgentConnected"),
        None,
        "no agent answered, so no AgentConnected"
    );
    // KubeVirt's Go types write `guestOSInfo` always (a struct, so `omitempty` keeps `{}`): with no agent it is
    // empty.
    assert!(
        vmi.data["status"]["guestOSInfo"]
            .as_object()
            .is_none_or(|os| os.is_empty()),
        "{}",
        vmi.data["status"]
    );
    eventually("VM Running", Duration::from_secs(30), || async {
        let vm = vms.get("demo").await.unwrap();
        (vm.data["status"]["printableStatus"] == "Running" && vm.data["status"]["ready"] == true)
            .then_some(())
    })
    .await;

    // The domain dies: the VMI fails, and `Always` replaces it with a new one that runs.
    let first_uid = vmi.uid().unwrap();
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*state.to_string_lossy()))
        })
        .map(|e| e.file_name().to_string_lossy().to_string())
        .expect("the QEMU process");
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap()
            .success()
    );
    eventually("a new VMI Running", Duration::from_secs(90), || async {
        vmis.get_opt("demo").await.unwrap().filter(|v| {
            v.uid().as_deref() != Some(first_uid.as_str()) && v.data["status"]["phase"] == "Running"
        })
    })
    .await;

    // Halting deletes the VMI, and the stand-in stops QEMU before letting it go.
    vms.patch(
        "demo",
        &PatchParams::apply("test"),
        &Patch::Apply(&vm("Halted")),
    )
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
}

#[tokio::test]
async fn efi_secure_boot_runs_ovmf_kubevirt_refuses_it_without_smm_and_a_failed_start_backs_off() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("kubevirt-efi").await;
    let client = lab.client().await;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("blank");
    std::fs::create_dir_all(&dir).unwrap();
    ferry_lab::disks::write_pattern(&dir.join("disk.img"), 1 << 20, 1).unwrap();
    let _volumes = Volumes(lab, vec![volume(&client, ns.name(), "blank", &dir).await]);
    let state = work.path().join("guests");
    let standin = start_standin(lab, &client, ns.name(), &state);
    let vms =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &kubevirt::vm_resource());
    let vmis =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &kubevirt::vmi_resource());
    let vm = |name: &str, strategy: &str, domain: Value| {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
               "spec": {"runStrategy": strategy, "template": {"spec": {
                   "domain": domain,
                   "volumes": [{"name": "blank", "persistentVolumeClaim": {"claimName": "blank"}}]}}}})
    };
    let disks = json!({"disks": [{"name": "blank", "disk": {"bus": "virtio"}}]});
    // efi without secureBoot means Secure Boot in KubeVirt, which needs SMM.
    let secure = vm(
        "secure",
        "Always",
        json!({"devices": disks, "memory": {"guest": "128Mi"}, "features": {"smm": {}},
               "firmware": {"bootloader": {"efi": {}}}}),
    );
    // KubeVirt's own admission refuses Secure Boot without SMM before anything runs.
    let no_smm = vm(
        "no-smm",
        "Always",
        json!({"devices": disks, "memory": {"guest": "128Mi"}, "firmware": {"bootloader": {"efi": {}}}}),
    );
    match vms
        .patch(
            "no-smm",
            &PatchParams::apply("test"),
            &Patch::Apply(&no_smm),
        )
        .await
    {
        Err(kube::Error::Api(refused)) => assert!(
            refused.code == 422 && refused.message.contains("SecureBoot requires SMM"),
            "{refused:?}"
        ),
        other => panic!("Secure Boot without SMM was not refused by KubeVirt's webhook: {other:?}"),
    }
    // Admitted by KubeVirt, but the lab's virt-launcher runs only `disk` devices: its VMI fails to start.
    let refused = vm(
        "refused",
        // Once: the failed VMI stays to be read (Always would replace it after the backoff).
        "Once",
        json!({"devices": {"disks": [{"name": "blank", "cdrom": {"bus": "sata"}}]},
               "memory": {"guest": "128Mi"}}),
    );
    for (name, object) in [("secure", &secure), ("refused", &refused)] {
        vms.patch(name, &PatchParams::apply("test"), &Patch::Apply(object))
            .await
            .unwrap();
    }
    eventually(
        "the Secure Boot domain runs",
        Duration::from_secs(60),
        || async {
            vmis.get_opt("secure")
                .await
                .unwrap()
                .filter(|v| condition(v, "Ready").as_deref() == Some("True"))
        },
    )
    .await;
    let qemu = ferry_testkit::processes_mentioning(&state);
    assert_eq!(qemu.len(), 1, "{qemu:?}");
    for part in [
        "smm=on",
        "driver=cfi.pflash01,property=secure,value=on",
        "OVMF_CODE_4M.secboot.fd",
    ] {
        assert!(qemu[0].contains(part), "{part} in {}", qemu[0]);
    }
    assert!(
        std::fs::read_dir(&state)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with("_VARS.fd")),
        "the VMI has its own variable store"
    );

    let failed = eventually("the refused VMI fails", Duration::from_secs(30), || async {
        vmis.get_opt("refused")
            .await
            .unwrap()
            .filter(|v| v.data["status"]["phase"] == "Failed")
    })
    .await;
    assert!(
        failed.data["status"]["conditions"]
            .to_string()
            .contains("cdrom"),
        "{}",
        failed.data["status"]
    );
    let vm = eventually("CrashLoopBackOff", Duration::from_secs(30), || async {
        vms.get("refused")
            .await
            .ok()
            .filter(|vm| vm.data["status"]["printableStatus"] == "CrashLoopBackOff")
    })
    .await;
    assert_eq!(vm.data["status"]["startFailure"]["consecutiveFailCount"], 1);

    for name in ["secure", "refused"] {
        vms.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("VMIs gone", Duration::from_secs(60), || async {
        vmis.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(ferry_testkit::processes_mentioning(&state).is_empty());
    standin.stop().await;
}

/// Debian's qemu-ga listening on a unix socket in a temp dir, killed when dropped.
struct HostAgent {
    child: Child,
    socket: PathBuf,
}

impl HostAgent {
    fn start(dir: &Path) -> Self {
        let socket = dir.join("qga.sock");
        let child = Command::new("qemu-ga")
            .arg("--method=unix-listen")
            .arg(format!("--path={}", socket.display()))
            .arg(format!("--pidfile={}", dir.join("qga.pid").display()))
            .arg(format!("--statedir={}", dir.display()))
            .arg(format!("--logfile={}", dir.join("qga.log").display()))
            .spawn()
            .expect("qemu-ga (Debian qemu-guest-agent)");
        let agent = Self { child, socket };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !agent.socket.exists() {
            assert!(Instant::now() < deadline, "qemu-ga did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_agent_client_talks_to_a_real_qemu_ga() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostAgent::start(dir.path());
    let timeout = Duration::from_secs(10);
    let mut agent = Agent::connect(&host.socket, timeout).await.unwrap();
    agent.ping().await.unwrap();
    let os = agent.os_info().await.unwrap();
    let release = std::fs::read_to_string("/etc/os-release").unwrap();
    let id = os.id.clone().expect("an OS id");
    assert!(release.contains(&format!("ID={id}")), "{os:?}");
    assert!(os.kernel_release.is_some() && os.machine.as_deref() == Some("x86_64"));
    let interfaces = agent.network_interfaces().await.unwrap();
    let lo = interfaces.iter().find(|i| i.name == "lo").expect("lo");
    assert!(
        lo.ip_addresses
            .iter()
            .any(|a| a.ip_address == "127.0.0.1" && a.prefix == 8)
    );
    let error = agent
        .execute("guest-no-such-command", None)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("guest-no-such-command"),
        "{error}"
    );
    drop(agent);

    // A new connection resynchronises past whatever an abandoned one left unread.
    let mut abandoned = Agent::connect(&host.socket, timeout).await.unwrap();
    let _ = abandoned.execute("guest-get-time", None).await.unwrap();
    drop(abandoned);
    let report = agent::poll(&host.socket, timeout)
        .await
        .expect("the agent answers");
    assert_eq!(report.os, os);
    assert!(report.interfaces.iter().any(|i| i.name == "lo"));

    drop(host);
    assert!(
        agent::poll(&dir.path().join("qga.sock"), Duration::from_millis(500))
            .await
            .is_none()
    );
}
