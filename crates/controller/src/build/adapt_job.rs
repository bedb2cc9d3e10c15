//! The adaptation Job: `ferry adapt` with the migration's volumes (filesystem or block, either path), a scratch
//! emptyDir for virt-v2v's overlays and appliance, the source VM as discovery recorded it, and the virtio-win
//! drivers and the Windows first-boot tool read-only when the migration names them (`conversion.virtioWin`,
//! `conversion.firstBootTool`).

use std::path::{Component, Path, PathBuf};

use ferry_adapt::domain::{Bus, Firmware as DomainFirmware, Nic};
use ferry_adapt::interface_names::SourceNic;
use ferry_adapt::spec::{AdaptDisk, AdaptSpec, StaticIp};
use ferry_api::{DiskStatus, Firmware, MountedFiles, SourceVmStatus, VirtualMachineMigration};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, ImageVolumeSource, PersistentVolumeClaimVolumeSource, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::job::{QEMU_ID, Work, block, disk_path, job, mount, mount_disks};
use crate::children;

const SCRATCH: &str = "/scratch";
/// Where the volume `conversion.virtioWin` names is mounted, read-only.
const VIRTIO_WIN: &str = "/run/ferry/virtio-win";
/// Where the volume `conversion.firstBootTool` names is mounted, read-only.
const FIRST_BOOT_TOOL: &str = "/run/ferry/first-boot-tool";
/// Overlays hold what virt-v2v changes (a new initramfs, removed packages), and the appliance is about 300 MiB.
const SCRATCH_MIB: u64 = 8 * 1024;

/// virt-v2v's own work on a guest, beyond reading its disks: an hour covers the slowest seen under emulation.
const ADAPT_DEADLINE_SECONDS: i64 = 60 * 60;
/// libguestfs's appliance takes 1-2 GiB besides the worker itself.
const MEMORY_MIB: u64 = 4096;

/// What `ferry adapt` runs with: each volume and the source sha256 it must still hold (`disks`, as verified).
pub fn adapt_spec(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    disks: &[DiskStatus],
) -> AdaptSpec {
    AdaptSpec {
        name: source.name.clone(),
        memory_mib: source.memory_mib.max(0) as u64,
        cpus: source.cpus.max(1) as u32,
        firmware: match source.firmware {
            Some(Firmware::Efi) => DomainFirmware::Efi,
            _ => DomainFirmware::Bios,
        },
        disks: disks
            .iter()
            .map(|disk| AdaptDisk {
                path: disk_path(vmm, disk.index as u32).into(),
                block: block(vmm),
                bus: Bus::from_source(
                    source
                        .disks
                        .get(disk.index as usize)
                        .and_then(|d| d.bus.as_deref()),
                ),
                size_bytes: disk.capacity_bytes.max(0) as u64,
                source_sha256: disk.sha256.clone().unwrap_or_default(),
            })
            .collect(),
        nics: source
            .nics
            .iter()
            .map(|nic| Nic {
                mac: nic.mac.clone(),
                network: nic.network.clone(),
                model: nic.model.clone(),
            })
            .collect(),
        scratch: SCRATCH.into(),
        virtio_win: vmm
            .spec
            .conversion
            .virtio_win
            .as_ref()
            .map(|d| path_in(VIRTIO_WIN, d)),
        first_boot_tool: vmm
            .spec
            .conversion
            .first_boot_tool
            .as_ref()
            .map(|t| path_in(FIRST_BOOT_TOOL, t)),
        static_ips: if vmm.spec.conversion.preserve_static_ips {
            static_ips(source)
        } else {
            vec![]
        },
        keep_interface_names: (!crate::build::vm::is_windows(source)).then(|| {
            source
                .nics
                .iter()
                .map(|nic| SourceNic {
                    mac: nic.mac.clone(),
                    addresses: nic.ip_addresses.iter().map(|a| a.address.clone()).collect(),
                })
                .collect()
        }),
    }
}

/// Every address VMware Tools reported as configured by hand, on the NIC with its MAC, with the guest's default
/// gateway of its family and its name servers. Pure.
pub fn static_ips(source: &SourceVmStatus) -> Vec<StaticIp> {
    let network = source.guest_network.clone().unwrap_or_default();
    let mut ips = Vec::new();
    for (index, nic) in source.nics.iter().enumerate() {
        for address in nic.ip_addresses.iter().filter(|a| a.is_static()) {
            ips.push(StaticIp {
                mac: nic.mac.clone(),
                address: address.address.clone(),
                prefix_length: address.prefix_length.clamp(0, 128) as u8,
                gateway: network.gateway_for(index, address).map(String::from),
                dns_servers: network.dns_servers.clone(),
            });
        }
    }
    ips
}

/// The file or directory virt-v2v reads (`VIRTIO_WIN`, `VIRT_TOOLS_DATA_DIR`): `path` inside the volume mounted
/// at `mount`. Only plain names are joined, so it never leaves the volume (preflight refuses a path that would).
fn path_in(mount: &str, files: &impl MountedFiles) -> PathBuf {
    let mut path = PathBuf::from(mount);
    for part in Path::new(files.path().unwrap_or_default()).components() {
        if let Component::Normal(name) = part {
            path.push(name);
        }
    }
    path
}

/// The claim or image that holds the files, as volume `name`.
fn files_volume(name: &str, files: &impl MountedFiles) -> Option<Volume> {
    let mut volume = Volume {
        name: name.into(),
        ..Volume::default()
    };
    if let Some(claim) = files.claim() {
        volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: Some(true),
        });
    } else {
        // An image volume is read-only whatever the mount says; IfNotPresent unless the tag is `latest`.
        volume.image = Some(ImageVolumeSource {
            reference: Some(files.image()?.into()),
            pull_policy: None,
        });
    }
    Some(volume)
}

pub fn adapt_job(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    disks: &[DiskStatus],
    attempt: i32,
    image: &str,
) -> Job {
    let spec = serde_json::to_string(&adapt_spec(vmm, source, disks)).expect("a spec serializes");
    let mut work = Work {
        step: "adapt",
        args: vec!["adapt".into(), format!("--spec-json={spec}")],
        volumes: vec![Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity(format!("{}Gi", SCRATCH_MIB / 1024))),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        }],
        mounts: vec![mount("scratch", SCRATCH, false)],
        devices: vec![],
        memory_limit_mib: MEMORY_MIB,
        user: QEMU_ID,
        // virt-v2v inspects and rewrites file systems, not whole disks: mostly a fixed time, and the volumes are
        // hashed before and after.
        deadline_seconds: ADAPT_DEADLINE_SECONDS
            + super::job::deadline_seconds(
                disks.iter().map(|d| d.capacity_bytes.max(0) as u64).sum(),
                2,
            ),
        scratch_mib: Some(SCRATCH_MIB),
    };
    let conversion = &vmm.spec.conversion;
    for (name, at, volume) in [
        (
            "virtio-win",
            VIRTIO_WIN,
            conversion
                .virtio_win
                .as_ref()
                .and_then(|d| files_volume("virtio-win", d)),
        ),
        (
            "first-boot-tool",
            FIRST_BOOT_TOOL,
            conversion
                .first_boot_tool
                .as_ref()
                .and_then(|t| files_volume("first-boot-tool", t)),
        ),
    ] {
        if let Some(volume) = volume {
            work.volumes.push(volume);
            work.mounts.push(mount(name, at, true));
        }
    }
    mount_disks(&mut work, vmm, disks.iter().map(|d| d.index as u32), false);
    job(vmm, &children::adapt_job(vmm, attempt), image, work)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn migration(conversion: serde_json::Value) -> VirtualMachineMigration {
        let mut vmm = VirtualMachineMigration::new(
            "m",
            serde_json::from_value(json!({
                "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
                "conversion": conversion}))
            .unwrap(),
        );
        vmm.metadata.uid = Some("u".into());
        vmm.metadata.namespace = Some("ns".into());
        vmm
    }

    fn source() -> SourceVmStatus {
        serde_json::from_value(json!({
            "name": "x", "moref": "vm-1", "cpus": 2, "coresPerSocket": 1, "memoryMib": 1024, "snapshots": 0,
            "firmware": "Efi",
            "disks": [{"key": 1, "file": "[ds] x/x.vmdk", "capacityBytes": 1024, "bus": "sata"},
                      {"key": 2, "file": "[ds] x/x_1.vmdk", "capacityBytes": 2048}],
            "nics": [{"mac": "00:50:56:aa:bb:cc", "network": "VM Network", "model": "vmxnet3"}]}))
        .unwrap()
    }

    fn disks() -> Vec<DiskStatus> {
        (0..2)
            .map(|i| DiskStatus {
                index: i,
                capacity_bytes: 1024 << i,
                sha256: Some(format!("sha{i}")),
                verified: true,
                ..DiskStatus::default()
            })
            .collect()
    }

    fn pod(job: Job) -> k8s_openapi::api::core::v1::PodSpec {
        job.spec.unwrap().template.spec.unwrap()
    }

    #[test]
    fn the_job_mounts_every_volume_writable_and_names_the_sha256_each_must_hold() {
        let vmm = migration(json!({"guestAdaptation": "VirtV2v"}));
        let (source, disks) = (source(), disks());
        let spec = adapt_spec(&vmm, &source, &disks);
        assert_eq!(spec.virtio_win, None, "no drivers named, none passed");
        assert_eq!(spec.firmware, DomainFirmware::Efi);
        assert_eq!(spec.disks[0].bus, Bus::Sata);
        assert_eq!(
            spec.disks[1].path,
            std::path::Path::new("/disks/1/disk.img")
        );
        assert_eq!(spec.disks[1].source_sha256, "sha1");
        assert_eq!(spec.nics[0].mac, "00:50:56:aa:bb:cc");

        let job = adapt_job(&vmm, &source, &disks, 1, "ferry:1");
        assert_eq!(job.metadata.name.as_deref(), Some("m-adapt-1"));
        let deadline = job.spec.as_ref().unwrap().active_deadline_seconds.unwrap();
        assert!(deadline >= 3600 + 1800, "{deadline}");
        let pod = pod(job);
        let container = &pod.containers[0];
        let mounts: Vec<_> = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.mount_path.as_str(), m.read_only.unwrap_or(false)))
            .collect();
        assert_eq!(
            mounts,
            [
                ("/scratch", false),
                ("/disks/0", false),
                ("/disks/1", false)
            ]
        );
        let claims: Vec<_> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
            .collect();
        assert_eq!(claims, ["m-disk-0", "m-disk-1"]);
        assert!(
            container.env.is_none(),
            "nothing secret, nothing in the environment"
        );
        // Its scratch space is bounded, and requested so the node has it.
        let scratch = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "scratch")
            .unwrap();
        let limit = scratch.empty_dir.as_ref().unwrap().size_limit.clone();
        assert_eq!(limit, Some(Quantity("8Gi".into())));
        let resources = container.resources.as_ref().unwrap();
        assert_eq!(
            resources.requests.as_ref().unwrap()["ephemeral-storage"],
            Quantity("8Gi".into())
        );
        assert_eq!(
            resources.limits.as_ref().unwrap()["ephemeral-storage"],
            Quantity("9Gi".into())
        );
    }

    #[test]
    fn the_virtio_win_drivers_are_mounted_read_only_and_named_to_virt_v2v() {
        let (source, disks) = (source(), disks());
        let image = "quay.io/kubevirt/virtio-container-disk:v1.6.0";
        for (drivers, expected) in [
            (
                json!({"image": image, "path": "disk/virtio-win.iso"}),
                "/run/ferry/virtio-win/disk/virtio-win.iso",
            ),
            (
                json!({"persistentVolumeClaim": "virtio-win"}),
                "/run/ferry/virtio-win",
            ),
            (
                json!({"persistentVolumeClaim": "virtio-win", "path": "./drivers/"}),
                "/run/ferry/virtio-win/drivers",
            ),
        ] {
            let vmm = migration(json!({"guestAdaptation": "VirtV2v", "virtioWin": drivers}));
            let spec = adapt_spec(&vmm, &source, &disks);
            assert_eq!(
                spec.virtio_win.as_deref(),
                Some(Path::new(expected)),
                "{drivers}"
            );
            let pod = pod(adapt_job(&vmm, &source, &disks, 1, "ferry:1"));
            let mount = pod.containers[0]
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| m.name == "virtio-win")
                .unwrap();
            assert_eq!(mount.mount_path, "/run/ferry/virtio-win");
            assert_eq!(mount.read_only, Some(true), "{drivers}");
            let volume = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == "virtio-win")
                .unwrap();
            match (&volume.persistent_volume_claim, &volume.image) {
                (Some(claim), None) => {
                    assert_eq!(claim.claim_name, "virtio-win");
                    assert_eq!(claim.read_only, Some(true));
                }
                (None, Some(oci)) => assert_eq!(oci.reference.as_deref(), Some(image)),
                other => panic!("one claim or one image, not {other:?}"),
            }
            let args = pod.containers[0].args.clone().unwrap();
            assert!(
                args[1].contains(&format!("\"virtioWin\":\"{expected}\"")),
                "the spec names the drivers: {}",
                args[1]
            );
        }
    }

    #[test]
    fn static_addresses_go_to_virt_v2v_only_when_asked_with_their_nics_gateway_and_dns() {
        let mut source = source();
        source.nics = serde_json::from_value(json!([
            {"mac": "00:50:56:aa:bb:cc", "network": "VM Network", "ipAddresses": [
                {"address": "192.168.122.50", "prefixLength": 24, "origin": "manual"},
                {"address": "fe80::1", "prefixLength": 64, "origin": "linklayer"}]},
            {"mac": "00:50:56:aa:bb:cd", "network": "Backup", "ipAddresses": [
                {"address": "10.1.0.9", "prefixLength": 16, "origin": "manual"},
                {"address": "10.1.0.10", "prefixLength": 16, "origin": "dhcp"}]}]))
        .unwrap();
        source.guest_network = serde_json::from_value(json!({
            "defaultGateways": [{"address": "192.168.122.1", "nic": 0}, {"address": "10.1.0.1", "nic": 1}],
            "dnsServers": ["192.168.122.2"]}))
        .unwrap();
        let ips = static_ips(&source);
        let options: Vec<String> = ips.iter().map(|ip| ip.mac_option().unwrap()).collect();
        assert_eq!(
            options,
            [
                "00:50:56:aa:bb:cc:ip:192.168.122.50,192.168.122.1,24,192.168.122.2",
                "00:50:56:aa:bb:cd:ip:10.1.0.9,10.1.0.1,16,192.168.122.2",
            ],
            "hand-configured addresses only, each with its own NIC's gateway"
        );
        let disks = disks();
        let asked = migration(json!({"guestAdaptation": "VirtV2v", "preserveStaticIPs": true}));
        assert_eq!(adapt_spec(&asked, &source, &disks).static_ips, ips);
        let not_asked = migration(json!({"guestAdaptation": "VirtV2v"}));
        assert!(
            adapt_spec(&not_asked, &source, &disks)
                .static_ips
                .is_empty()
        );
    }

    #[test]
    fn the_first_boot_tool_is_mounted_read_only_beside_the_drivers_and_named_to_the_worker() {
        let (source, disks) = (source(), disks());
        let vmm = migration(json!({"guestAdaptation": "VirtV2v",
            "virtioWin": {"persistentVolumeClaim": "virtio-win"},
            "firstBootTool": {"image": "registry.example/virt-tools:1", "path": "virt-tools/rhsrvany.exe"}}));
        let spec = adapt_spec(&vmm, &source, &disks);
        assert_eq!(
            spec.first_boot_tool.as_deref(),
            Some(Path::new(
                "/run/ferry/first-boot-tool/virt-tools/rhsrvany.exe"
            ))
        );
        let pod = pod(adapt_job(&vmm, &source, &disks, 1, "ferry:1"));
        let mounts: Vec<_> = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.mount_path.starts_with("/run/ferry/"))
            .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            [
                ("virtio-win", "/run/ferry/virtio-win", Some(true)),
                ("first-boot-tool", "/run/ferry/first-boot-tool", Some(true)),
            ]
        );
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "first-boot-tool")
            .unwrap();
        assert_eq!(
            volume.image.as_ref().and_then(|i| i.reference.as_deref()),
            Some("registry.example/virt-tools:1")
        );
        // Without adaptation's fields, neither is mounted.
        let bare = pod_of_plain(&source, &disks);
        assert!(
            bare.volumes
                .iter()
                .flatten()
                .all(|v| v.name != "first-boot-tool")
        );
    }

    fn pod_of_plain(
        source: &SourceVmStatus,
        disks: &[DiskStatus],
    ) -> k8s_openapi::api::core::v1::PodSpec {
        let vmm = migration(json!({"guestAdaptation": "VirtV2v"}));
        pod(adapt_job(&vmm, source, disks, 1, "ferry:1"))
    }

    #[test]
    fn a_path_that_would_leave_the_volume_is_kept_inside_it() {
        let drivers: ferry_api::VirtioWinSource = serde_json::from_value(
            json!({"persistentVolumeClaim": "v", "path": "/../x/../virtio-win.iso"}),
        )
        .unwrap();
        // Preflight refuses it first; the builder still never names a file outside the mount.
        assert!(path_in(VIRTIO_WIN, &drivers).starts_with(VIRTIO_WIN));
    }
}
