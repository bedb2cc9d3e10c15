//! One run of a workload in a chaos lab: driven to its end as the person in the workload would, then judged.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use ferry_api::{Phase, PowerState, VirtualMachineMigration};
use ferry_controller::chaos::{Fault, Plan, VSPHERE_CALL_LOG};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::children::Children;
use super::lab::{BOUND, ChaosLab};
use super::oracles::{self, Record};
use super::plans::Trial;
use super::under_test::{ControllerUnderTest, Pause, stopped, wait_ready};
use super::workload::{Act, Workload};

/// One run in progress: what it set up, and what it has seen so far.
pub struct Run {
    pub workload: Workload,
    pub trial: Option<Trial>,
    pub plan: Plan,
    pub client: kube::Client,
    pub ns: String,
    pub api: Api<VirtualMachineMigration>,
    pub children: Children,
    pub session: ferry_vsphere::Session,
    pub source: ferry_vsphere::MoRef,
    pub log: PathBuf,
    pub controller: ControllerUnderTest,
    pub pause: Pause,
    pub record: Record,
    pub phases: Vec<Phase>,
    pub restarted: bool,
    pub uid: String,
    pub corrected: bool,
    pub started: Instant,
    pub deadline: Instant,
    pub audit_from: u64,
    pub calls_file: PathBuf,
    pub calls_before: usize,
}

impl Run {
    /// Polls until the migration is terminal or gone, acting as the person in the workload does, and restarting
    /// a controller the plan crashed (once). Returns how it ended.
    pub async fn drive(&mut self, lab: &ChaosLab) -> Result<String> {
        let mut acted = false;
        loop {
            if Instant::now() > self.deadline {
                let phases = &self.phases;
                self.record.violations.push(format!(
                    "not terminal within {}s (phases {phases:?})",
                    BOUND.as_secs()
                ));
                return Ok("Timeout".to_string());
            }
            if self.plan.fault == Fault::PauseAfter {
                self.pause
                    .tend(self.controller.pid(), &self.children)
                    .await?;
            }
            if !self.keep_controller(lab).await? {
                return Ok("ControllerDied".to_string());
            }
            let Some(m) = self.api.get_opt("m").await? else {
                return Ok("Deleted".to_string());
            };
            self.uid = m.uid().unwrap_or_default();
            let status = m.status.clone().unwrap_or_default();
            if let Some(p) = status.phase
                && self.phases.last() != Some(&p)
            {
                self.phases.push(p);
            }
            self.children
                .observe(&mut self.record, &self.uid, status.disks.len())
                .await?;
            let reason = status.reason.clone().unwrap_or_default();
            if let Some((act, _)) = self
                .workload
                .act
                .as_ref()
                .filter(|_| !acted && reason == "Held")
            {
                acted = true;
                match act {
                    Act::Cancel => {
                        let cancel = json!({"spec": {"cancel": true}});
                        self.api
                            .patch("m", &PatchParams::default(), &Patch::Merge(&cancel))
                            .await?;
                    }
                    Act::Delete => {
                        self.api.delete("m", &DeleteParams::default()).await?;
                    }
                }
            }
            if self.workload.bad_spec
                && !self.corrected
                && status.phase == Some(Phase::ManualInterventionRequired)
            {
                self.correct_spec(&reason).await?;
            }
            // Never both running: while a VMI of the migration runs, the source is off.
            if self.children.target_running(&self.uid).await?
                && self.source_power().await? == PowerState::PoweredOn
            {
                self.record
                    .violations
                    .push("the source and the target ran at the same time".into());
            }
            self.record.why = format!("{reason}: {}", status.message.clone().unwrap_or_default());
            self.record.reason = reason;
            self.record.budget_used = status
                .retry
                .as_ref()
                .map_or(0, |r| r.budget_used.iter().map(|b| b.used).sum());
            if let Some(p) = status.phase.filter(|p| p.is_terminal()) {
                if p == Phase::Succeeded
                    && status.power.as_ref().and_then(|p| p.original) != Some(PowerState::PoweredOn)
                {
                    self.record
                        .violations
                        .push("the original power state was not recorded".into());
                }
                self.record.conditions = status
                    .conditions
                    .iter()
                    .map(|c| (c.type_.clone(), c.status.clone()))
                    .collect();
                return Ok(format!("{p:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Restarts a controller the plan crashed, once, without the plan; false when it died again.
    async fn keep_controller(&mut self, lab: &ChaosLab) -> Result<bool> {
        if self.controller.is_alive(&lab.state.dir) {
            return Ok(true);
        }
        if self.restarted {
            self.record
                .violations
                .push("the controller exited again without a fault".into());
            return Ok(false);
        }
        self.restarted = true;
        let restarted_log = self.log.with_extension("restarted.log");
        let (again, port) = lab.controller(None, &restarted_log)?;
        self.controller = ControllerUnderTest(Some(again));
        wait_ready(port, &restarted_log, &self.controller, &lab.state.dir).await?;
        Ok(true)
    }

    /// The bad spec must stop Ferry before it touches anything; then the person corrects it.
    async fn correct_spec(&mut self, reason: &str) -> Result<()> {
        self.corrected = true;
        if reason != "SecretNotFound" {
            self.record
                .violations
                .push(format!("the bad spec was reported as {reason}"));
        }
        if self.source_power().await? != PowerState::PoweredOn || !self.record.jobs_seen.is_empty()
        {
            self.record
                .violations
                .push("Ferry acted before the spec was correct".into());
        }
        let fix =
            json!({"spec": {"staging": {"secretRef": {"name": ferry_lab::demo::STAGING_SECRET}}}});
        self.api
            .patch("m", &PatchParams::default(), &Patch::Merge(&fix))
            .await?;
        Ok(())
    }

    /// Ending includes releasing the finalizer; a controller the plan stopped after its last writes is
    /// continued the same way as before.
    pub async fn finish(&mut self, lab: &ChaosLab, end: String) -> Result<()> {
        let pausing = self.plan.fault == Fault::PauseAfter;
        // A plan may crash it at one of its last writes (the finalizer's release): it is restarted here too.
        while Instant::now() < self.deadline
            && self.keep_controller(lab).await?
            && self
                .api
                .get_opt("m")
                .await?
                .is_some_and(|m| !m.finalizers().is_empty())
        {
            if pausing && self.pause.continued.is_none() {
                self.pause
                    .tend(self.controller.pid(), &self.children)
                    .await?;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        while pausing && self.pause.continued.is_none() && stopped(self.controller.pid()) {
            self.pause
                .tend(self.controller.pid(), &self.children)
                .await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.record.end = end;
        self.record.seconds = self.started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Everything the oracles need once the run ended: quiet afterwards, writes, objects left, power, vSphere
    /// changes, the controller's logs and the namespace's Events.
    pub async fn judge(&mut self, lab: &ChaosLab) -> Result<()> {
        let record = &mut self.record;
        if !oracles::phases_move_forward(&self.phases) {
            record
                .violations
                .push(format!("the phase went back: {:?}", self.phases));
        }
        if self.workload.bad_spec && !self.corrected && record.end == "Succeeded" {
            record
                .violations
                .push("the bad spec was never reported".into());
        }
        // Then quiet: no write of the migration's for 2 s (the audit log is written a moment after each
        // request). The Provider is reconciled on its own schedule, whatever its migrations do: its status
        // writes are not the migration's.
        let migration_writes = |audit: &[(String, String, i64)]| {
            audit
                .iter()
                .filter(|(_, resource, _)| resource != "providers")
                .count()
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = migration_writes(&lab.audit(&self.ns, self.audit_from));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let audit = lab.audit(&self.ns, self.audit_from);
        let after = migration_writes(&audit);
        if after != before {
            record
                .violations
                .push(format!("{} write(s) after the end", after - before));
        }
        record.writes = audit.len();
        for (verb, resource, code) in &audit {
            let counted = match verb.as_str() {
                "create" => Some(&mut record.creates),
                "delete" => Some(&mut record.deletes),
                _ => None,
            };
            if let Some(map) = counted
                && (200..300).contains(code)
                && resource != "events"
            {
                *map.entry(resource.clone()).or_default() += 1;
            }
        }
        record.objects = self.children.count().await?;
        record.labelled_left = self.children.labelled(&self.uid).await?;
        let restored_expected = record.end != "Succeeded" && record.end != "Timeout";
        if restored_expected
            && ferry_vsphere::power::current_power_state(&self.session, &self.source).await?
                != PowerState::PoweredOn
        {
            record.violations.push(format!(
                "ended {} with the source not powered on again",
                record.end
            ));
        }
        if matches!(record.end.as_str(), "Deleted" | "Cancelled") && record.labelled_left > 0 {
            record.violations.push(format!(
                "{} object(s) with the migration's UID left after it ended {}",
                record.labelled_left, record.end
            ));
        }
        if let Some(m) = self.api.get_opt("m").await?
            && !m.finalizers().is_empty()
        {
            record
                .violations
                .push("the finalizer stayed after the end".into());
        }
        let calls = std::fs::read_to_string(&self.calls_file).unwrap_or_default();
        for method in calls.get(self.calls_before..).unwrap_or_default().lines() {
            if oracles::changes_something(method) {
                *record
                    .vsphere_changes
                    .entry(method.to_string())
                    .or_default() += 1;
            }
        }
        let logs = std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(self.log.with_extension("restarted.log"))
                .unwrap_or_default();
        record.vsphere_calls = if self.restarted {
            0
        } else {
            logs.lines()
                .filter(|l| l.contains(VSPHERE_CALL_LOG))
                .count()
        };
        record.fired = match &self.trial {
            None => true,
            Some(Trial {
                lab_fault: Some(fault),
                ..
            }) => {
                let switch = Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns)
                    .get_opt("lab-faults")
                    .await?;
                switch
                    .and_then(|c| c.data)
                    .and_then(|d| d.get(&fault.key).cloned())
                    .as_deref()
                    == Some("0")
            }
            Some(_) => logs.contains(&self.plan.fault.log_marker(self.plan.at)),
        };
        record.violations.extend(oracles::unclassed_errors(&logs));
        record
            .violations
            .extend(oracles::vague_events(&self.children.warnings().await?));
        if logs.contains("panicked") {
            record.violations.push("the controller panicked".into());
        }
        let last_status = self
            .api
            .get_opt("m")
            .await?
            .map(|m| serde_json::to_string_pretty(&m.status).unwrap_or_default());
        let tail: Vec<&str> = logs.lines().rev().take(60).collect();
        record.detail = format!(
            "{}{}\n{}\n{}",
            self.pause.note(),
            self.children.story().await?,
            last_status.unwrap_or_default(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        Ok(())
    }

    async fn source_power(&self) -> Result<PowerState> {
        Ok(ferry_vsphere::power::current_power_state(&self.session, &self.source).await?)
    }
}
