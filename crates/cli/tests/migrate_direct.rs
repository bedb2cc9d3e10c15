//! The direct path end to end: no `spec.staging`, no S3 Secret in the namespace. Blank DataVolumes are allocated
//! before the source is touched, the conversion Job writes each disk into its volume (a `disk.img` on a
//! Filesystem volume, the device on a Block one), zeros stay holes, and every volume hashes to its source.

mod support;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

use ferry_api::{Phase, VirtualMachineMigration};
use ferry_lab::disks::{FlatVmdk, raw_to_flat_vmdk};
use ferry_testkit::migration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use support::*;

const MIB: u64 = 1 << 20;

/// A 1 GiB disk of which 900 MiB are zeros: 124 MiB of data in four runs, the rest holes.
fn mostly_zeros(dir: &Path, stem: &str) -> FlatVmdk {
    let raw = dir.join(format!("{stem}.raw"));
    let file = std::fs::File::create(&raw).unwrap();
    file.set_len(1024 * MIB).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut run = vec![0u8; 31 * MIB as usize];
    for (i, at) in [0u64, 200, 513, 993].into_iter().enumerate() {
        for byte in run.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *byte = (seed as u8) | (i as u8 + 1);
        }
        file.write_all_at(&run, at * MIB).unwrap();
    }
    drop(file);
    let sha = ferry_lab::disks::sha256_file(&raw).unwrap();
    raw_to_flat_vmdk(&raw, stem, sha, 1024 * MIB).unwrap()
}

/// The lab's migration of `vm` without staging, onto `volume_mode` volumes.
fn direct_migration(
    lab: &ferry_testkit::TestLab,
    ns: &str,
    name: &str,
    vm: &str,
    volume_mode: &str,
) -> serde_json::Value {
    let mut manifest = migration::migration(lab, ns, name, vm);
    manifest["spec"].as_object_mut().unwrap().remove("staging");
    manifest["spec"]["target"]["volumeMode"] = volume_mode.into();
    // PVSCSI becomes virtio-scsi: the lab's q35 boots from it.
    manifest["spec"]["target"]["devices"] = "Source".into();
    manifest
}

async fn migrate(
    client: &kube::Client,
    ns: &str,
    name: &str,
    manifest: serde_json::Value,
) -> VirtualMachineMigration {
    migration::apply(client, ns, manifest).await.unwrap();
    wait_for_phase(client, ns, name, Phase::Succeeded, Duration::from_secs(600)).await
}

#[tokio::test]
async fn three_disks_go_straight_into_filesystem_volumes_sparse_and_without_any_s3_secret() {
    let vm = "ferry-direct-fs";
    let (client, ns) = setup("direct-fs").await;
    let lab = lab().await;
    // Nothing in this namespace can reach the staging store.
    Api::<Secret>::namespaced(client.clone(), ns.name())
        .delete(
            ferry_lab::vsphere::demo::STAGING_SECRET,
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let dir = lab.dir().join(vm);
    std::fs::create_dir_all(&dir).unwrap();
    let boot = dir.join(format!("{}.raw", disk_stem(vm, 0)));
    let boot_sha = ferry_lab::vsphere::bootdisk::make_boot_disk(
        &boot,
        4 * MIB,
        &ferry_lab::vsphere::demo::marker(vm),
    )
    .unwrap();
    let disks = vec![
        raw_to_flat_vmdk(&boot, &disk_stem(vm, 0), boot_sha, 4 * MIB).unwrap(),
        mostly_zeros(&dir, &disk_stem(vm, 1)),
        ferry_lab::disks::make_flat_vmdk(&dir, &disk_stem(vm, 2), 3 * MIB, 7).unwrap(),
    ];
    provision_seeded(vm, &disks).await;

    let name = "direct-fs";
    let done = migrate(
        &client,
        ns.name(),
        name,
        direct_migration(lab, ns.name(), name, vm, "Filesystem"),
    )
    .await;
    let status = done.status.clone().unwrap();
    let phases: Vec<Phase> = status.checkpoints.iter().map(|c| c.phase).collect();
    assert!(
        phases
            .windows(2)
            .any(|w| w == [Phase::Allocating, Phase::Preparing]),
        "the volumes were allocated before the source was touched: {phases:?}"
    );
    assert_eq!(status.disks.len(), 3);
    for (disk, source) in status.disks.iter().zip(&disks) {
        assert!(disk.verified, "{disk:?}");
        assert_eq!(disk.sha256.as_deref(), Some(source.sha256.as_str()));
        assert!(disk.staged_url.is_none(), "nothing staged: {disk:?}");
        let image = volume_image(&client, ns.name(), disk.data_volume.as_deref().unwrap()).await;
        assert_eq!(
            sha256_prefix(&image, source.bytes),
            source.sha256,
            "disk {} in {}",
            disk.index,
            image.display()
        );
        let size = std::fs::metadata(&image).unwrap().len();
        assert!(size >= source.bytes, "{size} < {}", source.bytes);
    }
    // 900 MiB of zeros stayed holes.
    let zeros = volume_image(&client, ns.name(), &format!("{name}-disk-1")).await;
    let allocated = std::fs::metadata(&zeros).unwrap().blocks() * 512;
    println!(
        "1 GiB disk, 124 MiB of data: {} MiB allocated in its volume; {}",
        allocated / MIB,
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "DiskConverted")
            .map_or("", |c| c.message.as_str())
    );
    assert!(
        allocated < 200 * MIB,
        "{} MiB allocated for 124 MiB of data",
        allocated / MIB
    );
    assert!(
        staged_objects(ns.name(), name, &done.uid().unwrap(), 3)
            .await
            .is_empty()
    );
    assert!(
        guest_console(&client, ns.name(), name)
            .await
            .contains(&ferry_lab::vsphere::demo::marker(vm)),
        "the guest booted from its first volume"
    );
}

#[tokio::test]
async fn three_disks_go_straight_into_block_volumes_over_their_stale_bytes() {
    let vm = "ferry-direct-block";
    let (client, ns) = setup("direct-block").await;
    let lab = lab().await;
    let sources = seed_vm(&lab.dir().join(vm), vm, &[4, 2, 3]).await;
    let name = "direct-block";
    let done = migrate(
        &client,
        ns.name(),
        name,
        direct_migration(lab, ns.name(), name, vm, "Block"),
    )
    .await;
    let status = done.status.clone().unwrap();
    for (disk, (_, sha)) in status.disks.iter().zip(&sources) {
        assert!(disk.verified, "{disk:?}");
        assert_eq!(disk.sha256.as_ref(), Some(sha));
        // The lab's device is a file that CDI left unzeroed, with stale bytes over the disk's range.
        let device = volume_image(&client, ns.name(), disk.data_volume.as_deref().unwrap()).await;
        assert!(
            device.is_file() && device.file_name().unwrap() == "block",
            "{}",
            device.display()
        );
        assert_eq!(
            &sha256_prefix(&device, disk.capacity_bytes as u64),
            sha,
            "disk {}",
            disk.index
        );
    }
    assert!(
        guest_console(&client, ns.name(), name)
            .await
            .contains(&ferry_lab::vsphere::demo::marker(vm)),
        "the guest booted from its first volume"
    );
}

/// Local storage without volume populators (no `CSIDriver` for its provisioner: CDI's legacy path) keeps a blank
/// volume `WaitForFirstConsumer`, and CDI v1.65.0's importer makes `disk.img` (or, preallocating, zeroes a Block
/// device) only once the claim's first consumer has ended. So Ferry's own first-consumer Job binds every disk's
/// claim on one node, and the conversion pod writes only once CDI says `Succeeded`: as the first consumer it would
/// find no image (a failed attempt), or have its writes zeroed.
#[tokio::test]
async fn a_wait_for_first_consumer_class_without_populators_is_bound_by_a_first_consumer_that_writes_nothing()
 {
    let class = ferry_lab::standins::cdi::WFFC_STORAGE_CLASS;
    let bound_by = wait_for_first_consumer("ferry-direct-wffc", "direct-wffc", class).await;
    assert_eq!(bound_by, vec!["direct-wffc-bind".to_string()]);
}

/// With populators (a `CSIDriver` for the class's provisioner) the claim binds only once populated, so the
/// conversion pod is the first consumer: no Job of Ferry's binds it.
#[tokio::test]
async fn a_wait_for_first_consumer_class_with_populators_binds_the_volumes_where_the_conversion_pod_runs()
 {
    let class = ferry_lab::standins::cdi::POPULATED_WFFC_STORAGE_CLASS;
    let bound_by = wait_for_first_consumer("ferry-direct-wffc-csi", "direct-wffc-csi", class).await;
    assert_eq!(bound_by, Vec::<String>::new());
}

/// Migrates `vm` (two disks) into `class` and checks what it must hold whoever bound the claims: every claim on
/// the node its first consumer ran on, every volume equal to its source, the guest booted. Returns the
/// migration's first-consumer Jobs that ran (from the Job controller's Events).
async fn wait_for_first_consumer(vm: &str, name: &str, class: &str) -> Vec<String> {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
    let (client, ns) = setup(name).await;
    let lab = lab().await;
    let sources = seed_vm(&lab.dir().join(vm), vm, &[4, 2]).await;
    let mut manifest = direct_migration(lab, ns.name(), name, vm, "Filesystem");
    manifest["spec"]["target"]["storageClassName"] = class.into();
    let done = migrate(&client, ns.name(), name, manifest).await;
    let status = done.status.clone().unwrap();
    // One conversion attempt: it never met a volume CDI had not made yet (the worker never creates `disk.img`, so
    // a conversion pod that is the legacy path's first consumer fails, and CDI then makes the image).
    let retries = status.retry.as_ref().map(|r| r.budget_used.clone());
    assert!(
        retries.iter().flatten().all(|b| b.used == 0),
        "retries spent: {retries:?}"
    );
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns.name());
    for (disk, (_, sha)) in status.disks.iter().zip(&sources) {
        assert!(disk.verified, "{disk:?}");
        let dv = disk.data_volume.as_deref().unwrap();
        let claim = claims.get(dv).await.unwrap();
        assert_eq!(
            claim
                .annotations()
                .get(ferry_lab::standins::cdi::SELECTED_NODE),
            Some(&"lab-node".to_string()),
            "{dv} was bound for its first consumer"
        );
        let image = volume_image(&client, ns.name(), dv).await;
        assert_eq!(&sha256_prefix(&image, disk.capacity_bytes as u64), sha);
    }
    assert!(
        guest_console(&client, ns.name(), name)
            .await
            .contains(&ferry_lab::vsphere::demo::marker(vm)),
        "the guest booted from its first volume"
    );
    // Nothing of the first consumer is left once the migration is done.
    let jobs = Api::<Job>::namespaced(client.clone(), ns.name())
        .list(&Default::default())
        .await
        .unwrap();
    let names: Vec<String> = jobs.items.iter().map(|j| j.name_any()).collect();
    assert!(
        !names.iter().any(|n| n.ends_with("-bind")),
        "left behind: {names:?}"
    );
    let events = Api::<Event>::namespaced(client.clone(), ns.name())
        .list(&Default::default())
        .await
        .unwrap();
    let mut bound_by: Vec<String> = events
        .items
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("Job"))
        .filter_map(|e| e.involved_object.name.clone())
        .filter(|job| job.ends_with("-bind"))
        .collect();
    bound_by.dedup();
    bound_by
}

#[tokio::test]
async fn a_provider_lent_from_another_namespace_migrates_and_its_credentials_leave_with_the_conversion()
 {
    let vm = "ferry-direct-lent";
    let (client, ns) = setup("direct-lent").await;
    let lab = lab().await;
    // The tenant holds no vCenter credentials of its own: the Provider and its Secret live in the lender's
    // namespace.
    let lender = lab.namespace("lender").await;
    migration::create_provider(&client, lab, lender.name())
        .await
        .unwrap();
    Api::<ferry_api::Provider>::namespaced(client.clone(), ns.name())
        .delete(ferry_lab::vsphere::demo::PROVIDER, &DeleteParams::default())
        .await
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns.name())
        .delete(
            ferry_lab::vsphere::demo::VSPHERE_SECRET,
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let dir = lab.dir().join(vm);
    std::fs::create_dir_all(&dir).unwrap();
    let boot = dir.join(format!("{}.raw", disk_stem(vm, 0)));
    let boot_sha = ferry_lab::vsphere::bootdisk::make_boot_disk(
        &boot,
        4 * MIB,
        &ferry_lab::vsphere::demo::marker(vm),
    )
    .unwrap();
    let disks = vec![raw_to_flat_vmdk(&boot, &disk_stem(vm, 0), boot_sha, 4 * MIB).unwrap()];
    provision_seeded(vm, &disks).await;

    let name = "direct-lent";
    let mut manifest = direct_migration(lab, ns.name(), name, vm, "Filesystem");
    manifest["spec"]["source"]["providerRef"] =
        serde_json::json!({"name": ferry_lab::vsphere::demo::PROVIDER, "namespace": lender.name()});
    let done = migrate(&client, ns.name(), name, manifest).await;
    let status = done.status.clone().unwrap();
    assert_eq!(
        status.disks[0].sha256.as_deref(),
        Some(disks[0].sha256.as_str())
    );

    // The conversion Job read a copy made in the tenant's namespace, gone once the Job was done.
    let copy = format!("{name}-source-credentials");
    let secrets = lab.audit_requests_by("system:serviceaccount:ferry-system:ferry");
    let copy_requests: Vec<_> = secrets
        .iter()
        .filter(|r| r.resource == "secrets" && r.namespace == ns.name() && r.name == copy)
        .map(|r| (r.verb.as_str(), r.code))
        .collect();
    assert!(
        copy_requests.contains(&("create", 201)) && copy_requests.contains(&("delete", 200)),
        "{copy_requests:?}"
    );
    assert!(
        Api::<Secret>::namespaced(client.clone(), ns.name())
            .get_opt(&copy)
            .await
            .unwrap()
            .is_none()
    );
}
