//! Fleets. `Provider.spec.limits.maxConcurrentDisksPerHost` holds: twelve single-disk VMs on two ESXi hosts, a
//! limit of two disks per host, and a controller SIGKILLed at random moments; proof is what the migrations record:
//! the interval each spent in Converting (reading its source), never more than two at once per host. And
//! `MigrationPlan`s: VMs migrated with shared maps at most `maxInFlight` at a time, one added while the plan runs,
//! and a cancel that stops what is unfinished and leaves what finished. A plan's selector chooses its VMs from a
//! folder by name, once, when its start time comes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ferry_api::Phase;
use ferry_api::{MigrationPlan, PlanPhase};
use ferry_controller::surface::{most_at_once, source_reads};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::*;

const HOSTS: [&str; 2] = ["DC0_H0", "DC0_C0_H0"];
const PER_HOST: usize = 6;
const LIMIT: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_vms_on_two_hosts_never_read_more_disks_per_host_than_the_limit_through_controller_kills()
 {
    let started = Instant::now();
    let (client, ns) = setup("slots").await;
    let lab = lab().await;
    Api::<ferry_api::Provider>::namespaced(client.clone(), ns.name())
        .patch(
            ferry_lab::vsphere::demo::PROVIDER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"limits": {"maxConcurrentDisksPerHost": LIMIT}}})),
        )
        .await
        .unwrap();
    let mut host_of = BTreeMap::new();
    for (h, host) in HOSTS.iter().enumerate() {
        for i in 0..PER_HOST {
            let vm = format!("ferry-slots-{h}-{i}");
            seed_vm_on(&lab.dir().join(&vm), &vm, &[4], host).await;
            host_of.insert(format!("slots-{h}-{i}"), (vm, host.to_string()));
        }
    }
    for (name, (vm, _)) in &host_of {
        let manifest = ferry_testkit::migration::migration(lab, ns.name(), name, vm);
        ferry_testkit::migration::apply(&client, ns.name(), manifest)
            .await
            .unwrap();
    }
    println!(
        "12 VMs provisioned and their migrations created in {:?}",
        started.elapsed()
    );

    // Watch while the controller is killed: who waited for a slot, and that all end.
    let api = migrations(&client, ns.name());
    let watch = async {
        let mut waited = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(1200);
        loop {
            let all = api.list(&ListParams::default()).await.unwrap().items;
            for m in &all {
                let status = m.status.as_ref();
                if status.and_then(|s| s.reason.as_deref()) == Some("WaitingForHostSlot") {
                    waited.insert(m.name_any());
                }
            }
            let ended: Vec<_> = all
                .iter()
                .filter_map(|m| m.status.as_ref()?.phase.filter(|p| p.is_terminal()))
                .collect();
            if ended.len() == host_of.len() {
                return (all, waited);
            }
            assert!(Instant::now() < deadline, "not all ended: {ended:?}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let first = host_of.keys().next().unwrap().clone();
    let kills = kill_controller_at_random(
        &client,
        ns.name(),
        &first,
        4,
        (Duration::from_secs(4), Duration::from_secs(12)),
        22,
    );
    let ((all, waited), ()) = tokio::join!(watch, kills);
    println!(
        "all ended {:?} after the start; waited for a slot: {waited:?}",
        started.elapsed()
    );

    let mut per_host: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for m in &all {
        let status = m.status.as_ref().unwrap();
        assert_eq!(
            status.phase,
            Some(Phase::Succeeded),
            "{}: {}",
            m.name_any(),
            serde_json::to_string_pretty(status).unwrap()
        );
        let (_, host) = &host_of[&m.name_any()];
        let source = status.source.as_ref().unwrap();
        assert_eq!(
            source.host.as_deref(),
            Some(host.as_str()),
            "{}",
            m.name_any()
        );
        assert!(
            status.host_slot.is_none(),
            "{} still holds a slot",
            m.name_any()
        );
        per_host
            .entry(host.clone())
            .or_default()
            .extend(source_reads(status, i64::MAX));
    }
    for (host, intervals) in &per_host {
        let most = most_at_once(intervals);
        println!(
            "{host}: {} Converting intervals, at most {most} at once",
            intervals.len()
        );
        assert_eq!(intervals.len(), PER_HOST, "{host}");
        assert!(
            most <= LIMIT,
            "{host}: {most} disks read at once, limit {LIMIT}: {intervals:?}"
        );
    }
    assert!(
        !waited.is_empty(),
        "no migration was seen waiting for a slot: the limit was never tested"
    );
}

/// A site's maps in `ns`: the lab's networks (its seeded VMs' on the pod network) and its datastore on the
/// StorageClass that waits for the first consumer (not the default, so the map shows in every volume).
async fn site_maps(client: &kube::Client, ns: &str) {
    let map = |kind: &str, name: &str, spec: serde_json::Value| {
        json!({"apiVersion": ferry_api::API_VERSION, "kind": kind, "metadata": {"name": name, "namespace": ns},
            "spec": spec})
    };
    let networks = json!({"networks": [{"source": ferry_lab::vsphere::linux_vms::NETWORK, "pod": {}},
        {"source": "VM Network", "ignored": {}}]});
    let datastores = json!({"datastores": [{"source": ferry_lab::vsphere::linux_vms::DATASTORE,
        "storageClassName": ferry_lab::standins::cdi::WFFC_STORAGE_CLASS}]});
    for doc in [
        map("NetworkMap", "site-networks", networks),
        map("StorageMap", "site-datastores", datastores),
    ] {
        ferry_lab::vsphere::demo::apply(client, ns, doc)
            .await
            .unwrap();
    }
}

/// Plan `name` of `vms` (VM names), one at a time, through the site's maps.
fn plan(ns: &str, name: &str, vms: &[&str]) -> serde_json::Value {
    let vms: Vec<_> = vms.iter().map(|vm| json!({"name": vm})).collect();
    json!({"apiVersion": ferry_api::API_VERSION, "kind": "MigrationPlan", "metadata": {"name": name, "namespace": ns},
        "spec": {"providerRef": {"name": ferry_lab::vsphere::demo::PROVIDER}, "vms": vms, "maxInFlight": 1,
            "restorePowerState": true, "guestCheck": {"settleSeconds": ferry_lab::vsphere::demo::LAB_SETTLE_SECONDS},
            "target": {"networkMapRef": {"name": "site-networks"}, "storageMapRef": {"name": "site-datastores"}}}})
}

/// Waits until `ready` holds for plan `name`, failing with its status after `timeout`.
async fn plan_until(
    client: &kube::Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    ready: impl Fn(&MigrationPlan) -> bool,
) -> MigrationPlan {
    let api = Api::<MigrationPlan>::namespaced(client.clone(), ns);
    let deadline = Instant::now() + timeout;
    loop {
        let plan = api.get(name).await.unwrap();
        if ready(&plan) {
            return plan;
        }
        assert!(
            Instant::now() < deadline,
            "plan {name}: {}",
            serde_json::to_string_pretty(&plan.status).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn phase_of(plan: &MigrationPlan) -> Option<PlanPhase> {
    plan.status.as_ref().and_then(|s| s.phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_with_shared_maps_migrates_one_vm_at_a_time_and_a_vm_added_while_it_runs() {
    let (client, ns) = setup("plan").await;
    let lab = lab().await;
    let vms = ["ferry-plan-a", "ferry-plan-b", "ferry-plan-c"];
    for vm in vms {
        seed_vm_on(&lab.dir().join(vm), vm, &[4], "DC0_C0_H1").await;
    }
    site_maps(&client, ns.name()).await;
    ferry_lab::vsphere::demo::apply(&client, ns.name(), plan(ns.name(), "wave-1", &vms[..2]))
        .await
        .unwrap();
    plan_until(&client, ns.name(), "wave-1", Duration::from_secs(60), |p| {
        p.status
            .as_ref()
            .is_some_and(|s| s.running == 1 && s.pending == 1)
    })
    .await;
    let all: Vec<_> = vms.iter().map(|vm| json!({"name": vm})).collect();
    Api::<MigrationPlan>::namespaced(client.clone(), ns.name())
        .patch(
            "wave-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"vms": all}})),
        )
        .await
        .unwrap();
    let done = plan_until(
        &client,
        ns.name(),
        "wave-1",
        Duration::from_secs(900),
        |p| phase_of(p).is_some_and(|ph| ph != PlanPhase::Running),
    )
    .await;
    let status = done.status.unwrap();
    assert_eq!(status.phase, Some(PlanPhase::Succeeded), "{status:?}");
    assert_eq!((status.total, status.succeeded), (3, 3));
    assert_eq!(status.progress.as_deref(), Some("100%"));
    let children = migrations(&client, ns.name())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(children.len(), 3);
    let mut spans = Vec::new();
    for child in &children {
        let s = child.status.as_ref().unwrap();
        assert_eq!(s.phase, Some(Phase::Succeeded));
        for disk in &s.disks {
            let placed = disk.storage.as_ref().unwrap();
            assert_eq!(
                placed.storage_class_name.as_deref(),
                Some(ferry_lab::standins::cdi::WFFC_STORAGE_CLASS)
            );
        }
        assert_eq!(
            s.networks.len(),
            1,
            "only the network its NIC uses: {:?}",
            s.networks
        );
        let micros =
            |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_microsecond();
        spans.push((
            micros(s.start_time.as_ref().unwrap()),
            micros(s.completion_time.as_ref().unwrap()),
        ));
    }
    assert_eq!(most_at_once(&spans), 1, "maxInFlight 1: {spans:?}");

    // `ferry watch plan` of an ended plan: its totals and a line per VM, then it exits on its own.
    let watch = std::process::Command::new(ferry())
        .args(["watch", "plan", "wave-1", "-n", ns.name(), "--kubeconfig"])
        .arg(&lab.state().kubeconfig)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&watch.stdout);
    assert!(
        watch.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&watch.stderr)
    );
    assert!(
        shown.contains(&format!(
            "plan {}/wave-1 Succeeded: 3 VMs, 0 running, 0 waiting, 3 succeeded, 0 failed; 100%",
            ns.name()
        )),
        "{shown}"
    );
    for vm in vms {
        assert!(shown.contains(vm), "{vm} in {shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_plan_cleans_up_what_is_unfinished_and_keeps_what_finished() {
    let (client, ns) = setup("plan-cancel").await;
    let lab = lab().await;
    let vms = ["ferry-plan-d", "ferry-plan-e", "ferry-plan-f"];
    for vm in vms {
        seed_vm_on(&lab.dir().join(vm), vm, &[4], "DC0_C0_H2").await;
    }
    site_maps(&client, ns.name()).await;
    ferry_lab::vsphere::demo::apply(&client, ns.name(), plan(ns.name(), "wave-2", &vms))
        .await
        .unwrap();
    // The first finished and the second under way.
    let running = plan_until(
        &client,
        ns.name(),
        "wave-2",
        Duration::from_secs(600),
        |p| {
            p.status.as_ref().is_some_and(|s| {
                s.succeeded == 1
                    && s.vms
                        .get(1)
                        .and_then(|v| v.phase)
                        .is_some_and(|ph| !ph.is_terminal())
            })
        },
    )
    .await;
    let status = running.status.unwrap();
    let (finished, unfinished) = (
        status.vms[0].migration.clone(),
        status.vms[1].migration.clone(),
    );
    Api::<MigrationPlan>::namespaced(client.clone(), ns.name())
        .patch(
            "wave-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"cancel": true}})),
        )
        .await
        .unwrap();
    let cancelled = plan_until(
        &client,
        ns.name(),
        "wave-2",
        Duration::from_secs(300),
        |p| phase_of(p) == Some(PlanPhase::Cancelled),
    )
    .await;
    let status = cancelled.status.unwrap();
    assert_eq!(
        (status.succeeded, status.cancelled, status.pending),
        (1, 1, 1),
        "{status:?}"
    );
    let api = migrations(&client, ns.name());
    let kept = api.get(&finished).await.unwrap();
    let kept = kept.status.unwrap();
    assert_eq!(kept.phase, Some(Phase::Succeeded));
    let stopped = api.get(&unfinished).await.unwrap();
    let stopped_status = stopped.status.clone().unwrap();
    assert_eq!(stopped_status.phase, Some(Phase::Cancelled));
    assert!(stopped_status.cleaned_up);
    assert!(
        children_left(&client, ns.name(), &stopped.uid().unwrap())
            .await
            .is_empty()
    );
    assert!(
        api.get_opt(&status.vms[2].migration)
            .await
            .unwrap()
            .is_none(),
        "never started"
    );
    // The finished VM was handed over, and the cancel left it in place.
    let vms = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        ns.name(),
        &resource("kubevirt.io", "v1", "VirtualMachine"),
    );
    assert!(
        vms.get_opt(kept.target_vm.as_deref().unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_chooses_its_vms_by_folder_and_name_once_when_its_start_time_comes() {
    let (client, ns) = setup("select").await;
    let lab = lab().await;
    let folder = "ferry-select-app";
    for vm in ["ferry-select-a", "ferry-select-b", "ferry-select-c"] {
        seed_vm_on(&lab.dir().join(vm), vm, &[4], "DC0_C0_H1").await;
    }
    // c is not in the folder when the plan starts; a and b are, with a VM of another name.
    move_to_folder("ferry-select-a", folder).await;
    move_to_folder("ferry-select-b", folder).await;
    move_to_folder("DC0_C0_RP0_VM1", folder).await;
    site_maps(&client, ns.name()).await;
    let start =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(20);
    let mut manifest = plan(ns.name(), "chosen", &[]);
    manifest["spec"]["maxInFlight"] = json!(2);
    manifest["spec"]["startTime"] = json!(
        start
            .round(k8s_openapi::jiff::Unit::Second)
            .unwrap()
            .to_string()
    );
    manifest["spec"]["selector"] = json!({
        "folder": format!("/{}/DC0/vm/{folder}", ferry_lab::vsphere::vcsim::PRODUCTION_DC_FOLDER),
        "namePattern": "ferry-select-*", "powerState": "PoweredOn"});
    ferry_lab::vsphere::demo::apply(&client, ns.name(), manifest)
        .await
        .unwrap();

    let scheduled = plan_until(&client, ns.name(), "chosen", Duration::from_secs(15), |p| {
        phase_of(p) == Some(PlanPhase::Scheduled)
    })
    .await;
    let status = scheduled.status.unwrap();
    assert!(
        status.selected.is_none() && status.started_at.is_none(),
        "{status:?}"
    );
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("starts at"),
        "{status:?}"
    );
    let api = migrations(&client, ns.name());
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing starts before its time"
    );

    let started = plan_until(&client, ns.name(), "chosen", Duration::from_secs(60), |p| {
        p.status.as_ref().is_some_and(|s| s.selected.is_some())
    })
    .await;
    let status = started.status.unwrap();
    let began = status.started_at.as_ref().unwrap().0;
    assert!(
        began >= start.round(k8s_openapi::jiff::Unit::Second).unwrap(),
        "started {began}, due {start}"
    );
    let chosen: Vec<_> = status
        .selected
        .unwrap()
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(chosen, ["ferry-select-a", "ferry-select-b"]);
    // Chosen once: a VM that joins the folder now is not added.
    move_to_folder("ferry-select-c", folder).await;

    let done = plan_until(
        &client,
        ns.name(),
        "chosen",
        Duration::from_secs(900),
        |p| phase_of(p).is_some_and(|ph| !matches!(ph, PlanPhase::Running | PlanPhase::Scheduled)),
    )
    .await;
    let status = done.status.unwrap();
    assert_eq!(status.phase, Some(PlanPhase::Succeeded), "{status:?}");
    assert_eq!((status.total, status.succeeded), (2, 2), "{status:?}");
    assert!(status.bytes_per_second > 0, "{status:?}");
    assert!(
        status
            .throughput
            .as_deref()
            .unwrap_or_default()
            .ends_with("MiB/s"),
        "{status:?}"
    );
    assert_eq!(status.eta, None, "an ended plan has no time left");
    let children = api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(children.len(), 2);
    for child in &children {
        let moref = child
            .spec
            .source
            .vm
            .moref
            .as_deref()
            .expect("chosen VMs migrate by moref");
        assert_eq!(
            child
                .status
                .as_ref()
                .unwrap()
                .source
                .as_ref()
                .unwrap()
                .moref,
            moref
        );
        assert_eq!(child.status.as_ref().unwrap().phase, Some(Phase::Succeeded));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferry_plan_create_writes_a_plan_and_maps_that_apply_and_names_what_no_map_covers() {
    let (_client, ns) = setup("plancreate").await;
    let lab = lab().await;
    let folder = format!(
        "/{}/DC0/vm",
        ferry_lab::vsphere::vcsim::PRODUCTION_DC_FOLDER
    );
    let create = |pattern: &str, extra: &[&str]| {
        let out = std::process::Command::new(ferry())
            .args([
                "plan",
                "create",
                "wave",
                "--provider",
                ferry_lab::vsphere::demo::PROVIDER,
            ])
            .args([
                "--folder",
                &folder,
                "--name-pattern",
                pattern,
                "--power-state",
                "PoweredOn",
            ])
            .args(extra)
            .arg("-n")
            .arg(ns.name())
            .arg("--kubeconfig")
            .arg(&lab.state().kubeconfig)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let (ok, yaml, stderr) = create(
        "DC0_H0_VM*",
        &[
            "--storage-class",
            ferry_lab::standins::cdi::WFFC_STORAGE_CLASS,
        ],
    );
    assert!(ok, "{stderr}");
    println!("{yaml}\n{stderr}");
    assert!(yaml.contains("# 2 VM(s) of Provider"), "{yaml}");
    for expected in [
        "kind: NetworkMap",
        "kind: StorageMap",
        "kind: MigrationPlan",
        "name: DC0_H0_VM0",
        "name: DC0_H0_VM1",
    ] {
        assert!(yaml.contains(expected), "{expected} in\n{yaml}");
    }
    // What it wrote is what the API server accepts, as written.
    let mut apply = lab.kubectl();
    apply
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped());
    let mut child = apply
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), yaml.as_bytes()).unwrap();
    let applied = child.wait_with_output().unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let plan: MigrationPlan = Api::namespaced(lab.client().await, ns.name())
        .get("wave")
        .await
        .unwrap();
    let vms: Vec<_> = plan.spec.vms.iter().map(|v| v.key().to_string()).collect();
    assert_eq!(vms, ["DC0_H0_VM0", "DC0_H0_VM1"]);
    assert_eq!(
        plan.spec.target.network_map_ref.unwrap().name,
        "wave-networks"
    );

    // Against a map that lacks their datastore, it says so before anything is applied.
    let (ok, yaml, stderr) = create(
        "DC0_H0_VM*",
        &["--as-selector", "--storage-map", "wave-networks-missing"],
    );
    assert!(!ok && stderr.contains("no StorageMap"), "{stderr}{yaml}");
    let other = json!({"apiVersion": ferry_api::API_VERSION, "kind": "StorageMap",
        "metadata": {"name": "elsewhere", "namespace": ns.name()},
        "spec": {"datastores": [{"source": "OtherDS", "storageClassName": "fast"}]}});
    ferry_lab::vsphere::demo::apply(&lab.client().await, ns.name(), other)
        .await
        .unwrap();
    let (ok, yaml, stderr) = create("DC0_H0_VM*", &["--storage-map", "elsewhere"]);
    assert!(ok, "{stderr}");
    let line = r#"datastore "LocalDS_0" (used by DC0_H0_VM0, DC0_H0_VM1)"#;
    assert!(stderr.contains(&format!("not covered: {line}")), "{stderr}");
    assert!(yaml.contains(&format!("#   {line}")), "{yaml}");
    let (ok, yaml, stderr) = create(
        "DC0_H0_VM*",
        &[
            "--as-selector",
            "--network-map",
            "wave-networks",
            "--storage-class",
            "other",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        yaml.contains("selector:") && yaml.contains("namePattern: DC0_H0_VM*"),
        "{yaml}"
    );
    assert!(
        !yaml.contains("kind: NetworkMap"),
        "an existing map is named, not written: {yaml}"
    );
    let (ok, _, stderr) = create("no-such-vm-*", &["--storage-class", "x"]);
    assert!(!ok && stderr.contains("no VM of Provider"), "{stderr}");
}
