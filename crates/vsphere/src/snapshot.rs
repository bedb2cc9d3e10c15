//! Snapshots, for consistent reads and warm migration later. Ferry removes every snapshot it creates.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::power::{start_task, wait_task};
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
    let args = "<removeChildren>false</removeChildren><consolidate>true</consolidate>";
    match start_task(session, "RemoveSnapshot_Task", snapshot, args).await {
        Ok(task) => wait_task(session, &task, timeout).await.map(|_| ()),
        Err(e) if e.fault() == Some("ManagedObjectNotFound") => Ok(()),
        Err(e) => Err(e),
    }
}
