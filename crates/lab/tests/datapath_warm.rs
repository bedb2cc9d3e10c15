//! A warm copy, round by round, with Ferry's own pieces (`ferry_vsphere::cbt`, `ferry_datapath::delta`) against
//! the lab's vCenter with changed block tracking (`tools/vcsim -cbt`): a full round from the first snapshot's
//! frozen base, two delta rounds while the guest writes between and during them, then the final delta of the
//! powered-off VM; the volume then hashes to the disk the guest left.

use std::time::Duration;

use ferry_datapath::delta::{ChangedDisk, write_areas};
use ferry_datapath::direct::read_back;
use ferry_datapath::progress::Progress;
use ferry_datapath::spec::VolumeSpec;
use ferry_lab::lab::VcsimRealism;
use ferry_lab::vsphere::lab_hands::LabHands;
use ferry_testkit::TestVcsim;
use ferry_testkit::disks::make_flat_vmdk;
use ferry_vsphere::cbt::{self, Area, ChangeId};
use ferry_vsphere::datastore::flat_disk;
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{MoRef, Session, power, provision, snapshot};

const VM: &str = "DC0_H0_VM0";
const DISK: u64 = 64 << 20;
const MINUTE: Duration = Duration::from_secs(60);

struct Source<'a> {
    session: &'a Session,
    vm: MoRef,
    key: i32,
}

impl Source<'_> {
    /// Takes a snapshot and returns it with the disk's file and change ID in it.
    async fn snapshot(&self, name: &str) -> (MoRef, String, ChangeId) {
        let snap = snapshot::create(self.session, &self.vm, name, MINUTE)
            .await
            .unwrap();
        let disks = cbt::snapshot_disks(self.session, &snap).await.unwrap();
        let disk = disks.into_iter().find(|d| d.key == self.key).unwrap();
        let id = ChangeId::parse(disk.change_id.as_deref().unwrap()).unwrap();
        (snap, disk.file, id)
    }

    /// Copies `areas` of the flat file behind `descriptor` into the volume.
    async fn copy(&self, descriptor: &str, areas: Vec<Area>, volume: &VolumeSpec) -> u64 {
        let flat = flat_disk(self.session, "DC0", descriptor).await.unwrap();
        let disk = ChangedDisk {
            index: 0,
            extent: flat.extent,
            size: DISK,
            areas,
        };
        let written = write_areas(self.session, "DC0", &disk, volume, &Progress::new(true))
            .await
            .unwrap();
        written.bytes_read
    }

    async fn changed(&self, snapshot: Option<&MoRef>, since: &ChangeId) -> Vec<Area> {
        cbt::changed_areas(
            self.session,
            &self.vm,
            snapshot,
            self.key,
            DISK,
            &since.to_string(),
        )
        .await
        .unwrap()
        .areas
    }
}

#[tokio::test]
async fn rounds_of_changed_areas_bring_the_volume_to_the_disk_the_guest_left() {
    let realism = VcsimRealism {
        cbt: true,
        ..VcsimRealism::default()
    };
    let vcsim = TestVcsim::start_with(false, &realism).await.unwrap();
    let session = Session::connect(vcsim.endpoint().connect_config(MINUTE).unwrap())
        .await
        .unwrap();
    let hands = LabHands::new(vcsim.endpoint()).unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name(VM.into()))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let image = make_flat_vmdk(work.path(), "data", DISK, 11);
    let attached = provision::link_flat_vmdk(&session, &vm, &image.descriptor, &image.extent)
        .await
        .unwrap();
    let key = inventory::describe_vm(&session, &vm)
        .await
        .unwrap()
        .disks
        .iter()
        .find(|d| d.file == attached.to_string())
        .unwrap()
        .key;
    let source = Source {
        session: &session,
        vm: vm.clone(),
        key,
    };
    // The volume CDI would allocate: sparse, a little larger than the disk, with stale bytes.
    let volume_path = work.path().join("disk.img");
    std::fs::write(&volume_path, vec![0xEE; 1 << 20]).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&volume_path)
        .unwrap()
        .set_len(DISK + (1 << 20))
        .unwrap();
    let volume = VolumeSpec {
        index: 0,
        path: volume_path.clone(),
        block: false,
    };
    let write = |offset: u64, data: Vec<u8>| hands.write(VM, Some(key), offset, data);
    cbt::set_change_tracking(&session, &vm, true, MINUTE)
        .await
        .unwrap();

    // Round 1: everything, from the first snapshot's base, while the guest writes into its delta.
    let (first, base, mut since) = source.snapshot("ferry-round-1").await;
    write(3 << 20, vec![0x11; 100_000]).await.unwrap();
    let full = vec![Area {
        start: 0,
        length: DISK,
    }];
    assert_eq!(source.copy(&base, full, &volume).await, DISK);
    snapshot::remove(&session, &first, MINUTE).await.unwrap();

    // Rounds 2 and 3: what changed since the last round's snapshot, zeros included.
    let guest_writes: [&[(u64, u8, usize)]; 2] = [
        &[
            (0, 0x22, 512),
            (40 << 20, 0, 1 << 20),
            ((DISK - 4096), 0x33, 4096),
        ],
        &[(3 << 20, 0x44, 10), (17 << 20, 0x55, 300_000)],
    ];
    for (round, writes) in guest_writes.iter().enumerate() {
        for &(offset, byte, len) in *writes {
            write(offset, vec![byte; len]).await.unwrap();
        }
        let (snap, base, id) = source.snapshot(&format!("ferry-round-{}", round + 2)).await;
        write(9 << 20, vec![0x66 + round as u8; 4096])
            .await
            .unwrap(); // lands in the next round
        let areas = source.changed(Some(&snap), &since).await;
        assert!(!areas.is_empty() && areas.iter().all(|a| a.start % (64 << 10) == 0));
        let read = source.copy(&base, areas.clone(), &volume).await;
        assert_eq!(read, areas.iter().map(|a| a.length).sum::<u64>());
        assert!(
            read < DISK / 4,
            "round {}: a delta, not the disk ({read} bytes)",
            round + 2
        );
        snapshot::remove(&session, &snap, MINUTE).await.unwrap();
        since = id;
    }

    // Cutover: the guest writes last, the VM goes off, the final delta comes from the base without a snapshot.
    write(50 << 20, vec![0x77; 70_000]).await.unwrap();
    power::power_off(&session, &vm, MINUTE).await.unwrap();
    let last = source.changed(None, &since).await;
    assert!(
        last.contains(&Area {
            start: 9 << 20,
            length: 64 << 10
        }),
        "{last:?}"
    );
    source.copy(&attached.to_string(), last, &volume).await;

    let guest = hands.disk(VM, Some(key)).await.unwrap();
    let (volume_sha, _) = read_back(&volume_path, DISK).unwrap();
    assert_eq!(
        volume_sha, guest.sha256,
        "the volume is the disk the guest left"
    );
    assert!(!guest.snapshot);
}
