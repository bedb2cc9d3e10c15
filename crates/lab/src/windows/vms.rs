//! The phony Windows VMs in the lab's vcsim, shaped as vSphere makes Windows VMs: the guest ID of their version,
//! the system disk on a PVSCSI controller, a vmxnet3 NIC, BIOS or EFI with Secure Boot (and Windows 11's vTPM),
//! powered on, and VMware Tools reporting the guest's address (static on Windows Server, DHCP on Windows 11).

use std::path::Path;

use std::time::Duration;

use anyhow::{Context, Result};
use ferry_api::Firmware;
use ferry_vsphere::provision::{self, NewVm};
use ferry_vsphere::{Session, VmSelector, inventory, power};

use super::phony::{PhonyFixtures, ensure_phony_windows};
use super::{ALL, PhonyWindows, TOOLS_DNS, TOOLS_GATEWAY};
use crate::vsphere::linux_vms::{DATASTORE, HOST, NETWORK, seed_from_raws};
use crate::vsphere::tools_network::{self, ToolsReport};
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
        vtpm: guest.vtpm,
        host: HOST.into(),
        datastore: DATASTORE.into(),
        networks: vec![NETWORK.into()],
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
        report_guest_network(endpoint, &guest, true).await?;
    }
    Ok(fixtures)
}

/// Stands in for a person running `guest` in vSphere: powers it on, the guest leaves `leaving` as its disk (for a
/// hibernated guest booted and shut down fully, [`PhonyFixtures::shut_down_disk`]; its own disk to hibernate it
/// again), and powers it off.
pub async fn run_guest(
    endpoint: &VcsimEndpoint,
    guest: &PhonyWindows,
    leaving: &Path,
) -> Result<()> {
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(60))?).await?;
    let ran = async {
        let vm = inventory::find_vm(&session, &VmSelector::Name(guest.name.into())).await?;
        let timeout = Duration::from_secs(60);
        if power::current_power_state(&session, &vm).await? != ferry_api::PowerState::PoweredOn {
            power::power_on(&session, &vm, timeout).await?;
        }
        provision::relink_local_extent(&session, &vm, 0, leaving).await?;
        power::power_off(&session, &vm, timeout).await?;
        anyhow::Ok(())
    }
    .await
    .with_context(|| format!("running {} in vSphere", guest.name));
    session.logout().await;
    ran
}

/// Makes vcsim report what VMware Tools in `guest` would: its NIC's address with its origin, the default gateway
/// and the DNS server; with `running` false, nothing, as when the tools do not run.
pub async fn report_guest_network(
    endpoint: &VcsimEndpoint,
    guest: &PhonyWindows,
    running: bool,
) -> Result<()> {
    let address = guest.tools_address;
    let report = ToolsReport {
        address: address.address.into(),
        prefix_length: address.prefix_length,
        manual: address.manual,
        gateway: Some(TOOLS_GATEWAY.into()),
        dns_servers: vec![TOOLS_DNS.into()],
    };
    let reports = if running { vec![report] } else { vec![] };
    tools_network::report_guest_network(endpoint, guest.name, &reports).await
}
