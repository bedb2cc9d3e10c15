//! Snapshots, for consistent reads and warm migration. Ferry removes every snapshot it creates.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::power::{start_task, wait_task};
use crate::props;
use crate::session::Session;
use crate::soap::MoRef;
use crate::xml::escape;

/// Starts `CreateSnapshot_Task` (no memory, no quiescing); record the task, then [`finish_create`].
pub async fn start_create(
    session: &Session,
    vm: &MoRef,
    name: &str,
    description: &str,
) -> Result<MoRef> {
    let args = format!(
        "<name>{}</name><description>{}</description><memory>false</memory><quiesce>false</quiesce>",
        escape(name),
        escape(description)
    );
    start_task(session, "CreateSnapshot_Task", vm, &args).await
}

/// Follows a snapshot task to its end; returns the snapshot.
pub async fn finish_create(session: &Session, task: &MoRef, timeout: Duration) -> Result<MoRef> {
    wait_task(session, task, timeout)
        .await?
        .ok_or_else(|| Error::InvalidResponse {
            method: "CreateSnapshot_Task".into(),
            detail: "the task returned no snapshot".into(),
        })
}

pub async fn create(session: &Session, vm: &MoRef, name: &str, timeout: Duration) -> Result<MoRef> {
    let task = start_create(session, vm, name, "created by Ferry").await?;
    finish_create(session, &task, timeout).await
}

/// Removes one snapshot and consolidates; a snapshot already gone counts as removed.
pub async fn remove(session: &Session, snapshot: &MoRef, timeout: Duration) -> Result<()> {
    match start_remove(session, snapshot).await? {
        Some(task) => wait_task(session, &task, timeout).await.map(|_| ()),
        None => Ok(()),
    }
}

/// Starts `RemoveSnapshot_Task` (consolidating, children kept); None when the snapshot is gone already.
pub async fn start_remove(session: &Session, snapshot: &MoRef) -> Result<Option<MoRef>> {
    let args = "<removeChildren>false</removeChildren><consolidate>true</consolidate>";
    match start_task(session, "RemoveSnapshot_Task", snapshot, args).await {
        Ok(task) => Ok(Some(task)),
        Err(e) if e.fault() == Some("ManagedObjectNotFound") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `snapshot` still exists: a read, so that a removal whose record was lost is not asked again.
pub async fn exists(session: &Session, snapshot: &MoRef) -> Result<bool> {
    match props::retrieve(
        session,
        "VirtualMachineSnapshot",
        std::slice::from_ref(snapshot),
        &["vm"],
    )
    .await
    {
        Ok(found) => Ok(!found.is_empty()),
        Err(e) if e.fault() == Some("ManagedObjectNotFound") => Ok(false),
        Err(e) => Err(e),
    }
}

/// One snapshot in a VM's tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub snapshot: MoRef,
}

/// Every snapshot of `vm` whose name starts with `prefix`, from its whole tree.
pub async fn named(session: &Session, vm: &MoRef, prefix: &str) -> Result<Vec<Named>> {
    let found = props::retrieve(
        session,
        "VirtualMachine",
        std::slice::from_ref(vm),
        &["snapshot"],
    )
    .await?;
    let mut out = Vec::new();
    if let Some(info) = found.first().and_then(|o| o.prop("snapshot")) {
        collect(info.children_named("rootSnapshotList"), prefix, &mut out);
    }
    Ok(out)
}

fn collect<'a>(
    list: impl Iterator<Item = &'a crate::xml::Element>,
    prefix: &str,
    out: &mut Vec<Named>,
) {
    for tree in list {
        let name = tree.text_at(&["name"]).unwrap_or_default();
        if let Some(snapshot) = tree.child("snapshot").and_then(MoRef::from_element)
            && name.starts_with(prefix)
        {
            out.push(Named {
                name: name.to_string(),
                snapshot,
            });
        }
        collect(tree.children_named("childSnapshotList"), prefix, out);
    }
}
