//! Real Linux guests end to end: Debian 12 VMs shaped like VMware VMs (PVSCSI disks, a vmxnet3 NIC, an initramfs
//! with VMware's drivers only, open-vm-tools, and a qemu-guest-agent that starts only on its virtio port) move
//! from vcsim to the KubeVirt stand-in, which boots them in QEMU as virt-launcher would. Their guest agent is
//! real: `AgentConnected` and `guestOSInfo` come from it.

mod support;

use std::time::Duration;

use ferry_api::KeptInterfaceName;
use ferry_api::{GuestEvidence, Phase, PowerState, VirtualMachineMigration};
use ferry_lab::vsphere::guest_image::GuestImage;
use ferry_lab::vsphere::guest_image::StaticNetwork;
use ferry_lab::vsphere::linux_vms::{
    LINUX_BIOS_VM, LINUX_EFI_VM, LINUX_NM_VM, LINUX_STATIC_VM, NETWORK, SECOND_NETWORK,
};
use ferry_testkit::migration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::*;

/// A 1 GiB disk through the whole data path, then a Debian boot in software emulation.
const LINUX_TIMEOUT: Duration = Duration::from_secs(1200);
/// virt-v2v in software emulation: about 4 minutes on an idle machine, more beside other tests.
const ADAPTATION_TIMEOUT: Duration = Duration::from_secs(1200);

/// One Linux guest at a time: each takes a core of software emulation while it boots.
async fn one_guest_at_a_time() -> tokio::sync::OwnedMutexGuard<()> {
    source_lock("linux-guests").await
}

fn vmi_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("kubevirt.io", "v1", "VirtualMachineInstance"),
    )
}

fn vm_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("kubevirt.io", "v1", "VirtualMachine"),
    )
}

/// The guest's report line on its serial console, once it has printed it.
async fn report_line(client: &Client, ns: &str, name: &str) -> String {
    let vmi = vmi_api(client, ns).get(name).await.unwrap();
    vmi.annotations()
        .get("lab.ferry.dev/serial-marker")
        .cloned()
        .unwrap_or_default()
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
}

async fn migrate(client: &Client, ns: &str, name: &str, vm: &str, extra: Value) {
    let lab = lab().await;
    let mut manifest = migration::migration(lab, ns, name, vm);
    // The lab's 2 s settle is for boot sectors; a Linux guest is judged the way a user would.
    manifest["spec"]
        .as_object_mut()
        .unwrap()
        .remove("guestCheck");
    if let (Some(spec), Value::Object(extra)) = (manifest["spec"].as_object_mut(), extra) {
        for (key, value) in extra {
            match (spec.get_mut(&key), value) {
                (Some(Value::Object(existing)), Value::Object(more)) => existing.extend(more),
                (_, value) => {
                    spec.insert(key, value);
                }
            }
        }
    }
    migration::apply(client, ns, manifest).await.unwrap();
}

/// How long each checkpoint took, for the log: on a slow run it tells the data path from the boot.
fn print_timeline(done: &VirtualMachineMigration) {
    let checkpoints = &done.status.as_ref().unwrap().checkpoints;
    let Some(first) = checkpoints.first() else {
        return;
    };
    for pair in checkpoints.windows(2) {
        let took = pair[1].entered.0.duration_since(pair[0].entered.0);
        eprintln!(
            "{}: {:?} {:.1} s",
            done.name_any(),
            pair[0].phase,
            took.as_secs_f64()
        );
    }
    let last = checkpoints.last().unwrap();
    let total = last.entered.0.duration_since(first.entered.0);
    eprintln!(
        "{}: {:?} reached after {:.1} s",
        done.name_any(),
        last.phase,
        total.as_secs_f64()
    );
}

/// How a guest's network must come up: by DHCP on the pod network (masquerade), or with the static addresses its
/// own configuration gives the interfaces it names (in the VM's NIC order), on Multus networks.
enum GuestNetwork {
    PodDhcp,
    Static(Vec<StaticNetwork>),
}

/// The static addresses of a lab guest image.
fn static_networks(
    image: impl FnOnce(ferry_lab::vsphere::guest_image::GuestImages) -> GuestImage,
) -> Vec<StaticNetwork> {
    let images = ferry_lab::vsphere::guest_image::ensure_guest_images(None)
        .expect("the lab's guest images (cached)");
    let networks = image(images).static_networks;
    assert!(!networks.is_empty(), "the guest has static addresses");
    networks
}

/// The lab's bridge networks for the static guests, as Multus NetworkAttachmentDefinitions: the subnets and routers
/// their configurations expect (`crates/lab/guest/debian12.sh`).
async fn create_bridge_networks(client: &Client, ns: &str) {
    create_bridge_network(client, ns, "lan", Some(("192.168.50.0/24", "192.168.50.1"))).await;
    create_bridge_network(
        client,
        ns,
        "lan2",
        Some(("192.168.60.0/24", "192.168.60.1")),
    )
    .await;
}

/// The static guests' NICs on Multus networks (the bridges where their addresses mean something), not the pod's.
fn on_multus_networks(mut extra: Value) -> Value {
    extra["target"] = json!({"networks": [
        {"source": NETWORK, "multus": {"networkName": "lan"}},
        {"source": SECOND_NETWORK, "multus": {"networkName": "lan2"}}]});
    extra
}

async fn assert_booted_with_agent(
    client: &Client,
    ns: &str,
    done: &VirtualMachineMigration,
    hostname: &str,
    network: &GuestNetwork,
) {
    print_timeline(done);
    let name = done.name_any();
    let status = done.status.clone().unwrap();
    let guest = status.guest.clone().expect("status.guest");
    assert_eq!(guest.evidence, GuestEvidence::AgentAnswered, "{guest:?}");
    assert!(
        guest
            .os
            .as_deref()
            .unwrap_or_default()
            .contains("Debian GNU/Linux 12"),
        "{guest:?}"
    );
    let source_mac = status.source.as_ref().unwrap().nics[0].mac.to_lowercase();
    // The VMI's agent view, as KubeVirt fills it.
    let vmi = vmi_api(client, ns).get(&name).await.unwrap();
    let vmi_status = &vmi.data["status"];
    assert!(
        vmi_status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "AgentConnected" && c["status"] == "True"),
        "{vmi_status}"
    );
    assert_eq!(vmi_status["guestOSInfo"]["id"], "debian", "{vmi_status}");
    assert_eq!(vmi_status["guestOSInfo"]["versionId"], "12", "{vmi_status}");
    match network {
        // KubeVirt shows a masquerade NIC's address as the launcher pod's (the stand-in's is in the real node's pod
        // range); the guest's own is on its console line, below.
        GuestNetwork::PodDhcp => assert!(
            guest.ip_addresses.iter().any(|ip| ip.starts_with("10.88.")),
            "{guest:?}"
        ),
        // Off the pod network KubeVirt shows what the agent reports: the old names, the old MACs, the addresses.
        GuestNetwork::Static(expected) => {
            let source_nics = &status.source.as_ref().unwrap().nics;
            assert_eq!(source_nics.len(), expected.len(), "{source_nics:?}");
            for (source_nic, expected) in source_nics.iter().zip(expected) {
                let mac = source_nic.mac.to_lowercase();
                assert!(guest.ip_addresses.contains(&expected.address), "{guest:?}");
                let nic = vmi_status["interfaces"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|i| i["mac"] == mac.as_str())
                    .unwrap_or_else(|| panic!("no interface with {mac}: {vmi_status}"));
                assert_eq!(nic["interfaceName"], expected.interface.as_str(), "{nic}");
                assert!(
                    nic["ipAddresses"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|a| a == expected.address.as_str())),
                    "{nic}"
                );
            }
            assert!(
                guest.network.starts_with("network identity kept: "),
                "{guest:?}"
            );
        }
    }
    // The guest's own report: multi-user reached, data disk mounted by UUID with its known content, its address.
    let payload = ferry_lab::vsphere::guest_image::ensure_guest_images(None)
        .expect("the lab's guest images (cached)")
        .data_payload_sha256;
    // Printed after multi-user, the network and a hash of the data disk: minutes under a busy emulation.
    let line = ferry_testkit::eventually(
        "the guest's report line",
        Duration::from_secs(600),
        || async {
            let line = report_line(client, ns, &name).await;
            line.contains("FERRY-GUEST-READY").then_some(line)
        },
    )
    .await;
    assert!(
        line.contains(&format!("FERRY-GUEST-READY {hostname}")),
        "{line}"
    );
    assert_eq!(
        field(&line, "data-sha256"),
        Some(payload.as_str()),
        "{line}"
    );
    match network {
        GuestNetwork::PodDhcp => assert!(
            field(&line, "ip").is_some_and(|ip| ip.starts_with("10.0.2.")),
            "{line}"
        ),
        // The default route goes through the first NIC, and its router answers: the address means something on
        // the bridge. (The stand-in's pod network is QEMU's restricted user network, whose DHCP offers no router.)
        GuestNetwork::Static(expected) => {
            assert_eq!(
                field(&line, "ip"),
                Some(expected[0].address.as_str()),
                "{line}"
            );
            assert_eq!(field(&line, "gw"), Some("reachable"), "{line}");
        }
    }
    assert_eq!(field(&line, "mac"), Some(source_mac.as_str()), "{line}");
}

/// Each disk's bus in a VM's domain, in order.
fn disk_buses(domain: &Value) -> Vec<&str> {
    domain["devices"]["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["disk"]["bus"].as_str().unwrap())
        .collect()
}

/// The default guest check, with time for the agent: under TCG on a loaded 2-core machine a Debian guest's agent
/// can take minutes to answer, and after the settle the check would settle for "ran steadily". The check ends
/// when the agent answers, so the long window costs nothing on a machine that boots the guest quickly.
fn slow_boot() -> Value {
    json!({"guestCheck": {"settleSeconds": 900, "timeoutSeconds": 1200}})
}

/// A BIOS VM with default settings (compatibility devices, no adaptation) whose configuration gives `ens192` a
/// static address, onto a bridge network where that address is routed. It boots (its agent answers; `ferry lab
/// demo` shows the same image with DHCP succeed), but its NIC now has another name, so the address never comes
/// back: preflight warned that it would not (`StaticAddressNotKept`, `NoGuestAdaptation`), and the guest check,
/// comparing the agent's report with VMware Tools', fails naming the NIC, its new name and the address it lacks,
/// and keeps the copy.
#[tokio::test]
async fn an_unadapted_linux_vm_boots_on_compatibility_devices_and_its_lost_static_address_fails_the_check()
 {
    let _turn = one_guest_at_a_time().await;
    let _static = source_lock(LINUX_STATIC_VM).await;
    let (client, ns) = setup("linux-unadapted").await;
    create_bridge_networks(&client, ns.name()).await;
    set_source_power(LINUX_STATIC_VM, true).await;
    // Long enough for an address to come up after the agent answers, even under a busy emulation.
    let check =
        json!({"guestCheck": {"agent": "Required", "settleSeconds": 180, "timeoutSeconds": 1200}});
    migrate(
        &client,
        ns.name(),
        "static",
        LINUX_STATIC_VM,
        on_multus_networks(check),
    )
    .await;
    let lost = wait_for_phase(
        &client,
        ns.name(),
        "static",
        Phase::ManualInterventionRequired,
        LINUX_TIMEOUT,
    )
    .await;

    print_timeline(&lost);
    let status = lost.status.clone().unwrap();
    let warned = status
        .conditions
        .iter()
        .find(|c| c.type_ == "StaticAddressNotKept")
        .expect("the StaticAddressNotKept warning");
    assert_eq!(
        (warned.status.as_str(), warned.reason.as_str()),
        ("True", "NoGuestAdaptation"),
        "{warned:?}"
    );
    let expected = static_networks(|i| i.static_ifupdown).remove(0);
    let mac = status.source.as_ref().unwrap().nics[0].mac.to_lowercase();
    let error = status.retry.as_ref().unwrap().last_error.clone().unwrap();
    assert_eq!(error.reason, "GuestNotReady", "{error:?}");
    for words in [
        format!("NIC {mac} is enp"),
        format!(
            "lacks {}/{}, which VMware Tools reported as configured by hand",
            expected.address, expected.prefix_length
        ),
        "nothing was deleted".into(),
    ] {
        assert!(error.message.contains(&words), "{words:?}: {error:?}");
    }
    assert_eq!(
        status.guest.as_ref().map(|g| g.evidence),
        Some(GuestEvidence::NotProven)
    );
    // Kept as for any failed check: the VM halted with both volumes, the source running again. It ran on the
    // compatibility devices its VMware drivers can use.
    let vm = assert_kept_for_a_person(&client, ns.name(), &lost, LINUX_STATIC_VM).await;
    let domain = &vm.data["spec"]["template"]["spec"]["domain"];
    assert_eq!(disk_buses(domain), ["sata", "sata"], "{domain}");
    assert_eq!(domain["devices"]["interfaces"][0]["model"], "e1000e");
    assert_eq!(domain["firmware"]["bootloader"], json!({"bios": {}}));
}

/// What a failed guest check keeps: the VM halted (its instance gone), labelled with the migration's uid, its two
/// DataVolumes, and the source running again (restorePowerState). The VM.
async fn assert_kept_for_a_person(
    client: &Client,
    ns: &str,
    failed: &VirtualMachineMigration,
    source: &str,
) -> DynamicObject {
    let (name, uid) = (failed.name_any(), failed.uid().unwrap());
    let vm = ferry_testkit::eventually(
        "the VM halted and its instance gone",
        Duration::from_secs(120),
        || async {
            let vm = vm_api(client, ns).get(&name).await.ok()?;
            let gone = vmi_api(client, ns).get_opt(&name).await.ok()?.is_none();
            (gone && vm.data["spec"]["runStrategy"] == "Halted").then_some(vm)
        },
    )
    .await;
    assert_eq!(
        vm.labels().get("migration.platform.example/uid"),
        Some(&uid)
    );
    ferry_testkit::eventually(
        "the source powered on again",
        Duration::from_secs(120),
        || async { (source_power(source).await == PowerState::PoweredOn).then_some(()) },
    )
    .await;
    let dvs = labelled(
        client,
        ns,
        &resource("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        &uid,
    )
    .await;
    assert_eq!(dvs.len(), 2, "{dvs:?}");
    vm
}

/// What an adapted migration must show: virt-v2v's findings, both sha256 of each changed disk, the condition,
/// the interface names kept, a VM on virtio, and the guest booted with its agent answering and its root on
/// virtio-blk.
async fn assert_adapted(
    client: &Client,
    ns: &str,
    done: &VirtualMachineMigration,
    hostname: &str,
    network: &GuestNetwork,
) {
    let name = done.name_any();
    let status = done.status.clone().unwrap();
    let adaptation = status.adaptation.clone().expect("status.adaptation");
    assert_eq!(
        (adaptation.os_type.as_str(), adaptation.distro.as_str()),
        ("linux", "debian"),
        "{name}: {adaptation:?}"
    );
    assert_eq!(adaptation.boot_disk, Some(0), "{name}: {adaptation:?}");
    assert!(adaptation.os.contains("x86_64"), "{name}: {adaptation:?}");
    let root = &status.disks[0];
    assert!(
        root.adapted_sha256.is_some() && root.adapted_sha256 != root.sha256,
        "{name}: the root disk changed, and both hashes are kept: {root:?}"
    );
    assert!(!status.rewrite_volumes, "{name}: {status:?}");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "GuestAdapted" && c.status == "True"),
        "{name}: {:?}",
        status.conditions
    );
    // A configuration naming an interface has it kept by MAC; DHCP on any NIC names none.
    let names = adaptation.interface_names.clone().expect("interfaceNames");
    assert!(
        names.error.is_empty() && names.left_alone.is_empty(),
        "{name}: {names:?}"
    );
    let kept = match network {
        GuestNetwork::PodDhcp => vec![],
        GuestNetwork::Static(expected) => status
            .source
            .as_ref()
            .unwrap()
            .nics
            .iter()
            .zip(expected)
            .map(|(nic, expected)| KeptInterfaceName {
                name: expected.interface.clone(),
                mac: nic.mac.to_lowercase(),
            })
            .collect(),
    };
    assert_eq!(names.kept, kept, "{name}");
    let vm = vm_api(client, ns).get(&name).await.unwrap();
    let domain = &vm.data["spec"]["template"]["spec"]["domain"];
    assert_eq!(disk_buses(domain), ["virtio", "virtio"], "{domain}");
    assert_eq!(domain["devices"]["interfaces"][0]["model"], "virtio");
    assert_booted_with_agent(client, ns, done, hostname, network).await;
    let line = report_line(client, ns, &name).await;
    assert_eq!(field(&line, "root"), Some("/dev/vda1"), "{name}: {line}");
}

fn adapted(mut extra: Value) -> Value {
    extra["conversion"] = json!({"guestAdaptation": "VirtV2v"});
    extra
}

/// Two Linux VMs adapted by virt-v2v, at once (two sources, so two cores of emulation), whose configurations
/// give their NICs static addresses by name (VMware Tools reports them as configured by hand): a BIOS guest with
/// ifupdown on `ens192`, as Debian's installer writes it, whose initramfs cannot find its root on virtio without
/// adaptation (`a_guest_without_virtio_drivers_...` shows it for the same image); and an EFI guest under Secure
/// Boot with NetworkManager keyfiles for `ens192` and `ens224`. Both come up on virtio-blk and virtio-net on Multus
/// networks, under their old names, with their old MACs and their addresses, as their own agents report: Ferry
/// kept the names by MAC before virt-v2v ran, and the guest check says the network identity was kept. The volumes
/// hold the adapted guests, the status both sha256 and what virt-v2v found.
#[tokio::test]
async fn linux_vms_adapted_by_virt_v2v_boot_on_virtio_with_their_interface_names_and_static_addresses()
 {
    let _turn = one_guest_at_a_time().await;
    let _static = source_lock(LINUX_STATIC_VM).await;
    let _nm = source_lock(LINUX_NM_VM).await;
    let (client, ns) = setup("linux-adapted").await;
    create_bridge_networks(&client, ns.name()).await;
    for (name, vm) in [("static", LINUX_STATIC_VM), ("nm", LINUX_NM_VM)] {
        set_source_power(vm, true).await;
        migrate(
            &client,
            ns.name(),
            name,
            vm,
            on_multus_networks(adapted(slow_boot())),
        )
        .await;
    }
    let timeout = LINUX_TIMEOUT + ADAPTATION_TIMEOUT;
    let (ifupdown, nm) = tokio::join!(
        wait_for_phase(&client, ns.name(), "static", Phase::Succeeded, timeout),
        wait_for_phase(&client, ns.name(), "nm", Phase::Succeeded, timeout),
    );
    let static_ifupdown = GuestNetwork::Static(static_networks(|i| i.static_ifupdown));
    assert_adapted(
        &client,
        ns.name(),
        &ifupdown,
        "ferry-linux-static",
        &static_ifupdown,
    )
    .await;
    let static_nm = GuestNetwork::Static(static_networks(|i| i.static_nm));
    assert_adapted(&client, ns.name(), &nm, "ferry-linux-nm", &static_nm).await;
    let vm = vm_api(&client, ns.name()).get("nm").await.unwrap();
    let domain = &vm.data["spec"]["template"]["spec"]["domain"];
    assert_eq!(
        domain["firmware"]["bootloader"],
        json!({"efi": {"secureBoot": true}})
    );
}

/// This migration's adaptation pod while it runs, and its log so far (the lab's node keeps it by pod uid).
async fn running_adaptation(client: &Client, ns: &str, uid: &str) -> Option<(String, String)> {
    let selector = format!(
        "{},{}=adapt",
        ferry_api::keys::uid_selector(uid),
        ferry_api::keys::STEP_LABEL
    );
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?;
    let pod = pods.items.into_iter().find(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })?;
    let log = lab()
        .await
        .dir()
        .join("standin-node")
        .join(pod.uid()?)
        .join("container.log");
    Some((
        pod.name_any(),
        std::fs::read_to_string(log).unwrap_or_default(),
    ))
}

/// Waits until this migration's adaptation pod has logged `words`; its name.
async fn adaptation_logged(client: &Client, ns: &str, uid: &str, words: &str) -> String {
    ferry_testkit::eventually(
        &format!("the adaptation pod to log {words:?}"),
        ADAPTATION_TIMEOUT,
        || async {
            let (pod, log) = running_adaptation(client, ns, uid).await?;
            log.contains(words).then_some(pod)
        },
    )
    .await
}

/// Processes of virt-v2v or its appliance still running on this machine.
fn adaptation_processes() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("virt-v2v") || cmdline.contains("appliance.d") {
            found.push(cmdline);
        }
    }
    found
}

/// Cancelled, then deleted, while virt-v2v runs: its pod is stopped with its appliance, and nothing with the
/// migration's UID is left; the source runs again.
#[tokio::test]
async fn an_adaptation_cancelled_or_deleted_midway_leaves_nothing_behind() {
    let _turn = one_guest_at_a_time().await;
    let _source = source_lock(LINUX_BIOS_VM).await;
    let (client, ns) = setup("linux-adapt-stop").await;
    let api = migrations(&client, ns.name());
    for (name, cancel) in [("cancelled", true), ("deleted", false)] {
        set_source_power(LINUX_BIOS_VM, true).await;
        migrate(&client, ns.name(), name, LINUX_BIOS_VM, adapted(json!({}))).await;
        let midway = wait_for_phase(&client, ns.name(), name, Phase::Adapting, LINUX_TIMEOUT).await;
        let uid = midway.uid().unwrap();
        // virt-v2v's own progress lines: it runs, in its appliance.
        let pod = adaptation_logged(&client, ns.name(), &uid, "virt-v2v: [").await;
        println!("{name}: stopping while {pod} adapts");
        assert!(!adaptation_processes().is_empty(), "virt-v2v runs");
        if cancel {
            let patch = json!({"spec": {"cancel": true}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            let done = wait_for_phase(
                &client,
                ns.name(),
                name,
                Phase::Cancelled,
                Duration::from_secs(120),
            )
            .await;
            assert!(done.status.unwrap().cleaned_up);
        } else {
            api.delete(name, &DeleteParams::default()).await.unwrap();
        }
        ferry_testkit::eventually(
            &format!("everything of {name} gone"),
            Duration::from_secs(120),
            || async {
                if !children_left(&client, ns.name(), &uid).await.is_empty() {
                    return None;
                }
                let processes = adaptation_processes();
                let gone = if cancel {
                    true
                } else {
                    api.get_opt(name).await.unwrap().is_none()
                };
                (gone && processes.is_empty()).then_some(())
            },
        )
        .await;
        ferry_testkit::eventually(
            "the source powered on again",
            Duration::from_secs(120),
            || async { (source_power(LINUX_BIOS_VM).await == PowerState::PoweredOn).then_some(()) },
        )
        .await;
    }
}

/// Runs `ferry adapt` again, by hand, on a migration's adapted volumes: it must refuse them before anything runs
/// (`VolumeNotAsConverted`), and leave them as they were.
async fn a_second_adaptation_is_refused(
    client: &Client,
    ns: &str,
    adapted: &VirtualMachineMigration,
) {
    let status = adapted.status.clone().unwrap();
    let mut spec = ferry_controller::surface::build::adapt_spec(
        adapted,
        status.source.as_ref().unwrap(),
        &status.disks,
    );
    let mut before = Vec::new();
    for (disk, recorded) in spec.disks.iter_mut().zip(&status.disks) {
        // The lab's volumes are files, whatever their mode.
        disk.path =
            support::volume_image(client, ns, recorded.data_volume.as_deref().unwrap()).await;
        disk.block = false;
        before.push(ferry_testkit::disks::sha256_file(&disk.path));
    }
    let dir = tempfile::tempdir().unwrap();
    spec.scratch = dir.path().join("scratch");
    let result = dir.path().join("result");
    let out = std::process::Command::new(ferry())
        .arg("adapt")
        .arg(format!(
            "--spec-json={}",
            serde_json::to_string(&spec).unwrap()
        ))
        .arg("--result-file")
        .arg(&result)
        .output()
        .unwrap();
    let report = std::fs::read_to_string(&result).unwrap_or_default();
    assert!(!out.status.success(), "{report}");
    assert!(report.contains("VolumeNotAsConverted"), "{report}");
    assert!(
        !spec.scratch.exists(),
        "refused before any overlay was made"
    );
    for (disk, sha) in spec.disks.iter().zip(&before) {
        assert_eq!(
            &ferry_testkit::disks::sha256_file(&disk.path),
            sha,
            "{}",
            disk.path.display()
        );
    }
}

/// Sets (or, with null, removes) the annotation that holds `name` before a checkpoint.
async fn hold(client: &Client, ns: &str, name: &str, phase: Value) {
    let patch = json!({"metadata": {"annotations": {ferry_api::keys::HOLD_ANNOTATION: phase}}});
    migrations(client, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Restarts, run by hand (two adaptations and a boot: about ten minutes of emulation, too long for CI):
/// `cargo test -p ferry --test linux_guest -- --ignored --nocapture`. The controller is SIGKILLed at seeded
/// pseudo-random moments (`FERRY_RESTART_SEED`), and the first adaptation pod is killed right as it starts
/// committing. The volumes, possibly half-adapted, are written from the source again before the next attempt;
/// the migration succeeds with each disk adapted once: one GuestAdapted, the volumes hashing to the recorded
/// adapted sha256 (read while held before the VM is created), and the guest booting on virtio.
#[tokio::test]
#[ignore = "ten minutes of emulation; run by hand"]
async fn an_adaptation_killed_midway_and_a_controller_killed_again_and_again_still_adapt_once() {
    let _turn = one_guest_at_a_time().await;
    let _source = source_lock(LINUX_BIOS_VM).await;
    let (client, ns) = setup("linux-adapt-kill").await;
    set_source_power(LINUX_BIOS_VM, true).await;
    migrate(
        &client,
        ns.name(),
        "survivor",
        LINUX_BIOS_VM,
        adapted(slow_boot()),
    )
    .await;
    // Held before the VM is created, so the volumes can be read as adaptation left them: a booted guest writes.
    let creating = serde_json::to_value(Phase::CreatingVm).unwrap();
    hold(&client, ns.name(), "survivor", creating).await;
    let pauses = (Duration::from_secs(5), Duration::from_secs(60));
    let kills = kill_controller_at_random(&client, ns.name(), "survivor", 6, pauses, 20261202);
    let pod_kill = async {
        let midway = wait_for_phase(
            &client,
            ns.name(),
            "survivor",
            Phase::Adapting,
            LINUX_TIMEOUT,
        )
        .await;
        let uid = midway.uid().unwrap();
        // Printed right before the first overlay is committed into its volume.
        let pod = adaptation_logged(&client, ns.name(), &uid, "virt-v2v found").await;
        println!("killing {pod} as it commits");
        Api::<Pod>::namespaced(client.clone(), ns.name())
            .delete(&pod, &DeleteParams::default())
            .await
            .unwrap();
    };
    tokio::join!(kills, pod_kill);
    let held = wait_for_phase(
        &client,
        ns.name(),
        "survivor",
        Phase::CreatingVm,
        LINUX_TIMEOUT + 2 * ADAPTATION_TIMEOUT,
    )
    .await;
    let status = held.status.clone().unwrap();
    // The volumes hold what the one counted adaptation recorded.
    for disk in &status.disks {
        let image =
            support::volume_image(&client, ns.name(), disk.data_volume.as_deref().unwrap()).await;
        let sha = ferry_testkit::disks::sha256_file(&image);
        assert_eq!(
            Some(&sha),
            disk.adapted_sha256.as_ref(),
            "disk {}",
            disk.index
        );
    }
    a_second_adaptation_is_refused(&client, ns.name(), &held).await;
    hold(&client, ns.name(), "survivor", Value::Null).await;
    let done = wait_for_phase(
        &client,
        ns.name(),
        "survivor",
        Phase::Succeeded,
        LINUX_TIMEOUT,
    )
    .await;
    print_timeline(&done);
    let status = done.status.clone().unwrap();
    let retry = status.retry.clone().unwrap_or_default();
    println!("retries: {:?}", retry.budget_used);
    let audit = lab().await.audit_requests_by(migration::SERVICE_ACCOUNT);
    let jobs: Vec<String> = audit
        .iter()
        .filter(|r| r.resource == "jobs" && r.namespace == ns.name() && r.verb == "create")
        .map(|r| format!("{} {}", r.name, r.code))
        .collect();
    println!("job creates: {jobs:?}");
    assert!(
        jobs.iter().any(|j| j.starts_with("survivor-rewrite-")),
        "the killed attempt's volumes were written again: {jobs:?}"
    );
    // One adaptation counted: its Event.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns.name())
        .list(&ListParams::default())
        .await
        .unwrap();
    // An Event repeated is one object with a count.
    let adapted_events: i32 = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("GuestAdapted"))
        .map(|e| e.count.unwrap_or(1).max(1))
        .sum();
    assert_eq!(adapted_events, 1, "one adaptation recorded");
    assert_adapted(
        &client,
        ns.name(),
        &done,
        "ferry-linux-bios",
        &GuestNetwork::PodDhcp,
    )
    .await;
}

/// The EFI VM with Secure Boot on in vSphere: OVMF with Microsoft's keys boots it through shim.
async fn assert_efi_boots_with_secure_boot(client: &Client, ns: &str) {
    let done = wait_for_phase(client, ns, "efi", Phase::Succeeded, LINUX_TIMEOUT).await;
    assert!(
        done.status
            .as_ref()
            .unwrap()
            .source
            .as_ref()
            .unwrap()
            .secure_boot
    );
    let vm = vm_api(client, ns).get("efi").await.unwrap();
    let domain = &vm.data["spec"]["template"]["spec"]["domain"];
    assert_eq!(
        domain["firmware"]["bootloader"],
        json!({"efi": {"secureBoot": true}})
    );
    assert_eq!(domain["features"]["smm"]["enabled"], true);
    assert_booted_with_agent(client, ns, &done, "ferry-linux-efi", &GuestNetwork::PodDhcp).await;
}

/// Two guests at once (one core of emulation each). The EFI VM boots under Secure Boot as its source had
/// ([`assert_efi_boots_with_secure_boot`]). Virtio forced on the BIOS guest, whose initramfs has no virtio driver:
/// it cannot find its root. Ferry does not succeed, keeps everything, powers the source back on, and says what to
/// do.
#[tokio::test]
async fn an_efi_vm_boots_with_secure_boot_and_a_guest_without_virtio_drivers_fails_its_check_and_keeps_its_copy()
 {
    let _turn = one_guest_at_a_time().await;
    let _source = source_lock(LINUX_BIOS_VM).await;
    let _efi = source_lock(LINUX_EFI_VM).await;
    let (client, ns) = setup("linux-virtio").await;
    set_source_power(LINUX_EFI_VM, true).await;
    migrate(&client, ns.name(), "efi", LINUX_EFI_VM, slow_boot()).await;
    let efi = assert_efi_boots_with_secure_boot(&client, ns.name());
    set_source_power(LINUX_BIOS_VM, true).await;
    migrate(
        &client,
        ns.name(),
        "virtio",
        LINUX_BIOS_VM,
        json!({
            "target": {"devices": "Virtio"},
            // Long enough for the initramfs to give up on its root first, even under a busy emulation.
            "guestCheck": {"agent": "Required", "timeoutSeconds": 240},
        }),
    )
    .await;
    let stopped = wait_for_phase(
        &client,
        ns.name(),
        "virtio",
        Phase::ManualInterventionRequired,
        LINUX_TIMEOUT,
    )
    .await;
    print_timeline(&stopped);
    let status = stopped.status.clone().unwrap();
    let error = status.retry.as_ref().unwrap().last_error.clone().unwrap();
    assert_eq!(error.reason, "GuestNotReady", "{error:?}");
    assert!(
        error.message.contains("did not answer within 240 s"),
        "{error:?}"
    );
    assert!(error.message.contains("nothing was deleted"), "{error:?}");
    assert_eq!(
        status.guest.as_ref().map(|g| g.evidence),
        Some(GuestEvidence::NotProven)
    );

    // The VM is stopped and kept, its instance gone, and the source runs again (restorePowerState).
    let uid = stopped.uid().unwrap();
    assert_kept_for_a_person(&client, ns.name(), &stopped, LINUX_BIOS_VM).await;
    // Each volume still holds exactly the source disk.
    for disk in &status.disks {
        let image =
            support::volume_image(&client, ns.name(), disk.data_volume.as_deref().unwrap()).await;
        let sha = ferry_testkit::disks::sha256_file(&image);
        assert_eq!(Some(&sha), disk.sha256.as_ref(), "disk {}", disk.index);
    }
    // The console shows why: the initramfs found no root device.
    let console = support::guest_console(&client, ns.name(), "virtio").await;
    assert!(
        console.contains("Gave up waiting for root") || console.contains("ALERT!"),
        "console:\n{console}"
    );

    let out = std::process::Command::new(ferry())
        .args(["describe", "-n", ns.name(), "virtio", "--kubeconfig"])
        .arg(&lab().await.state().kubeconfig)
        .output()
        .unwrap();
    let describe = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{describe}");
    for words in [
        "ManualInterventionRequired",
        "GuestNotReady",
        "kept with its 2 DataVolume(s)",
        "target.devices Compatibility",
        "virtctl start virtio",
    ] {
        assert!(
            describe.contains(words),
            "describe lacks {words:?}:\n{describe}"
        );
    }
    // Deleting the migration still removes everything.
    migrations(&client, ns.name())
        .delete("virtio", &Default::default())
        .await
        .unwrap();
    ferry_testkit::eventually(
        "the migration's VM and disks removed",
        Duration::from_secs(120),
        || async {
            let vms = labelled(
                &client,
                ns.name(),
                &resource("kubevirt.io", "v1", "VirtualMachine"),
                &uid,
            )
            .await;
            let dvs = labelled(
                &client,
                ns.name(),
                &resource("cdi.kubevirt.io", "v1beta1", "DataVolume"),
                &uid,
            )
            .await;
            (vms.is_empty() && dvs.is_empty()).then_some(())
        },
    )
    .await;
    efi.await;
}
