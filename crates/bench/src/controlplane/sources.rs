//! The benchmark's source VMs: vcsim's own VMs (its `-vm` per host and per resource pool), each given one real
//! 1 MiB disk in place of the simulator's empty one, so every conversion reads and checks real bytes.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ferry_lab::VcsimEndpoint;
use ferry_vsphere::soap::MoRef;
use ferry_vsphere::{Session, inventory, props, provision};
use futures::{StreamExt, TryStreamExt};

/// Disk uploads and reconfigurations in flight at once while seeding.
const SEEDING_PARALLEL: usize = 16;
pub const DISK_BYTES: u64 = 1 << 20;

/// `count` VMs (name, reference), each with one 1 MiB disk, powered on.
pub async fn source_vms(
    endpoint: &VcsimEndpoint,
    dir: &Path,
    count: usize,
) -> Result<Vec<(String, MoRef)>> {
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(120))?).await?;
    let disk = ferry_lab::disks::make_flat_vmdk(dir, "bench-disk", DISK_BYTES, 1)?;
    // One listing for all: finding each VM by name would list them all N times.
    let mut vms: Vec<(String, MoRef)> = props::retrieve_all(&session, "VirtualMachine", &["name"])
        .await?
        .into_iter()
        .filter_map(|o| Some((o.text("name")?.to_string(), o.obj.clone())))
        .collect();
    if vms.len() < count {
        bail!("vcsim holds {} VMs, {count} wanted", vms.len());
    }
    vms.sort_by_key(|(name, _)| natural(name));
    vms.truncate(count);
    futures::stream::iter(vms.iter().map(|(name, vm)| {
        let (session, disk) = (&session, &disk);
        async move {
            let original: Vec<i32> = inventory::describe_vm(session, vm)
                .await?
                .disks
                .iter()
                .map(|d| d.key)
                .collect();
            provision::attach_flat_vmdk(session, vm, &disk.descriptor, &disk.extent)
                .await
                .with_context(|| format!("attaching a disk to {name}"))?;
            provision::remove_disks(session, vm, &original).await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(SEEDING_PARALLEL)
    .try_collect::<Vec<()>>()
    .await?;
    power_on(&session, &vms).await?;
    session.logout().await;
    Ok(vms)
}

/// Powers every VM on (the floor leaves them off, as a migration does).
pub async fn power_on(session: &Session, vms: &[(String, MoRef)]) -> Result<()> {
    futures::stream::iter(vms.iter().map(|(_, vm)| async move {
        ferry_vsphere::power::power_on(session, vm, Duration::from_secs(60)).await
    }))
    .buffer_unordered(SEEDING_PARALLEL)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

/// Orders `DC0_H0_VM10` after `DC0_H0_VM9`, so the first N are the same in every run.
fn natural(name: &str) -> (String, u64) {
    let digits = name.len() - name.chars().rev().take_while(char::is_ascii_digit).count();
    (
        name[..digits].to_string(),
        name[digits..].parse().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbered_names_sort_by_number() {
        let mut names = vec!["DC0_H0_VM10", "DC0_C0_RP0_VM1", "DC0_H0_VM9"];
        names.sort_by_key(|n| super::natural(n));
        assert_eq!(names, ["DC0_C0_RP0_VM1", "DC0_H0_VM9", "DC0_H0_VM10"]);
    }
}
