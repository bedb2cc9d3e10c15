//! A migration as the dashboard shows it: where it stands, how far each disk is, why it waits or failed, and
//! when it entered each checkpoint. Everything comes from its status as the controller recorded it.

use ferry_api::{Phase, VirtualMachineMigration, VirtualMachineMigrationStatus, keys};
use k8s_openapi::jiff::Timestamp;

use crate::format;

/// How a phase reads at a glance; the page says it in words too, never by colour alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    Good,
    Bad,
    /// Stopped until a person acts.
    Attention,
    Busy,
    Waiting,
    Neutral,
}

pub fn tone(phase: Option<Phase>) -> Tone {
    match phase {
        Some(Phase::Succeeded) => Tone::Good,
        Some(Phase::Failed) => Tone::Bad,
        Some(Phase::ManualInterventionRequired) => Tone::Attention,
        Some(Phase::Cancelled | Phase::Cancelling) => Tone::Neutral,
        None => Tone::Waiting,
        Some(_) => Tone::Busy,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MigrationView {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub tone: Tone,
    pub ended: bool,
    /// The checkpoint it is in, or the last one it entered before it ended.
    pub checkpoint: String,
    /// The source VM as the spec names it, or as discovery found it.
    pub vm: String,
    pub host: Option<String>,
    pub target_vm: Option<String>,
    /// The migration created its target VM (it records the VM's uid then).
    pub target_created: bool,
    /// The plan that made it (its name).
    pub plan: Option<String>,
    pub bytes_done: f64,
    pub bytes_total: i64,
    pub disks: Vec<DiskView>,
    /// Why it waits, stopped or failed; what it is doing while it runs.
    pub why: Option<Why>,
    pub next_attempt: Option<Timestamp>,
    pub created: Option<Timestamp>,
    pub started: Option<Timestamp>,
    pub completed: Option<Timestamp>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DiskView {
    pub index: i32,
    pub source_file: String,
    pub capacity: i64,
    pub fraction: f64,
    /// `not copied yet`, `written, importing 45%`, `imported, sha256 verified`.
    pub state: String,
}

/// A reason and its message, and what kind of news it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Why {
    pub kind: WhyKind,
    pub reason: String,
    pub message: String,
    /// The checkpoint the error came from, with its class (`Permanent`, `Transient`, ...).
    pub checkpoint: Option<String>,
    pub class: Option<String>,
    pub at: Option<Timestamp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhyKind {
    Failed,
    /// Waits for a person (ManualInterventionRequired).
    Stopped,
    /// Runs, or waits for something it will retry: the status's reason and message.
    Now,
    Cancelled,
}

impl WhyKind {
    pub fn label(self) -> &'static str {
        match self {
            WhyKind::Failed => "Failed",
            WhyKind::Stopped => "Waits for a person",
            WhyKind::Now => "Now",
            WhyKind::Cancelled => "Cancelled",
        }
    }
}

impl MigrationView {
    pub fn of(vmm: &VirtualMachineMigration) -> Self {
        let empty = VirtualMachineMigrationStatus::default();
        let status = vmm.status.as_ref().unwrap_or(&empty);
        let (bytes_done, bytes_total) = status.bytes_done();
        let source = status.source.as_ref();
        let vm = &vmm.spec.source.vm;
        let asked = [&vm.name, &vm.inventory_path, &vm.uuid, &vm.moref]
            .into_iter()
            .find_map(|k| k.clone());
        Self {
            namespace: vmm.metadata.namespace.clone().unwrap_or_default(),
            name: vmm.metadata.name.clone().unwrap_or_default(),
            phase: format::phase(status.phase),
            tone: tone(status.phase),
            ended: status.phase.is_some_and(Phase::is_terminal),
            checkpoint: checkpoint(status),
            vm: source.map(|s| s.name.clone()).or(asked).unwrap_or_default(),
            host: source.and_then(|s| s.host.clone()),
            target_vm: status.target_vm.clone(),
            target_created: status.target_vm_uid.is_some(),
            plan: vmm
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::PLAN_LABEL).cloned()),
            bytes_done,
            bytes_total,
            disks: status
                .disks
                .iter()
                .map(|d| disk(d, status.phase.is_some_and(Phase::is_terminal)))
                .collect(),
            why: why(status),
            next_attempt: status
                .retry
                .as_ref()
                .and_then(|r| r.next_attempt_time.as_ref())
                .map(|t| t.0)
                .filter(|_| !status.phase.is_some_and(Phase::is_terminal)),
            created: vmm.metadata.creation_timestamp.as_ref().map(|t| t.0),
            started: status.start_time.as_ref().map(|t| t.0),
            completed: status.completion_time.as_ref().map(|t| t.0),
        }
    }

    /// Bytes done over the total, 0 before the disks are known.
    pub fn fraction(&self) -> f64 {
        if self.bytes_total > 0 {
            self.bytes_done / self.bytes_total as f64
        } else {
            0.0
        }
    }
}

/// The checkpoint it is in; for one that ended, the last checkpoint it entered before that.
fn checkpoint(status: &VirtualMachineMigrationStatus) -> String {
    let ended = status
        .phase
        .is_some_and(|p| p.is_terminal() || p == Phase::ManualInterventionRequired);
    if !ended || status.phase == Some(Phase::Succeeded) {
        return format::phase(status.phase);
    }
    let last_error = status.retry.as_ref().and_then(|r| r.last_error.as_ref());
    let entered = status.checkpoints.iter().rev().map(|c| c.phase).find(|p| {
        !p.is_terminal() && !matches!(p, Phase::ManualInterventionRequired | Phase::Cancelling)
    });
    match (status.phase, last_error) {
        (Some(Phase::Failed | Phase::ManualInterventionRequired), Some(error)) => {
            format::phase(Some(error.phase))
        }
        _ => entered.map_or_else(|| format::phase(status.phase), |p| format::phase(Some(p))),
    }
}

/// A disk; of a migration that `ended`, one not copied never will be.
fn disk(d: &ferry_api::DiskStatus, ended: bool) -> DiskView {
    let importing = d.progress.clone().unwrap_or_else(|| "0%".into());
    let state = match (d.verified, d.sha256.is_some()) {
        (true, _) => "imported, sha256 verified".to_string(),
        (false, true) if d.done_fraction() >= 1.0 => "written and imported".to_string(),
        (false, true) => format!("copied, importing {importing}"),
        (false, false) if ended => "not copied".to_string(),
        (false, false) => "not copied yet".to_string(),
    };
    DiskView {
        index: d.index,
        source_file: d.source_file.clone(),
        capacity: d.capacity_bytes,
        fraction: d.done_fraction(),
        state,
    }
}

/// Why it stands where it does: the last error for one that failed or stopped (status.retry.lastError), else
/// the status's own reason and message.
fn why(status: &VirtualMachineMigrationStatus) -> Option<Why> {
    let kind = match status.phase {
        Some(Phase::Succeeded) => return None,
        Some(Phase::Failed) => WhyKind::Failed,
        Some(Phase::ManualInterventionRequired) => WhyKind::Stopped,
        Some(Phase::Cancelled | Phase::Cancelling) => WhyKind::Cancelled,
        _ => WhyKind::Now,
    };
    let last_error = status.retry.as_ref().and_then(|r| r.last_error.as_ref());
    match (kind, last_error) {
        (WhyKind::Failed | WhyKind::Stopped, Some(e)) => Some(Why {
            kind,
            reason: e.reason.clone(),
            message: e.message.clone(),
            checkpoint: Some(format::phase(Some(e.phase))),
            class: Some(format!("{:?}", e.class)),
            at: Some(e.time.0),
        }),
        _ => status.reason.as_ref().map(|reason| Why {
            kind,
            reason: reason.clone(),
            message: status.message.clone().unwrap_or_default(),
            checkpoint: None,
            class: None,
            at: None,
        }),
    }
}

/// One checkpoint in the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineRow {
    pub phase: String,
    pub entered: Timestamp,
    /// Seconds after the first checkpoint.
    pub after_start: f64,
    /// Seconds until the next checkpoint, the end, or now for the one it is in.
    pub took: f64,
    /// It is in this checkpoint now.
    pub current: bool,
}

/// The checkpoints in the order entered, from the recorded timestamps; the last one of a migration that has not
/// ended runs until `now`. A terminal phase is a point: it took nothing.
pub fn timeline(status: &VirtualMachineMigrationStatus, now: Timestamp) -> Vec<TimelineRow> {
    let Some(first) = status.checkpoints.first() else {
        return Vec::new();
    };
    let start = first.entered.0;
    let ended = status.phase.is_some_and(Phase::is_terminal);
    let end = status
        .completion_time
        .as_ref()
        .map(|t| t.0)
        .filter(|_| ended);
    let seconds = |from: Timestamp, to: Timestamp| to.duration_since(from).as_secs_f64().max(0.0);
    let count = status.checkpoints.len();
    status
        .checkpoints
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let last = i + 1 == count;
            let until = match status.checkpoints.get(i + 1) {
                Some(next) => next.entered.0,
                None if c.phase.is_terminal() => c.entered.0,
                None => end.unwrap_or(now),
            };
            TimelineRow {
                phase: format::phase(Some(c.phase)),
                entered: c.entered.0,
                after_start: seconds(start, c.entered.0),
                took: seconds(c.entered.0, until),
                current: last && !ended,
            }
        })
        .collect()
}

/// A condition as the page lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct ConditionRow {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub since: Timestamp,
}

pub fn conditions(status: &VirtualMachineMigrationStatus) -> Vec<ConditionRow> {
    status
        .conditions
        .iter()
        .map(|c| ConditionRow {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            since: c.last_transition_time.0,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn vmm(name: &str, status: serde_json::Value) -> VirtualMachineMigration {
        serde_json::from_value(json!({
            "apiVersion": "migration.platform.example/v1alpha1", "kind": "VirtualMachineMigration",
            "metadata": {"name": name, "namespace": "apps", "uid": format!("uid-{name}"),
                         "creationTimestamp": "2026-12-01T10:00:00Z",
                         "labels": {"migration.platform.example/plan": "wave",
                                    "migration.platform.example/plan-uid": "plan-uid"}},
            "spec": {"source": {"providerRef": {"name": "vc"}, "vm": {"name": name}},
                     "target": {"networks": []}},
            "status": status}))
        .unwrap()
    }

    const MIB: i64 = 1048576;

    #[test]
    fn a_failed_migration_says_its_last_error_and_the_checkpoint_it_came_from() {
        let m = vmm(
            "enc",
            json!({
            "phase": "Failed", "reason": "EncryptedDisk", "message": "refused",
            "checkpoints": [{"phase": "Discovering", "entered": "2026-12-01T10:00:00.000000Z"},
                            {"phase": "Validating", "entered": "2026-12-01T10:00:00.400000Z"},
                            {"phase": "Failed", "entered": "2026-12-01T10:00:01.000000Z"}],
            "retry": {"attempts": 1, "lastError": {"class": "Permanent", "reason": "EncryptedDisk",
                "message": "disk 0 is VM Encryption ciphertext", "phase": "Validating",
                "time": "2026-12-01T10:00:01Z"}}}),
        );
        let view = MigrationView::of(&m);
        assert_eq!(
            (view.phase.as_str(), view.checkpoint.as_str()),
            ("Failed", "Validating")
        );
        assert_eq!(view.tone, Tone::Bad);
        let why = view.why.unwrap();
        assert_eq!(why.kind, WhyKind::Failed);
        assert_eq!(why.reason, "EncryptedDisk");
        assert_eq!(why.message, "disk 0 is VM Encryption ciphertext");
        assert_eq!(why.class.as_deref(), Some("Permanent"));
        assert_eq!(view.plan.as_deref(), Some("wave"));
    }

    #[test]
    fn a_running_migration_says_what_it_waits_for_and_how_far_each_disk_is() {
        let m = vmm(
            "web",
            json!({
            "phase": "Preparing", "reason": "WaitingForHostSlot", "message": "waiting for a disk slot on host h1",
            "retry": {"attempts": 0, "nextAttemptTime": "2026-12-01T10:02:00Z"},
            "source": {"name": "web-01", "moref": "vm-1", "host": "h1", "cpus": 1, "coresPerSocket": 1,
                       "memoryMib": 512},
            "disks": [{"index": 0, "sourceFile": "[ds] web/web.vmdk", "capacityBytes": 64 * MIB},
                      {"index": 1, "sourceFile": "[ds] web/web_1.vmdk", "capacityBytes": 64 * MIB,
                       "sha256": "ab", "progress": "50.0%"},
                      {"index": 2, "sourceFile": "[ds] web/web_2.vmdk", "capacityBytes": 128 * MIB,
                       "sha256": "cd", "verified": true}]}),
        );
        let view = MigrationView::of(&m);
        assert_eq!(view.checkpoint, "Preparing");
        assert_eq!(
            (view.vm.as_str(), view.host.as_deref()),
            ("web-01", Some("h1"))
        );
        let why = view.why.clone().unwrap();
        assert_eq!(
            (why.kind, why.reason.as_str()),
            (WhyKind::Now, "WaitingForHostSlot")
        );
        assert!(view.next_attempt.is_some());
        let states: Vec<_> = view
            .disks
            .iter()
            .map(|d| (d.fraction, d.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                (0.0, "not copied yet"),
                (0.75, "copied, importing 50.0%"),
                (1.0, "imported, sha256 verified")
            ]
        );
        // 0 + 48 + 128 MiB of 256 MiB.
        assert_eq!(view.fraction(), 176.0 / 256.0);
    }

    #[test]
    fn a_succeeded_migration_has_nothing_to_explain() {
        let view = MigrationView::of(&vmm(
            "ok",
            json!({"phase": "Succeeded", "reason": "GuestReady"}),
        ));
        assert_eq!(view.why, None);
        assert!(view.ended);
        assert_eq!(MigrationView::of(&vmm("new", json!(null))).phase, "Pending");
    }

    #[test]
    fn the_timeline_runs_from_checkpoint_to_checkpoint_and_the_current_one_until_now() {
        let status = |phase: &str, completed: Option<&str>| -> VirtualMachineMigrationStatus {
            let mut checkpoints = vec![
                json!({"phase": "Discovering", "entered": "2026-12-01T10:00:00.000000Z"}),
                json!({"phase": "Validating", "entered": "2026-12-01T10:00:00.500000Z"}),
                json!({"phase": "Converting", "entered": "2026-12-01T10:00:02.000000Z"}),
            ];
            if phase == "Succeeded" {
                checkpoints
                    .push(json!({"phase": "Succeeded", "entered": "2026-12-01T10:00:12.000000Z"}));
            }
            serde_json::from_value(json!({"phase": phase, "checkpoints": checkpoints,
                "completionTime": completed}))
            .unwrap()
        };
        let now: Timestamp = "2026-12-01T10:00:07Z".parse().unwrap();
        let running = timeline(&status("Converting", None), now);
        let took: Vec<_> = running
            .iter()
            .map(|r| (r.phase.as_str(), r.took, r.current))
            .collect();
        assert_eq!(
            took,
            [
                ("Discovering", 0.5, false),
                ("Validating", 1.5, false),
                ("Converting", 5.0, true)
            ]
        );
        let done = timeline(&status("Succeeded", Some("2026-12-01T10:00:12Z")), now);
        assert_eq!(done.len(), 4);
        assert_eq!(done[2].took, 10.0);
        assert_eq!(
            (done[3].after_start, done[3].took, done[3].current),
            (12.0, 0.0, false)
        );
        assert!(timeline(&VirtualMachineMigrationStatus::default(), now).is_empty());
    }
}
