//! A VM with twelve disks migrates, and every disk is verified against its source's sha256.
//!
//! A conversion Job used to report the list of its disks in its pod's termination message, which Kubernetes (and
//! the lab's kubelet stand-in) cuts at 4 KiB: from about seven disks on, the cut JSON did not parse, every attempt
//! ended `JobResultUnreadable`, and the migration failed once its retries were spent. The message is now a short
//! summary, and the controller reads each disk's result from its manifest in staging.

mod support;

use std::time::{Duration, Instant};

use ferry_api::{DiskStatus, Phase, VirtualMachineMigrationStatus};
use ferry_datapath::DiskResult;
use ferry_datapath::report::{JobReport, TERMINATION_MESSAGE_BYTES};
use ferry_datapath::staging::{SourceIdentity, StagedObject};
use ferry_testkit::migration;
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};
use support::*;

const VM: &str = "ferry-twelve-disks";
/// Small disks, so the test stays short; the first one boots and prints the VM's marker.
const SIZES_MIB: [u64; 12] = [4, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2];

/// The result a Job of an earlier release put in its termination message for `disk`.
fn as_earlier_releases_reported(
    disk: &DiskStatus,
    status: &VirtualMachineMigrationStatus,
) -> DiskResult {
    let sha = disk.sha256.clone().unwrap_or_default();
    let bytes = disk.bytes_moved as u64;
    let source = status.source.clone().unwrap_or_default();
    DiskResult {
        index: disk.index as u32,
        staged: StagedObject {
            url: disk.staged_url.clone().unwrap_or_default(),
            format: "raw".into(),
            object_sha256: Some(sha.clone()),
            object_bytes: bytes,
            source_sha256: sha,
            source_bytes: bytes,
            source: SourceIdentity {
                vm_uuid: source.uuid.or(source.instance_uuid).unwrap_or_default(),
                disk_file: disk.source_file.clone(),
                capacity_bytes: disk.capacity_bytes as u64,
            },
            e_tag: None,
            run: None,
            bytes_read: None,
        },
        bytes_read: bytes,
        skipped: false,
    }
}

#[tokio::test]
async fn a_vm_with_twelve_disks_migrates_and_every_disk_is_verified() {
    let started = Instant::now();
    let (client, ns) = setup("twelve").await;
    let lab = lab().await;
    let disks = seed_vm(&lab.dir().join(VM), VM, &SIZES_MIB).await;
    let seeded = started.elapsed();

    let name = "twelve";
    // The default (compatibility) devices: twelve SATA disks, over two AHCI controllers as libvirt spreads them.
    let manifest = migration::staged_migration(lab, ns.name(), name, VM);
    migration::apply(&client, ns.name(), manifest)
        .await
        .unwrap();
    let done = wait_for_phase(
        &client,
        ns.name(),
        name,
        Phase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
    let status = done.status.clone().unwrap();

    assert_eq!(status.disks.len(), disks.len());
    for disk in &status.disks {
        // Matched by file, not by position: each disk's recorded sha256 is its own source's.
        let (stem, sha) = disks
            .iter()
            .find(|(stem, _)| disk.source_file.ends_with(&format!("/{stem}.vmdk")))
            .unwrap_or_else(|| panic!("disk {} is none of the seeded ones: {disk:?}", disk.index));
        assert!(
            disk.verified,
            "disk {} ({stem}) not verified: {disk:?}",
            disk.index
        );
        assert_eq!(
            disk.sha256.as_ref(),
            Some(sha),
            "disk {} ({stem})",
            disk.index
        );
        let index = stem.rsplit_once('_').map_or(0, |(_, i)| i.parse().unwrap());
        assert_eq!(
            disk.bytes_moved as u64,
            SIZES_MIB[index] << 20,
            "disk {} ({stem}) was copied in this run",
            disk.index
        );
    }
    // No retry was spent: the first conversion Job's result was read.
    let retries: Vec<_> = status
        .retry
        .as_ref()
        .map(|r| r.budget_used.iter().filter(|b| b.used > 0).collect())
        .unwrap_or_default();
    assert!(retries.is_empty(), "{retries:?}");

    // The guest booted from the first disk and printed its marker.
    let vmi = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns.name(),
        &resource("kubevirt.io", "v1", "VirtualMachineInstance"),
    )
    .get(name)
    .await
    .unwrap();
    let marker = vmi
        .annotations()
        .get("lab.ferry.dev/serial-marker")
        .cloned()
        .unwrap_or_default();
    assert!(
        marker.contains(&ferry_lab::vsphere::demo::marker(VM)),
        "marker: {marker:?}"
    );

    // Why this failed before: what an earlier release's Job reported for these disks is over what Kubernetes
    // keeps of a termination message.
    let old = JobReport::Disks(
        status
            .disks
            .iter()
            .map(|d| as_earlier_releases_reported(d, &status))
            .collect(),
    );
    let old_bytes = old.to_json().len();
    assert!(old_bytes > TERMINATION_MESSAGE_BYTES, "{old_bytes}");

    println!(
        "twelve disks: seeded in {seeded:?}, migrated in {:?} (the list earlier releases reported: {old_bytes} \
         bytes)",
        started.elapsed() - seeded
    );
}
