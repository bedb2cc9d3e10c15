//! Warm migration end to end, against the lab's vCenter with Changed Block Tracking (`-cbt`): three rounds copied
//! from snapshots while the source's guest writes known patterns between them, a cutover that copies only what
//! changed since (and reads the powered-off source whole once, to prove each volume), the volumes equal to the
//! guest's disks at power-off, and nothing Ferry did to the source left behind (snapshots, tracking), also after a
//! cancel in the middle of a round; a source without tracking, and a vCenter that locks a running VM's base.
mod support;

use std::time::{Duration, Instant};

use ferry_api::{ChangeTrackingChange, Phase, VirtualMachineMigration, WarmStatus};
use ferry_lab::lab::VcsimRealism;
use ferry_lab::vsphere::lab_hands::{FolderLock, LabHands};
use ferry_testkit::{TestLab, migration};
use kube::api::{Patch, PatchParams};
use support::*;

const MIB: u64 = 1 << 20;

/// The vCenter's file lock is the whole lab's: a test that sets it runs alone.
static FILE_LOCK: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

async fn cbt_lab() -> &'static TestLab {
    let realism = VcsimRealism {
        cbt: true,
        ..VcsimRealism::production_like()
    };
    TestLab::shared_with_standins_and(ferry(), realism).await
}

fn hands(lab: &TestLab) -> LabHands {
    LabHands::new(lab.state().vcsim.as_ref().unwrap()).unwrap()
}

fn warm_migration(
    lab: &TestLab,
    ns: &str,
    name: &str,
    vm: &str,
    interval: i32,
) -> serde_json::Value {
    let mut manifest = migration::migration(lab, ns, name, vm);
    // PVSCSI becomes virtio-scsi: the lab's q35 boots from it.
    manifest["spec"]["target"]["devices"] = "Source".into();
    manifest["spec"]["source"]["powerOff"] = serde_json::json!({"mode": "Force"});
    manifest["spec"]["warm"] =
        serde_json::json!({"precopyIntervalSeconds": interval, "enableChangeTracking": true});
    manifest
}

/// Polls `name` until `done` holds of its warm status; fails on a terminal phase or after `timeout`.
async fn wait_for_warm(
    client: &kube::Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&WarmStatus) -> bool,
) -> VirtualMachineMigration {
    let deadline = Instant::now() + timeout;
    loop {
        let vmm = migrations(client, ns).get(name).await.unwrap();
        let status = vmm.status.clone().unwrap_or_default();
        if status.warm.as_ref().is_some_and(&done) {
            return vmm;
        }
        let ended = status.phase.is_some_and(|p| p.is_terminal());
        assert!(
            !ended && Instant::now() < deadline,
            "{ns}/{name}: no {what}; status: {}",
            serde_json::to_string_pretty(&status).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the guest writes: `n` scattered 4 KiB blocks, each marked with `round`.
async fn guest_writes(hands: &LabHands, vm: &str, disk: i32, round: u8, n: u64) {
    for i in 0..n {
        let block = vec![round.wrapping_mul(31).wrapping_add(i as u8) | 1; 4096];
        let offset = (i * 997 + u64::from(round) * 13) % 4000 * 4096;
        hands.write(vm, Some(disk), offset, block).await.unwrap();
    }
}

async fn ferry_snapshots(vm: &str) -> Vec<String> {
    let (session, moref) = source_vm(vm).await;
    let found = ferry_vsphere::snapshot::named(&session, &moref, "ferry-")
        .await
        .unwrap();
    found.into_iter().map(|n| n.name).collect()
}

async fn change_tracking_on(vm: &str) -> bool {
    let (session, moref) = source_vm(vm).await;
    ferry_vsphere::inventory::describe_vm(&session, &moref)
        .await
        .unwrap()
        .change_tracking
}

#[tokio::test]
async fn three_rounds_follow_the_running_guest_and_the_cutover_copies_only_the_last_changes() {
    let _shared = FILE_LOCK.read().await;
    let lab = cbt_lab().await;
    let (client, ns) = setup("warm").await;
    const VM: &str = "ferry-warm";
    let disks = seed_vm(&lab.dir().join(VM), VM, &[4, 16]).await;
    let hands = hands(lab);
    let name = "warm";
    migration::apply(
        &client,
        ns.name(),
        warm_migration(lab, ns.name(), name, VM, 60),
    )
    .await
    .unwrap();

    let first = wait_for_warm(
        &client,
        ns.name(),
        name,
        Duration::from_secs(300),
        "round 1",
        |w| w.rounds_done >= 1 && w.snapshot.is_none(),
    )
    .await;
    let status = first.status.unwrap();
    let warm = status.warm.clone().unwrap();
    assert_eq!(
        warm.rounds[0].full_disks, 2,
        "the first round copies whole: {warm:?}"
    );
    assert_eq!(
        warm.change_tracking_enabled,
        Some(ChangeTrackingChange::Enabled)
    );
    assert!(warm.change_ids.iter().all(Option::is_some), "{warm:?}");
    assert!(
        ferry_snapshots(VM).await.is_empty(),
        "removed after its round"
    );
    let data_disk = status.source.as_ref().unwrap().disks[1].key;

    guest_writes(&hands, VM, data_disk, 2, 40).await;
    let second = wait_for_warm(
        &client,
        ns.name(),
        name,
        Duration::from_secs(240),
        "round 2",
        |w| w.rounds_done >= 2 && w.snapshot.is_none(),
    )
    .await;
    let warm = second.status.unwrap().warm.unwrap();
    let round = &warm.rounds[1];
    assert_eq!(round.full_disks, 0, "a delta: {round:?}");
    assert!(round.areas >= 1, "{round:?}");
    assert!(
        (round.bytes_read as u64) < 4 * MIB,
        "only the changes, not the 16 MiB disk: {round:?}"
    );

    guest_writes(&hands, VM, data_disk, 3, 30).await;
    let third = wait_for_warm(
        &client,
        ns.name(),
        name,
        Duration::from_secs(240),
        "round 3",
        |w| w.rounds_done >= 3 && w.snapshot.is_none(),
    )
    .await;
    let warm = third.status.unwrap().warm.unwrap();
    assert_eq!(
        warm.rounds.len(),
        3,
        "each round is in the status: {warm:?}"
    );
    assert_eq!((warm.rounds[2].full_disks, warm.rounds[2].round), (0, 3));
    assert!(warm.rounds[2].areas >= 1, "{warm:?}");

    guest_writes(&hands, VM, data_disk, 4, 25).await;
    patch_warm(
        &client,
        ns.name(),
        name,
        serde_json::json!({"cutover": true}),
    )
    .await;
    let done = wait_for_phase(
        &client,
        ns.name(),
        name,
        Phase::Succeeded,
        Duration::from_secs(600),
    )
    .await;
    let status = done.status.unwrap();
    let warm = status.warm.clone().unwrap();
    let last = warm.final_copy.clone().unwrap();
    assert_eq!(
        last.full_disks, 0,
        "the cutover copied only changes: {last:?}"
    );
    // By default (cutoverCheck Source) the powered-off source is read whole once more, to prove each volume.
    let whole: i64 = status.disks.iter().map(|d| d.capacity_bytes).sum();
    assert!(
        last.bytes_read >= whole && last.bytes_read < whole + 4 * MIB as i64,
        "the last changes and one whole read of the source: {last:?}"
    );
    assert_eq!(warm.rounds.len(), 3);
    let phases: Vec<Phase> = status.checkpoints.iter().map(|c| c.phase).collect();
    assert!(
        phases
            .windows(2)
            .any(|w| w == [Phase::Precopying, Phase::Preparing]),
        "{phases:?}"
    );
    // The guest's disks at power-off, as the VM sees them, are what every volume holds.
    for (disk, (stem, seeded)) in status.disks.iter().zip(&disks) {
        let key = status.source.as_ref().unwrap().disks[disk.index as usize].key;
        let guest = hands.disk(VM, Some(key)).await.unwrap();
        assert_eq!(
            disk.sha256.as_deref(),
            Some(guest.sha256.as_str()),
            "{stem}"
        );
        let image = volume_image(&client, ns.name(), disk.data_volume.as_deref().unwrap()).await;
        assert_eq!(
            sha256_prefix(&image, guest.capacity),
            guest.sha256,
            "{stem}"
        );
        if disk.index == 1 {
            assert_ne!(&guest.sha256, seeded, "the guest changed the data disk");
        }
    }
    assert!(ferry_snapshots(VM).await.is_empty());
    assert!(
        !change_tracking_on(VM).await,
        "Ferry turned tracking on and off again"
    );
    assert_eq!(
        warm.change_tracking_enabled,
        Some(ChangeTrackingChange::Restored)
    );
}

#[tokio::test]
async fn a_cancel_in_the_middle_of_a_round_removes_its_snapshot_and_restores_tracking() {
    let _shared = FILE_LOCK.read().await;
    let lab = cbt_lab().await;
    let (client, ns) = setup("warm-cancel").await;
    const VM: &str = "ferry-warm-cancel";
    seed_vm(&lab.dir().join(VM), VM, &[4, 64]).await;
    let name = "warm-cancel";
    migration::apply(
        &client,
        ns.name(),
        warm_migration(lab, ns.name(), name, VM, 3600),
    )
    .await
    .unwrap();
    wait_for_warm(
        &client,
        ns.name(),
        name,
        Duration::from_secs(300),
        "snapshot",
        |w| w.snapshot.as_ref().is_some_and(|s| s.moref.is_some()),
    )
    .await;
    assert_eq!(ferry_snapshots(VM).await.len(), 1, "one snapshot at a time");
    let cancel = serde_json::json!({"spec": {"cancel": true}});
    migrations(&client, ns.name())
        .patch(name, &PatchParams::default(), &Patch::Merge(&cancel))
        .await
        .unwrap();
    let cancelled = wait_for_phase(
        &client,
        ns.name(),
        name,
        Phase::Cancelled,
        Duration::from_secs(300),
    )
    .await;
    assert!(ferry_snapshots(VM).await.is_empty());
    assert!(!change_tracking_on(VM).await);
    assert_eq!(source_power(VM).await, ferry_api::PowerState::PoweredOn);
    let warm = cancelled.status.unwrap().warm.unwrap();
    assert_eq!(
        warm.change_tracking_enabled,
        Some(ChangeTrackingChange::Restored)
    );
}

#[tokio::test]
async fn a_source_without_change_tracking_waits_for_leave_to_turn_it_on() {
    let lab = cbt_lab().await;
    let (client, ns) = setup("warm-no-cbt").await;
    const VM: &str = "ferry-warm-no-cbt";
    seed_vm(&lab.dir().join(VM), VM, &[4]).await;
    let name = "warm-no-cbt";
    let mut manifest = warm_migration(lab, ns.name(), name, VM, 3600);
    manifest["spec"]["warm"]["enableChangeTracking"] = false.into();
    migration::apply(&client, ns.name(), manifest)
        .await
        .unwrap();
    let waiting = wait_for_phase(
        &client,
        ns.name(),
        name,
        Phase::ManualInterventionRequired,
        Duration::from_secs(120),
    )
    .await;
    let status = waiting.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("ChangeTrackingOff"));
    assert!(
        status
            .message
            .as_deref()
            .unwrap()
            .contains("enableChangeTracking"),
        "{status:?}"
    );
    assert!(
        ferry_snapshots(VM).await.is_empty(),
        "nothing done to the source"
    );
    assert!(!change_tracking_on(VM).await);
}

#[tokio::test]
async fn a_vcenter_that_locks_a_running_vms_base_refuses_warm_mode_until_a_cold_copy_is_allowed() {
    let _alone = FILE_LOCK.write().await;
    let lab = cbt_lab().await;
    let hands = hands(lab);
    hands.lock_files(FolderLock::Base).await.unwrap();
    // The lock is the whole lab's: lifted however the test ends.
    let run = tokio::spawn(locked_base_refuses_warm_mode(lab));
    let ended = run.await;
    hands.lock_files(FolderLock::Off).await.unwrap();
    if let Err(e) = ended {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn locked_base_refuses_warm_mode(lab: &'static TestLab) {
    let (client, ns) = setup("warm-locked").await;
    const VM: &str = "ferry-warm-locked";
    seed_vm(&lab.dir().join(VM), VM, &[4, 8]).await;
    let hands = hands(lab);
    let name = "warm-locked";
    migration::apply(
        &client,
        ns.name(),
        warm_migration(lab, ns.name(), name, VM, 3600),
    )
    .await
    .unwrap();
    let refused = wait_for_phase(
        &client,
        ns.name(),
        name,
        Phase::ManualInterventionRequired,
        Duration::from_secs(300),
    )
    .await;
    let status = refused.status.unwrap();
    assert_eq!(
        status.reason.as_deref(),
        Some("SourceDiskLocked"),
        "{status:?}"
    );
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("fallBackToCold"),
        "what to do is said: {message}"
    );
    let why = status.warm.unwrap().refused.unwrap();
    assert!(why.contains("500"), "the vCenter's answer is named: {why}");
    assert!(ferry_snapshots(VM).await.is_empty());
    assert_eq!(source_power(VM).await, ferry_api::PowerState::PoweredOn);

    // A person allows the cold copy, and asks for the cutover.
    patch_warm(
        &client,
        ns.name(),
        name,
        serde_json::json!({"fallBackToCold": true, "cutover": true}),
    )
    .await;
    let done = wait_for_phase(
        &client,
        ns.name(),
        name,
        Phase::Succeeded,
        Duration::from_secs(600),
    )
    .await;
    let status = done.status.unwrap();
    assert!(
        status.warm.as_ref().unwrap().final_copy.is_none(),
        "copied cold: {status:?}"
    );
    for disk in &status.disks {
        let key = status.source.as_ref().unwrap().disks[disk.index as usize].key;
        let guest = hands.disk(VM, Some(key)).await.unwrap();
        assert_eq!(disk.sha256.as_deref(), Some(guest.sha256.as_str()));
    }
    assert!(!change_tracking_on(VM).await);
}
