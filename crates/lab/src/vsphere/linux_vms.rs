//! Linux VMs in the lab's vcsim, shaped as vSphere makes them: root and data disks on a PVSCSI controller (units 0
//! and 1, booting from the root disk), a vmxnet3 NIC on the distributed port group, BIOS or EFI with or without
//! Secure Boot, powered on. Their disks are real guest images, turned into monolithicFlat VMDKs once per lab dir.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ferry_api::Firmware;
use ferry_vsphere::provision::{self, NewVm, Transfer, VmdkFiles};
use ferry_vsphere::{Session, power};

use crate::vsphere::tools_network::{ToolsReport, report_guest_network};
use crate::vsphere::vcsim::VcsimEndpoint;

/// Where the vCenter model puts them: the host of the demo VMs, its datastore, and the port group its VMs use.
pub const HOST: &str = "DC0_H0";
pub const DATASTORE: &str = "LocalDS_0";
pub const NETWORK: &str = "DC0_DVPG0";
pub const GUEST_ID: &str = "debian12_64Guest";
/// The lab's Linux VMs, named as their guests' hostnames.
pub const LINUX_BIOS_VM: &str = "ferry-linux-bios";
pub const LINUX_EFI_VM: &str = "ferry-linux-efi";
/// A BIOS VM whose guest gives `ens192` a static address (ifupdown), which VMware Tools reports as configured by
/// hand.
pub const LINUX_STATIC_VM: &str = "ferry-linux-static";
/// An EFI VM (Secure Boot) with two NICs, `ens192` on [`NETWORK`] and `ens224` on [`SECOND_NETWORK`], each with a
/// static address in a NetworkManager keyfile, which VMware Tools reports as configured by hand.
pub const LINUX_NM_VM: &str = "ferry-linux-nm";
/// The standard network of the lab's host, for a second NIC.
pub const SECOND_NETWORK: &str = "VM Network";

/// Seeds the lab's Linux VMs from the cached Debian images (built first if the recipe changed): a BIOS VM with 2
/// vCPUs as one socket of 2 cores, an EFI VM with Secure Boot on, a BIOS VM with a static address and an EFI VM
/// with two NICs with static addresses, all with 1 GiB of memory; the static ones' tools report their addresses.
pub async fn seed_lab_linux_vms(endpoint: &VcsimEndpoint, dir: &Path) -> Result<()> {
    let images =
        tokio::task::spawn_blocking(|| crate::vsphere::guest_image::ensure_guest_images(None))
            .await?
            .context("building the lab's Debian guest images")?;
    let seeds = [
        LinuxVmSeed {
            name: LINUX_BIOS_VM.into(),
            firmware: Firmware::Bios,
            secure_boot: false,
            cpus: 2,
            cores_per_socket: 2,
            memory_mib: 1024,
            root_raw: images.bios.root.clone(),
            data_raw: images.data.clone(),
            networks: vec![NETWORK.into()],
        },
        LinuxVmSeed {
            name: LINUX_EFI_VM.into(),
            firmware: Firmware::Efi,
            secure_boot: true,
            cpus: 2,
            cores_per_socket: 1,
            memory_mib: 1024,
            root_raw: images.efi.root.clone(),
            data_raw: images.data.clone(),
            networks: vec![NETWORK.into()],
        },
        LinuxVmSeed {
            name: LINUX_STATIC_VM.into(),
            firmware: Firmware::Bios,
            secure_boot: false,
            cpus: 2,
            cores_per_socket: 2,
            memory_mib: 1024,
            root_raw: images.static_ifupdown.root.clone(),
            data_raw: images.data.clone(),
            networks: vec![NETWORK.into()],
        },
        LinuxVmSeed {
            name: LINUX_NM_VM.into(),
            firmware: Firmware::Efi,
            secure_boot: true,
            cpus: 2,
            cores_per_socket: 1,
            memory_mib: 1024,
            root_raw: images.static_nm.root.clone(),
            data_raw: images.data.clone(),
            networks: vec![NETWORK.into(), SECOND_NETWORK.into()],
        },
    ];
    for seed in &seeds {
        seed_linux_vm(endpoint, dir, seed)
            .await
            .with_context(|| format!("seeding {}", seed.name))?;
    }
    for (vm, image) in [
        (LINUX_STATIC_VM, &images.static_ifupdown),
        (LINUX_NM_VM, &images.static_nm),
    ] {
        let reports: Vec<ToolsReport> = image
            .static_networks
            .iter()
            .map(|n| ToolsReport {
                address: n.address.clone(),
                prefix_length: n.prefix_length,
                manual: true,
                gateway: n.gateway.clone(),
                dns_servers: vec![],
            })
            .collect();
        report_guest_network(endpoint, vm, &reports).await?;
    }
    Ok(())
}

/// A Linux VM to seed: its shape and the raw images of its two disks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxVmSeed {
    pub name: String,
    pub firmware: Firmware,
    /// Only with EFI.
    pub secure_boot: bool,
    pub cpus: i32,
    /// Divides `cpus`, as vSphere requires.
    pub cores_per_socket: i32,
    pub memory_mib: i64,
    pub root_raw: PathBuf,
    pub data_raw: PathBuf,
    /// One NIC on each.
    pub networks: Vec<String>,
}

impl LinuxVmSeed {
    fn check(&self) -> Result<()> {
        if self.secure_boot && self.firmware != Firmware::Efi {
            bail!("{}: Secure Boot needs EFI firmware", self.name);
        }
        if self.cpus < 1 || self.cores_per_socket < 1 || self.cpus % self.cores_per_socket != 0 {
            bail!(
                "{}: {} vCPUs cannot have {} cores per socket",
                self.name,
                self.cpus,
                self.cores_per_socket
            );
        }
        Ok(())
    }
}

/// Creates `vm` in the lab's vcsim with its disks and powers it on. Seeding it again changes nothing.
pub async fn seed_linux_vm(endpoint: &VcsimEndpoint, dir: &Path, vm: &LinuxVmSeed) -> Result<()> {
    vm.check()?;
    let spec = NewVm {
        name: vm.name.clone(),
        guest_id: GUEST_ID.into(),
        cpus: vm.cpus,
        cores_per_socket: vm.cores_per_socket,
        memory_mib: vm.memory_mib,
        firmware: vm.firmware,
        efi_secure_boot: vm.secure_boot,
        vtpm: false,
        host: HOST.into(),
        datastore: DATASTORE.into(),
        networks: vm.networks.clone(),
    };
    seed_from_raws(endpoint, dir, &spec, &[&vm.root_raw, &vm.data_raw]).await
}

/// Creates `spec` in the lab's vcsim with disks made from raw images (each turned into a monolithicFlat VMDK
/// once per lab dir, named as vSphere names a VM's disks) and powers it on. Seeding it again changes nothing.
pub(crate) async fn seed_from_raws(
    endpoint: &VcsimEndpoint,
    dir: &Path,
    spec: &NewVm,
    raws: &[&Path],
) -> Result<()> {
    let cache = dir.join("linux-vms");
    std::fs::create_dir_all(&cache)?;
    let mut vmdks = vec![];
    for (index, raw) in raws.iter().enumerate() {
        let stem = match index {
            0 => spec.name.clone(),
            n => format!("{}_{n}", spec.name),
        };
        vmdks.push(flat_vmdk_once(raw, &cache, &stem)?);
    }
    let disks: Vec<VmdkFiles> = vmdks.iter().map(Vmdk::files).collect();
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(120))?).await?;
    let result = async {
        let moref =
            provision::provision_vm(&session, spec, &disks, Transfer::LinkIntoLocalDatastore)
                .await?;
        power::power_on(&session, &moref, Duration::from_secs(60)).await?;
        anyhow::Ok(())
    }
    .await
    .with_context(|| format!("seeding the VM {}", spec.name));
    session.logout().await;
    result
}

/// Creates a small VM `vm` (1 vCPU, 64 MiB, BIOS) on ESXi host `host`, its `disks` on one PVSCSI controller,
/// and powers it on: the tests' seeded VMs, whose first disk boots and prints the VM's marker.
pub async fn seed_flat_vm(
    endpoint: &VcsimEndpoint,
    vm: &str,
    disks: &[crate::disks::FlatVmdk],
    host: &str,
) -> Result<()> {
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(60))?).await?;
    let spec = NewVm {
        name: vm.into(),
        guest_id: GUEST_ID.into(),
        cpus: 1,
        cores_per_socket: 1,
        memory_mib: 64,
        firmware: Firmware::Bios,
        efi_secure_boot: false,
        vtpm: false,
        host: host.into(),
        datastore: DATASTORE.into(),
        networks: vec![NETWORK.into()],
    };
    let files: Vec<VmdkFiles> = disks
        .iter()
        .map(|d| VmdkFiles {
            descriptor: &d.descriptor,
            extent: &d.extent,
        })
        .collect();
    let result = async {
        let moref =
            provision::provision_vm(&session, &spec, &files, Transfer::LinkIntoLocalDatastore)
                .await?;
        power::power_on(&session, &moref, Duration::from_secs(60)).await?;
        anyhow::Ok(())
    }
    .await
    .with_context(|| format!("seeding VM {vm}"));
    session.logout().await;
    result
}

struct Vmdk {
    descriptor: PathBuf,
    extent: PathBuf,
}

impl Vmdk {
    fn files(&self) -> VmdkFiles<'_> {
        VmdkFiles {
            descriptor: &self.descriptor,
            extent: &self.extent,
        }
    }
}

/// `<stem>.vmdk` and `<stem>-flat.vmdk` in `cache`, converted from `raw` unless an earlier conversion of the
/// same raw file is there, unchanged. The raw file is left as it is.
fn flat_vmdk_once(raw: &Path, cache: &Path, stem: &str) -> Result<Vmdk> {
    let meta = std::fs::metadata(raw).with_context(|| format!("reading {}", raw.display()))?;
    let vmdk = Vmdk {
        descriptor: cache.join(format!("{stem}.vmdk")),
        extent: cache.join(format!("{stem}-flat.vmdk")),
    };
    // The raw file and the extent as they were (path, size, modification time): the extent is linked into
    // vcsim's datastore, and anything writing there would change it.
    let stamp = cache.join(format!("{stem}.source"));
    let state = || -> Option<String> {
        let extent = std::fs::metadata(&vmdk.extent).ok()?;
        vmdk.descriptor.exists().then_some(())?;
        Some(format!(
            "{}\n{}\n{}",
            raw.display(),
            identity(&meta),
            identity(&extent)
        ))
    };
    if state().is_some() && std::fs::read_to_string(&stamp).ok() == state() {
        return Ok(vmdk);
    }
    for stale in [&stamp, &vmdk.descriptor, &vmdk.extent] {
        remove_if_present(stale)?;
    }
    // `raw_to_flat_vmdk` removes the raw file it converts: it gets a link (or a sparse copy) of its own.
    let own = cache.join(format!("{stem}.raw"));
    remove_if_present(&own)?;
    if std::fs::hard_link(raw, &own).is_err() {
        let status = std::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(raw)
            .arg(&own)
            .status()
            .context("running cp")?;
        if !status.success() {
            bail!("copying {} to {}: {status}", raw.display(), own.display());
        }
    }
    // The checksum is the caller's to know; nothing here reads it.
    crate::disks::raw_to_flat_vmdk(&own, stem, String::new(), meta.len())?;
    std::fs::write(&stamp, state().context("the conversion left no VMDK")?)?;
    Ok(vmdk)
}

fn identity(meta: &std::fs::Metadata) -> String {
    format!("{} {}.{}", meta.len(), meta.mtime(), meta.mtime_nsec())
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_image_is_converted_once_and_again_when_it_or_its_vmdk_changes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (raw, cache) = (dir.path().join("root.raw"), dir.path().join("cache"));
        std::fs::create_dir_all(&cache).unwrap();
        let sha = crate::disks::write_pattern(&raw, 1 << 20, 1).unwrap();
        let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();

        let first = flat_vmdk_once(&raw, &cache, "vm").unwrap();
        assert_eq!(crate::disks::sha256_file(&first.extent).unwrap(), sha);
        assert!(raw.exists(), "the raw image is kept");
        let converted = inode(&first.extent);
        assert_eq!(
            inode(&flat_vmdk_once(&raw, &cache, "vm").unwrap().extent),
            converted
        );

        // Written through a link in vcsim's datastore: converted again.
        std::fs::write(&first.extent, b"overwritten").unwrap();
        let again = flat_vmdk_once(&raw, &cache, "vm").unwrap();
        assert_eq!(crate::disks::sha256_file(&again.extent).unwrap(), sha);

        // A rebuilt raw image: converted again, with its new bytes.
        let sha = crate::disks::write_pattern(&raw, 2 << 20, 2).unwrap();
        let rebuilt = flat_vmdk_once(&raw, &cache, "vm").unwrap();
        assert_eq!(crate::disks::sha256_file(&rebuilt.extent).unwrap(), sha);
    }

    #[test]
    fn shapes_vsphere_would_refuse_are_refused() {
        let ok = LinuxVmSeed {
            name: "vm".into(),
            firmware: Firmware::Efi,
            secure_boot: true,
            cpus: 6,
            cores_per_socket: 2,
            memory_mib: 512,
            root_raw: "root.raw".into(),
            data_raw: "data.raw".into(),
            networks: vec![NETWORK.into()],
        };
        ok.check().unwrap();
        for (bad, message) in [
            (
                LinuxVmSeed {
                    firmware: Firmware::Bios,
                    ..ok.clone()
                },
                "vm: Secure Boot needs EFI firmware",
            ),
            (
                LinuxVmSeed {
                    cores_per_socket: 4,
                    ..ok.clone()
                },
                "vm: 6 vCPUs cannot have 4 cores per socket",
            ),
            (
                LinuxVmSeed {
                    cpus: 0,
                    ..ok.clone()
                },
                "vm: 0 vCPUs cannot have 2 cores per socket",
            ),
        ] {
            assert_eq!(bad.check().unwrap_err().to_string(), message);
        }
    }
}
