//! The disks' DataVolumes as the checkpoints see them ([`observe`], [`DvState`]), the blank ones the direct path
//! writes ([`ensure_blank`]), a claim of a DataVolume's name left behind, and removal.

use ferry_api::foreign::DataVolumeStatus;
use ferry_api::{Phase, Reason};
use ferry_kube::create::{Created, create_if_absent};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::{first_consumer, retry};
use crate::build::dv_resource;
use crate::checkpoint::step::{Next, Step};
use crate::error::{Failure, Result};
use crate::{build, children, status};

/// A disk's DataVolume as one pass sees it.
pub struct Observed {
    pub name: String,
    pub dv: Option<DynamicObject>,
    pub state: DvState,
    /// Its failure is on record (charged) and it is not being removed yet: it is to be removed.
    pub charged: bool,
    pub uid: String,
}

/// Reads disk `index`'s DataVolume, refusing one that is not this migration's. The watch cache answers when
/// `waiting_only` says a stale copy of that state can only make us wait (never for a volume whose failure is
/// charged); anything else is read from the API server.
pub async fn observe(
    step: &Step<'_>,
    index: i32,
    waiting_only: impl Fn(&DvState) -> bool,
) -> Result<Observed> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let name = children::data_volume(step.vmm, index);
    let dvs = data_volumes(step, &ns);
    let enough = |dv: &DynamicObject| {
        !status::is_charged(step.status, &dv.uid().unwrap_or_default())
            && waiting_only(&dv_state(Some(dv)))
    };
    let cached = step.ctx.caches.data_volume(&ns, &name);
    let found = crate::cache::read(cached, &dvs, &name, enough).await?;
    let dv = children::refuse_unless_ours(found, step.vmm, "DataVolume", Reason::DataVolumeExists)?;
    let uid = dv.as_ref().and_then(|d| d.uid()).unwrap_or_default();
    let charged = dv
        .as_ref()
        .is_some_and(|d| d.metadata.deletion_timestamp.is_none())
        && status::is_charged(step.status, &uid);
    Ok(Observed {
        state: dv_state(dv.as_ref()),
        name,
        dv,
        charged,
        uid,
    })
}

/// The migration's namespace's DataVolumes.
pub fn data_volumes(step: &Step<'_>, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(step.ctx.client.clone(), ns, &dv_resource())
}

/// CDI's phases of a blank volume that a writer can use: allocated, or populated once its first consumer binds
/// it (`PendingPopulation`: the claim binds only after population, so the writer can be that consumer). Not
/// `WaitForFirstConsumer`: there CDI's importer runs after the first consumer ends ([`first_consumer`]).
pub fn usable(state: &DvState) -> bool {
    match state {
        DvState::Succeeded => true,
        DvState::InProgress { phase, .. } => phase == "PendingPopulation",
        _ => false,
    }
}

/// Where the disks' blank DataVolumes stand after one pass of [`ensure_blank`].
pub enum Ensured {
    /// Every one can be written.
    Usable,
    /// Not yet: what each is waiting for.
    Waiting(Vec<String>),
    /// Something must be on record first (a failure charged, the disks the volumes are for): write the status.
    Persist(Next),
}

/// Makes every disk's blank DataVolume exist, created again after a failure (charged to Allocating's budget).
/// Allocating runs it, and Converting again before each attempt, so a volume lost since is allocated again.
pub async fn ensure_blank(step: &mut Step<'_>) -> Result<Ensured> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let dvs = data_volumes(step, &ns);
    let mut waiting = Vec::new();
    // Whether some volume waits for a first consumer, and whether every disk's volume is there to be bound.
    let (mut awaiting_consumer, mut all_there) = (false, true);
    for i in 0..step.status.disks.len() {
        let disk = step.status.disks[i].clone();
        // A volume the cache shows usable or on its way is only checked again.
        let seen = observe(step, disk.index, |s| {
            usable(s) || matches!(s, DvState::InProgress { .. })
        });
        let Observed {
            name,
            dv,
            state,
            charged,
            uid,
        } = seen.await?;
        awaiting_consumer |= state.waits_for_consumer();
        all_there &= matches!(state, DvState::InProgress { .. } | DvState::Succeeded) && !charged;
        if let Some(dv) = &dv
            && charged
        {
            // Its failure is on record: remove it, and it is allocated again.
            delete_dv(&dvs, dv).await?;
            waiting.push(format!("{name} removed to be allocated again"));
            continue;
        }
        if usable(&state) {
            step.status.disks[i].data_volume = Some(name);
            continue;
        }
        match state {
            DvState::Absent => {
                // Discovery's disks may still be only in this pass's working copy: a volume is created only for
                // a disk on record.
                let on_record = step
                    .vmm
                    .status
                    .as_ref()
                    .is_some_and(|s| s.disks.len() == step.status.disks.len());
                if !on_record {
                    return Ok(Ensured::Persist(Next::persist(
                        "Allocating",
                        "recording the source's disks before allocating their volumes",
                    )));
                }
                if earlier_claim_left(step, &ns, &name).await? {
                    waiting.push(format!("the previous claim {name} is being removed"));
                    continue;
                }
                let placement = crate::maps::disk_storage(step.vmm, &disk);
                let blank = build::datavolume::blank_data_volume(
                    step.vmm,
                    disk.index,
                    disk.capacity_bytes,
                    &placement,
                )
                .ok_or_else(|| {
                    Failure::permanent(
                        Reason::APIRejected,
                        format!("DataVolume {name} does not build"),
                    )
                })?;
                create_if_absent(&dvs, &blank).await?;
                step.status.disks[i].data_volume = Some(name.clone());
                waiting.push(format!("{name} created"));
            }
            DvState::Failed { message } => {
                let failure = Failure::bounded(
                    Reason::VolumeAllocationFailed,
                    format!("DataVolume {name}: {message}"),
                );
                return allocation_failed(step, &uid, failure).map(Ensured::Persist);
            }
            DvState::Terminating => waiting.push(format!("{name} being removed")),
            DvState::InProgress { .. }
                if let Some(why) = dv
                    .as_ref()
                    .and_then(|dv| unbound_past_deadline(dv, &step.now)) =>
            {
                let failure = Failure::bounded(
                    Reason::VolumeNotBound,
                    format!("DataVolume {name} is {why}"),
                );
                return allocation_failed(step, &uid, failure).map(Ensured::Persist);
            }
            DvState::InProgress { phase, .. } => waiting.push(format!("{name} {phase}")),
            DvState::Succeeded => {}
        }
    }
    if let Some(consumer) = first_consumer::ensure(step, awaiting_consumer && all_there).await? {
        waiting.push(consumer);
    }
    Ok(if waiting.is_empty() {
        Ensured::Usable
    } else {
        Ensured::Waiting(waiting)
    })
}

/// A failed allocation: charged to the budget and recorded before the DataVolume is removed.
fn allocation_failed(step: &mut Step<'_>, failed: &str, failure: Failure) -> Result<Next> {
    retry::charge(step, Phase::Allocating, failed, &failure)?;
    Ok(retry::persist(
        step,
        Phase::Allocating,
        "AllocationRetrying",
        &failure,
    ))
}

/// What CDI reports about a DataVolume.
#[derive(Clone, Debug, PartialEq)]
pub enum DvState {
    Absent,
    /// Being deleted: wait until it is gone before creating it again.
    Terminating,
    InProgress {
        phase: String,
        progress: Option<String>,
    },
    Succeeded,
    Failed {
        message: String,
    },
}

/// CDI never fails an import whose importer pod fails (a source it cannot read, wrong credentials, a full
/// volume): it restarts the pod without end, the DataVolume stays in its phase with `Running` False for reason
/// `Error`, and counts the restarts. After this many, the attempt has failed, with the importer's own error.
pub const IMPORTER_RESTART_LIMIT: i64 = 3;

/// The phase CDI gives a blank DataVolume whose claim waits for a first consumer it will not provide.
pub const WAITING_PHASE: &str = "WaitForFirstConsumer";

impl DvState {
    /// Whether CDI waits for somebody else to use the claim first ([`first_consumer`]).
    pub fn waits_for_consumer(&self) -> bool {
        matches!(self, DvState::InProgress { phase, .. } if phase == WAITING_PHASE)
    }
}

pub fn dv_state(dv: Option<&DynamicObject>) -> DvState {
    let Some(dv) = dv else { return DvState::Absent };
    if dv.metadata.deletion_timestamp.is_some() {
        return DvState::Terminating;
    }
    let status = DataVolumeStatus::of(dv);
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    let progress = status.progress.clone().filter(|p| p != "N/A");
    match phase.as_str() {
        "Succeeded" => DvState::Succeeded,
        "Failed" => {
            let message = status.message_of(&["Ready", "Running"]);
            let message = message.unwrap_or("the import failed").to_string();
            DvState::Failed { message }
        }
        _ => match importer_failing(&status) {
            Some(message) => DvState::Failed { message },
            None => DvState::InProgress { phase, progress },
        },
    }
}

/// The importer's error once CDI restarted it [`IMPORTER_RESTART_LIMIT`] times and it still fails.
fn importer_failing(status: &DataVolumeStatus) -> Option<String> {
    let restarts = status.restart_count.unwrap_or(0);
    let running = status.condition("Running")?;
    let failing = running.status == "False" && running.reason.as_deref() == Some("Error");
    (failing && restarts >= IMPORTER_RESTART_LIMIT).then(|| {
        let error = running.message.as_deref().unwrap_or("no message");
        format!("CDI's importer failed {restarts} times: {error}")
    })
}

/// How long a DataVolume may stay `Pending` (its claim not bound, or not even created: a quota, no capacity, a
/// StorageClass nobody provisions), or `WaitForFirstConsumer` with Ferry's first consumer there (no node can take
/// it and the volumes), before the attempt counts as failed. CDI binds in seconds when it can. A volume in
/// `PendingPopulation` is the conversion pod's to bind, and is usable.
pub const BIND_DEADLINE_SECONDS: i64 = 15 * 60;

/// Why `dv` is still `Pending` or `WaitForFirstConsumer` past [`BIND_DEADLINE_SECONDS`] after it was created, as
/// CDI says it; None while it has time or has moved on. Pure.
pub fn unbound_past_deadline(dv: &DynamicObject, now: &Time) -> Option<String> {
    let status = DataVolumeStatus::of(dv);
    let phase = status.phase.as_deref().unwrap_or("Pending");
    if phase != "Pending" && phase != WAITING_PHASE {
        return None;
    }
    let created = dv.metadata.creation_timestamp.as_ref()?;
    let waited = now.0.duration_since(created.0).as_secs();
    (waited >= BIND_DEADLINE_SECONDS).then(|| {
        let said = status
            .message_of(&["Bound", "Ready", "Running"])
            .filter(|m| !m.is_empty())
            .unwrap_or("no condition says why");
        let why = if phase == "Pending" {
            "its claim is not bound: a quota, no capacity, or a StorageClass nobody provisions?"
        } else {
            "its claim waits for a first consumer: can no node take the first-consumer Job and all of the VM's \
             volumes?"
        };
        format!("still {phase} {waited}s after it was created ({why}): {said}")
    })
}

/// Whether a claim named `name` is still there from an earlier DataVolume of this migration (being collected):
/// a new DataVolume must wait, or it would take that claim for its own. A claim that is not this migration's
/// is a person's to remove.
pub async fn earlier_claim_left(step: &Step<'_>, ns: &str, name: &str) -> Result<bool> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(step.ctx.client.clone(), ns);
    let Some(claim) = claims.get_opt(name).await? else {
        return Ok(false);
    };
    if claim.metadata.deletion_timestamp.is_none()
        && claim.labels().get(children::UID_LABEL) != Some(&children::uid(step.vmm))
    {
        return Err(Failure::fixable(
            Reason::PersistentVolumeClaimExists,
            format!(
                "PersistentVolumeClaim {ns}/{name} exists and is not this migration's; delete it"
            ),
        ));
    }
    Ok(true)
}

/// Deletes `dv`, one of ours just read, unless it has been replaced since.
pub async fn delete_dv(dvs: &Api<DynamicObject>, dv: &DynamicObject) -> Result<()> {
    let uid = dv.metadata.uid.as_deref().unwrap_or_default();
    Ok(ferry_kube::delete::delete_exactly(dvs, &dv.name_any(), uid).await?)
}

/// The ConfigMap with the staging CA bundle that CDI's importer trusts, there before any DataVolume names it, and
/// brought up to date if the bundle changed. Nothing without a bundle.
pub async fn ensure_staging_ca(step: &Step<'_>, ns: &str) -> Result<()> {
    let Some(wanted) = build::datavolume::staging_ca(step.vmm) else {
        return Ok(());
    };
    let maps = Api::<ConfigMap>::namespaced(step.ctx.client.clone(), ns);
    if create_if_absent(&maps, &wanted).await? == Created::Now {
        return Ok(());
    }
    let name = wanted.name_any();
    let found = maps.get_opt(&name).await?;
    match children::refuse_unless_ours(found, step.vmm, "ConfigMap", Reason::ConfigMapExists)? {
        Some(found) if found.data != wanted.data => {
            let patch = serde_json::json!({"data": wanted.data});
            maps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(())
        }
        Some(_) => Ok(()),
        None => Err(Failure::transient(
            Reason::NotFound,
            format!("ConfigMap {ns}/{name} went away as it was created; creating it again"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_volume_pending_past_its_bind_deadline_says_why() {
        let at = |secs: i64| Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap());
        let dv: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "m-disk-0", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Pending", "conditions": [{"type": "Bound", "status": "False",
                "message": "exceeded quota: storage"}]},
        }))
        .unwrap();
        let created = dv
            .metadata
            .creation_timestamp
            .clone()
            .unwrap()
            .0
            .as_second();
        assert_eq!(unbound_past_deadline(&dv, &at(created + 60)), None);
        let late = unbound_past_deadline(&dv, &at(created + BIND_DEADLINE_SECONDS)).unwrap();
        assert!(late.contains("exceeded quota: storage"), "{late}");
        // Populators bind the claim once the conversion pod uses it: no deadline before that.
        let mut populating = dv.clone();
        populating.data["status"]["phase"] = json!("PendingPopulation");
        assert_eq!(
            unbound_past_deadline(&populating, &at(created + 86_400)),
            None
        );
        // CDI's legacy path waits for a consumer Ferry provides: one that never binds runs out of time.
        let mut waiting = dv.clone();
        waiting.data["status"]["phase"] = json!("WaitForFirstConsumer");
        assert_eq!(unbound_past_deadline(&waiting, &at(created + 60)), None);
        let late = unbound_past_deadline(&waiting, &at(created + BIND_DEADLINE_SECONDS)).unwrap();
        assert!(late.starts_with("still WaitForFirstConsumer"), "{late}");
        assert!(late.contains("first-consumer Job"), "{late}");
    }

    #[test]
    fn cdi_phases_map_to_states() {
        let dv = |status: serde_json::Value| -> DynamicObject {
            serde_json::from_value(
                json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "d"}, "status": status}),
            )
            .unwrap()
        };
        assert_eq!(dv_state(None), DvState::Absent);
        assert_eq!(
            dv_state(Some(&dv(json!({"phase": "Succeeded"})))),
            DvState::Succeeded
        );
        assert_eq!(
            dv_state(Some(&dv(
                json!({"phase": "ImportInProgress", "progress": "12.5%"})
            ))),
            DvState::InProgress {
                phase: "ImportInProgress".into(),
                progress: Some("12.5%".into())
            }
        );
        let failed = dv(
            json!({"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "message": "boom"}]}),
        );
        assert_eq!(
            dv_state(Some(&failed)),
            DvState::Failed {
                message: "boom".into()
            }
        );
    }

    #[test]
    fn only_cdis_legacy_wait_needs_a_consumer_of_ours() {
        let phase = |p: &str| DvState::InProgress {
            phase: p.into(),
            progress: None,
        };
        assert!(phase("WaitForFirstConsumer").waits_for_consumer());
        // Populators bind the claim only once it is populated: the conversion pod may be the first consumer.
        assert!(!phase("PendingPopulation").waits_for_consumer());
        assert!(!phase("PVCBound").waits_for_consumer());
        assert!(!DvState::Succeeded.waits_for_consumer());
        assert!(!DvState::Absent.waits_for_consumer());
    }

    /// Real CDI v1.65.0's status for an S3 import with a wrong secret, 60 s in: never `Failed`.
    #[test]
    fn an_importer_cdi_keeps_restarting_fails_the_attempt_with_its_error() {
        let error = "Unable to connect to s3 data source: could not get s3 object: \"ferry-staging/migrations/\
            disk-0.raw\": InvalidAccessKeyId: The Access Key Id you provided does not exist in our records. \
            \tstatus code: 403, request id: 18EE8E5F801286E9";
        let status = |restarts: i64| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "d"},
                "status": {"claimName": "d", "phase": "ImportInProgress", "progress": "N/A",
                    "restartCount": restarts, "conditions": [
                    {"type": "Bound", "status": "True", "reason": "Bound", "message": "PVC d Bound"},
                    {"type": "Ready", "status": "False"},
                    {"type": "Running", "status": "False", "reason": "Error", "message": error}]},
            }))
            .unwrap()
        };
        assert_eq!(
            dv_state(Some(&status(2))),
            DvState::InProgress {
                phase: "ImportInProgress".into(),
                progress: None
            },
            "a restart or two may be a passing fault"
        );
        assert_eq!(
            dv_state(Some(&status(IMPORTER_RESTART_LIMIT))),
            DvState::Failed {
                message: format!("CDI's importer failed 3 times: {error}")
            }
        );
        let mut recovered = status(5);
        recovered.data["status"]["conditions"][2] = json!({"type": "Running", "status": "True"});
        assert!(matches!(
            dv_state(Some(&recovered)),
            DvState::InProgress { .. }
        ));
    }
}
