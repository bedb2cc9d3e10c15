//! Finding VMs and describing them: hardware, disks, NICs, power, tools and snapshots. Read-only.

use std::collections::{BTreeMap, BTreeSet};

use ferry_types::{Firmware, PowerState};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::props::{self, ObjectContent};
use crate::session::Session;
use crate::soap::MoRef;
use crate::xml::{Element, escape};

/// How a migration names its source VM; exactly one way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmSelector {
    Name(String),
    /// `/DC0/vm/folder/vm-name`
    InventoryPath(String),
    /// The BIOS UUID (`config.uuid`) or the instance UUID (`config.instanceUuid`).
    Uuid(String),
    Moref(String),
}

impl std::fmt::Display for VmSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmSelector::Name(n) => write!(f, "name {n:?}"),
            VmSelector::InventoryPath(p) => write!(f, "inventory path {p:?}"),
            VmSelector::Uuid(u) => write!(f, "uuid {u}"),
            VmSelector::Moref(m) => write!(f, "moref {m}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmSummary {
    pub moref: String,
    pub name: String,
    pub power_state: Option<PowerState>,
    pub uuid: Option<String>,
    pub instance_uuid: Option<String>,
    pub guest_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmInfo {
    pub moref: String,
    pub name: String,
    pub uuid: Option<String>,
    pub instance_uuid: Option<String>,
    pub guest_id: Option<String>,
    pub firmware: Firmware,
    /// `config.bootOptions.efiSecureBootEnabled`; unset on BIOS VMs and on EFI VMs that never had it set.
    pub efi_secure_boot: Option<bool>,
    /// The disk keys of `config.bootOptions.bootOrder`, in order (other bootable devices left out); empty when
    /// the VM has no explicit boot order.
    pub boot_order: Vec<i32>,
    /// A virtual TPM (`VirtualTPM`) among the devices. Its contents stay in vSphere, sealed by its key provider.
    pub vtpm: bool,
    pub cpus: i32,
    pub cores_per_socket: i32,
    pub memory_mib: i64,
    pub power_state: PowerState,
    /// `guestToolsRunning` when VMware Tools answers; a guest shutdown needs it.
    pub tools_running_status: Option<String>,
    /// What VMware Tools reports of the guest's network; empty while they do not run.
    pub guest_network: crate::guest_network::GuestNetwork,
    pub change_tracking: bool,
    pub snapshots: usize,
    /// The datacenter's inventory path below the root folder (`DC0`, or `Folder1/DC0` in a folder): the
    /// `dcPath` of `/folder` URLs.
    pub datacenter: String,
    /// The ESXi host the VM runs on (`runtime.host`): whose disk reads a migration shares.
    pub host: Option<HostRef>,
    pub disks: Vec<DiskInfo>,
    pub nics: Vec<NicInfo>,
}

/// An ESXi host: its managed object id and its name in the inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostRef {
    pub moref: String,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskInfo {
    pub key: i32,
    pub label: String,
    /// `scsi`, `sata`, `ide` or `nvme`.
    pub bus: String,
    /// The controller's device type, for example `ParaVirtualSCSIController`.
    pub controller: String,
    /// The controller's model: `pvscsi`, `lsilogic`, `lsilogic-sas`, `buslogic`, `ahci`, `ide`, `nvme`, or
    /// `unknown`.
    pub controller_model: String,
    pub controller_key: i32,
    pub unit_number: i32,
    pub capacity_bytes: i64,
    /// `[datastore] dir/disk.vmdk`
    pub file: String,
    pub datastore: String,
    pub backing: String,
    pub thin: bool,
    pub disk_mode: String,
    /// The backing's `uuid` (the guest sees it as the disk's serial on VMware); absent for backings without one.
    pub uuid: Option<String>,
    /// Files of the snapshot chain below this disk, newest first; empty without snapshots.
    pub parents: Vec<String>,
    /// The backing's Changed Block Tracking ID (`changeId`), once tracking is active on the disk.
    pub change_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NicInfo {
    pub key: i32,
    pub label: String,
    pub mac: String,
    /// `vmxnet3`, `e1000`, `e1000e`, ...
    pub model: String,
    /// The network or distributed port group name.
    pub network: String,
}

const SUMMARY_PROPS: [&str; 5] = [
    "name",
    "runtime.powerState",
    "config.uuid",
    "config.instanceUuid",
    "config.guestId",
];

pub async fn list_vms(session: &Session) -> Result<Vec<VmSummary>> {
    let mut vms: Vec<VmSummary> = props::retrieve_all(session, "VirtualMachine", &SUMMARY_PROPS)
        .await?
        .iter()
        .map(summary)
        .collect();
    vms.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(vms)
}

/// Every VM below the VM folder at inventory path `folder` (`/DC0/vm/web`), at any depth, by name.
pub async fn list_vms_in_folder(session: &Session, folder: &str) -> Result<Vec<VmSummary>> {
    let not_found = || Error::FolderNotFound {
        path: folder.to_string(),
    };
    let args = format!(
        "<inventoryPath>{}</inventoryPath>",
        escape(folder.trim_start_matches('/'))
    );
    let search_index = session.content().search_index.clone();
    let container = session
        .call("FindByInventoryPath", &search_index, &args)
        .await?
        .child("returnval")
        .and_then(MoRef::from_element)
        .filter(|m| m.type_ == "Folder")
        .ok_or_else(not_found)?;
    let mut vms: Vec<VmSummary> =
        props::retrieve_under(session, &container, "VirtualMachine", &SUMMARY_PROPS)
            .await?
            .iter()
            .map(summary)
            .collect();
    vms.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(vms)
}

fn summary(o: &ObjectContent) -> VmSummary {
    VmSummary {
        moref: o.obj.value.clone(),
        name: o.text("name").unwrap_or_default().to_string(),
        power_state: o.text("runtime.powerState").and_then(power_state),
        uuid: o.text("config.uuid").map(String::from),
        instance_uuid: o.text("config.instanceUuid").map(String::from),
        guest_id: o.text("config.guestId").map(String::from),
    }
}

pub fn power_state(text: &str) -> Option<PowerState> {
    match text {
        "poweredOn" => Some(PowerState::PoweredOn),
        "poweredOff" => Some(PowerState::PoweredOff),
        "suspended" => Some(PowerState::Suspended),
        _ => None,
    }
}

/// Every VM's name, from one listing: a controller discovering many VMs by name reads it once, instead of
/// listing every VM once per migration (N migrations would cost N² names).
#[derive(Clone, Debug)]
pub struct VmNameIndex {
    built: std::time::Instant,
    by_name: std::collections::HashMap<String, Vec<MoRef>>,
}

impl VmNameIndex {
    pub async fn build(session: &Session) -> Result<Self> {
        let listed = props::retrieve_all(session, "VirtualMachine", &["name"]).await?;
        Ok(Self::from_names(listed.into_iter().filter_map(|o| {
            let name = o.text("name")?.to_string();
            Some((name, o.obj))
        })))
    }

    pub fn from_names(names: impl IntoIterator<Item = (String, MoRef)>) -> Self {
        let mut by_name: std::collections::HashMap<String, Vec<MoRef>> = Default::default();
        for (name, vm) in names {
            by_name.entry(name).or_default().push(vm);
        }
        Self {
            built: std::time::Instant::now(),
            by_name,
        }
    }

    pub fn age(&self) -> std::time::Duration {
        self.built.elapsed()
    }

    /// The one VM named `name`, with the errors `find_vm` gives.
    pub fn lookup(&self, name: &str) -> Result<MoRef> {
        match self.by_name.get(name).map(Vec::as_slice) {
            None | Some([]) => Err(Error::VmNotFound {
                selector: VmSelector::Name(name.into()).to_string(),
            }),
            Some([one]) => Ok(one.clone()),
            Some(many) => Err(Error::AmbiguousVmName {
                name: name.into(),
                count: many.len(),
            }),
        }
    }
}

pub async fn find_vm(session: &Session, selector: &VmSelector) -> Result<MoRef> {
    let not_found = || Error::VmNotFound {
        selector: selector.to_string(),
    };
    let search_index = session.content().search_index.clone();
    match selector {
        VmSelector::Name(name) => VmNameIndex::build(session).await?.lookup(name),
        VmSelector::InventoryPath(path) => {
            let args = format!(
                "<inventoryPath>{}</inventoryPath>",
                escape(path.trim_start_matches('/'))
            );
            let response = session
                .call("FindByInventoryPath", &search_index, &args)
                .await?;
            response
                .child("returnval")
                .and_then(MoRef::from_element)
                .filter(|m| m.type_ == "VirtualMachine")
                .ok_or_else(not_found)
        }
        VmSelector::Uuid(uuid) => {
            for instance in [false, true] {
                let args = format!(
                    "<uuid>{}</uuid><vmSearch>true</vmSearch><instanceUuid>{instance}</instanceUuid>",
                    escape(uuid)
                );
                let response = session.call("FindByUuid", &search_index, &args).await?;
                if let Some(found) = response.child("returnval").and_then(MoRef::from_element) {
                    return Ok(found);
                }
            }
            Err(not_found())
        }
        VmSelector::Moref(id) => {
            let vm = MoRef::new("VirtualMachine", id.as_str());
            match props::retrieve(
                session,
                "VirtualMachine",
                std::slice::from_ref(&vm),
                &["name"],
            )
            .await
            {
                Ok(found) if !found.is_empty() => Ok(vm),
                Ok(_) => Err(not_found()),
                Err(e) if e.fault() == Some("ManagedObjectNotFound") => Err(not_found()),
                Err(e) => Err(e),
            }
        }
    }
}

const DESCRIBE_PROPS: [&str; 19] = [
    "name",
    "config.uuid",
    "config.instanceUuid",
    "config.guestId",
    "config.firmware",
    "config.bootOptions",
    "config.hardware.numCPU",
    "config.hardware.numCoresPerSocket",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "config.changeTrackingEnabled",
    "runtime.powerState",
    "runtime.host",
    "guest.toolsRunningStatus",
    "guest.net",
    "guest.ipStack",
    "snapshot",
    "parent",
    "resourcePool",
];

pub async fn describe_vm(session: &Session, vm: &MoRef) -> Result<VmInfo> {
    let found = match props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &DESCRIBE_PROPS,
    )
    .await
    {
        Err(e) if e.fault() == Some("ManagedObjectNotFound") => {
            return Err(Error::VmNotFound {
                selector: VmSelector::Moref(vm.value.clone()).to_string(),
            });
        }
        other => other?,
    };
    let o = found.into_iter().next().ok_or_else(|| Error::VmNotFound {
        selector: vm.to_string(),
    })?;
    let (mut disks, mut nics) = o
        .prop("config.hardware.device")
        .map(decode_devices)
        .unwrap_or_default();
    let vtpm = o.prop("config.hardware.device").is_some_and(has_vtpm);
    let boot = parse_boot_options(o.prop("config.bootOptions"));
    resolve_names(session, &mut disks, &mut nics).await?;
    let invalid = |what: &str| Error::InvalidResponse {
        method: "RetrievePropertiesEx".into(),
        detail: format!("VM {vm} has no {what}"),
    };
    Ok(VmInfo {
        moref: vm.value.clone(),
        name: o.text("name").unwrap_or_default().to_string(),
        uuid: o.text("config.uuid").map(String::from),
        instance_uuid: o.text("config.instanceUuid").map(String::from),
        guest_id: o.text("config.guestId").map(String::from),
        firmware: if o.text("config.firmware") == Some("efi") {
            Firmware::Efi
        } else {
            Firmware::Bios
        },
        efi_secure_boot: boot.efi_secure_boot,
        boot_order: boot.disk_order,
        vtpm,
        cpus: o.int("config.hardware.numCPU").unwrap_or(1) as i32,
        cores_per_socket: o
            .int("config.hardware.numCoresPerSocket")
            .unwrap_or(1)
            .max(1) as i32,
        memory_mib: o
            .int("config.hardware.memoryMB")
            .ok_or_else(|| invalid("memory"))?,
        power_state: o
            .text("runtime.powerState")
            .and_then(power_state)
            .ok_or_else(|| invalid("power state"))?,
        tools_running_status: o.text("guest.toolsRunningStatus").map(String::from),
        guest_network: crate::guest_network::GuestNetwork::parse(
            o.prop("guest.net"),
            o.prop("guest.ipStack"),
        ),
        change_tracking: o.text("config.changeTrackingEnabled") == Some("true"),
        snapshots: o.prop("snapshot").map(count_snapshots).unwrap_or(0),
        datacenter: datacenter_of(session, o.prop("parent").or(o.prop("resourcePool"))).await?,
        host: host_of(session, o.prop("runtime.host")).await?,
        disks,
        nics,
    })
}

/// The disks and NICs in a VM's `config.hardware.device` (an `ArrayOfVirtualDevice`), their datastores and networks
/// still unresolved.
pub fn decode_devices(devices: &Element) -> (Vec<DiskInfo>, Vec<NicInfo>) {
    let devices: Vec<&Element> = devices.children.iter().collect();
    (parse_disks(&devices), parse_nics(&devices))
}

/// Whether a VM's `config.hardware.device` holds a virtual TPM.
pub fn has_vtpm(devices: &Element) -> bool {
    devices
        .children
        .iter()
        .any(|d| d.xsi_type.as_deref() == Some("VirtualTPM"))
}

/// The instance UUID (`config.instanceUuid`) of the VM `vm` names now; VmNotFound when it names none.
pub async fn instance_uuid(session: &Session, vm: &MoRef) -> Result<Option<String>> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &["config.instanceUuid"],
    )
    .await;
    match found {
        Err(e) if e.fault() == Some("ManagedObjectNotFound") => Err(Error::VmNotFound {
            selector: VmSelector::Moref(vm.value.clone()).to_string(),
        }),
        Err(e) => Err(e),
        Ok(found) => Ok(found
            .first()
            .and_then(|o| o.text("config.instanceUuid"))
            .map(String::from)),
    }
}

fn int(e: &Element, name: &str) -> Option<i64> {
    e.text_at(&[name]).and_then(|t| t.trim().parse().ok())
}

fn parse_disks(devices: &[&Element]) -> Vec<DiskInfo> {
    let controllers: BTreeMap<i64, String> = devices
        .iter()
        .filter(|d| {
            d.xsi_type
                .as_deref()
                .is_some_and(|t| t.ends_with("Controller"))
        })
        .filter_map(|d| Some((int(d, "key")?, d.xsi_type.clone()?)))
        .collect();
    devices
        .iter()
        .filter(|d| d.xsi_type.as_deref() == Some("VirtualDisk"))
        .map(|d| {
            let backing = d.child("backing");
            let controller_key = int(d, "controllerKey").unwrap_or(-1);
            let controller = controllers
                .get(&controller_key)
                .cloned()
                .unwrap_or_default();
            let capacity_bytes = int(d, "capacityInBytes")
                .or_else(|| int(d, "capacityInKB").map(|kb| kb * 1024))
                .unwrap_or(0);
            let mut parents = Vec::new();
            let mut parent = backing.and_then(|b| b.child("parent"));
            while let Some(p) = parent {
                parents.push(p.text_at(&["fileName"]).unwrap_or_default().to_string());
                parent = p.child("parent");
            }
            let file = backing
                .and_then(|b| b.text_at(&["fileName"]))
                .unwrap_or_default()
                .to_string();
            DiskInfo {
                key: int(d, "key").unwrap_or(0) as i32,
                label: d
                    .text_at(&["deviceInfo", "label"])
                    .unwrap_or_default()
                    .to_string(),
                bus: bus_of(&controller).to_string(),
                controller_model: controller_model(&controller).to_string(),
                controller,
                controller_key: controller_key as i32,
                unit_number: int(d, "unitNumber").unwrap_or(0) as i32,
                capacity_bytes,
                datastore: crate::datastore::DatastorePath::parse(&file)
                    .map(|p| p.datastore)
                    .unwrap_or_default(),
                file,
                backing: backing.and_then(|b| b.xsi_type.clone()).unwrap_or_default(),
                thin: backing.and_then(|b| b.text_at(&["thinProvisioned"])) == Some("true"),
                disk_mode: backing
                    .and_then(|b| b.text_at(&["diskMode"]))
                    .unwrap_or_default()
                    .to_string(),
                uuid: backing
                    .and_then(|b| b.text_at(&["uuid"]))
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(String::from),
                parents,
                change_id: backing
                    .and_then(|b| b.text_at(&["changeId"]))
                    .map(str::trim)
                    .filter(|id| !id.is_empty())
                    .map(String::from),
            }
        })
        .collect()
}

fn bus_of(controller: &str) -> &'static str {
    match controller {
        "VirtualIDEController" => "ide",
        "VirtualAHCIController" => "sata",
        "VirtualNVMEController" => "nvme",
        c if c.contains("SCSI") || c.contains("LsiLogic") || c.contains("BusLogic") => "scsi",
        _ => "unknown",
    }
}

/// vSphere's concrete controller types, by the names KubeVirt and virt-v2v users know them.
fn controller_model(controller: &str) -> &'static str {
    match controller {
        "ParaVirtualSCSIController" => "pvscsi",
        "VirtualLsiLogicController" => "lsilogic",
        "VirtualLsiLogicSASController" => "lsilogic-sas",
        "VirtualBusLogicController" => "buslogic",
        "VirtualAHCIController" => "ahci",
        "VirtualIDEController" => "ide",
        "VirtualNVMEController" => "nvme",
        _ => "unknown",
    }
}

/// What `config.bootOptions` says about booting.
#[derive(Debug, Default, PartialEq)]
struct BootOptions {
    efi_secure_boot: Option<bool>,
    disk_order: Vec<i32>,
}

fn parse_boot_options(options: Option<&Element>) -> BootOptions {
    let Some(options) = options else {
        return BootOptions::default();
    };
    BootOptions {
        efi_secure_boot: match options.text_at(&["efiSecureBootEnabled"]).map(str::trim) {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => None,
        },
        // CD-ROM, floppy and network entries do not name a disk.
        disk_order: options
            .children_named("bootOrder")
            .filter(|b| {
                b.xsi_type.as_deref() == Some("VirtualMachineBootOptionsBootableDiskDevice")
            })
            .filter_map(|b| int(b, "deviceKey"))
            .map(|k| k as i32)
            .collect(),
    }
}

fn parse_nics(devices: &[&Element]) -> Vec<NicInfo> {
    devices
        .iter()
        .filter(|d| d.child("macAddress").is_some())
        .map(|d| {
            let backing = d.child("backing");
            // Standard networks name themselves; distributed ones are resolved from the port group key later.
            let network = backing
                .and_then(|b| b.text_at(&["deviceName"]).map(String::from))
                .or_else(|| {
                    backing
                        .and_then(|b| b.text_at(&["port", "portgroupKey"]))
                        .map(|k| format!("dvportgroup:{k}"))
                })
                .or_else(|| {
                    backing
                        .and_then(|b| b.text_at(&["opaqueNetworkId"]))
                        .map(|k| format!("opaque:{k}"))
                })
                .unwrap_or_default();
            let model = d
                .xsi_type
                .as_deref()
                .unwrap_or("Unknown")
                .trim_start_matches("Virtual")
                .to_ascii_lowercase();
            NicInfo {
                key: int(d, "key").unwrap_or(0) as i32,
                label: d
                    .text_at(&["deviceInfo", "label"])
                    .unwrap_or_default()
                    .to_string(),
                mac: d.text_at(&["macAddress"]).unwrap_or_default().to_string(),
                model,
                network,
            }
        })
        .collect()
}

/// Replaces distributed port group keys with their names.
async fn resolve_names(
    session: &Session,
    _disks: &mut [DiskInfo],
    nics: &mut [NicInfo],
) -> Result<()> {
    let keys: BTreeSet<String> = nics
        .iter()
        .filter_map(|n| n.network.strip_prefix("dvportgroup:").map(String::from))
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    let refs: Vec<MoRef> = keys
        .iter()
        .map(|k| MoRef::new("DistributedVirtualPortgroup", k.as_str()))
        .collect();
    let names: BTreeMap<String, String> =
        props::retrieve(session, "DistributedVirtualPortgroup", &refs, &["name"])
            .await?
            .into_iter()
            .filter_map(|o| Some((o.obj.value.clone(), o.text("name")?.to_string())))
            .collect();
    for nic in nics {
        if let Some(name) = nic
            .network
            .strip_prefix("dvportgroup:")
            .and_then(|k| names.get(k))
        {
            nic.network = name.clone();
        }
    }
    Ok(())
}

fn count_snapshots(info: &Element) -> usize {
    fn count(list: &Element) -> usize {
        1 + list
            .children_named("childSnapshotList")
            .map(count)
            .sum::<usize>()
    }
    info.children_named("rootSnapshotList").map(count).sum()
}

/// The host `runtime.host` names, with its name; none when the VM has no host (vCenter leaves it unset for a VM
/// that is not registered on one).
async fn host_of(session: &Session, host: Option<&Element>) -> Result<Option<HostRef>> {
    let Some(host) = host.and_then(MoRef::from_element) else {
        return Ok(None);
    };
    let found = props::retrieve(
        session,
        "HostSystem",
        std::slice::from_ref(&host),
        &["name"],
    )
    .await?;
    let name = found
        .first()
        .and_then(|o| o.text("name"))
        .unwrap_or(&host.value)
        .to_string();
    Ok(Some(HostRef {
        moref: host.value,
        name,
    }))
}

/// Walks `parent` up from `start` to the datacenter, then on up to the root folder: the datacenter's inventory
/// path (`Folder1/DC0`), which `/folder` URLs take as `dcPath`. A bare name answers 404 on a real vCenter once
/// the datacenter sits in a folder (govmomi `object/datastore.go` FindInventoryPath; govmomi issue 285).
async fn datacenter_of(session: &Session, start: Option<&Element>) -> Result<String> {
    let upward = match start.and_then(MoRef::from_element) {
        Some(start) => ancestry(session, start).await?,
        None => Vec::new(),
    };
    let Some(datacenter) = upward.iter().position(|(type_, _)| type_ == "Datacenter") else {
        return Err(Error::InvalidResponse {
            method: "RetrievePropertiesEx".into(),
            detail: "no datacenter above the VM".into(),
        });
    };
    Ok(inventory_path(&names(&upward[datacenter..])))
}

/// Where a VM sits in the inventory, as paths below the root folder: its folder (`DC0/vm/team-a`) and its
/// resource pool (`DC0/host/cluster-1/Resources/team-a`; a cluster's own path is a prefix of its pools').
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub folder: String,
    pub resource_pool: Option<String>,
}

/// The folder and resource pool `vm` sits in (a template has no pool).
pub async fn placement(session: &Session, vm: &MoRef) -> Result<Placement> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &["parent", "resourcePool"],
    )
    .await?;
    let o = found.first().ok_or_else(|| Error::VmNotFound {
        selector: vm.to_string(),
    })?;
    let folder = match o.prop("parent").and_then(MoRef::from_element) {
        Some(parent) => path_of(session, parent).await?,
        None => String::new(),
    };
    let resource_pool = match o.prop("resourcePool").and_then(MoRef::from_element) {
        Some(pool) => Some(path_of(session, pool).await?),
        None => None,
    };
    Ok(Placement {
        folder,
        resource_pool,
    })
}

/// `object`'s inventory path: the names from it up to (not including) the root folder.
async fn path_of(session: &Session, object: MoRef) -> Result<String> {
    Ok(inventory_path(&names(&ancestry(session, object).await?)))
}

/// `object` and its ancestors up to (not including) the root folder, as (type, name), nearest first.
async fn ancestry(session: &Session, object: MoRef) -> Result<Vec<(String, String)>> {
    let root = &session.content().root_folder;
    let mut current = Some(object);
    let mut upward = Vec::new();
    // A bound, not a depth vSphere allows: a hostile endpoint may answer with a parent cycle.
    for _ in 0..64 {
        let Some(obj) = current else { break };
        if obj == *root {
            break;
        }
        let found = props::retrieve(
            session,
            &obj.type_,
            std::slice::from_ref(&obj),
            &["name", "parent"],
        )
        .await?;
        let Some(o) = found.first() else { break };
        let name = o.text("name").unwrap_or_default().to_string();
        current = o.prop("parent").and_then(MoRef::from_element);
        upward.push((obj.type_, name));
    }
    Ok(upward)
}

fn names(upward: &[(String, String)]) -> Vec<String> {
    upward.iter().map(|(_, name)| name.clone()).collect()
}

/// Names from an object up to (not including) the root folder, as the object's inventory path. vSphere hands
/// out names with `/`, `\\` and `%` already escaped (`%2f`, `%5c`, `%25`), so they are joined as they are.
fn inventory_path(upward: &[String]) -> String {
    upward
        .iter()
        .rev()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod name_index_tests {
    use super::*;

    #[test]
    fn a_virtual_tpm_is_found_among_the_devices() {
        let devices = |inner: &str| {
            crate::xml::parse(&format!(
                r#"<val xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">{inner}</val>"#
            ))
            .unwrap()
        };
        let nic = r#"<VirtualDevice xsi:type="VirtualVmxnet3"><key>4000</key></VirtualDevice>"#;
        let tpm = r#"<VirtualDevice xsi:type="VirtualTPM"><key>11000</key></VirtualDevice>"#;
        assert!(has_vtpm(&devices(&format!("{nic}{tpm}"))));
        assert!(!has_vtpm(&devices(nic)));
    }

    #[test]
    fn a_datacenter_path_joins_its_folders_from_the_root_down() {
        let path = |names: &[&str]| {
            inventory_path(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(path(&["DC0"]), "DC0");
        assert_eq!(path(&["DC0", "Europe", "Lab A&B"]), "Lab A&B/Europe/DC0");
        // A `/` inside a name comes escaped from vSphere and stays so: it is not a path separator.
        assert_eq!(path(&["DC%2f1", "F"]), "F/DC%2f1");
    }

    #[test]
    fn a_name_finds_its_one_vm_and_says_when_it_is_missing_or_shared() {
        let vm = |id: &str| MoRef::new("VirtualMachine", id.to_string());
        let index = VmNameIndex::from_names([
            ("web".to_string(), vm("vm-1")),
            ("db".to_string(), vm("vm-2")),
            ("db".to_string(), vm("vm-3")),
        ]);
        assert_eq!(index.lookup("web").unwrap(), vm("vm-1"));
        assert!(matches!(
            index.lookup("db"),
            Err(Error::AmbiguousVmName { count: 2, .. })
        ));
        assert!(matches!(
            index.lookup("mail"),
            Err(Error::VmNotFound { .. })
        ));
    }
}

#[cfg(test)]
mod parse_tests;
