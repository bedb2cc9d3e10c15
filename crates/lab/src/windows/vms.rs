//! The phony Windows VMs in the lab's vcsim, shaped as vSphere makes Windows VMs: the guest ID of their version,
//! the system disk on a PVSCSI controller, a vmxnet3 NIC, BIOS or EFI with Secure Boot, powered on.

use std::path::Path;

use anyhow::{Context, Result};
use ferry_api::Firmware;
use ferry_vsphere::provision::NewVm;

use super::phony::{PhonyFixtures, ensure_phony_windows};
use super::{ALL, PhonyWindows};
use crate::vsphere::linux_vms::{DATASTORE, HOST, NETWORK, seed_from_raws};
use crate::vsphere::vcsim::VcsimEndpoint;

/// The VM vSphere would have for `guest`: 2 vCPUs, and the memory its version needs.
pub fn new_vm(guest: &PhonyWindows) -> NewVm {
    NewVm {
        name: guest.name.into(),
        guest_id: guest.guest_id.into(),
        cpus: 2,
        cores_per_socket: 2,
        memory_mib: if guest.server() { 2048 } else { 4096 },
        firmware: guest.firmware,
        efi_secure_boot: guest.secure_boot && guest.firmware == Firmware::Efi,
        host: HOST.into(),
        datastore: DATASTORE.into(),
        network: NETWORK.into(),
    }
}

/// Builds the fixtures if needed and seeds every phony Windows VM into the lab's vcsim; returns the fixtures
/// (for the drivers and the first-boot tool). Seeding again changes nothing.
pub async fn seed_phony_windows_vms(endpoint: &VcsimEndpoint, dir: &Path) -> Result<PhonyFixtures> {
    let fixtures = tokio::task::spawn_blocking(|| ensure_phony_windows(None))
        .await?
        .context("building the lab's phony Windows guests")?;
    for guest in ALL {
        seed_from_raws(endpoint, dir, &new_vm(&guest), &[&fixtures.disk(&guest)]).await?;
    }
    Ok(fixtures)
}
