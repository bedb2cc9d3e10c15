//! Warm migration: the disks are copied while the source runs, from one snapshot at a time, then only what
//! changed since (vSphere's Changed Block Tracking); at cutover the source is powered off and the last changes
//! copied, so the downtime is one small delta instead of every byte.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a warm migration copies while the source runs, and when it cuts over.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WarmSpec {
    /// Seconds from the end of one precopy round to the start of the next.
    #[serde(default = "default_precopy_interval")]
    #[schemars(range(min = 60, max = 604800))]
    pub precopy_interval_seconds: i32,
    /// Set it to cut over: after the round in flight (and at least one round), the source is powered off per
    /// `source.powerOff` and only what changed since is copied. It cannot be taken back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[x_kube(validation = Rule::new("self || !oldSelf").message("spec.warm.cutover cannot go back to false once set"))]
    pub cutover: bool,
    /// Cut over at this time, as if `cutover` were set then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cutover_at: Option<Time>,
    /// How the cutover proves the volumes. `Source` (the default) reads each powered-off source disk whole and
    /// compares its sha256 with its volume's: proof of the whole disk, at the cost of one whole read of every disk
    /// during the downtime. `ChangedAreas` is cheaper: each round's areas were read back against the bytes read,
    /// and each volume is hashed whole, but the source is not read again.
    #[serde(default)]
    pub cutover_check: CutoverCheck,
    /// When the vCenter will not serve a running VM's disks (warm mode refused), copy the source cold at the
    /// cutover: powered off, every byte. Off (the default), the migration waits for a person to allow that (or
    /// cancel) once the refusal is known.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fall_back_to_cold: bool,
    /// Let Ferry turn Changed Block Tracking on when the source has it off: a change to the source's
    /// configuration, undone when the migration ends. Off (the default), a source without it is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_change_tracking: bool,
}

fn default_precopy_interval() -> i32 {
    3600
}

impl Default for WarmSpec {
    fn default() -> Self {
        WarmSpec {
            precopy_interval_seconds: default_precopy_interval(),
            cutover: false,
            cutover_at: None,
            cutover_check: CutoverCheck::default(),
            fall_back_to_cold: false,
            enable_change_tracking: false,
        }
    }
}

/// See [`WarmSpec::cutover_check`].
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CutoverCheck {
    #[default]
    Source,
    ChangedAreas,
}

impl WarmSpec {
    /// Whether the cutover is asked for at `now`.
    pub fn cutover_due(&self, now: &Time) -> bool {
        self.cutover || self.cutover_at.as_ref().is_some_and(|at| at.0 <= now.0)
    }
}

/// A warm migration's precopy: the rounds copied, each disk's change ID, and the snapshot in flight.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmStatus {
    /// Precopy rounds finished (the cutover's copy is not one of them).
    #[serde(default)]
    pub rounds_done: i32,
    /// The latest rounds, oldest first (at most [`WarmStatus::KEPT_ROUNDS`]; `roundsDone` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<WarmRound>,
    /// Per disk, in the order of `disks`: the change ID the last round copied up to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub change_ids: Vec<Option<String>>,
    /// The one snapshot Ferry holds on the source, from before it is created until it is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<WarmSnapshot>,
    /// When the next round starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_round_at: Option<Time>,
    /// The cutover's copy, after power-off: what the downtime was spent on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_copy: Option<WarmRound>,
    /// Why warm mode was refused (the vCenter will not serve a running VM's frozen disks): the cutover copies
    /// the source whole, after power-off, as a cold migration would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Ferry turned Changed Block Tracking on (recorded before it did): it turns it off again at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_tracking_enabled: Option<ChangeTrackingChange>,
}

impl WarmStatus {
    /// Rounds kept in `rounds`.
    pub const KEPT_ROUNDS: usize = 20;

    /// Records a finished round, keeping the latest [`WarmStatus::KEPT_ROUNDS`].
    pub fn push_round(&mut self, round: WarmRound) {
        self.rounds_done = self.rounds_done.max(round.round);
        self.rounds.push(round);
        let over = self.rounds.len().saturating_sub(Self::KEPT_ROUNDS);
        self.rounds.drain(..over);
    }
}

/// Where Ferry's change to the source's Changed Block Tracking stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ChangeTrackingChange {
    /// On record, not yet done (or not known to be).
    Enabling,
    Enabled,
    /// Turned off again.
    Restored,
}

/// A precopy round's snapshot, recorded before each vSphere call about it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmSnapshot {
    /// The round it is for.
    pub round: i32,
    /// `ferry-<migration uid>-<round>`: found by name after a crash between its creation and this record.
    pub name: String,
    /// The create or remove task in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// The snapshot's moref, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moref: Option<String>,
    /// Its round is copied: it is being removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removing: bool,
}

/// One precopy round.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmRound {
    pub round: i32,
    pub started: Option<Time>,
    pub finished: Option<Time>,
    /// Changed areas copied, over all disks (0 for whole copies).
    #[serde(default)]
    pub areas: i64,
    #[serde(default)]
    pub bytes_read: i64,
    #[serde(default)]
    pub bytes_written: i64,
    /// Disks copied whole (a first round, or after vSphere refused a change ID).
    #[serde(default)]
    pub full_disks: i32,
    /// Why disks were copied whole again, when vSphere refused their change ID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

impl WarmRound {
    /// Seconds the round took, when both ends are known.
    pub fn seconds(&self) -> Option<f64> {
        let (start, end) = (self.started.as_ref()?, self.finished.as_ref()?);
        Some(end.0.duration_since(start.0).as_secs_f64())
    }
}
