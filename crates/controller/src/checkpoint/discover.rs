//! Discovering. Desired: the source VM found and described. Observed: the Provider, the VM by its selector, its
//! hardware, disks, NICs and power. Action: log in and read (nothing changes in vSphere). Recorded:
//! `status.source`, the disk list, the target VM name; SourceDiscovered.

use ferry_api::{
    DiskStatus, GuestGateway, GuestIpAddress, GuestNetworkStatus, Reason, SourceDisk, SourceNic,
    SourceVmStatus,
};
use ferry_vsphere::guest_network::GuestNic;
use ferry_vsphere::inventory::NicInfo;
use ferry_vsphere::{VmInfo, VmSelector};

use super::step::{Next, Step};
use super::support::source;
use crate::children;
use crate::error::{Failure, Result};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let provider = source::provider(step.ctx, step.vmm).await?;
    let session = source::session_for(step.ctx, &provider).await?;
    let selector = source::selector(step.vmm);
    let (moref, from_earlier_listing) = match &selector {
        VmSelector::Name(name) => step.ctx.find_vm_by_name(&provider, &session, name).await?,
        other => (
            ferry_vsphere::inventory::find_vm(&session, other).await?,
            false,
        ),
    };
    let described = ferry_vsphere::inventory::describe_vm(&session, &moref).await;
    let renamed =
        matches!((&described, &selector), (Ok(info), VmSelector::Name(n)) if &info.name != n);
    let gone = matches!(&described, Err(e) if e.reason() == Reason::VSphereObjectNotFound);
    if from_earlier_listing && (renamed || gone) {
        step.ctx.forget_vm_names(&provider).await;
        return Err(Failure::transient(
            Reason::SourceListingStale,
            format!("{selector} changed since the VMs were listed; listing them again"),
        ));
    }
    let info = described?;
    check_scope(&provider, &session, &moref, &info.name).await?;
    let source = source_status(&info, session.about().instance_uuid.clone());
    let message = format!(
        "found {} ({}): {} vCPU, {} MiB, {} disk(s), {} NIC(s), {:?}",
        source.name,
        source.moref,
        source.cpus,
        source.memory_mib,
        source.disks.len(),
        source.nics.len(),
        info.power_state
    );
    step.status.disks = disks(&source);
    step.status.source = Some(source);
    step.status.target_vm = Some(children::vm_name(step.vmm));
    Ok(Next::advance("SourceFound", message))
}

/// A Provider with a scope lends only the VMs inside it: any other is refused before anything touches it.
async fn check_scope(
    provider: &ferry_api::Provider,
    session: &ferry_vsphere::Session,
    vm: &ferry_vsphere::MoRef,
    name: &str,
) -> Result<()> {
    let Some(scope) = &provider.spec.scope else {
        return Ok(());
    };
    let placed = ferry_vsphere::inventory::placement(session, vm).await?;
    if scope.admits(&placed.folder, placed.resource_pool.as_deref()) {
        return Ok(());
    }
    Err(Failure::permanent(
        Reason::SourceVMOutOfScope,
        format!(
            "VM {name} ({}) sits in folder {} and resource pool {}, outside Provider {}'s scope (folders {:?}, \
             clusters {:?}, resource pools {:?}); it was not touched",
            vm.value,
            placed.folder,
            placed.resource_pool.as_deref().unwrap_or("none"),
            provider.metadata.name.as_deref().unwrap_or_default(),
            scope.folders,
            scope.clusters,
            scope.resource_pools
        ),
    ))
}

/// What discovery records, from the vSphere description and the endpoint's instance UUID.
pub fn source_status(info: &VmInfo, vcenter_uuid: Option<String>) -> SourceVmStatus {
    SourceVmStatus {
        name: info.name.clone(),
        moref: info.moref.clone(),
        uuid: info.uuid.clone(),
        instance_uuid: info.instance_uuid.clone(),
        vcenter_uuid,
        guest_os: info.guest_id.clone(),
        firmware: Some(info.firmware),
        secure_boot: info.efi_secure_boot.unwrap_or(false),
        vtpm: info.vtpm,
        change_tracking: info.change_tracking,
        boot_order: info.boot_order.clone(),
        datacenter: Some(info.datacenter.clone()),
        host: info.host.as_ref().map(|h| h.name.clone()),
        host_moref: info.host.as_ref().map(|h| h.moref.clone()),
        cpus: info.cpus,
        cores_per_socket: info.cores_per_socket,
        memory_mib: info.memory_mib,
        snapshots: info.snapshots as i32,
        disks: info
            .disks
            .iter()
            .map(|d| SourceDisk {
                key: d.key,
                file: d.file.clone(),
                capacity_bytes: d.capacity_bytes,
                controller: Some(d.controller.clone()),
                bus: Some(d.bus.clone()),
                uuid: d.uuid.clone(),
                backing: Some(d.backing.clone()),
                thin: d.thin,
                snapshot_chain: d.parents.len() as i32,
            })
            .collect(),
        nics: info
            .nics
            .iter()
            .map(|n| SourceNic {
                mac: n.mac.clone(),
                network: n.network.clone(),
                model: Some(n.model.clone()),
                ip_addresses: reported_nic(info, n)
                    .map(|g| {
                        g.addresses
                            .iter()
                            .map(|a| GuestIpAddress {
                                address: a.address.clone(),
                                prefix_length: i32::from(a.prefix_length),
                                origin: a.origin.clone(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect(),
        guest_network: guest_network(info),
    }
}

/// What the tools reported for the VM's NIC `nic`: the guest interface with its device key, or else its MAC.
fn reported_nic<'a>(info: &'a VmInfo, nic: &NicInfo) -> Option<&'a GuestNic> {
    let reported = &info.guest_network.nics;
    reported
        .iter()
        .find(|g| g.device_key == Some(nic.key))
        .or_else(|| {
            reported
                .iter()
                .find(|g| g.mac.eq_ignore_ascii_case(&nic.mac))
        })
}

/// The guest's default gateways (each NIC as an index into the VM's NICs) and name servers; none when the tools
/// reported neither.
fn guest_network(info: &VmInfo) -> Option<GuestNetworkStatus> {
    let reported = &info.guest_network;
    let vm_nic = |guest_index: usize| {
        let guest = reported.nics.get(guest_index)?;
        info.nics
            .iter()
            .position(|n| reported_nic(info, n) == Some(guest))
            .map(|i| i as i32)
    };
    let status = GuestNetworkStatus {
        default_gateways: reported
            .default_gateways
            .iter()
            .map(|g| GuestGateway {
                address: g.address.clone(),
                nic: g.nic.and_then(vm_nic),
            })
            .collect(),
        dns_servers: reported.dns_servers.clone(),
    };
    (!status.default_gateways.is_empty() || !status.dns_servers.is_empty()).then_some(status)
}

/// The disk list discovery records: one entry per source disk, nothing staged yet.
pub fn disks(source: &SourceVmStatus) -> Vec<DiskStatus> {
    source
        .disks
        .iter()
        .enumerate()
        .map(|(i, d)| DiskStatus {
            index: i as i32,
            source_file: d.file.clone(),
            capacity_bytes: d.capacity_bytes,
            ..Default::default()
        })
        .collect()
}
