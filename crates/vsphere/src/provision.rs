//! Provisioning a simulator for the lab and tests: create a VM shaped like a VMware Linux VM, put disks into a VM's
//! folder and attach them, set the boot disk. Behind the `provision` feature, so the controller, which must never
//! change a source VM beyond its power, does not link it.
use std::path::Path;
use std::time::Duration;

use reqwest::Body;

use crate::datastore::{DatastorePath, folder_url};
use crate::error::{Error, Result};
use crate::inventory::{DiskInfo, VmInfo, describe_vm};
use crate::power::{start_task, wait_task};
use crate::props;
use crate::session::Session;
use crate::soap::MoRef;
use crate::xml::escape;

mod vm;
pub use vm::{
    NewVm, VmdkFiles, controller_key, create_vm, move_into_folder, provision_vm, set_boot_disk,
};

/// PUTs a local file to `[datastore] path`.
pub async fn upload(
    session: &Session,
    datacenter: &str,
    target: &DatastorePath,
    local: &Path,
) -> Result<()> {
    let url = folder_url(session, datacenter, target)?;
    let file = tokio::fs::File::open(local)
        .await
        .map_err(|e| io_error(local, e))?;
    let length = file.metadata().await.map_err(|e| io_error(local, e))?.len();
    let mut request = session
        .http()
        .put(url.clone())
        .header("Content-Type", "application/octet-stream")
        .header("Content-Length", length)
        .body(Body::wrap_stream(tokio_util::io::ReaderStream::new(file)));
    if let Some(cookie) = session.cookie() {
        request = request.header("Cookie", cookie);
    }
    let response = request.send().await.map_err(|e| Error::Unreachable {
        url: url.to_string(),
        detail: crate::session::error_chain(&e),
    })?;
    if !response.status().is_success() {
        return Err(Error::Http {
            url: url.to_string(),
            what: format!("PUT {target}"),
            status: response.status().as_u16(),
        });
    }
    Ok(())
}

/// Uploads a monolithicFlat VMDK (descriptor and extent, as `qemu-img convert -O vmdk -o subformat=monolithicFlat`
/// writes them) into the VM's folder and attaches it as a new disk on the controller of its first disk.
pub async fn attach_flat_vmdk(
    session: &Session,
    vm: &MoRef,
    descriptor: &Path,
    extent: &Path,
) -> Result<DatastorePath> {
    attach_new_disk(session, vm, descriptor, extent, Transfer::Upload).await
}

/// As [`attach_flat_vmdk`], but hard-links the files when the datastore is a directory on this machine (vcsim's
/// are): nothing is copied, so a busy machine cannot stall the fixture on a long upload.
pub async fn link_flat_vmdk(
    session: &Session,
    vm: &MoRef,
    descriptor: &Path,
    extent: &Path,
) -> Result<DatastorePath> {
    attach_new_disk(
        session,
        vm,
        descriptor,
        extent,
        Transfer::LinkIntoLocalDatastore,
    )
    .await
}

async fn attach_new_disk(
    session: &Session,
    vm: &MoRef,
    descriptor: &Path,
    extent: &Path,
    transfer: Transfer,
) -> Result<DatastorePath> {
    let disk = attach_flat_vmdk_at(session, vm, descriptor, extent, None, transfer).await?;
    DatastorePath::parse(&disk.file).ok_or_else(|| Error::UnsupportedDisk {
        file: disk.file.clone(),
        reason: "not a datastore path".into(),
    })
}

/// Where a new disk goes: a controller (its device key) and a unit on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskSlot {
    pub controller_key: i32,
    pub unit: i32,
}

/// How a disk's files get into the datastore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// PUT over `/folder`, as to any vSphere.
    Upload,
    /// Hard-link into the datastore's directory when it is a directory on this machine (vcsim's are), which keeps
    /// a sparse extent sparse and copies nothing; an upload otherwise.
    LinkIntoLocalDatastore,
}

/// Puts a monolithicFlat VMDK into the VM's folder (`config.files.vmPathName`, so a VM without disks works) and
/// attaches it at `slot`, or after the disks on its first disk's controller. Attaching a file the VM already has
/// changes nothing. Returns the disk as Ferry describes it.
pub async fn attach_flat_vmdk_at(
    session: &Session,
    vm: &MoRef,
    descriptor: &Path,
    extent: &Path,
    slot: Option<DiskSlot>,
    transfer: Transfer,
) -> Result<DiskInfo> {
    let info = describe_vm(session, vm).await?;
    let home = vm_home(session, vm).await?;
    let target = home.sibling(&file_name(descriptor));
    if let Some(disk) = info.disks.iter().find(|d| d.file == target.to_string()) {
        return Ok(disk.clone());
    }
    let slot = match slot {
        Some(slot) => slot,
        None => next_slot(&info)?,
    };
    let extent_target = home.sibling(&file_name(extent));
    let linked = transfer == Transfer::LinkIntoLocalDatastore
        && link_into_local_datastore(session, &[(extent, &extent_target), (descriptor, &target)])
            .await?;
    if !linked {
        upload(session, &info.datacenter, &extent_target, extent).await?;
        upload(session, &info.datacenter, &target, descriptor).await?;
    }

    let capacity_kb = std::fs::metadata(extent)
        .map_err(|e| io_error(extent, e))?
        .len()
        / 1024;
    let args = format!(
        r#"<spec><deviceChange><operation>add</operation><device xsi:type="VirtualDisk"><key>-100</key><backing xsi:type="VirtualDiskFlatVer2BackingInfo"><fileName>{}</fileName><diskMode>persistent</diskMode><thinProvisioned>false</thinProvisioned></backing><controllerKey>{}</controllerKey><unitNumber>{}</unitNumber><capacityInKB>{capacity_kb}</capacityInKB></device></deviceChange></spec>"#,
        escape(&target.to_string()),
        slot.controller_key,
        slot.unit,
    );
    let task = start_task(session, "ReconfigVM_Task", vm, &args).await?;
    wait_task(session, &task, Duration::from_secs(60)).await?;
    describe_vm(session, vm)
        .await?
        .disks
        .into_iter()
        .find(|d| d.file == target.to_string())
        .ok_or_else(|| Error::InvalidResponse {
            method: "ReconfigVM_Task".into(),
            detail: format!("{target} is not attached to {vm} after the reconfigure succeeded"),
        })
}

/// The first free unit on the controller of the VM's first disk.
fn next_slot(info: &VmInfo) -> Result<DiskSlot> {
    let first = info.disks.first().ok_or_else(|| Error::UnsupportedDisk {
        file: info.name.clone(),
        reason: "the VM has no disk whose controller a new disk could join; name a slot".into(),
    })?;
    let used: Vec<i32> = info
        .disks
        .iter()
        .filter(|d| d.controller_key == first.controller_key)
        .map(|d| d.unit_number)
        .collect();
    // SCSI unit 7 is the controller itself.
    let unit = (0..16).find(|u| !used.contains(u) && *u != 7).unwrap_or(15);
    Ok(DiskSlot {
        controller_key: first.controller_key,
        unit,
    })
}

/// The VM's folder, as the path of its `.vmx`.
async fn vm_home(session: &Session, vm: &MoRef) -> Result<DatastorePath> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &["config.files.vmPathName"],
    )
    .await?;
    let vmx = found
        .first()
        .and_then(|o| o.text("config.files.vmPathName"))
        .unwrap_or_default();
    DatastorePath::parse(vmx).ok_or_else(|| Error::InvalidResponse {
        method: "RetrievePropertiesEx".into(),
        detail: format!("VM {vm} has no datastore path for its files: {vmx:?}"),
    })
}

/// Hard-links each (local file, datastore path) pair into its datastore's directory, when that directory is on
/// this machine. False when it is not (a real vSphere): nothing was linked then.
/// Puts `local` in place of the extent of the VM's disk `index` (a monolithicFlat `<stem>.vmdk` whose extent is
/// `<stem>-flat.vmdk`, as the lab attaches them) in a datastore on this machine, as a hard link: what a guest
/// leaves on its disk when it runs, without writing into a file other links share. The disk keeps its size.
pub async fn relink_local_extent(
    session: &Session,
    vm: &MoRef,
    index: usize,
    local: &Path,
) -> Result<()> {
    let info = describe_vm(session, vm).await?;
    let unsupported = |reason: &str| Error::UnsupportedDisk {
        file: info.name.clone(),
        reason: reason.into(),
    };
    let disk = info
        .disks
        .get(index)
        .ok_or_else(|| unsupported("the VM has no such disk"))?;
    let descriptor =
        DatastorePath::parse(&disk.file).ok_or_else(|| unsupported("unparsable disk file"))?;
    let stem = descriptor
        .path
        .rsplit('/')
        .next()
        .and_then(|name| name.strip_suffix(".vmdk"))
        .ok_or_else(|| unsupported("not a .vmdk"))?;
    let extent = descriptor.sibling(&format!("{stem}-flat.vmdk"));
    if !link_into_local_datastore(session, &[(local, &extent)]).await? {
        return Err(unsupported(
            "its datastore is not a directory on this machine, or another filesystem",
        ));
    }
    Ok(())
}

async fn link_into_local_datastore(
    session: &Session,
    files: &[(&Path, &DatastorePath)],
) -> Result<bool> {
    let datastores = props::retrieve_all(session, "Datastore", &["name", "summary.url"]).await?;
    let mut links = Vec::new();
    for (local, target) in files {
        let dir = datastores
            .iter()
            .find(|d| d.text("name") == Some(target.datastore.as_str()))
            .and_then(|d| d.text("summary.url"))
            .map(std::path::PathBuf::from)
            .filter(|dir| dir.is_absolute() && dir.is_dir());
        let Some(dir) = dir else { return Ok(false) };
        links.push((*local, dir.join(&target.path)));
    }
    for (i, (local, link)) in links.iter().enumerate() {
        remove_if_present(link)?;
        if let Err(e) = std::fs::hard_link(local, link) {
            // Another filesystem: the upload copies instead. The links made so far go first, or the upload would
            // truncate the local files through them.
            tracing::debug!("linking {} to {}: {e}", local.display(), link.display());
            for (_, made) in &links[..i] {
                remove_if_present(made)?;
            }
            return Ok(false);
        }
    }
    Ok(true)
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(path, e)),
        _ => Ok(()),
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default()
}

/// Detaches and deletes the disks with these device keys (simulator VMs come with an empty disk).
pub async fn remove_disks(session: &Session, vm: &MoRef, keys: &[i32]) -> Result<()> {
    let info = describe_vm(session, vm).await?;
    let changes: String = info
        .disks
        .iter()
        .filter(|d| keys.contains(&d.key))
        .map(|d| {
            format!(
                r#"<deviceChange><operation>remove</operation><fileOperation>destroy</fileOperation><device xsi:type="VirtualDisk"><key>{}</key><controllerKey>{}</controllerKey><unitNumber>{}</unitNumber><capacityInKB>0</capacityInKB></device></deviceChange>"#,
                d.key, d.controller_key, d.unit_number
            )
        })
        .collect();
    if changes.is_empty() {
        return Ok(());
    }
    let task = start_task(
        session,
        "ReconfigVM_Task",
        vm,
        &format!("<spec>{changes}</spec>"),
    )
    .await?;
    wait_task(session, &task, Duration::from_secs(60)).await?;
    Ok(())
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::UnsupportedDisk {
        file: path.display().to_string(),
        reason: e.to_string(),
    }
}
