//! VMware-shaped Linux VMs seeded into vcsim, read back through Ferry's inventory and datastore code as a migration
//! would read them. (Small synthetic disks here; the lab seeds real Debian images the same way.)

use std::path::Path;
use std::time::Duration;

use ferry_api::{Firmware, PowerState};
use ferry_lab::vsphere::linux_vms::{LinuxVmSeed, NETWORK, SECOND_NETWORK, seed_linux_vm};
use ferry_testkit::TestVcsim;
use ferry_testkit::disks::{hex, write_pattern};
use ferry_vsphere::Session;
use ferry_vsphere::datastore::{Download, flat_disk};
use ferry_vsphere::inventory::{self, VmInfo, VmSelector};
use sha2::{Digest, Sha256};

const ROOT_BYTES: u64 = 64 << 20;
const DATA_BYTES: u64 = 16 << 20;

async fn download_sha(session: &Session, datacenter: &str, disk_file: &str) -> (String, u64) {
    let flat = flat_disk(session, datacenter, disk_file).await.unwrap();
    let mut download = Download::open(session, datacenter, &flat.extent, 0)
        .await
        .unwrap();
    let mut hash = Sha256::new();
    while let Some(chunk) = download.next_chunk().await.unwrap() {
        hash.update(&chunk);
    }
    (hex(&hash.finalize()), download.offset())
}

/// How many times vcsim was asked to create or change a VM.
fn writes(calls_file: &Path) -> usize {
    std::fs::read_to_string(calls_file)
        .unwrap_or_default()
        .lines()
        .filter(|m| matches!(*m, "CreateVM_Task" | "ReconfigVM_Task" | "PowerOnVM_Task"))
        .count()
}

fn assert_shape(vm: &VmInfo, seed: &LinuxVmSeed) {
    assert_eq!(vm.guest_id.as_deref(), Some("debian12_64Guest"));
    assert_eq!(vm.power_state, PowerState::PoweredOn);
    assert_eq!(
        (vm.cpus, vm.cores_per_socket, vm.memory_mib),
        (seed.cpus, seed.cores_per_socket, seed.memory_mib),
        "{}",
        vm.name
    );
    assert_eq!(vm.firmware, seed.firmware);
    assert_eq!(vm.efi_secure_boot, Some(seed.secure_boot), "{}", vm.name);

    let disks: Vec<(&str, &str, &str, i32, u64)> = vm
        .disks
        .iter()
        .map(|d| {
            (
                d.controller.as_str(),
                d.controller_model.as_str(),
                d.bus.as_str(),
                d.unit_number,
                d.capacity_bytes as u64,
            )
        })
        .collect();
    assert_eq!(
        disks,
        [
            ("ParaVirtualSCSIController", "pvscsi", "scsi", 0, ROOT_BYTES),
            ("ParaVirtualSCSIController", "pvscsi", "scsi", 1, DATA_BYTES),
        ],
        "{}",
        vm.name
    );
    assert_eq!(vm.disks[0].controller_key, vm.disks[1].controller_key);
    assert_eq!(
        (vm.disks[0].file.clone(), vm.disks[1].file.clone()),
        (
            format!("[LocalDS_0] {0}/{0}.vmdk", vm.name),
            format!("[LocalDS_0] {0}/{0}_1.vmdk", vm.name)
        )
    );
    let uuids: Vec<&str> = vm.disks.iter().filter_map(|d| d.uuid.as_deref()).collect();
    assert_eq!(uuids.len(), 2, "every disk has a uuid: {:?}", vm.disks);
    assert_ne!(uuids[0], uuids[1]);
    assert_eq!(vm.boot_order, [vm.disks[0].key], "boots from the root disk");

    let nics: Vec<(&str, &str)> = vm
        .nics
        .iter()
        .map(|n| (n.model.as_str(), n.network.as_str()))
        .collect();
    let expected: Vec<(&str, &str)> = seed
        .networks
        .iter()
        .map(|n| ("vmxnet3", n.as_str()))
        .collect();
    assert_eq!(nics, expected, "a vmxnet3 NIC on each network, in order");
    for nic in &vm.nics {
        assert_eq!(nic.mac.len(), 17, "{nic:?}");
    }
}

#[tokio::test]
async fn linux_vms_are_seeded_with_vmware_devices_and_read_back_as_a_migration_reads_them() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let work = tempfile::tempdir().unwrap();
    let (root_raw, data_raw) = (work.path().join("root.raw"), work.path().join("data.raw"));
    let root_sha = write_pattern(&root_raw, ROOT_BYTES, 11);
    let data_sha = write_pattern(&data_raw, DATA_BYTES, 12);
    let seeds = [
        LinuxVmSeed {
            name: "linux-bios".into(),
            firmware: Firmware::Bios,
            secure_boot: false,
            cpus: 6,
            cores_per_socket: 2,
            memory_mib: 2048,
            root_raw: root_raw.clone(),
            data_raw: data_raw.clone(),
            networks: vec![NETWORK.into()],
        },
        LinuxVmSeed {
            name: "linux-efi".into(),
            firmware: Firmware::Efi,
            secure_boot: true,
            cpus: 2,
            cores_per_socket: 1,
            memory_mib: 1024,
            root_raw: root_raw.clone(),
            data_raw: data_raw.clone(),
            networks: vec![NETWORK.into(), SECOND_NETWORK.into()],
        },
    ];
    let lab_dir = work.path().join("lab");
    for seed in &seeds {
        seed_linux_vm(&endpoint, &lab_dir, seed).await.unwrap();
    }

    let session = Session::connect(endpoint.connect_config(Duration::from_secs(120)).unwrap())
        .await
        .unwrap();
    let mut described = Vec::new();
    for seed in &seeds {
        let moref = inventory::find_vm(&session, &VmSelector::Name(seed.name.clone()))
            .await
            .unwrap();
        let vm = inventory::describe_vm(&session, &moref).await.unwrap();
        assert_shape(&vm, seed);
        described.push(vm);
    }
    // vcsim derives a disk's uuid from its path: distinct across VMs too.
    assert_ne!(described[0].disks[0].uuid, described[1].disks[0].uuid);

    // The disks read through Ferry's datastore code are the raw images, byte for byte.
    let vm = &described[1];
    for (disk, sha, bytes) in [
        (&vm.disks[0], &root_sha, ROOT_BYTES),
        (&vm.disks[1], &data_sha, DATA_BYTES),
    ] {
        let (got, read) = download_sha(&session, &vm.datacenter, &disk.file).await;
        assert_eq!((got.as_str(), read), (sha.as_str(), bytes), "{}", disk.file);
    }

    // Seeding again changes nothing: no VM is created, reconfigured or powered on, and the raw images stay.
    let calls = vcsim.dir().join(ferry_lab::vsphere::vcsim::CALLS_FILE);
    let before = writes(&calls);
    assert!(before >= 6, "the first seeding wrote {before} times");
    for seed in &seeds {
        seed_linux_vm(&endpoint, &lab_dir, seed).await.unwrap();
    }
    assert_eq!(writes(&calls), before);
    let again = inventory::describe_vm(
        &session,
        &inventory::find_vm(&session, &VmSelector::Name(seeds[0].name.clone()))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(again.disks, described[0].disks);
    assert!(root_raw.exists() && data_raw.exists());
    session.logout().await;
}
