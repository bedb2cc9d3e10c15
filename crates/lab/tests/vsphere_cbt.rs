//! Ferry's Changed Block Tracking client (`ferry_vsphere::cbt`, `file_lock`) against the lab's vCenter with
//! its CBT model (`tools/vcsim -cbt`): change IDs follow stuns, a snapshot's base is frozen while the guest
//! writes, changed areas page to the disk's end, a reset is refused, and a file a running VM holds is told from
//! a passing fault.

use std::time::Duration;

use ferry_lab::lab::VcsimRealism;
use ferry_lab::vsphere::lab_hands::{FolderLock, LabHands};
use ferry_testkit::TestVcsim;
use ferry_vsphere::cbt::{self, Area, ChangeId, ChangedAreas, QueryRefusal};
use ferry_vsphere::datastore::DatastorePath;
use ferry_vsphere::file_lock::{Readability, probe_read};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{MoRef, Session, power, snapshot};

const VM: &str = "DC0_H0_VM0";
const BLOCK: u64 = 64 << 10;
const MINUTE: Duration = Duration::from_secs(60);

async fn lab(realism: VcsimRealism) -> (TestVcsim, Session, LabHands, MoRef) {
    let vcsim = TestVcsim::start_with(false, &realism).await.unwrap();
    let session = Session::connect(vcsim.endpoint().connect_config(MINUTE).unwrap())
        .await
        .unwrap();
    let hands = LabHands::new(vcsim.endpoint()).unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name(VM.into()))
        .await
        .unwrap();
    (vcsim, session, hands, vm)
}

/// The change ID a new snapshot records for the VM's first disk, and the snapshot.
async fn snapshot_with_id(session: &Session, vm: &MoRef, name: &str) -> (MoRef, ChangeId, i32) {
    let snap = snapshot::create(session, vm, name, MINUTE).await.unwrap();
    let disk = cbt::snapshot_disks(session, &snap).await.unwrap().remove(0);
    let id = disk.change_id.as_deref().and_then(ChangeId::parse);
    (
        snap,
        id.expect("a snapshot of a tracked disk has a change ID"),
        disk.key,
    )
}

/// The areas of disk `key` written since `since`, up to `snapshot`.
async fn changed_up_to(
    session: &Session,
    vm: &MoRef,
    snapshot: &MoRef,
    key: i32,
    capacity: u64,
    since: &ChangeId,
) -> ferry_vsphere::Result<ChangedAreas> {
    cbt::changed_areas(
        session,
        vm,
        Some(snapshot),
        key,
        capacity,
        &since.to_string(),
    )
    .await
}

#[tokio::test]
async fn changed_areas_page_to_the_disk_end_and_a_reset_is_refused() {
    let (_vcsim, session, hands, vm) = lab(VcsimRealism {
        cbt: true,
        ..VcsimRealism::default()
    })
    .await;
    cbt::set_change_tracking(&session, &vm, true, MINUTE)
        .await
        .unwrap();
    let described = inventory::describe_vm(&session, &vm).await.unwrap();
    assert!(described.change_tracking);
    assert_eq!(
        described.disks[0].change_id, None,
        "running: active only after a stun"
    );
    let capacity = described.disks[0].capacity_bytes as u64;

    let (first, first_id, key) = snapshot_with_id(&session, &vm, "ferry-test-1").await;
    // While the snapshot exists the VM runs on a delta; the snapshot keeps the base.
    let running = inventory::describe_vm(&session, &vm)
        .await
        .unwrap()
        .disks
        .remove(0);
    let frozen = cbt::snapshot_disks(&session, &first)
        .await
        .unwrap()
        .remove(0);
    assert!(running.file.ends_with("-000001.vmdk"), "{running:?}");
    assert_eq!(running.parents, std::slice::from_ref(&frozen.file));
    snapshot::remove(&session, &first, MINUTE).await.unwrap();

    // 2,001 separate blocks: more than one page of ESXi's 2,000 areas.
    for i in 0..2001u64 {
        hands
            .write(VM, None, i * 2 * BLOCK, vec![0xa5; 512])
            .await
            .unwrap();
    }
    let (second, second_id, _) = snapshot_with_id(&session, &vm, "ferry-test-2").await;
    assert!(!first_id.reset_before(&second_id) && second_id.sequence > first_id.sequence);
    let changed = changed_up_to(&session, &vm, &second, key, capacity, &first_id)
        .await
        .unwrap();
    assert_eq!(changed.pages, 2);
    assert_eq!(changed.areas.len(), 2001);
    assert_eq!(
        changed.areas[2000],
        Area {
            start: 4000 * BLOCK,
            length: BLOCK
        }
    );
    assert_eq!(changed.bytes(), 2001 * BLOCK);

    // No snapshot while running: vSphere allows that only for a powered-off VM.
    let running_query = cbt::query_page(&session, &vm, None, key, 0, &second_id.to_string()).await;
    assert_eq!(running_query.unwrap_err().fault(), Some("FileFault"));

    hands.reset_change_tracking(VM).await.unwrap();
    let e = changed_up_to(&session, &vm, &second, key, capacity, &first_id)
        .await
        .unwrap_err();
    assert!(
        matches!(cbt::refusal(&e), Some(QueryRefusal::ChangeIdRejected(_))),
        "{e}"
    );
    snapshot::remove(&session, &second, MINUTE).await.unwrap();
    let e = cbt::query_page(&session, &vm, Some(&second), key, 0, "*")
        .await
        .unwrap_err();
    assert!(
        matches!(cbt::refusal(&e), Some(QueryRefusal::SnapshotGone(_))),
        "{e}"
    );

    // Off: a query up to now, without a snapshot; the new epoch's ID is on the disk.
    let now = inventory::describe_vm(&session, &vm)
        .await
        .unwrap()
        .disks
        .remove(0);
    let now_id = ChangeId::parse(now.change_id.as_deref().unwrap()).unwrap();
    assert!(first_id.reset_before(&now_id));
    hands.write(VM, None, 7 * BLOCK, vec![1; 10]).await.unwrap();
    power::power_off(&session, &vm, MINUTE).await.unwrap();
    let changed = cbt::changed_areas(&session, &vm, None, key, capacity, &now_id.to_string())
        .await
        .unwrap();
    assert_eq!(
        changed.areas,
        [Area {
            start: 7 * BLOCK,
            length: BLOCK
        }]
    );
}

#[tokio::test]
async fn a_file_a_running_vm_holds_is_told_from_a_passing_fault() {
    let (_vcsim, session, hands, vm) = lab(VcsimRealism {
        cbt: true,
        folder_lock: FolderLock::Running,
        ..VcsimRealism::default()
    })
    .await;
    let disk = inventory::describe_vm(&session, &vm)
        .await
        .unwrap()
        .disks
        .remove(0);
    let flat = DatastorePath::parse(&disk.file)
        .unwrap()
        .sibling("disk1-flat.vmdk");
    let probe = || probe_read(&session, "DC0", &flat, 2, Duration::from_millis(50));
    assert!(matches!(
        probe().await.unwrap(),
        Readability::Locked { status: 500, .. }
    ));

    let snap = snapshot::create(&session, &vm, "ferry-lock", MINUTE)
        .await
        .unwrap();
    assert_eq!(
        probe().await.unwrap(),
        Readability::Readable,
        "a snapshot's base"
    );
    hands.lock_files(FolderLock::Base).await.unwrap();
    assert!(matches!(probe().await.unwrap(), Readability::Locked { .. }));
    snapshot::remove(&session, &snap, MINUTE).await.unwrap();
    power::power_off(&session, &vm, MINUTE).await.unwrap();
    assert_eq!(probe().await.unwrap(), Readability::Readable, "powered off");
}
