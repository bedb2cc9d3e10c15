//! A warm copy, round by round, with Ferry's own pieces (`ferry_vsphere::cbt`, `ferry_datapath::delta` and
//! `round`) against the lab's vCenter with changed block tracking (`tools/vcsim -cbt`): whole and delta rounds
//! while the guest writes between and during them, a reset, the cutover's delta of the powered-off VM, a base the
//! host keeps locked, a session expiring mid-delta. After the last round the volume hashes to the disk the guest
//! left.

use std::path::PathBuf;
use std::time::Duration;

use ferry_api::{DiskFormat, ErrorClass};
use ferry_datapath::delta::{ChangedDisk, write_areas};
use ferry_datapath::direct::read_back;
use ferry_datapath::progress::Progress;
use ferry_datapath::round::{RoundDisk, RoundKind, run_round};
use ferry_datapath::spec::{ConvertSpec, DiskSpec, RoundSpec, SourceSpec, SourceTrust, VolumeSpec};
use ferry_lab::lab::VcsimRealism;
use ferry_lab::vsphere::lab_hands::{FolderLock, GuestDisk, LabHands};
use ferry_lab::vsphere::vcsim::CALLS_FILE;
use ferry_testkit::TestVcsim;
use ferry_testkit::disks::make_flat_vmdk;
use ferry_vsphere::cbt::{self, Area, ChangeId};
use ferry_vsphere::datastore::flat_disk;
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{MoRef, Session, power, provision, snapshot};

const VM: &str = "DC0_H0_VM0";
const MINUTE: Duration = Duration::from_secs(60);

/// vcsim with the CBT model, a disk of its own on the running VM (tracking on), and a blank volume for it.
struct Warm {
    vcsim: TestVcsim,
    session: Session,
    hands: LabHands,
    vm: MoRef,
    size: u64,
    /// The disk's descriptor, `[ds] dir/data.vmdk`.
    disk: String,
    key: i32,
    volume: PathBuf,
    work: tempfile::TempDir,
}

impl Warm {
    async fn start(realism: VcsimRealism, size: u64, seed: u64) -> Self {
        let realism = VcsimRealism {
            cbt: true,
            ..realism
        };
        let vcsim = TestVcsim::start_with(false, &realism).await.unwrap();
        let endpoint = vcsim.endpoint();
        let session = Session::connect(endpoint.connect_config(MINUTE).unwrap())
            .await
            .unwrap();
        let hands = LabHands::new(endpoint).unwrap();
        let vm = inventory::find_vm(&session, &VmSelector::Name(VM.into()))
            .await
            .unwrap();
        let work = tempfile::tempdir().unwrap();
        let image = make_flat_vmdk(work.path(), "data", size, seed);
        let disk = provision::link_flat_vmdk(&session, &vm, &image.descriptor, &image.extent)
            .await
            .unwrap()
            .to_string();
        let described = inventory::describe_vm(&session, &vm).await.unwrap();
        let key = described.disks.iter().find(|d| d.file == disk).unwrap().key;
        std::fs::write(work.path().join("user"), &endpoint.username).unwrap();
        std::fs::write(work.path().join("password"), endpoint.password().unwrap()).unwrap();
        // The volume CDI would allocate: sparse, a little larger than the disk, with stale bytes.
        let volume = work.path().join("disk.img");
        std::fs::write(&volume, vec![0xEE; 1 << 20]).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&volume)
            .unwrap()
            .set_len(size + (1 << 20))
            .unwrap();
        cbt::set_change_tracking(&session, &vm, true, MINUTE)
            .await
            .unwrap();
        Self {
            vcsim,
            session,
            hands,
            vm,
            size,
            disk,
            key,
            volume,
            work,
        }
    }

    async fn write(&self, offset: u64, byte: u8, len: usize) {
        self.hands
            .write(VM, Some(self.key), offset, vec![byte; len])
            .await
            .unwrap();
    }

    async fn snapshot(&self, name: &str) -> MoRef {
        snapshot::create(&self.session, &self.vm, name, MINUTE)
            .await
            .unwrap()
    }

    async fn remove(&self, snapshot: &MoRef) {
        snapshot::remove(&self.session, snapshot, MINUTE)
            .await
            .unwrap();
    }

    /// The disk in `snapshot`: its base file and the change ID the snapshot took.
    async fn in_snapshot(&self, snapshot: &MoRef) -> (String, ChangeId) {
        let disks = cbt::snapshot_disks(&self.session, snapshot).await.unwrap();
        let disk = disks.into_iter().find(|d| d.key == self.key).unwrap();
        (
            disk.file,
            ChangeId::parse(disk.change_id.as_deref().unwrap()).unwrap(),
        )
    }

    async fn changed(&self, snapshot: Option<&MoRef>, since: &ChangeId) -> Vec<Area> {
        let id = since.to_string();
        cbt::changed_areas(&self.session, &self.vm, snapshot, self.key, self.size, &id)
            .await
            .unwrap()
            .areas
    }

    /// Copies `areas` of the flat file behind `descriptor` into the volume; returns the bytes read.
    async fn copy(&self, descriptor: &str, areas: Vec<Area>) -> u64 {
        let flat = flat_disk(&self.session, "DC0", descriptor).await.unwrap();
        let changed = ChangedDisk {
            index: 0,
            extent: flat.extent,
            size: self.size,
            areas,
        };
        write_areas(
            &self.session,
            "DC0",
            &changed,
            &self.volume_spec(),
            &quiet(),
        )
        .await
        .unwrap()
        .bytes_read
    }

    fn volume_spec(&self) -> VolumeSpec {
        VolumeSpec {
            index: 0,
            path: self.volume.clone(),
            block: false,
        }
    }

    /// The conversion Job's spec for a round from `snapshot` (None: the cutover's).
    fn round(&self, snapshot: Option<&MoRef>, since: Option<String>) -> ConvertSpec {
        let endpoint = self.vcsim.endpoint();
        ConvertSpec {
            source: SourceSpec {
                url: endpoint.url.clone(),
                credentials_dir: self.work.path().to_path_buf(),
                trust: SourceTrust::CaFile(endpoint.ca_file.clone()),
                datacenter: "DC0".into(),
                vm_uuid: String::new(),
                instance_uuid: None,
            },
            disks: vec![DiskSpec {
                index: 0,
                file: self.disk.clone(),
                capacity_bytes: self.size,
            }],
            format: DiskFormat::Raw,
            staging: None,
            volumes: vec![self.volume_spec()],
            parallel: 1,
            transfer: Default::default(),
            round: Some(RoundSpec {
                vm_moref: self.vm.value.clone(),
                snapshot: snapshot.map(|s| s.value.clone()),
                since: vec![since],
                // The cutover's copy is proven against the whole powered-off source, as by default.
                hash_source: snapshot.is_none(),
            }),
        }
    }

    async fn run_round(&self, snapshot: Option<&MoRef>, since: Option<String>) -> RoundDisk {
        run_round(&self.round(snapshot, since), &quiet())
            .await
            .unwrap()
            .remove(0)
    }

    async fn power_off(&self) {
        power::power_off(&self.session, &self.vm, MINUTE)
            .await
            .unwrap();
    }

    async fn guest(&self) -> GuestDisk {
        self.hands.disk(VM, Some(self.key)).await.unwrap()
    }

    fn volume_sha256(&self) -> String {
        read_back(&self.volume, self.size).unwrap().0
    }
}

fn quiet() -> Progress {
    Progress::new(true)
}

#[tokio::test]
async fn rounds_of_changed_areas_bring_the_volume_to_the_disk_the_guest_left() {
    const DISK: u64 = 64 << 20;
    let warm = Warm::start(VcsimRealism::default(), DISK, 11).await;

    // Round 1: everything, from the first snapshot's base, while the guest writes into its delta.
    let first = warm.snapshot("ferry-round-1").await;
    let (base, mut since) = warm.in_snapshot(&first).await;
    warm.write(3 << 20, 0x11, 100_000).await;
    let whole = vec![Area {
        start: 0,
        length: DISK,
    }];
    assert_eq!(warm.copy(&base, whole).await, DISK);
    warm.remove(&first).await;

    // Rounds 2 and 3: what changed since the last round's snapshot, zeros included.
    let guest_writes: [&[(u64, u8, usize)]; 2] = [
        &[
            (0, 0x22, 512),
            (40 << 20, 0, 1 << 20),
            (DISK - 4096, 0x33, 4096),
        ],
        &[(3 << 20, 0x44, 10), (17 << 20, 0x55, 300_000)],
    ];
    for (round, writes) in guest_writes.iter().enumerate() {
        for &(offset, byte, len) in *writes {
            warm.write(offset, byte, len).await;
        }
        let snap = warm.snapshot(&format!("ferry-round-{}", round + 2)).await;
        let (base, id) = warm.in_snapshot(&snap).await;
        warm.write(9 << 20, 0x66 + round as u8, 4096).await; // lands in the next round
        let areas = warm.changed(Some(&snap), &since).await;
        assert!(!areas.is_empty() && areas.iter().all(|a| a.start % (64 << 10) == 0));
        let read = warm.copy(&base, areas.clone()).await;
        assert!(read >= areas.iter().map(|a| a.length).sum::<u64>());
        assert!(
            read < DISK / 4,
            "round {}: a delta ({read} bytes)",
            round + 2
        );
        warm.remove(&snap).await;
        since = id;
    }

    // Cutover: the guest writes last, the VM goes off, the final delta comes from the base without a snapshot.
    warm.write(50 << 20, 0x77, 70_000).await;
    warm.power_off().await;
    let last = warm.changed(None, &since).await;
    let in_last = Area {
        start: 9 << 20,
        length: 64 << 10,
    };
    assert!(last.contains(&in_last), "{last:?}");
    warm.copy(&warm.disk, last).await;

    let guest = warm.guest().await;
    assert_eq!(
        warm.volume_sha256(),
        guest.sha256,
        "the volume is the guest's disk"
    );
    assert!(!guest.snapshot);
}

/// The conversion Job's side of a warm migration: `ferry convert` given a round (`ConvertSpec.round`).
#[tokio::test]
async fn the_jobs_rounds_copy_whole_then_deltas_then_whole_again_after_a_reset() {
    const DISK: u64 = 64 << 20;
    let warm = Warm::start(VcsimRealism::default(), DISK, 5).await;
    let mut since = None;
    for (n, kind) in [RoundKind::Full, RoundKind::Delta, RoundKind::FullAfterReset]
        .into_iter()
        .enumerate()
    {
        if kind == RoundKind::FullAfterReset {
            warm.hands.reset_change_tracking(VM).await.unwrap();
        }
        let snap = warm.snapshot(&format!("ferry-{n}")).await;
        warm.write((n as u64 + 1) << 20, 0x10 + n as u8, 5000).await;
        let disk = warm.run_round(Some(&snap), since.clone()).await;
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
        warm.remove(&snap).await;
        since = disk.change_id;
        assert!(since.is_some());
    }

    // A round without a snapshot is the cutover's: refused while the VM runs, then the last delta.
    let cutover = warm.round(None, since.clone());
    let e = run_round(&cutover, &quiet()).await.unwrap_err();
    assert_eq!(e.reason(), "SourcePoweredOn", "{e}");
    warm.write(60 << 20, 0x99, 1).await;
    warm.power_off().await;
    let last = warm.run_round(None, since).await;
    assert_eq!(
        (last.kind, last.change_id.as_deref()),
        (RoundKind::Delta, None)
    );
    let guest = warm.guest().await.sha256;
    assert_eq!(warm.volume_sha256(), guest);
    assert_eq!(
        last.sha256, guest,
        "the cutover reports the whole volume's hash"
    );
    assert!(
        last.bytes_read >= DISK,
        "the source was read whole to prove the volume: {last:?}"
    );
}

/// A host that will not serve a running VM's disks, even under a snapshot: the round says so at once, instead of
/// retrying its HTTP 500 for minutes as a passing fault.
#[tokio::test]
async fn a_base_the_host_keeps_locked_refuses_the_round_clearly() {
    let locked = VcsimRealism {
        folder_lock: FolderLock::Base,
        ..VcsimRealism::default()
    };
    let warm = Warm::start(locked, 4 << 20, 3).await;
    let snap = warm.snapshot("ferry-locked").await;
    let before = warm.volume_sha256();
    let started = std::time::Instant::now();
    let e = run_round(&warm.round(Some(&snap), None), &quiet())
        .await
        .unwrap_err();
    assert_eq!(
        (e.reason().as_str(), e.class()),
        ("SourceDiskLocked", ErrorClass::Permanent),
        "{e}"
    );
    assert!(e.to_string().contains("cannot be copied warm"), "{e}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "told apart in {took:?}");
    assert_eq!(warm.volume_sha256(), before, "the volume untouched");
    warm.remove(&snap).await;
}

/// vCenter ends idle sessions, and a `/folder` download does not keep one alive: a delta whose later requests
/// start after the session expired logs in again and completes.
#[tokio::test]
async fn a_session_that_expires_during_a_delta_logs_in_again() {
    let strict = VcsimRealism {
        folder_auth: true,
        session_idle: Some(Duration::from_secs(1)),
        folder_throttle: Some(2 << 20),
        ..VcsimRealism::default()
    };
    let warm = Warm::start(strict, 32 << 20, 9).await;
    // The whole copy: 16 s at the throttle's 2 MiB/s, far longer than the session's idle second.
    let first = warm.snapshot("ferry-0").await;
    let whole = warm.run_round(Some(&first), None).await;
    warm.remove(&first).await;

    // A 3 MiB area first (1.5 s at the throttle), then more areas than requests in flight: the later ones start
    // once the first is handed on, after the session expired.
    warm.write(0, 1, 3 << 20).await;
    for i in 0..12u64 {
        warm.write((8 << 20) + i * (2 << 20), 2, 4096).await;
    }
    let second = warm.snapshot("ferry-1").await;
    let logins = || {
        std::fs::read_to_string(warm.vcsim.dir().join(CALLS_FILE))
            .unwrap()
            .lines()
            .filter(|l| *l == "Login")
            .count()
    };
    let before = logins();
    let delta = warm.run_round(Some(&second), whole.change_id).await;
    assert_eq!(
        (delta.kind, delta.areas),
        (RoundKind::Delta, 13),
        "{delta:?}"
    );
    assert!(
        logins() >= before + 2,
        "the Job's login, then at least one more after the expiry"
    );
    warm.remove(&second).await;
    warm.power_off().await;
    assert_eq!(warm.volume_sha256(), warm.guest().await.sha256);
}
