//! Keeps the lab's KubeVirt stand-in honest. The same VMs, as Ferry builds them (the Debian BIOS guest, the EFI one
//! under Secure Boot, twelve SATA disks, no bootable disk, the unadapted BIOS guest forced onto virtio, a NIC on a
//! Multus network without its NetworkAttachmentDefinition), run on the
//! stand-in and, with `FERRY_REAL_NODE=1`, on real KubeVirt v1.9.0 on the real node; each is then halted or
//! deleted. Both are compared with what real KubeVirt showed, recorded in `real-kubevirt-v1.9.0.json`
//! (`FERRY_KUBEVIRT_RECORD=1` records it anew from real KubeVirt): the VMI's phases, the VM's printable statuses,
//! both objects' conditions and messages, `guestOSInfo`, `interfaces`, the console's landmarks, and what halting
//! and deleting leave.

mod host;
mod observe;
mod scenario;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ferry_testkit::TestLab;
use ferry_testkit::real_node::RealNodeLab;
use host::Host;
use kube::Client;
use observe::Observed;
use scenario::{Images, Scenario};

const RECORD: &str = "tests/kubevirt_conformance/real-kubevirt-v1.9.0.json";
/// Record real KubeVirt's observations instead of comparing with them.
const RECORD_ANEW: &str = "FERRY_KUBEVIRT_RECORD";
/// A real-node lab already running (its directory), used instead of starting one.
const RUNNING_LAB: &str = "FERRY_KUBEVIRT_LAB";
const PREFIX: &str = "kubevirt-conformance";

fn record_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORD)
}

fn recorded() -> BTreeMap<String, Observed> {
    let text = std::fs::read_to_string(record_path()).expect("the record of real KubeVirt");
    serde_json::from_str(&text).expect("the record of real KubeVirt parses")
}

fn images(work: &Path) -> Images {
    let guests = ferry_lab::vsphere::guest_image::ensure_guest_images(None)
        .expect("the lab's Debian guest images");
    let marker_disk = work.join("marker.raw");
    let marker = ferry_lab::vsphere::demo::marker(Scenario::TwelveSata.name());
    ferry_lab::vsphere::bootdisk::make_boot_disk(&marker_disk, 4 << 20, &marker).unwrap();
    Images {
        bios: guests.bios.root,
        efi: guests.efi.root,
        data: guests.data,
        marker_disk,
    }
}

/// Every scenario, at once, in `ns`.
async fn observe_all(client: &Client, ns: &str, host: &Host) -> BTreeMap<String, Observed> {
    let work = tempfile::tempdir().unwrap();
    let images = images(work.path());
    let runs = Scenario::ALL.map(|s| {
        let images = &images;
        async move {
            let observed = observe::run(client, ns, s, images, host).await;
            (s.name().to_string(), observed)
        }
    });
    futures::future::join_all(runs)
        .await
        .into_iter()
        .map(|(name, observed)| {
            let observed = observed.unwrap_or_else(|e| panic!("scenario {name}: {e:#}"));
            (name, observed)
        })
        .collect()
}

/// Whether `seen` is a part of `real`, in order, ending where it ends: polling may miss a short status.
fn walks_alike(seen: &[String], real: &[String]) -> bool {
    let mut rest = real.iter();
    seen.iter().all(|s| rest.any(|r| r == s)) && seen.last() == real.last()
}

/// How `observed` differs from real KubeVirt's `record`.
fn differences(
    record: &BTreeMap<String, Observed>,
    observed: &BTreeMap<String, Observed>,
) -> Vec<String> {
    let mut found = vec![];
    for (name, real) in record {
        let Some(seen) = observed.get(name) else {
            found.push(format!("{name}: not run"));
            continue;
        };
        let mut field = |what: &str, alike: bool, seen: String, real: String| {
            if !alike {
                found.push(format!(
                    "{name}: {what}\n    seen: {seen}\n    real: {real}"
                ));
            }
        };
        field(
            "the VMI's phases",
            seen.vmi_walk == real.vmi_walk,
            format!("{:?}", seen.vmi_walk),
            format!("{:?}", real.vmi_walk),
        );
        field(
            "the VM's printable statuses",
            walks_alike(&seen.vm_walk, &real.vm_walk),
            format!("{:?}", seen.vm_walk),
            format!("{:?}", real.vm_walk),
        );
        let end = |what: &str, seen: String, real: String| (what.to_string(), seen, real);
        let (s, r) = (&seen.end, &real.end);
        for (what, seen, real) in [
            end("the VMI's phase", s.vmi_phase.clone(), r.vmi_phase.clone()),
            end(
                "the VMI's conditions",
                format!("{:?}", s.vmi_conditions),
                format!("{:?}", r.vmi_conditions),
            ),
            end(
                "guestOSInfo",
                format!("{:?}", s.guest_os_info),
                format!("{:?}", r.guest_os_info),
            ),
            end(
                "interfaces",
                format!("{:?}", s.interfaces),
                format!("{:?}", r.interfaces),
            ),
            end(
                "the VM's status",
                format!("{} ready={}", s.vm_printable_status, s.vm_ready),
                format!("{} ready={}", r.vm_printable_status, r.vm_ready),
            ),
            end(
                "the VM's conditions",
                format!("{:?}", s.vm_conditions),
                format!("{:?}", r.vm_conditions),
            ),
            end(
                "the console",
                format!("{:?}", s.console),
                format!("{:?}", r.console),
            ),
        ] {
            field(&what, seen == real, seen, real);
        }
        match (&seen.halted, &real.halted) {
            (Some(s), Some(r)) => {
                field(
                    "halting: the VM's printable statuses",
                    walks_alike(&s.vm_walk, &r.vm_walk),
                    format!("{:?}", s.vm_walk),
                    format!("{:?}", r.vm_walk),
                );
                field(
                    "halted: the VM's status and conditions",
                    (&s.vm_printable_status, &s.vm_conditions)
                        == (&r.vm_printable_status, &r.vm_conditions),
                    format!("{} {:?}", s.vm_printable_status, s.vm_conditions),
                    format!("{} {:?}", r.vm_printable_status, r.vm_conditions),
                );
            }
            (s, r) => field("halting", s == r, format!("{s:?}"), format!("{r:?}")),
        }
        field(
            "left after deletion",
            seen.left_after_deletion == real.left_after_deletion,
            format!("{:?}", seen.left_after_deletion),
            format!("{:?}", real.left_after_deletion),
        );
    }
    found
}

#[test]
fn a_walk_seen_by_polling_may_miss_a_status_but_not_reorder_or_end_elsewhere() {
    let walk = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let real = walk(&["Stopped", "Starting", "Running"]);
    assert!(walks_alike(&walk(&["Starting", "Running"]), &real));
    assert!(!walks_alike(&walk(&["Running", "Starting"]), &real));
    assert!(!walks_alike(&walk(&["Stopped", "Starting"]), &real));
}

fn assert_conforms(who: &str, observed: &BTreeMap<String, Observed>) {
    println!(
        "{who}:\n{}",
        serde_json::to_string_pretty(observed).unwrap()
    );
    for (name, seen) in observed {
        assert!(
            seen.left_after_deletion.is_empty(),
            "{who}: {name} left {:?} after its VM was deleted",
            seen.left_after_deletion
        );
    }
    let found = differences(&recorded(), observed);
    assert!(
        found.is_empty(),
        "{who} differs from real KubeVirt v1.9.0:\n{}",
        found.join("\n")
    );
}

#[tokio::test]
async fn the_kubevirt_standin_does_what_real_kubevirt_does() {
    let lab = TestLab::shared_with_standins(Path::new(env!("CARGO_BIN_EXE_ferry"))).await;
    let ns = lab.namespace(PREFIX).await;
    let client = lab.client().await;
    let host = Host {
        standin_dir: Some(lab.dir().join("standin-kubevirt")),
    };
    let observed = observe_all(&client, ns.name(), &host).await;
    assert_conforms("the KubeVirt stand-in", &observed);
}

#[tokio::test]
async fn the_record_of_real_kubevirt_v1_9_still_holds() {
    if !RealNodeLab::enabled("real KubeVirt") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let lab = RealNodeLab::running_or_started(
        RUNNING_LAB,
        Path::new(env!("CARGO_BIN_EXE_ferry")),
        work.path(),
    );
    assert!(
        !lab.state
            .processes
            .iter()
            .any(|p| p.name == "standin-kubevirt"),
        "{} runs the KubeVirt stand-in, not real KubeVirt",
        lab.state.dir.display()
    );
    let ns = format!("{PREFIX}-{}", std::process::id());
    let client = lab.restricted_namespace(&ns).await;
    let observed = observe_all(&client, &ns, &Host { standin_dir: None }).await;
    RealNodeLab::delete_namespace(&client, &ns).await;
    if std::env::var_os(RECORD_ANEW).is_some() {
        let text = serde_json::to_string_pretty(&observed).unwrap() + "\n";
        std::fs::write(record_path(), text).unwrap();
        println!("recorded real KubeVirt in {}", record_path().display());
        return;
    }
    assert_conforms("real KubeVirt", &observed);
}
