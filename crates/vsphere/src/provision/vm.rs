//! New VMs shaped like vSphere's Linux VMs: placement, NIC backing, controllers, boot order.

use std::path::Path;
use std::time::Duration;

use ferry_types::Firmware;

use super::{DiskSlot, Transfer, attach_flat_vmdk_at};
use crate::error::{Error, Result};
use crate::inventory::{VmNameIndex, describe_vm};
use crate::power::{start_task, wait_task};
use crate::props;
use crate::session::Session;
use crate::soap::MoRef;
use crate::xml::escape;

/// A VM to create, with the devices vSphere gives a Linux VM: a PVSCSI controller on bus 0 and a vmxnet3 NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewVm {
    pub name: String,
    /// For example `debian12_64Guest`.
    pub guest_id: String,
    pub cpus: i32,
    pub cores_per_socket: i32,
    pub memory_mib: i64,
    pub firmware: Firmware,
    pub efi_secure_boot: bool,
    /// A virtual TPM (`VirtualTPM`; vSphere needs a key provider for it, vcsim does not).
    pub vtpm: bool,
    /// The host the VM runs on; its compute resource's root pool and its datacenter's VM folder hold the VM.
    pub host: String,
    /// The datastore for the VM's folder.
    pub datastore: String,
    /// One vmxnet3 NIC on each: a distributed port group or a standard network, by name.
    pub networks: Vec<String>,
}

/// A monolithicFlat VMDK on local disk.
#[derive(Clone, Copy, Debug)]
pub struct VmdkFiles<'a> {
    pub descriptor: &'a Path,
    pub extent: &'a Path,
}

/// Creates `spec` (unless a VM has its name), attaches `disks` at units 0, 1, ... of its PVSCSI controller on
/// bus 0, and sets the boot order to the first, as a VM with an explicit boot order has. What is already there
/// is left alone, so a second call changes nothing. Power is the caller's.
pub async fn provision_vm(
    session: &Session,
    spec: &NewVm,
    disks: &[VmdkFiles<'_>],
    transfer: Transfer,
) -> Result<MoRef> {
    let vm = create_vm(session, spec).await?;
    let controller_key = controller_key(session, &vm, "ParaVirtualSCSIController", 0).await?;
    let mut boot = None;
    // SCSI unit 7 is the controller's own.
    for (unit, disk) in (0..).filter(|u| *u != 7).zip(disks) {
        let slot = DiskSlot {
            controller_key,
            unit,
        };
        let attached = attach_flat_vmdk_at(
            session,
            &vm,
            disk.descriptor,
            disk.extent,
            Some(slot),
            transfer,
        )
        .await?;
        boot.get_or_insert(attached.key);
    }
    if let Some(key) = boot {
        set_boot_disk(session, &vm, key).await?;
    }
    Ok(vm)
}

/// The VM named `spec.name`, created powered off with `spec`'s shape when there is none.
pub async fn create_vm(session: &Session, spec: &NewVm) -> Result<MoRef> {
    match VmNameIndex::build(session).await?.lookup(&spec.name) {
        Ok(vm) => return Ok(vm),
        Err(Error::VmNotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let place = placement(session, &spec.host).await?;
    let mut nics = String::new();
    for (index, network) in spec.networks.iter().enumerate() {
        let backing = nic_backing(session, network).await?;
        nics += &format!(
            concat!(
                r#"<deviceChange><operation>add</operation><device xsi:type="VirtualVmxnet3"><key>{key}</key>{backing}"#,
                "<connectable><startConnected>true</startConnected><allowGuestControl>true</allowGuestControl>",
                "<connected>false</connected></connectable><addressType>generated</addressType></device></deviceChange>",
            ),
            key = -110 - index as i32,
            backing = backing,
        );
    }
    let firmware = match spec.firmware {
        Firmware::Bios => "bios",
        Firmware::Efi => "efi",
    };
    // Elements in the WSDL's order: vSphere rejects others.
    let config = format!(
        concat!(
            "<config><name>{name}</name><guestId>{guest}</guestId>",
            "<files><vmPathName>[{datastore}]</vmPathName></files>",
            "<numCPUs>{cpus}</numCPUs><numCoresPerSocket>{cores}</numCoresPerSocket><memoryMB>{memory}</memoryMB>",
            r#"<deviceChange><operation>add</operation><device xsi:type="ParaVirtualSCSIController"><key>-101</key>"#,
            "<busNumber>0</busNumber><sharedBus>noSharing</sharedBus></device></deviceChange>",
            "{nics}",
            "{tpm}<bootOptions><efiSecureBootEnabled>{secure}</efiSecureBootEnabled></bootOptions>",
            "<firmware>{firmware}</firmware></config>",
        ),
        name = escape(&spec.name),
        guest = escape(&spec.guest_id),
        datastore = escape(&spec.datastore),
        cpus = spec.cpus,
        cores = spec.cores_per_socket,
        memory = spec.memory_mib,
        nics = nics,
        secure = spec.efi_secure_boot,
        tpm = if spec.vtpm {
            r#"<deviceChange><operation>add</operation><device xsi:type="VirtualTPM"><key>-103</key></device></deviceChange>"#
        } else {
            ""
        },
        firmware = firmware,
    );
    let args = format!(
        "{config}{}{}",
        place.pool.xml("pool"),
        place.host.xml("host")
    );
    let task = start_task(session, "CreateVM_Task", &place.folder, &args).await?;
    wait_task(session, &task, Duration::from_secs(60))
        .await?
        .ok_or_else(|| Error::InvalidResponse {
            method: "CreateVM_Task".into(),
            detail: "the task returned no VM".into(),
        })
}

/// The device key of the VM's controller of this type on `bus`.
pub async fn controller_key(
    session: &Session,
    vm: &MoRef,
    controller_type: &str,
    bus: i32,
) -> Result<i32> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &["config.hardware.device"],
    )
    .await?;
    let int = |d: &crate::xml::Element, name: &str| {
        d.text_at(&[name])
            .and_then(|t| t.trim().parse::<i32>().ok())
    };
    found
        .first()
        .and_then(|o| o.prop("config.hardware.device"))
        .into_iter()
        .flat_map(|devices| devices.children.iter())
        .find(|d| {
            d.xsi_type.as_deref() == Some(controller_type) && int(d, "busNumber") == Some(bus)
        })
        .and_then(|d| int(d, "key"))
        .ok_or_else(|| Error::InvalidResponse {
            method: "RetrievePropertiesEx".into(),
            detail: format!("VM {vm} has no {controller_type} on bus {bus}"),
        })
}

/// Makes `disk_key` the VM's only boot device, keeping its Secure Boot setting (vcsim replaces the whole
/// `bootOptions`, where vSphere would merge).
pub async fn set_boot_disk(session: &Session, vm: &MoRef, disk_key: i32) -> Result<()> {
    let info = describe_vm(session, vm).await?;
    if info.boot_order == [disk_key] {
        return Ok(());
    }
    let secure = info
        .efi_secure_boot
        .map(|on| format!("<efiSecureBootEnabled>{on}</efiSecureBootEnabled>"))
        .unwrap_or_default();
    let args = format!(
        r#"<spec><bootOptions>{secure}<bootOrder xsi:type="VirtualMachineBootOptionsBootableDiskDevice"><deviceKey>{disk_key}</deviceKey></bootOrder></bootOptions></spec>"#
    );
    let task = start_task(session, "ReconfigVM_Task", vm, &args).await?;
    wait_task(session, &task, Duration::from_secs(60)).await?;
    Ok(())
}

/// Where a new VM goes: its host, the host's root resource pool, and the VM folder of the host's datacenter.
struct Placement {
    host: MoRef,
    pool: MoRef,
    folder: MoRef,
}

async fn placement(session: &Session, host_name: &str) -> Result<Placement> {
    let not_found = |what: String| Error::Fault {
        method: "CreateVM_Task".into(),
        fault: "NotFound".into(),
        message: what,
    };
    let hosts = props::retrieve_all(session, "HostSystem", &["name", "parent"]).await?;
    let host = hosts
        .iter()
        .find(|h| h.text("name") == Some(host_name))
        .ok_or_else(|| not_found(format!("no host named {host_name}")))?;
    let compute = host
        .prop("parent")
        .and_then(MoRef::from_element)
        .ok_or_else(|| not_found(format!("host {host_name} has no compute resource")))?;
    let found = props::retrieve(
        session,
        &compute.type_,
        std::slice::from_ref(&compute),
        &["resourcePool", "parent"],
    )
    .await?;
    let pool = found
        .first()
        .and_then(|o| o.prop("resourcePool"))
        .and_then(MoRef::from_element)
        .ok_or_else(|| not_found(format!("{compute} has no resource pool")))?;
    let mut current = found
        .first()
        .and_then(|o| o.prop("parent"))
        .and_then(MoRef::from_element);
    // Up through host folders to the datacenter.
    for _ in 0..32 {
        let Some(obj) = current else { break };
        let paths: &[&str] = if obj.type_ == "Datacenter" {
            &["vmFolder"]
        } else {
            &["parent"]
        };
        let found = props::retrieve(session, &obj.type_, std::slice::from_ref(&obj), paths).await?;
        let Some(o) = found.first() else { break };
        if obj.type_ == "Datacenter" {
            let folder = o
                .prop("vmFolder")
                .and_then(MoRef::from_element)
                .ok_or_else(|| not_found(format!("{obj} has no VM folder")))?;
            return Ok(Placement {
                host: host.obj.clone(),
                pool,
                folder,
            });
        }
        current = o.prop("parent").and_then(MoRef::from_element);
    }
    Err(not_found(format!("no datacenter above host {host_name}")))
}

/// A NIC backing on `network`: a distributed port (switch UUID and port group key, as vCenter writes them) or a
/// standard network.
async fn nic_backing(session: &Session, network: &str) -> Result<String> {
    let portgroups = props::retrieve_all(
        session,
        "DistributedVirtualPortgroup",
        &["name", "key", "config.distributedVirtualSwitch"],
    )
    .await?;
    if let Some(pg) = portgroups.iter().find(|p| p.text("name") == Some(network)) {
        let dvs = pg
            .prop("config.distributedVirtualSwitch")
            .and_then(MoRef::from_element);
        let uuid = match dvs {
            Some(dvs) => {
                props::retrieve(session, &dvs.type_, std::slice::from_ref(&dvs), &["uuid"])
                    .await?
                    .first()
                    .and_then(|o| o.text("uuid").map(String::from))
            }
            None => None,
        };
        let (Some(uuid), Some(key)) = (uuid, pg.text("key")) else {
            return Err(Error::InvalidResponse {
                method: "RetrievePropertiesEx".into(),
                detail: format!("port group {network} has no switch UUID or key"),
            });
        };
        return Ok(format!(
            r#"<backing xsi:type="VirtualEthernetCardDistributedVirtualPortBackingInfo"><port><switchUuid>{}</switchUuid><portgroupKey>{}</portgroupKey></port></backing>"#,
            escape(&uuid),
            escape(key)
        ));
    }
    let networks = props::retrieve_all(session, "Network", &["name"]).await?;
    let standard = networks
        .iter()
        .find(|n| n.obj.type_ == "Network" && n.text("name") == Some(network))
        .ok_or_else(|| Error::Fault {
            method: "CreateVM_Task".into(),
            fault: "NotFound".into(),
            message: format!("no network or distributed port group named {network}"),
        })?;
    Ok(format!(
        r#"<backing xsi:type="VirtualEthernetCardNetworkBackingInfo"><deviceName>{}</deviceName>{}</backing>"#,
        escape(network),
        standard.obj.xml("network")
    ))
}

/// Moves `vm` into the folder `name` beside it (created when absent), as people group VMs by application or
/// team. Returns the folder.
pub async fn move_into_folder(session: &Session, vm: &MoRef, name: &str) -> Result<MoRef> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &["parent"],
    )
    .await?;
    let parent = found
        .first()
        .and_then(|o| o.prop("parent"))
        .and_then(MoRef::from_element)
        .ok_or_else(|| Error::InvalidResponse {
            method: "RetrievePropertiesEx".into(),
            detail: format!("{vm} has no parent folder"),
        })?;
    let folder = match child_folder(session, &parent, name).await? {
        Some(folder) => folder,
        None => session
            .call(
                "CreateFolder",
                &parent,
                &format!("<name>{}</name>", escape(name)),
            )
            .await?
            .child("returnval")
            .and_then(MoRef::from_element)
            .ok_or_else(|| Error::InvalidResponse {
                method: "CreateFolder".into(),
                detail: "no folder returned".into(),
            })?,
    };
    if folder == parent {
        return Ok(folder);
    }
    let task = start_task(session, "MoveIntoFolder_Task", &folder, &vm.xml("list")).await?;
    wait_task(session, &task, Duration::from_secs(60)).await?;
    Ok(folder)
}

/// The folder named `name` directly in `parent`.
async fn child_folder(session: &Session, parent: &MoRef, name: &str) -> Result<Option<MoRef>> {
    let found = props::retrieve(
        session,
        "Folder",
        std::slice::from_ref(parent),
        &["childEntity"],
    )
    .await?;
    let folders: Vec<MoRef> = found
        .first()
        .and_then(|o| o.prop("childEntity"))
        .map(|list| {
            list.children
                .iter()
                .filter_map(MoRef::from_element)
                .filter(|m| m.type_ == "Folder")
                .collect()
        })
        .unwrap_or_default();
    if folders.is_empty() {
        return Ok(None);
    }
    let named = props::retrieve(session, "Folder", &folders, &["name"]).await?;
    Ok(named
        .iter()
        .find(|o| o.text("name") == Some(name))
        .map(|o| o.obj.clone()))
}
