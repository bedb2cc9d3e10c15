//! Pure edits of a migration's status: phase moves, conditions, retries and progress. No I/O here; `now` is given.

use std::time::Duration;

use ferry_api::{
    BudgetUse, CheckpointTime, ConditionType, ErrorClass, ErrorStatus, Phase, RetryStatus,
    VirtualMachineMigrationStatus as Status,
};
use ferry_kube::conditions::{ConditionUpdate, set_condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

use crate::backoff;
use crate::error::Failure;

/// The status working copy of one reconcile, with the generation and time that every edit stamps on it.
/// A phase and the condition that turns True when it is left (the checkpoint table says which).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PhaseCondition {
    pub phase: Phase,
    pub condition: Option<ConditionType>,
}

pub struct StatusEditor {
    pub status: Status,
    generation: Option<i64>,
    now: Time,
}

impl StatusEditor {
    pub fn new(status: Status, generation: Option<i64>, now: Time) -> Self {
        Self {
            status,
            generation,
            now,
        }
    }

    pub fn now(&self) -> &Time {
        &self.now
    }

    /// Sets a condition, keeping the conditions in [`ConditionType::ALL`]'s order, `Ready` last.
    pub fn condition(
        &mut self,
        type_: ConditionType,
        value: bool,
        reason: &str,
        message: impl Into<String>,
    ) {
        let conditions = &mut self.status.conditions;
        set_condition(
            conditions,
            ConditionUpdate {
                type_: type_.as_str(),
                status: value,
                reason,
                message: message.into(),
                observed_generation: self.generation,
            },
            &self.now,
        );
        let rank = |t: &str| {
            ConditionType::ALL
                .iter()
                .position(|c| c.as_str() == t)
                .unwrap_or(usize::MAX)
        };
        conditions.sort_by_key(|c| rank(&c.type_));
    }

    /// Enters `phase`: records when, resets the per-checkpoint attempts, and marks its condition as in progress.
    pub fn enter(&mut self, entered: PhaseCondition) {
        let PhaseCondition { phase, condition } = entered;
        let status = &mut self.status;
        status.phase = Some(phase);
        if !status.checkpoints.iter().any(|c| c.phase == phase) {
            status.checkpoints.push(CheckpointTime {
                phase,
                entered: MicroTime(self.now.0),
            });
        }
        if let Some(retry) = &mut status.retry {
            retry.attempts = 0;
            retry.next_attempt_time = None;
        }
        if let Some(kind) = condition {
            self.condition(kind, false, "InProgress", format!("{phase:?} in progress"));
        }
        if !phase.is_terminal() && phase != Phase::ManualInterventionRequired {
            let message = format!("checkpoint {phase:?}");
            self.condition(ConditionType::Ready, false, "MigrationInProgress", message);
        }
    }

    /// Leaves `from` with its evidence recorded: its condition turns True, then `to` is entered.
    pub fn advance(
        &mut self,
        from: PhaseCondition,
        to: PhaseCondition,
        reason: &str,
        message: String,
    ) {
        if let Some(kind) = from.condition {
            self.condition(kind, true, reason, message.clone());
        }
        self.status.reason = Some(reason.into());
        self.status.message = Some(message);
        self.enter(to);
    }

    /// Records an error of checkpoint `phase`.
    pub fn record_error(&mut self, failure: &Failure, phase: Phase) {
        record_error(&mut self.status, failure, phase, &self.now);
    }

    /// One more transient attempt; returns how long to wait before the next.
    pub fn transient_attempt(&mut self, key: &str, cap: Duration) -> Duration {
        let retry = self.status.retry.get_or_insert_with(RetryStatus::default);
        retry.attempts += 1;
        let wait = backoff::jittered(retry.attempts.max(0) as u32, key, cap);
        retry.next_attempt_time = Some(Time(self.now.0 + signed(wait)));
        wait
    }
}

/// Records an error of the current checkpoint.
pub fn record_error(status: &mut Status, failure: &Failure, phase: Phase, now: &Time) {
    let retry = status.retry.get_or_insert_with(RetryStatus::default);
    retry.last_error = Some(ErrorStatus {
        class: failure.class,
        reason: failure.reason.to_string(),
        message: failure.message.clone(),
        phase,
        time: now.clone(),
    });
    status.reason = Some(failure.reason.to_string());
    status.message = Some(failure.message.clone());
}

fn signed(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_millis(d.as_millis() as i64)
}

pub fn budget_used(status: &Status, phase: Phase) -> i32 {
    status
        .retry
        .as_ref()
        .and_then(|r| r.budget_used.iter().find(|b| b.phase == phase))
        .map_or(0, |b| b.used)
}

/// Spends one bounded retry of `phase` if the budget allows; false when it is exhausted.
pub fn spend_budget(status: &mut Status, phase: Phase, budget: i32) -> bool {
    let used = budget_used(status, phase);
    if used >= budget {
        return false;
    }
    let retry = status.retry.get_or_insert_with(RetryStatus::default);
    match retry.budget_used.iter_mut().find(|b| b.phase == phase) {
        Some(b) => b.used += 1,
        None => retry.budget_used.push(BudgetUse { phase, used: 1 }),
    }
    true
}

/// What to do about a failed child (a Job or a DataVolume, by uid) of a bounded step.
#[derive(Debug, PartialEq)]
pub enum Charge {
    /// Charged now: write that first; the failed object is removed on the next pass.
    Charged,
    /// Charged in an earlier pass: remove the failed object.
    AlreadyCharged,
    Exhausted,
}

/// True when the failure of the object `uid` was charged to a budget already.
pub fn is_charged(status: &Status, uid: &str) -> bool {
    status
        .retry
        .as_ref()
        .is_some_and(|r| r.charged.iter().any(|c| c == uid))
}

/// Charges the failure of `uid` to `phase`'s budget, once.
pub fn charge(status: &mut Status, phase: Phase, budget: i32, uid: &str) -> Charge {
    if is_charged(status, uid) {
        return Charge::AlreadyCharged;
    }
    if !spend_budget(status, phase, budget) {
        return Charge::Exhausted;
    }
    status
        .retry
        .get_or_insert_with(RetryStatus::default)
        .charged
        .push(uid.to_string());
    Charge::Charged
}

/// The class the migration ends with when a bounded step has no budget left.
pub fn exhausted(failure: &Failure, budget: i32) -> Failure {
    Failure {
        class: ErrorClass::BoundedRetryable,
        reason: failure.reason,
        message: format!("{} (retry budget of {budget} spent)", failure.message),
        fixable: false,
    }
}

/// How far one disk is, from 0 to 1: converted counts half, imported (and verified) the other half.
pub fn disk_fraction(d: &ferry_api::DiskStatus) -> f64 {
    d.done_fraction()
}

/// Bytes done (by [`disk_fraction`]) and the total capacity of the disks.
pub fn progress_bytes(status: &Status) -> (f64, i64) {
    status.bytes_done()
}

/// `after` differs from `before` only in how far the work went: progress, and a message with the same reason.
/// Pure.
pub fn only_progress(before: &Status, after: &Status) -> bool {
    let without_progress = |s: &Status| {
        let mut s = s.clone();
        s.progress = None;
        s.message = None;
        s.disks.iter_mut().for_each(|d| d.progress = None);
        s
    };
    before.phase == after.phase
        && before.reason == after.reason
        && without_progress(before) == without_progress(after)
}

/// `42% (27 MiB of 64 MiB)`.
pub fn progress(status: &Status) -> Option<String> {
    let (done, total) = progress_bytes(status);
    if total == 0 {
        return None;
    }
    let percent = (done * 100.0 / total as f64).floor() as i64;
    Some(format!(
        "{percent}% ({} MiB of {} MiB)",
        (done / 1048576.0).round() as i64,
        (total as f64 / 1048576.0).round() as i64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::DiskStatus;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
    }

    #[test]
    fn only_a_changed_progress_or_message_under_the_same_reason_is_progress() {
        let before = Status {
            phase: Some(Phase::Importing),
            reason: Some("Importing".into()),
            message: Some("disk-0 ImportInProgress 10.0%".into()),
            disks: vec![DiskStatus {
                progress: Some("10.0%".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut after = before.clone();
        after.message = Some("disk-0 ImportInProgress 55.0%".into());
        after.disks[0].progress = Some("55.0%".into());
        after.progress = Some("55% (55 MiB of 100 MiB)".into());
        assert!(only_progress(&before, &after));
        let mut verified = after.clone();
        verified.disks[0].verified = true;
        assert!(!only_progress(&before, &verified));
        let mut advanced = after.clone();
        advanced.reason = Some("DisksImportedAndVerified".into());
        assert!(!only_progress(&before, &advanced));
    }

    #[test]
    fn budgets_are_per_phase_and_run_out() {
        let mut status = Status::default();
        assert!(spend_budget(&mut status, Phase::Converting, 2));
        assert!(spend_budget(&mut status, Phase::Converting, 2));
        assert!(!spend_budget(&mut status, Phase::Converting, 2));
        assert_eq!(budget_used(&status, Phase::Importing), 0);
        assert_eq!(budget_used(&status, Phase::Converting), 2);
    }

    #[test]
    fn a_failed_object_is_charged_once_then_removed() {
        let mut status = Status::default();
        assert_eq!(
            charge(&mut status, Phase::Importing, 1, "dv-uid-1"),
            Charge::Charged
        );
        assert_eq!(
            charge(&mut status, Phase::Importing, 1, "dv-uid-1"),
            Charge::AlreadyCharged
        );
        assert_eq!(
            charge(&mut status, Phase::Importing, 1, "dv-uid-2"),
            Charge::Exhausted
        );
        assert_eq!(budget_used(&status, Phase::Importing), 1);
    }

    #[test]
    fn advancing_marks_the_left_condition_true_and_ready_false() {
        let mut edit = StatusEditor::new(Status::default(), Some(1), now());
        let discovering = PhaseCondition {
            phase: Phase::Discovering,
            condition: Some(ConditionType::SourceDiscovered),
        };
        let validating = PhaseCondition {
            phase: Phase::Validating,
            condition: Some(ConditionType::Validated),
        };
        edit.enter(discovering);
        edit.advance(discovering, validating, "Found", "vm-1".into());
        let status = edit.status;
        let get = |t: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == t)
                .unwrap()
                .status
                .clone()
        };
        assert_eq!(get("SourceDiscovered"), "True");
        assert_eq!(get("Validated"), "False");
        assert_eq!(get("Ready"), "False");
        assert_eq!(status.phase, Some(Phase::Validating));
        assert_eq!(status.checkpoints.len(), 2);
    }

    #[test]
    fn progress_counts_conversion_and_import_halves() {
        let status = Status {
            disks: vec![
                DiskStatus {
                    capacity_bytes: 64 << 20,
                    sha256: Some("x".into()),
                    progress: Some("50.00%".into()),
                    ..Default::default()
                },
                DiskStatus {
                    capacity_bytes: 64 << 20,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(progress(&status).unwrap(), "37% (48 MiB of 128 MiB)");
    }
}
