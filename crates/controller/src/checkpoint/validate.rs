//! Validating (preflight). Desired: everything that can fail early was checked. Observed: the discovered source,
//! the network map, the StorageClass, name collisions, the staging store. Action: none (pure checks and reads).
//! Recorded: Validated, or a specific reason before any side effect.

use std::collections::BTreeSet;

use ferry_api::{GuestAdaptation, Reason, SourceVmStatus, VirtualMachineMigration};
use ferry_datapath::staging::{PartPlan, too_large_message};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};

use super::{Next, Step};
use crate::build::{dv_resource, vm_resource};
use crate::children;
use crate::error::{Failure, Result};

const FLAT_BACKINGS: [&str; 3] = [
    "VirtualDiskFlatVer2BackingInfo",
    "VirtualDiskSparseVer2BackingInfo",
    "VirtualDiskSeSparseBackingInfo",
];

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let source = super::source::recorded(step.status)?;
    check_source(step.vmm, &source)?;
    super::disk_files::check(step, &source).await?;
    let storage_class = check_storage_class(step).await?;
    check_virtio_win_claim(step).await?;
    check_collisions(step).await?;
    let route = if crate::staging::staged(step.vmm) {
        let staging = crate::staging::open(step.ctx, step.vmm).await?;
        staging.head("preflight").await?;
        "staging reachable"
    } else {
        "each disk goes straight into its volume"
    };
    Ok(Next::advance(
        "PreflightPassed",
        format!(
            "{} disk(s) supported and readable, every NIC mapped, StorageClass {storage_class}, {route}",
            source.disks.len()
        ),
    ))
}

/// What virt-v2v can adapt, as far as vSphere's description tells before the source is touched. The adaptation
/// Job checks again with its own inspection of the guest.
fn check_adaptable(vmm: &VirtualMachineMigration, source: &SourceVmStatus) -> Result<()> {
    let drivers = vmm.spec.conversion.virtio_win.as_ref();
    if let Some(drivers) = drivers {
        drivers
            .relative_path()
            .map_err(|message| Failure::fixable(Reason::InvalidConversionSpec, message))?;
    }
    let guest = source.guest_os.as_deref().unwrap_or_default();
    if guest.starts_with("win") && drivers.is_none() {
        // Fixable: nothing has happened to the source yet, and naming the drivers in place lets it go on.
        return Err(Failure::fixable(
            Reason::GuestDriversMissing,
            format!(
                "{} is a Windows guest ({guest}): adapting it needs the virtio-win drivers (viostor, vioscsi, \
                 netkvm, the QEMU guest agent's MSI); set spec.conversion.virtioWin to the PersistentVolumeClaim \
                 (persistentVolumeClaim) or image (image) that holds the virtio-win ISO or its unpacked \
                 contents, for example image quay.io/kubevirt/virtio-container-disk:<KubeVirt version>; or \
                 migrate it with guestAdaptation None, which keeps the devices it has drivers for",
                source.name
            ),
        ));
    }
    let most = super::adapt::MAX_DISKS;
    if source.disks.len() > most {
        return Err(Failure::permanent(
            Reason::GuestAdaptationUnsupported,
            format!(
                "{} has {} disks; an adapted VM has at most {most}",
                source.name,
                source.disks.len()
            ),
        ));
    }
    Ok(())
}

/// The claim `conversion.virtioWin` names must exist before the source is touched: the adaptation Job's pod
/// would wait for it forever.
async fn check_virtio_win_claim(step: &Step<'_>) -> Result<()> {
    if step.vmm.spec.conversion.guest_adaptation != GuestAdaptation::VirtV2v {
        return Ok(());
    }
    let Some(name) = step
        .vmm
        .spec
        .conversion
        .virtio_win
        .as_ref()
        .and_then(|d| d.persistent_volume_claim.as_deref())
    else {
        return Ok(());
    };
    let ns = step.vmm.namespace().unwrap_or_default();
    let claims = Api::<PersistentVolumeClaim>::namespaced(step.ctx.client.clone(), &ns);
    match claims.get_opt(name).await? {
        Some(claim) if claim.metadata.deletion_timestamp.is_none() => Ok(()),
        found => Err(Failure::fixable(
            Reason::GuestDriversMissing,
            format!(
                "PersistentVolumeClaim {ns}/{name}, named by spec.conversion.virtioWin, {}; create it holding \
                 the virtio-win ISO or its unpacked drivers (or name another), and the migration resumes",
                if found.is_some() {
                    "is being deleted"
                } else {
                    "does not exist"
                }
            ),
        )),
    }
}

/// The checks that need nothing but the spec and what discovery found.
pub fn check_source(vmm: &VirtualMachineMigration, source: &SourceVmStatus) -> Result<()> {
    if vmm.spec.conversion.guest_adaptation == GuestAdaptation::VirtV2v {
        check_adaptable(vmm, source)?;
    }
    if source.disks.is_empty() {
        return Err(Failure::permanent(
            Reason::NoDisks,
            format!("{} has no virtual disk to migrate", source.name),
        ));
    }
    let most = super::direct_convert::MAX_DISKS;
    if !crate::staging::staged(vmm) && source.disks.len() > most {
        return Err(Failure::permanent(
            Reason::TooManyDisksForDirect,
            format!(
                "{} has {} disks; written directly, at most {most} fit one conversion Job's report: set \
                 spec.staging in a new migration",
                source.name,
                source.disks.len()
            ),
        ));
    }
    for disk in &source.disks {
        let backing = disk.backing.as_deref().unwrap_or_default();
        if !backing.is_empty() && !FLAT_BACKINGS.contains(&backing) {
            return Err(Failure::permanent(
                Reason::UnsupportedDisk,
                format!(
                    "disk {} has backing {backing} (raw device mappings and other non-VMDK disks cannot be copied)",
                    disk.file
                ),
            ));
        }
        if disk.snapshot_chain > 0 || source.snapshots > 0 {
            return Err(Failure::permanent(
                Reason::SnapshotsPresent,
                format!(
                    "{} has {} snapshot(s); delete or consolidate them in vSphere, then create a new migration",
                    source.name,
                    source.snapshots.max(disk.snapshot_chain)
                ),
            ));
        }
        if disk.capacity_bytes <= 0 {
            return Err(Failure::permanent(
                Reason::UnsupportedDisk,
                format!("disk {} reports no capacity", disk.file),
            ));
        }
        // The conversion Job would refuse it too, but only after the VM was powered off.
        let capacity = disk.capacity_bytes as u64;
        if crate::staging::staged(vmm) && PartPlan::for_size(capacity).is_none() {
            return Err(Failure::permanent(
                Reason::DiskTooLargeToStage,
                too_large_message(&format!("disk {}", disk.file), capacity),
            ));
        }
    }
    let mapped: BTreeSet<&str> = vmm
        .spec
        .target
        .networks
        .iter()
        .map(|m| m.source.as_str())
        .collect();
    let unmapped: BTreeSet<&str> = source
        .nics
        .iter()
        .map(|n| n.network.as_str())
        .filter(|n| !mapped.contains(n))
        .collect();
    if !unmapped.is_empty() {
        return Err(Failure::permanent(
            Reason::NetworkNotMapped,
            format!(
                "no spec.target.networks entry for source network(s) {}; map each to pod, multus or ignored \
                 (in a new migration: the target is immutable)",
                unmapped.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let on_pod = source
        .nics
        .iter()
        .filter(|n| {
            vmm.spec
                .target
                .networks
                .iter()
                .any(|m| m.source == n.network && m.pod.is_some())
        })
        .count();
    if on_pod > 1 {
        return Err(Failure::permanent(
            Reason::MultiplePodNetworkNICs,
            format!(
                "{on_pod} NICs map to the pod network, which takes one; map the others to multus or ignored"
            ),
        ));
    }
    Ok(())
}

async fn check_storage_class(step: &Step<'_>) -> Result<String> {
    let classes: Api<StorageClass> = Api::all(step.ctx.client.clone());
    match &step.vmm.spec.target.storage_class_name {
        Some(name) => match classes.get_opt(name).await? {
            Some(_) => Ok(name.clone()),
            None => Err(Failure::fixable(
                Reason::StorageClassNotFound,
                format!("StorageClass {name} does not exist; create it, and the migration resumes"),
            )),
        },
        None => classes
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|c| {
                c.annotations().get("storageclass.kubernetes.io/is-default-class").map(String::as_str)
                    == Some("true")
            })
            .map(|c| format!("{} (the default)", c.name_any()))
            .ok_or_else(|| {
                Failure::fixable(
                    Reason::NoDefaultStorageClass,
                    "spec.target.storageClassName is not set and the cluster has no default StorageClass; \
                     mark one as default, and the migration resumes",
                )
            }),
    }
}

/// The VM and DataVolume names must be free, or already this migration's.
async fn check_collisions(step: &Step<'_>) -> Result<()> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let uid = children::uid(step.vmm);
    let ours = |o: &DynamicObject| o.labels().get(children::UID_LABEL) == Some(&uid);
    let vms = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vm_resource());
    let name = children::vm_name(step.vmm);
    if let Some(vm) = vms.get_opt(&name).await?
        && !ours(&vm)
    {
        return Err(Failure::fixable(
            Reason::TargetVMExists,
            format!(
                "VirtualMachine {ns}/{name} already exists and is not this migration's; delete or rename it"
            ),
        ));
    }
    let dvs = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &dv_resource());
    for disk in &step.status.disks {
        let dv = children::data_volume(step.vmm, disk.index);
        if let Some(found) = dvs.get_opt(&dv).await?
            && !ours(&found)
        {
            return Err(Failure::fixable(
                Reason::DataVolumeExists,
                format!(
                    "DataVolume {ns}/{dv} already exists and is not this migration's; delete it"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::{SourceDisk, SourceNic};
    use serde_json::json;

    fn vmm(networks: serde_json::Value) -> VirtualMachineMigration {
        VirtualMachineMigration::new(
            "m",
            serde_json::from_value(json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
            "target": {"networks": networks}, "staging": {"url": "s3://b/p"}}))
            .unwrap(),
        )
    }

    fn source() -> SourceVmStatus {
        SourceVmStatus {
            name: "x".into(),
            disks: vec![SourceDisk {
                file: "[ds] x/x.vmdk".into(),
                capacity_bytes: 1 << 20,
                backing: Some("VirtualDiskFlatVer2BackingInfo".into()),
                ..Default::default()
            }],
            nics: vec![SourceNic {
                mac: "m".into(),
                network: "VM Network".into(),
                model: None,
            }],
            ..Default::default()
        }
    }

    fn reason(r: Result<()>) -> String {
        r.err().map(|f| f.reason.to_string()).unwrap_or_default()
    }

    #[test]
    fn every_nic_must_be_mapped_and_only_one_on_the_pod_network() {
        assert_eq!(
            reason(check_source(&vmm(json!([])), &source())),
            "NetworkNotMapped"
        );
        assert!(
            check_source(
                &vmm(json!([{"source": "VM Network", "pod": {}}])),
                &source()
            )
            .is_ok()
        );
        assert!(
            check_source(
                &vmm(json!([{"source": "VM Network", "ignored": {}}])),
                &source()
            )
            .is_ok()
        );
        let mut two = source();
        two.nics.push(two.nics[0].clone());
        assert_eq!(
            reason(check_source(
                &vmm(json!([{"source": "VM Network", "pod": {}}])),
                &two
            )),
            "MultiplePodNetworkNICs"
        );
    }

    fn adapted(conversion: serde_json::Value) -> VirtualMachineMigration {
        let mut vmm = vmm(json!([{"source": "VM Network", "pod": {}}]));
        vmm.spec.conversion = serde_json::from_value(conversion).unwrap();
        vmm
    }

    #[test]
    fn a_windows_guest_is_adapted_only_with_the_virtio_win_drivers_named() {
        let mut windows = source();
        windows.guest_os = Some("windows2019srv_64Guest".into());
        let bare = adapted(json!({"guestAdaptation": "VirtV2v"}));
        let refused = check_source(&bare, &windows).unwrap_err();
        assert_eq!(refused.reason, "GuestDriversMissing");
        assert_eq!(refused.class, ferry_api::ErrorClass::Permanent);
        assert!(refused.fixable, "naming the drivers in place resumes it");
        assert!(
            refused.message.contains("windows2019srv_64Guest")
                && refused.message.contains("spec.conversion.virtioWin")
                && refused
                    .message
                    .contains("quay.io/kubevirt/virtio-container-disk"),
            "{}",
            refused.message
        );
        for drivers in [
            json!({"image": "quay.io/kubevirt/virtio-container-disk:v1.6.0", "path": "disk/virtio-win.iso"}),
            json!({"persistentVolumeClaim": "virtio-win"}),
        ] {
            let named = adapted(json!({"guestAdaptation": "VirtV2v", "virtioWin": drivers}));
            assert!(check_source(&named, &windows).is_ok(), "{drivers}");
        }
        // Not adapted: its devices stay ones it has drivers for, and nothing is asked of it.
        assert!(check_source(&adapted(json!({})), &windows).is_ok());
        // A Linux guest needs no drivers.
        assert!(check_source(&bare, &source()).is_ok());
    }

    #[test]
    fn a_virtio_win_path_outside_its_volume_is_refused() {
        for path in [
            "/disk/virtio-win.iso",
            "../virtio-win.iso",
            "disk/../../etc",
        ] {
            let escaping = adapted(json!({"guestAdaptation": "VirtV2v",
                "virtioWin": {"persistentVolumeClaim": "virtio-win", "path": path}}));
            assert_eq!(
                reason(check_source(&escaping, &source())),
                "InvalidConversionSpec",
                "{path}"
            );
        }
        let inside = adapted(json!({"guestAdaptation": "VirtV2v",
            "virtioWin": {"persistentVolumeClaim": "virtio-win", "path": "drivers..old/virtio-win.iso"}}));
        assert!(check_source(&inside, &source()).is_ok());
    }

    #[test]
    fn raw_device_mappings_snapshots_and_empty_vms_are_refused() {
        let ok = vmm(json!([{"source": "VM Network", "pod": {}}]));
        let mut rdm = source();
        rdm.disks[0].backing = Some("VirtualDiskRawDiskMappingVer1BackingInfo".into());
        assert_eq!(reason(check_source(&ok, &rdm)), "UnsupportedDisk");
        let mut snap = source();
        snap.snapshots = 1;
        assert_eq!(reason(check_source(&ok, &snap)), "SnapshotsPresent");
        let mut none = source();
        none.disks.clear();
        assert_eq!(reason(check_source(&ok, &none)), "NoDisks");
    }

    #[test]
    fn a_disk_too_large_for_s3_staging_is_refused_before_any_power_change() {
        let ok = vmm(json!([{"source": "VM Network", "pod": {}}]));
        const TIB: i64 = 1 << 40;
        for capacity in [1 << 30, 156 << 30, 2 * TIB, 43 * TIB] {
            let mut big = source();
            big.disks[0].capacity_bytes = capacity;
            assert!(check_source(&ok, &big).is_ok(), "{capacity}");
        }
        let mut huge = source();
        huge.disks.push(SourceDisk {
            file: "[ds] x/x_1.vmdk".into(),
            capacity_bytes: 60 * TIB,
            ..huge.disks[0].clone()
        });
        let refused = check_source(&ok, &huge).unwrap_err();
        assert_eq!(refused.reason, "DiskTooLargeToStage");
        assert_eq!(refused.class, ferry_api::ErrorClass::Permanent);
        assert!(
            refused
                .message
                .starts_with("disk [ds] x/x_1.vmdk is 60.0 TiB (65970697666560 bytes)"),
            "{}",
            refused.message
        );
        assert!(refused.message.contains("43.9 TiB"), "{}", refused.message);
    }
}
