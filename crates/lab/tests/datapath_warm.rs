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
        assert!(read >= areas.iter().map(|a| a.length).sum::<u64>());
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

/// The conversion Job's side of a warm migration: `ferry convert` given a round (`ConvertSpec.round`).
#[tokio::test]
async fn the_jobs_rounds_copy_whole_then_deltas_then_whole_again_after_a_reset() {
    use ferry_api::DiskFormat;
    use ferry_datapath::round::{RoundKind, run_round};
    use ferry_datapath::spec::{ConvertSpec, DiskSpec, RoundSpec, SourceSpec, SourceTrust};

    let realism = VcsimRealism {
        cbt: true,
        ..VcsimRealism::default()
    };
    let vcsim = TestVcsim::start_with(false, &realism).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let session = Session::connect(endpoint.connect_config(MINUTE).unwrap())
        .await
        .unwrap();
    let hands = LabHands::new(&endpoint).unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name(VM.into()))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let image = make_flat_vmdk(work.path(), "data", DISK, 5);
    let attached = provision::link_flat_vmdk(&session, &vm, &image.descriptor, &image.extent)
        .await
        .unwrap()
        .to_string();
    let info = inventory::describe_vm(&session, &vm).await.unwrap();
    let key = info.disks.iter().find(|d| d.file == attached).unwrap().key;
    std::fs::write(work.path().join("user"), &endpoint.username).unwrap();
    std::fs::write(work.path().join("password"), endpoint.password().unwrap()).unwrap();
    let volume_path = work.path().join("disk.img");
    std::fs::File::create(&volume_path)
        .unwrap()
        .set_len(DISK)
        .unwrap();
    let round = |snapshot: Option<&MoRef>, since: Option<String>| ConvertSpec {
        source: SourceSpec {
            url: endpoint.url.clone(),
            credentials_dir: work.path().to_path_buf(),
            trust: SourceTrust::CaFile(endpoint.ca_file.clone()),
            datacenter: "DC0".into(),
            vm_uuid: info.uuid.clone().unwrap_or_default(),
            instance_uuid: info.instance_uuid.clone(),
        },
        disks: vec![DiskSpec {
            index: 0,
            file: attached.clone(),
            capacity_bytes: DISK,
        }],
        format: DiskFormat::Raw,
        staging: None,
        volumes: vec![VolumeSpec {
            index: 0,
            path: volume_path.clone(),
            block: false,
        }],
        parallel: 1,
        transfer: Default::default(),
        round: Some(RoundSpec {
            vm_moref: vm.value.clone(),
            snapshot: snapshot.map(|s| s.value.clone()),
            since: vec![since],
        }),
    };
    let quiet = Progress::new(true);
    let write =
        |offset: u64, byte: u8, len: usize| hands.write(VM, Some(key), offset, vec![byte; len]);
    cbt::set_change_tracking(&session, &vm, true, MINUTE)
        .await
        .unwrap();

    let mut since = None;
    for (n, kind) in [RoundKind::Full, RoundKind::Delta, RoundKind::FullAfterReset]
        .into_iter()
        .enumerate()
    {
        if kind == RoundKind::FullAfterReset {
            hands.reset_change_tracking(VM).await.unwrap();
        }
        let snap = snapshot::create(&session, &vm, &format!("ferry-{n}"), MINUTE)
            .await
            .unwrap();
        write((n as u64 + 1) << 20, 0x10 + n as u8, 5000)
            .await
            .unwrap();
        let disk = run_round(&round(Some(&snap), since.clone()), &quiet)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(disk.kind, kind, "round {n}: {disk:?}");
        match kind {
            RoundKind::Delta => assert!(disk.areas > 0 && disk.bytes_read < DISK / 4, "{disk:?}"),
            RoundKind::FullAfterReset => {
                assert!(
                    disk.reason.as_deref().unwrap().contains("reset"),
                    "{disk:?}"
                )
            }
            RoundKind::Full => assert_eq!(disk.bytes_read, DISK),
        }
        snapshot::remove(&session, &snap, MINUTE).await.unwrap();
        since = disk.change_id;
        assert!(since.is_some());
    }

    // A round without a snapshot is the cutover's: refused while the VM runs, then the last delta.
    let e = run_round(&round(None, since.clone()), &quiet)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "SourcePoweredOn", "{e}");
    write(60 << 20, 0x99, 1).await.unwrap();
    power::power_off(&session, &vm, MINUTE).await.unwrap();
    let last = run_round(&round(None, since), &quiet)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (last.kind, last.change_id.as_deref()),
        (RoundKind::Delta, None)
    );
    let guest = hands.disk(VM, Some(key)).await.unwrap();
    assert_eq!(read_back(&volume_path, DISK).unwrap().0, guest.sha256);
}

/// A host that will not serve a running VM's disks, even under a snapshot: the round says so at once, instead of
/// retrying its HTTP 500 for minutes as a passing fault.
#[tokio::test]
async fn a_base_the_host_keeps_locked_refuses_the_round_clearly() {
    use ferry_datapath::round::run_round;
    use ferry_datapath::spec::{ConvertSpec, DiskSpec, RoundSpec, SourceSpec, SourceTrust};
    use ferry_lab::vsphere::lab_hands::FolderLock;

    let realism = VcsimRealism {
        cbt: true,
        folder_lock: FolderLock::Base,
        ..VcsimRealism::default()
    };
    let vcsim = TestVcsim::start_with(false, &realism).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let session = Session::connect(endpoint.connect_config(MINUTE).unwrap())
        .await
        .unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name(VM.into()))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let image = make_flat_vmdk(work.path(), "data", 4 << 20, 3);
    let attached = provision::link_flat_vmdk(&session, &vm, &image.descriptor, &image.extent)
        .await
        .unwrap()
        .to_string();
    std::fs::write(work.path().join("user"), &endpoint.username).unwrap();
    std::fs::write(work.path().join("password"), endpoint.password().unwrap()).unwrap();
    let volume = work.path().join("disk.img");
    std::fs::File::create(&volume)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let snap = snapshot::create(&session, &vm, "ferry-locked", MINUTE)
        .await
        .unwrap();
    let spec = ConvertSpec {
        source: SourceSpec {
            url: endpoint.url.clone(),
            credentials_dir: work.path().to_path_buf(),
            trust: SourceTrust::CaFile(endpoint.ca_file.clone()),
            datacenter: "DC0".into(),
            vm_uuid: String::new(),
            instance_uuid: None,
        },
        disks: vec![DiskSpec {
            index: 0,
            file: attached,
            capacity_bytes: 4 << 20,
        }],
        format: ferry_api::DiskFormat::Raw,
        staging: None,
        volumes: vec![VolumeSpec {
            index: 0,
            path: volume.clone(),
            block: false,
        }],
        parallel: 1,
        transfer: Default::default(),
        round: Some(RoundSpec {
            vm_moref: vm.value.clone(),
            snapshot: Some(snap.value.clone()),
            since: vec![None],
        }),
    };
    let started = std::time::Instant::now();
    let e = run_round(&spec, &Progress::new(true)).await.unwrap_err();
    assert_eq!(
        (e.reason().as_str(), e.class()),
        ("SourceDiskLocked", ferry_api::ErrorClass::Permanent),
        "{e}"
    );
    assert!(e.to_string().contains("cannot be copied warm"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "told apart in {:?}",
        started.elapsed()
    );
    assert_eq!(
        std::fs::metadata(&volume).unwrap().len(),
        4 << 20,
        "the volume untouched"
    );
    snapshot::remove(&session, &snap, MINUTE).await.unwrap();
}

/// vCenter ends idle sessions, and a `/folder` download does not keep one alive: a delta whose later requests
/// start after the session expired logs in again and completes.
#[tokio::test]
async fn a_session_that_expires_during_a_delta_logs_in_again() {
    use ferry_datapath::round::{RoundKind, run_round};
    use ferry_datapath::spec::{ConvertSpec, DiskSpec, RoundSpec, SourceSpec, SourceTrust};

    let realism = VcsimRealism {
        cbt: true,
        folder_auth: true,
        session_idle: Some(Duration::from_secs(1)),
        folder_throttle: Some(2 << 20),
        ..VcsimRealism::default()
    };
    let vcsim = TestVcsim::start_with(false, &realism).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let session = Session::connect(endpoint.connect_config(MINUTE).unwrap())
        .await
        .unwrap();
    let hands = LabHands::new(&endpoint).unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name(VM.into()))
        .await
        .unwrap();
    let size = 32u64 << 20;
    let work = tempfile::tempdir().unwrap();
    let image = make_flat_vmdk(work.path(), "data", size, 9);
    let attached = provision::link_flat_vmdk(&session, &vm, &image.descriptor, &image.extent)
        .await
        .unwrap()
        .to_string();
    let key = inventory::describe_vm(&session, &vm)
        .await
        .unwrap()
        .disks
        .iter()
        .find(|d| d.file == attached)
        .unwrap()
        .key;
    std::fs::write(work.path().join("user"), &endpoint.username).unwrap();
    std::fs::write(work.path().join("password"), endpoint.password().unwrap()).unwrap();
    let volume = work.path().join("disk.img");
    std::fs::File::create(&volume)
        .unwrap()
        .set_len(size)
        .unwrap();
    let spec = |snapshot: &MoRef, since: Option<String>| ConvertSpec {
        source: SourceSpec {
            url: endpoint.url.clone(),
            credentials_dir: work.path().to_path_buf(),
            trust: SourceTrust::CaFile(endpoint.ca_file.clone()),
            datacenter: "DC0".into(),
            vm_uuid: String::new(),
            instance_uuid: None,
        },
        disks: vec![DiskSpec {
            index: 0,
            file: attached.clone(),
            capacity_bytes: size,
        }],
        format: ferry_api::DiskFormat::Raw,
        staging: None,
        volumes: vec![VolumeSpec {
            index: 0,
            path: volume.clone(),
            block: false,
        }],
        parallel: 1,
        transfer: Default::default(),
        round: Some(RoundSpec {
            vm_moref: vm.value.clone(),
            snapshot: Some(snapshot.value.clone()),
            since: vec![since],
        }),
    };
    let quiet = Progress::new(true);
    cbt::set_change_tracking(&session, &vm, true, MINUTE)
        .await
        .unwrap();
    // The whole copy: 16 s at the throttle's 2 MiB/s, its pieces far longer than the session's idle second.
    let first = snapshot::create(&session, &vm, "ferry-0", MINUTE)
        .await
        .unwrap();
    let whole = run_round(&spec(&first, None), &quiet)
        .await
        .unwrap()
        .remove(0);
    snapshot::remove(&session, &first, MINUTE).await.unwrap();

    // A 3 MiB area first (1.5 s at the throttle), then more areas than requests in flight: the later ones start
    // once the first is handed on, after the session expired.
    hands
        .write(VM, Some(key), 0, vec![1; 3 << 20])
        .await
        .unwrap();
    for i in 0..12u64 {
        hands
            .write(VM, Some(key), (8 << 20) + i * (2 << 20), vec![2; 4096])
            .await
            .unwrap();
    }
    let second = snapshot::create(&session, &vm, "ferry-1", MINUTE)
        .await
        .unwrap();
    let logins = || {
        std::fs::read_to_string(vcsim.dir().join(ferry_lab::vsphere::vcsim::CALLS_FILE))
            .unwrap()
            .lines()
            .filter(|l| *l == "Login")
            .count()
    };
    let before = logins();
    let delta = run_round(&spec(&second, whole.change_id), &quiet)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (delta.kind, delta.areas),
        (RoundKind::Delta, 13),
        "{delta:?}"
    );
    assert!(
        logins() >= before + 2,
        "the Job's login, then at least one more after the expiry"
    );
    snapshot::remove(&session, &second, MINUTE).await.unwrap();
    power::power_off(&session, &vm, MINUTE).await.unwrap();
    let guest = hands.disk(VM, Some(key)).await.unwrap();
    assert_eq!(read_back(&volume, size).unwrap().0, guest.sha256);
}
