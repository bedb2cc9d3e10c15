//! Demo VMs in the lab's vcsim: their empty simulator disks are replaced by real, bootable VMDKs, so a migrated
//! VM really boots and prints its marker. `DC0_H0_VM0` gets one disk; `DC0_H0_VM1` three of different sizes; the
//! cluster's two VMs get one small disk each (tests use them side by side).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{Session, seed};

use crate::standins::kubevirt::READY_MARKER;
use crate::vcsim::VcsimEndpoint;

/// (VM, disk sizes in MiB); the first disk boots.
pub const DEMO_VMS: [(&str, &[u64]); 4] = [
    ("DC0_H0_VM0", &[64]),
    ("DC0_H0_VM1", &[64, 32, 16]),
    ("DC0_C0_RP0_VM0", &[16]),
    ("DC0_C0_RP0_VM1", &[16]),
];

/// The marker a demo VM's boot disk prints.
pub fn marker(vm: &str) -> String {
    format!("{READY_MARKER} {vm}")
}

pub async fn seed_demo_vms(endpoint: &VcsimEndpoint, dir: &Path) -> Result<()> {
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(120))?).await?;
    let disks_dir = dir.join("demo-disks");
    std::fs::create_dir_all(&disks_dir)?;
    for (vm_name, sizes) in DEMO_VMS {
        let vm = inventory::find_vm(&session, &VmSelector::Name(vm_name.into())).await?;
        let original: Vec<i32> = inventory::describe_vm(&session, &vm)
            .await?
            .disks
            .iter()
            .map(|d| d.key)
            .collect();
        for (i, mib) in sizes.iter().enumerate() {
            let stem = format!("{vm_name}-demo-{i}");
            let (descriptor, extent) = (
                disks_dir.join(format!("{stem}.vmdk")),
                disks_dir.join(format!("{stem}-flat.vmdk")),
            );
            if !descriptor.exists() || !extent.exists() {
                let raw = disks_dir.join(format!("{stem}.raw"));
                let sha = if i == 0 {
                    crate::bootdisk::make_boot_disk(&raw, mib << 20, &marker(vm_name))?
                } else {
                    crate::disks::write_pattern(&raw, mib << 20, i as u64)?
                };
                crate::disks::raw_to_flat_vmdk(&raw, &stem, sha, mib << 20)?;
            }
            seed::attach_flat_vmdk(&session, &vm, &descriptor, &extent)
                .await
                .with_context(|| format!("attaching {stem} to {vm_name}"))?;
        }
        seed::remove_disks(&session, &vm, &original).await?;
    }
    session.logout().await;
    Ok(())
}
