//! `Provider.spec.limits.maxConcurrentDisksPerHost` holds: twelve single-disk VMs on two ESXi hosts, a limit of
//! two disks per host, and a controller SIGKILLed at random moments. Proof is what the migrations record: the
//! interval each spent in Converting (reading its source), never more than two at once per host.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ferry_api::Phase;
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
            ferry_lab::demo::PROVIDER,
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
