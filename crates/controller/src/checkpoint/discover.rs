//! Discovering. Desired: the source VM found and described. Observed: the Provider, the VM by its selector, its
//! hardware, disks, NICs and power. Action: log in and read (nothing changes in vSphere). Recorded:
//! `status.source`, the disk list, the target VM name; SourceDiscovered.

use ferry_api::{DiskStatus, Phase, SourceDisk, SourceNic, SourceVmStatus};
use ferry_vsphere::VmInfo;

use super::{Next, Step, power};
use crate::children;
use crate::error::Result;

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let session = power::session(step.ctx, step.vmm).await?;
    let moref = ferry_vsphere::inventory::find_vm(&session, &power::selector(step.vmm)).await?;
    let info = ferry_vsphere::inventory::describe_vm(&session, &moref).await?;
    let source = source_status(&info);
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
    Ok(Next::advance(Phase::Validating, "SourceFound", message))
}

/// What discovery records, from the vSphere description.
pub fn source_status(info: &VmInfo) -> SourceVmStatus {
    SourceVmStatus {
        name: info.name.clone(),
        moref: info.moref.clone(),
        uuid: info.uuid.clone(),
        instance_uuid: info.instance_uuid.clone(),
        guest_os: info.guest_id.clone(),
        firmware: Some(info.firmware),
        datacenter: Some(info.datacenter.clone()),
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
            })
            .collect(),
    }
}

fn disks(source: &SourceVmStatus) -> Vec<DiskStatus> {
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
