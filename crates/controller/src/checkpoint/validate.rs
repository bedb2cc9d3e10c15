//! Validating (preflight). Desired: everything that can fail early was checked. Observed: the discovered source,
//! the network map and the Multus networks' NetworkAttachmentDefinitions, the StorageClass, name collisions, the staging store. Action: none (pure checks and reads).
//! Recorded: Validated, or a specific reason before any side effect.

use std::collections::BTreeSet;

use ferry_api::foreign::{nad_namespaced_name, nad_resource};
use ferry_api::{
    ConditionType, DiskStorage, FirstBootToolSource, GuestAdaptation, MountedFiles, NetworkMap,
    NetworkMapSpec, NetworkMapping, Reason, SourceVmStatus, StorageMap, StorageMapSpec,
    VirtioWinSource, VirtualMachineMigration,
};
use ferry_datapath::staging::{PartPlan, too_large_message};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};

use super::step::{Next, Step};
use crate::build::{dv_resource, vm_resource};
use crate::children;
use crate::error::{Failure, Result};
use crate::maps;
use warnings::{
    check_static_addresses, static_address_not_kept, warn, warn_if_plain_http, warn_if_vtpm,
};

mod warnings;

const FLAT_BACKINGS: [&str; 3] = [
    "VirtualDiskFlatVer2BackingInfo",
    "VirtualDiskSparseVer2BackingInfo",
    "VirtualDiskSeSparseBackingInfo",
];

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let source = super::support::source::recorded(step.status)?;
    check_source(step.vmm, &source)?;
    super::support::disk_files::check(step, &source).await?;
    let (network_map, storage_map) = read_maps(step).await?;
    let networks = check_networks(step.vmm, network_map.as_ref(), &source)?;
    check_network_attachments(step, &networks).await?;
    let static_on_pod = check_static_addresses(step.vmm, &source, &networks)?;
    let storage = check_storage(step.vmm, storage_map.as_ref(), &source)?;
    let storage_class = check_storage_classes(step, &storage).await?;
    check_adaptation_claims(step).await?;
    check_collisions(step).await?;
    warn_if_vtpm(step, &source);
    if let Some(message) = static_on_pod {
        warn(
            step,
            ConditionType::StaticAddressOnPodNetwork,
            "StaticAddressOnPodNetwork",
            message,
        );
    }
    if let Some((reason, message)) = static_address_not_kept(step.vmm, &source, &networks) {
        warn(step, ConditionType::StaticAddressNotKept, reason, message);
    }
    let route = if crate::staging::staged(step.vmm) {
        let staging = crate::staging::open(step.ctx, step.vmm).await?;
        staging.head("preflight").await?;
        warn_if_plain_http(step);
        "staging reachable"
    } else {
        "each disk goes straight into its volume"
    };
    step.status.networks = networks;
    for (disk, placement) in step.status.disks.iter_mut().zip(storage) {
        disk.storage = Some(placement);
    }
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
    let conversion = &vmm.spec.conversion;
    for path in [
        conversion
            .virtio_win
            .as_ref()
            .map(MountedFiles::relative_path),
        conversion
            .first_boot_tool
            .as_ref()
            .map(MountedFiles::relative_path),
    ]
    .into_iter()
    .flatten()
    {
        path.map_err(|message| Failure::fixable(Reason::InvalidConversionSpec, message))?;
    }
    let guest = source.guest_os.as_deref().unwrap_or_default();
    // Fixable: nothing has happened to the source yet, and naming what is missing in place lets it go on.
    if guest.starts_with("win") && conversion.virtio_win.is_none() {
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
    if guest.starts_with("win") && conversion.first_boot_tool.is_none() {
        return Err(Failure::fixable(
            Reason::GuestFirstBootToolMissing,
            format!(
                "{} is a Windows guest ({guest}): adapting it needs the first-boot tool rhsrvany.exe (or \
                 pvvxsvc.exe), which runs virt-v2v's first-boot scripts (installing the drivers and the QEMU \
                 guest agent, removing VMware Tools); set spec.conversion.firstBootTool to the \
                 PersistentVolumeClaim (persistentVolumeClaim) or image (image) that holds it; or migrate it \
                 with guestAdaptation None",
                source.name
            ),
        ));
    }
    // Fixable by giving up on it; a source whose tools start reporting needs a new migration (discovery is done).
    if conversion.preserve_static_ips && source.nics.iter().all(|n| n.ip_addresses.is_empty()) {
        return Err(Failure::fixable(
            Reason::StaticIPsNotReported,
            format!(
                "spec.conversion.preserveStaticIPs is true, but VMware Tools reported no address for {} when it \
                 was discovered (the tools were not running, or the VM was off), so there is nothing to keep: \
                 start it with VMware Tools running and create the migration again, or set preserveStaticIPs \
                 false",
                source.name
            ),
        ));
    }
    let most = ferry_datapath::adapt::MAX_ADAPTED_DISKS;
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

/// The claims `conversion.virtioWin` and `conversion.firstBootTool` name must exist before the source is
/// touched: the adaptation Job's pod would wait for them forever.
async fn check_adaptation_claims(step: &Step<'_>) -> Result<()> {
    let conversion = &step.vmm.spec.conversion;
    if conversion.guest_adaptation != GuestAdaptation::VirtV2v {
        return Ok(());
    }
    let named = [
        (
            conversion.virtio_win.as_ref().and_then(MountedFiles::claim),
            VirtioWinSource::FIELD,
            Reason::GuestDriversMissing,
            "the virtio-win ISO or its unpacked drivers",
        ),
        (
            conversion
                .first_boot_tool
                .as_ref()
                .and_then(MountedFiles::claim),
            FirstBootToolSource::FIELD,
            Reason::GuestFirstBootToolMissing,
            "rhsrvany.exe or pvvxsvc.exe",
        ),
    ];
    let ns = step.vmm.namespace().unwrap_or_default();
    let claims = Api::<PersistentVolumeClaim>::namespaced(step.ctx.client.clone(), &ns);
    for (name, field, reason, holding) in named {
        let Some(name) = name else { continue };
        match claims.get_opt(name).await? {
            Some(claim) if claim.metadata.deletion_timestamp.is_none() => {}
            found => {
                return Err(Failure::fixable(
                    reason,
                    format!(
                        "PersistentVolumeClaim {ns}/{name}, named by spec.{field}, {}; create it holding \
                         {holding} (or name another), and the migration resumes",
                        if found.is_some() {
                            "is being deleted"
                        } else {
                            "does not exist"
                        }
                    ),
                ));
            }
        }
    }
    Ok(())
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
    let most = ferry_datapath::report::MAX_WRITTEN_DISKS;
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
    check_warm(vmm, source)?;
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
    Ok(())
}

/// A warm migration needs Changed Block Tracking on the source (or leave to turn it on), and its rounds' reports
/// must fit a termination message.
fn check_warm(vmm: &VirtualMachineMigration, source: &SourceVmStatus) -> Result<()> {
    let Some(warm) = &vmm.spec.warm else {
        return Ok(());
    };
    let most = ferry_datapath::report::MAX_ROUND_DISKS;
    if source.disks.len() > most {
        return Err(Failure::permanent(
            Reason::TooManyDisksForWarm,
            format!(
                "{} has {} disks; a warm round reports at most {most}: migrate it cold (a new migration without \
                 spec.warm)",
                source.name,
                source.disks.len()
            ),
        ));
    }
    if !source.change_tracking && !warm.enable_change_tracking {
        return Err(Failure::fixable(
            Reason::ChangeTrackingOff,
            format!(
                "{} has Changed Block Tracking off, which warm migration needs: set spec.warm.enableChangeTracking \
                 to let Ferry turn it on (and off again at the end), and the migration resumes",
                source.name
            ),
        ));
    }
    Ok(())
}

/// Where each NIC's network goes: the migration's entries, then the NetworkMap's. A gap is fixable when a map is
/// named (edit it, and the migration resumes), else permanent (the target is immutable).
pub fn check_networks(
    vmm: &VirtualMachineMigration,
    map: Option<&NetworkMapSpec>,
    source: &SourceVmStatus,
) -> Result<Vec<NetworkMapping>> {
    let map_name = vmm
        .spec
        .target
        .network_map_ref
        .as_ref()
        .map(|r| r.name.as_str());
    let refuse = |reason, message: String| match map_name {
        Some(_) => Failure::fixable(reason, message),
        None => Failure::permanent(reason, message),
    };
    let fix = match map_name {
        Some(name) => format!("add them to NetworkMap {name}, and the migration resumes"),
        None => {
            "map each in spec.target.networks or a NetworkMap (in a new migration: the target is \
                 immutable)"
                .into()
        }
    };
    let resolved =
        maps::resolve_networks(&vmm.spec.target, map, &source.nics).map_err(|uncovered| {
            refuse(
                Reason::NetworkNotMapped,
                format!(
                    "no mapping for source network(s) {} of {} (to pod, multus or ignored); {fix}",
                    uncovered.join(", "),
                    source.name
                ),
            )
        })?;
    let on_pod = source
        .nics
        .iter()
        .filter(|n| {
            resolved
                .iter()
                .any(|m| m.source == n.network && m.pod.is_some())
        })
        .count();
    if on_pod > 1 {
        return Err(refuse(
            Reason::MultiplePodNetworkNICs,
            format!(
                "{on_pod} NICs map to the pod network, which takes one; map the others to multus or ignored"
            ),
        ));
    }
    let ns = vmm.namespace().unwrap_or_default();
    let foreign = maps::foreign_networks(&resolved, &ns);
    if !foreign.is_empty() {
        return Err(refuse(
            Reason::NetworkNamespaceNotAllowed,
            format!(
                "Multus network(s) {} are in another namespace: a migration in {ns} may use its own \
                 namespace's networks and default's",
                foreign.join(", ")
            ),
        ));
    }
    Ok(resolved)
}

/// Each disk's StorageClass, volume mode and access mode: the migration's own, then its datastore's in the
/// StorageMap. A datastore the map does not cover waits for the map to be edited.
pub fn check_storage(
    vmm: &VirtualMachineMigration,
    map: Option<&StorageMapSpec>,
    source: &SourceVmStatus,
) -> Result<Vec<DiskStorage>> {
    let map_name = vmm
        .spec
        .target
        .storage_map_ref
        .as_ref()
        .map(|r| r.name.clone());
    let resolved =
        maps::resolve_storage(&vmm.spec.target, map, &source.disks).map_err(|uncovered| {
            Failure::fixable(
                Reason::DatastoreNotMapped,
                format!(
                    "StorageMap {} has no entry for datastore(s) {} of {}; add them (or set \
                 spec.target.storageClassName in a new migration), and the migration resumes",
                    map_name.unwrap_or_default(),
                    uncovered.join(", "),
                    source.name
                ),
            )
        })?;
    if maps::one_volume_mode(&resolved).is_none() {
        return Err(Failure::fixable(
            Reason::VolumeModesDiffer,
            format!(
                "the datastores of {} map to both Block and Filesystem volumes; one migration's disks take \
                 one volume mode: give them one in the StorageMap, and the migration resumes",
                source.name
            ),
        ));
    }
    Ok(resolved)
}

/// The maps the migration names, read now; a missing one waits for a person.
async fn read_maps(step: &Step<'_>) -> Result<(Option<NetworkMapSpec>, Option<StorageMapSpec>)> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let target = &step.vmm.spec.target;
    let network = match &target.network_map_ref {
        Some(r) => Some(
            Api::<NetworkMap>::namespaced(step.ctx.client.clone(), &ns)
                .get_opt(&r.name)
                .await?
                .ok_or_else(|| missing_map(Reason::NetworkMapNotFound, "NetworkMap", &ns, &r.name))?
                .spec,
        ),
        None => None,
    };
    let storage = match &target.storage_map_ref {
        Some(r) => Some(
            Api::<StorageMap>::namespaced(step.ctx.client.clone(), &ns)
                .get_opt(&r.name)
                .await?
                .ok_or_else(|| missing_map(Reason::StorageMapNotFound, "StorageMap", &ns, &r.name))?
                .spec,
        ),
        None => None,
    };
    Ok((network, storage))
}

fn missing_map(reason: Reason, kind: &str, ns: &str, name: &str) -> Failure {
    Failure::fixable(
        reason,
        format!(
            "{kind} {ns}/{name}, named by spec.target, does not exist; create it, and the migration resumes"
        ),
    )
}

/// Every Multus network's NetworkAttachmentDefinition must exist: without it the VM's launcher cannot attach the
/// NIC (Multus fails the pod's sandbox, or virt-launcher finds no pod link), which would show only after the source
/// was powered off and copied. A NAD the controller may not read (a namespaced
/// install that does not serve `default`) is left to KubeVirt.
async fn check_network_attachments(step: &Step<'_>, networks: &[NetworkMapping]) -> Result<()> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let mut missing = vec![];
    for multus in networks.iter().filter_map(|m| m.multus.as_ref()) {
        let (nad_ns, name) = nad_namespaced_name(&ns, &multus.network_name);
        let nads = Api::<DynamicObject>::namespaced_with(
            step.ctx.client.clone(),
            &nad_ns,
            &nad_resource(),
        );
        match nads.get_opt(&name).await {
            Ok(Some(_)) => {}
            Ok(None) => missing.push(format!("{nad_ns}/{name}")),
            Err(kube::Error::Api(e)) if e.code == 403 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    missing.dedup();
    Err(Failure::fixable(
        Reason::NetworkAttachmentDefinitionNotFound,
        format!(
            "NetworkAttachmentDefinition {} does not exist (KubeVirt could not attach the VM's NIC to it; is \
             Multus installed?); create it, and the migration resumes",
            missing.join(", ")
        ),
    ))
}

/// Every StorageClass the disks name must exist, and a default one when a disk names none.
async fn check_storage_classes(step: &Step<'_>, disks: &[DiskStorage]) -> Result<String> {
    let named: BTreeSet<Option<&str>> = disks
        .iter()
        .map(|d| d.storage_class_name.as_deref())
        .collect();
    let mut found = Vec::new();
    for class in named {
        found.push(check_storage_class(step, class).await?);
    }
    Ok(found.join(", "))
}

async fn check_storage_class(step: &Step<'_>, class: Option<&str>) -> Result<String> {
    let classes: Api<StorageClass> = Api::all(step.ctx.client.clone());
    match class {
        Some(name) => match classes.get_opt(name).await? {
            Some(_) => Ok(name.to_string()),
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
    // Our label and a controller owner reference to this migration: a label alone can be copied.
    let ours = |o: &DynamicObject| children::is_ours(o, step.vmm);
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
    // The first conversion Job's name, from the watch cache (no request): a Job left by an earlier migration of
    // the same name would otherwise be found only after the source was powered off. Any later Job in the way is
    // refused where it is used.
    let job = children::convert_job(step.vmm, 1);
    if let Some(found) = step.ctx.caches.job(&ns, &job)
        && !children::is_ours(&*found, step.vmm)
    {
        return Err(Failure::fixable(
            Reason::JobExists,
            format!("Job {ns}/{job} already exists and is not this migration's; delete it"),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use ferry_api::{SourceDisk, SourceNic};
    use serde_json::json;

    pub(super) fn vmm(networks: serde_json::Value) -> VirtualMachineMigration {
        VirtualMachineMigration::new(
            "m",
            serde_json::from_value(json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
            "target": {"networks": networks}, "staging": {"url": "s3://b/p"}}))
            .unwrap(),
        )
    }

    pub(super) fn source() -> SourceVmStatus {
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
                ip_addresses: vec![],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn keeping_static_addresses_is_refused_when_the_tools_reported_none() {
        let mut vmm = vmm(json!([]));
        vmm.spec.conversion = serde_json::from_value(
            json!({"guestAdaptation": "VirtV2v", "preserveStaticIPs": true}),
        )
        .unwrap();
        let mut source = source();
        let refused = check_adaptable(&vmm, &source).unwrap_err();
        assert_eq!(refused.reason, "StaticIPsNotReported");
        assert!(refused.fixable && refused.message.contains("VMware Tools reported no address"));
        source.nics[0].ip_addresses = vec![ferry_api::GuestIpAddress {
            address: "10.0.0.7".into(),
            prefix_length: 16,
            origin: "dhcp".into(),
        }];
        assert!(
            check_adaptable(&vmm, &source).is_ok(),
            "reported, if by DHCP: nothing static to keep, and nothing refused"
        );
    }

    fn reason(r: Result<()>) -> String {
        r.err().map(|f| f.reason.to_string()).unwrap_or_default()
    }

    fn networks(
        vmm: &VirtualMachineMigration,
        map: Option<&NetworkMapSpec>,
        source: &SourceVmStatus,
    ) -> String {
        reason(check_networks(vmm, map, source).map(|_| ()))
    }

    #[test]
    fn every_nic_must_be_mapped_and_only_one_on_the_pod_network() {
        assert_eq!(
            networks(&vmm(json!([])), None, &source()),
            "NetworkNotMapped"
        );
        let permanent = check_networks(&vmm(json!([])), None, &source()).unwrap_err();
        assert!(!permanent.fixable, "the target is immutable");
        assert_eq!(
            networks(
                &vmm(json!([{"source": "VM Network", "pod": {}}])),
                None,
                &source()
            ),
            ""
        );
        assert_eq!(
            networks(
                &vmm(json!([{"source": "VM Network", "ignored": {}}])),
                None,
                &source()
            ),
            ""
        );
        let mut two = source();
        two.nics.push(two.nics[0].clone());
        assert_eq!(
            networks(
                &vmm(json!([{"source": "VM Network", "pod": {}}])),
                None,
                &two
            ),
            "MultiplePodNetworkNICs"
        );
    }

    #[test]
    fn a_network_map_covers_what_the_migration_does_not_and_its_gaps_wait_for_an_edit() {
        let mut named = vmm(json!([]));
        named.metadata.namespace = Some("team-a".into());
        named.spec.target.network_map_ref = Some(ferry_api::LocalObjectReference {
            name: "nets".into(),
        });
        let map = |entries| {
            serde_json::from_value::<NetworkMapSpec>(json!({"networks": entries})).unwrap()
        };
        let covering =
            map(json!([{"source": "VM Network", "multus": {"networkName": "team-a/vlan10"}}]));
        let resolved = check_networks(&named, Some(&covering), &source()).unwrap();
        assert_eq!(resolved, covering.networks);
        let gap = check_networks(
            &named,
            Some(&map(json!([{"source": "other", "pod": {}}]))),
            &source(),
        )
        .unwrap_err();
        assert_eq!(
            (gap.reason.as_str(), gap.fixable),
            ("NetworkNotMapped", true)
        );
        assert!(
            gap.message.contains("VM Network") && gap.message.contains("NetworkMap nets"),
            "{}",
            gap.message
        );
        for (network, allowed) in [
            ("default/shared", true),
            ("team-b/vlan10", false),
            ("vlan10", true),
        ] {
            let map = map(json!([{"source": "VM Network", "multus": {"networkName": network}}]));
            let checked = check_networks(&named, Some(&map), &source());
            assert_eq!(checked.is_ok(), allowed, "{network}");
            if !allowed {
                assert_eq!(checked.unwrap_err().reason, "NetworkNamespaceNotAllowed");
            }
        }
    }

    #[test]
    fn a_datastore_no_storage_map_entry_covers_waits_for_an_edit() {
        let mut named = vmm(json!([]));
        named.spec.target.storage_map_ref = Some(ferry_api::LocalObjectReference {
            name: "disks".into(),
        });
        let map = |entries| {
            serde_json::from_value::<StorageMapSpec>(json!({"datastores": entries})).unwrap()
        };
        let covering = map(
            json!([{"source": "ds", "storageClassName": "ssd", "accessMode": "ReadWriteMany"}]),
        );
        let resolved = check_storage(&named, Some(&covering), &source()).unwrap();
        assert_eq!(resolved[0].storage_class_name.as_deref(), Some("ssd"));
        let gap = check_storage(
            &named,
            Some(&map(
                json!([{"source": "other", "storageClassName": "ssd"}]),
            )),
            &source(),
        )
        .unwrap_err();
        assert_eq!(
            (gap.reason.as_str(), gap.fixable),
            ("DatastoreNotMapped", true)
        );
        assert!(
            gap.message.contains("datastore(s) ds") && gap.message.contains("StorageMap disks"),
            "{}",
            gap.message
        );
        let mut two = source();
        two.disks.push(SourceDisk {
            file: "[fast] x/x_1.vmdk".into(),
            ..two.disks[0].clone()
        });
        let mixed = map(json!([{"source": "ds", "storageClassName": "ssd"},
            {"source": "fast", "storageClassName": "nvme", "volumeMode": "Block"}]));
        assert_eq!(
            reason(check_storage(&named, Some(&mixed), &two).map(|_| ())),
            "VolumeModesDiffer"
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
        let tool = json!({"persistentVolumeClaim": "virt-tools", "path": "rhsrvany.exe"});
        for drivers in [
            json!({"image": "quay.io/kubevirt/virtio-container-disk:v1.6.0", "path": "disk/virtio-win.iso"}),
            json!({"persistentVolumeClaim": "virtio-win"}),
        ] {
            let named = adapted(
                json!({"guestAdaptation": "VirtV2v", "virtioWin": drivers, "firstBootTool": tool}),
            );
            assert!(check_source(&named, &windows).is_ok(), "{drivers}");
            // The drivers alone are not enough: virt-v2v installs them through first-boot scripts.
            let no_tool = adapted(json!({"guestAdaptation": "VirtV2v", "virtioWin": drivers}));
            let refused = check_source(&no_tool, &windows).unwrap_err();
            assert_eq!(
                (refused.reason.as_str(), refused.fixable),
                ("GuestFirstBootToolMissing", true)
            );
            assert!(
                refused.message.contains("rhsrvany.exe")
                    && refused.message.contains("spec.conversion.firstBootTool"),
                "{}",
                refused.message
            );
        }
        let escaping = adapted(json!({"guestAdaptation": "VirtV2v",
            "virtioWin": {"persistentVolumeClaim": "virtio-win"},
            "firstBootTool": {"persistentVolumeClaim": "virt-tools", "path": "../x"}}));
        let refused = check_source(&escaping, &windows).unwrap_err();
        assert!(
            refused.message.contains("conversion.firstBootTool.path"),
            "{}",
            refused.message
        );
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
