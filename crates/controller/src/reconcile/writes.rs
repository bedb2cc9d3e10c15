//! The reconcile's writes: the guarded status write, the finalizer, and Events.

use ferry_api::{FINALIZER, VirtualMachineMigration, VirtualMachineMigrationStatus as Status};
use ferry_kube::status::apply_guarded;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use std::time::Duration;

use super::key;
use crate::children::MANAGER;
use crate::context::Context;
use crate::error::Result;

/// A migration's progress (a DataVolume's percentage, say) is written at most this often: a thousand imports
/// report theirs many times a minute, and each write costs the API server and a reconcile.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// Writes status when it differs from what was read, with that read's resourceVersion as a precondition. When
/// the reconcile `waits` (concludes with a wait, its timer set): a change of progress alone is written at most
/// every [`PROGRESS_INTERVAL`] (`Some` is when to look again so the latest progress is shown).
pub(super) async fn write_status(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    before: &Status,
    status: &mut Status,
    waits: bool,
) -> Result<Option<Duration>> {
    status.progress = crate::status::progress(status).or(status.progress.take());
    status.observed_generation = vmm.metadata.generation;
    if status == before {
        return Ok(None);
    }
    if waits
        && crate::status::only_progress(before, status)
        && let Some(left) = ctx.progress_shown_within(&key(vmm), PROGRESS_INTERVAL)
    {
        return Ok(Some(left));
    }
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &vmm.namespace().unwrap_or_default());
    let written = apply_guarded(&api, vmm, &*status, MANAGER).await?;
    ctx.wrote(&key(vmm), written.resource_version());
    crate::slots::wrote(&ctx.slots, vmm, before, status);
    Ok(None)
}

pub(super) async fn set_finalizer(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    present: bool,
) -> Result<()> {
    let mut finalizers: Vec<String> = vmm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(FINALIZER.to_string());
    }
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &vmm.namespace().unwrap_or_default());
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": vmm.resource_version()}});
    match api
        .patch(
            &vmm.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        // Released: the migration is over, and nothing reconciles it against our writes any more.
        Ok(_) if !present => {
            ctx.forget(&key(vmm));
            Ok(())
        }
        Ok(written) => {
            ctx.wrote(&key(vmm), written.resource_version());
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 && !present => {
            ctx.forget(&key(vmm));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn event(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &vmm.object_ref(&())).await {
        tracing::warn!(
            class = "Transient",
            reason = "EventNotPublished",
            "publishing an event: {e}"
        );
    }
}
