//! Provisioning a simulator for the lab and tests: upload a disk into a VM's folder and attach it. Behind the
//! `provision` feature, so the controller, which must never change a source VM beyond its power, does not link it.
use std::path::Path;
use std::time::Duration;

use reqwest::Body;

use crate::datastore::{DatastorePath, folder_url};
use crate::error::{Error, Result};
use crate::inventory::describe_vm;
use crate::power::{start_task, wait_task};
use crate::session::Session;
use crate::soap::MoRef;
use crate::xml::escape;

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
        detail: e.to_string(),
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
    let info = describe_vm(session, vm).await?;
    let first = info.disks.first().ok_or_else(|| Error::UnsupportedDisk {
        file: info.name.clone(),
        reason: "the VM has no disk whose controller a new disk could join".into(),
    })?;
    let home = DatastorePath::parse(&first.file).ok_or_else(|| Error::UnsupportedDisk {
        file: first.file.clone(),
        reason: "not a datastore path".into(),
    })?;
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let target = home.sibling(&name(descriptor));
    upload(
        session,
        &info.datacenter,
        &home.sibling(&name(extent)),
        extent,
    )
    .await?;
    upload(session, &info.datacenter, &target, descriptor).await?;

    let used: Vec<i32> = info
        .disks
        .iter()
        .filter(|d| d.controller_key == first.controller_key)
        .map(|d| d.unit_number)
        .collect();
    // SCSI unit 7 is the controller itself.
    let unit = (0..16).find(|u| !used.contains(u) && *u != 7).unwrap_or(15);
    let capacity_kb = std::fs::metadata(extent)
        .map_err(|e| io_error(extent, e))?
        .len()
        / 1024;
    let args = format!(
        r#"<spec><deviceChange><operation>add</operation><device xsi:type="VirtualDisk"><key>-100</key><backing xsi:type="VirtualDiskFlatVer2BackingInfo"><fileName>{}</fileName><diskMode>persistent</diskMode><thinProvisioned>false</thinProvisioned></backing><controllerKey>{}</controllerKey><unitNumber>{unit}</unitNumber><capacityInKB>{capacity_kb}</capacityInKB></device></deviceChange></spec>"#,
        escape(&target.to_string()),
        first.controller_key
    );
    let task = start_task(session, "ReconfigVM_Task", vm, &args).await?;
    wait_task(session, &task, Duration::from_secs(60)).await?;
    Ok(target)
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
