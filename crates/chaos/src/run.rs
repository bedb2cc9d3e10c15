//! One run of a workload in a chaos lab: driven to its end as the person in the workload would, then judged.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use ferry_api::{MigrationPlan, Phase, PowerState, VirtualMachineMigration};
use ferry_controller::chaos::{Fault, FaultPlan, VSPHERE_CALL_LOG};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::children::Children;
use super::lab::{ChaosLab, PLAN};
use super::oracles::{self, Record};
use super::plans::Trial;
use super::under_test::{ControllerUnderTest, Pause, stopped, wait_ready};
use super::workload::{Act, Workload};

/// One run in progress: what it set up, and what it has seen so far.
pub struct Run {
    pub workload: Workload,
    pub trial: Option<Trial>,
    pub plan: FaultPlan,
    pub client: kube::Client,
    pub ns: String,
    pub api: Api<VirtualMachineMigration>,
    pub children: Children,
    pub session: ferry_vsphere::Session,
    /// The source VMs by name.
    pub sources: BTreeMap<String, ferry_vsphere::MoRef>,
    pub log: PathBuf,
    pub controller: ControllerUnderTest,
    pub pause: Pause,
    pub record: Record,
    /// Each migration's phases as seen, by migration.
    pub phases: BTreeMap<String, Vec<Phase>>,
    pub restarted: bool,
    /// Each migration's UID, by migration.
    pub uids: BTreeMap<String, String>,
    /// The source VM each migration names, by migration.
    pub vm_of: BTreeMap<String, String>,
    pub corrected: bool,
    pub started: Instant,
    pub deadline: Instant,
    pub audit_from: u64,
    pub calls_file: PathBuf,
    pub calls_before: usize,
}

impl Run {
    /// Polls until the migration (or the plan) is terminal or gone, acting as the person in the workload does,
    /// and restarting a controller the plan crashed (once). Returns how it ended.
    pub async fn drive(&mut self, lab: &ChaosLab) -> Result<String> {
        let mut acted = false;
        loop {
            if Instant::now() > self.deadline {
                let phases = &self.phases;
                self.record.violations.push(format!(
                    "not terminal within {}s (phases {phases:?})",
                    (self.deadline - self.started).as_secs()
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
            let end = if self.workload.plan.is_some() {
                self.look_at_plan().await?
            } else {
                self.look_at_migration(&mut acted).await?
            };
            if let Some(end) = end {
                return Ok(end);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// One look at the migration `m`; its end once it has one.
    async fn look_at_migration(&mut self, acted: &mut bool) -> Result<Option<String>> {
        let Some(m) = self.api.get_opt("m").await? else {
            return Ok(Some("Deleted".to_string()));
        };
        self.observe(&m).await?;
        let status = m.status.clone().unwrap_or_default();
        let reason = status.reason.clone().unwrap_or_default();
        if let Some((act, _)) = self
            .workload
            .act
            .as_ref()
            .filter(|_| !*acted && reason == "Held")
        {
            *acted = true;
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
        self.record.why = format!("{reason}: {}", status.message.clone().unwrap_or_default());
        self.record.reason = reason;
        self.record.budget_used = budget_used(&m);
        let Some(p) = status.phase.filter(|p| p.is_terminal()) else {
            return Ok(None);
        };
        self.record.conditions = status
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect();
        Ok(Some(format!("{p:?}")))
    }

    /// What every look checks of one migration: its phases, its children, that its source and its target never
    /// run together, and that a success recorded the source's original power state.
    pub(crate) async fn observe(&mut self, m: &VirtualMachineMigration) -> Result<()> {
        let (name, uid) = (m.name_any(), m.uid().unwrap_or_default());
        self.uids.insert(name.clone(), uid.clone());
        let status = m.status.clone().unwrap_or_default();
        let phases = self.phases.entry(name).or_default();
        if let Some(p) = status.phase
            && phases.last() != Some(&p)
        {
            phases.push(p);
        }
        self.children.observe(&mut self.record, m).await?;
        if self.children.target_running(m).await?
            && self.source_power(m).await? == Some(PowerState::PoweredOn)
        {
            self.record
                .violations
                .push("the source and the target ran at the same time".into());
        }
        if status.phase == Some(Phase::Succeeded)
            && status.power.as_ref().and_then(|p| p.original) != Some(PowerState::PoweredOn)
        {
            let note = "the original power state was not recorded".to_string();
            if !self.record.violations.contains(&note) {
                self.record.violations.push(note);
            }
        }
        Ok(())
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
        if self.power_of(self.workload.vm).await? != Some(PowerState::PoweredOn)
            || !self.record.jobs_seen.is_empty()
        {
            self.record
                .violations
                .push("Ferry acted before the spec was correct".into());
        }
        let fix = json!({"spec": {"staging": {"secretRef": {"name": ferry_lab::vsphere::demo::STAGING_SECRET}}}});
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
            && self.finalizers_left().await?
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
        for (name, phases) in &self.phases {
            if !oracles::phases_move_forward(phases) {
                record
                    .violations
                    .push(format!("the phase of {name} went back: {phases:?}"));
            }
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
        record.released = self.children.released().await?;
        record.labelled_left = 0;
        // A succeeded migration's volumes and VMI keep its label (CDI and KubeVirt copied it): they are the user's.
        for (name, uid) in &self.uids {
            if self.phases.get(name).and_then(|p| p.last()) != Some(&Phase::Succeeded) {
                record.labelled_left += self.children.labelled(uid).await?;
            }
        }
        // A migration that did not succeed powers its source on again (restorePowerState).
        if record.end != "Timeout" {
            for (name, phases) in &self.phases {
                if phases.last() == Some(&Phase::Succeeded) {
                    continue;
                }
                let Some(source) = self.vm_of.get(name).and_then(|vm| self.sources.get(vm)) else {
                    continue;
                };
                if ferry_vsphere::power::current_power_state(&self.session, source).await?
                    != PowerState::PoweredOn
                {
                    record.violations.push(format!(
                        "ended {} with the source of {name} not powered on again",
                        record.end
                    ));
                }
            }
        }
        if matches!(record.end.as_str(), "Deleted" | "Cancelled") && record.labelled_left > 0 {
            record.violations.push(format!(
                "{} object(s) with the migration's UID left after it ended {}",
                record.labelled_left, record.end
            ));
        }
        if self.workload.warm && record.end != "Timeout" {
            for source in self.sources.values() {
                let snapshots =
                    ferry_vsphere::snapshot::named(&self.session, source, "ferry-").await?;
                let names: Vec<String> = snapshots.into_iter().map(|n| n.name).collect();
                let tracking =
                    ferry_vsphere::cbt::change_tracking_enabled(&self.session, source).await?;
                record
                    .violations
                    .extend(oracles::warm_source_left(&names, tracking));
            }
        }
        let migrations = self.api.list(&ListParams::default()).await?.items;
        if migrations.iter().any(|m| !m.finalizers().is_empty()) {
            record
                .violations
                .push("the finalizer stayed after the end".into());
        }
        if self.workload.plan.is_some() {
            record
                .violations
                .extend(super::plan_run::host_limit_violations(&migrations));
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
        let plan = Api::<MigrationPlan>::namespaced(self.client.clone(), &self.ns)
            .get_opt(PLAN)
            .await?
            .map(|p| serde_json::to_string_pretty(&p.status).unwrap_or_default());
        let last_status = migrations
            .iter()
            .map(|m| {
                let status = serde_json::to_string_pretty(&m.status).unwrap_or_default();
                format!("{}: {status}", m.name_any())
            })
            .chain(plan)
            .collect::<Vec<_>>()
            .join("\n");
        let tail: Vec<&str> = logs.lines().rev().take(60).collect();
        record.detail = format!(
            "{}{}\n{}\n{}",
            self.pause.note(),
            self.children.story().await?,
            last_status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        Ok(())
    }

    /// The power state of the source a migration names; None for a VM the run did not set up.
    async fn source_power(&mut self, m: &VirtualMachineMigration) -> Result<Option<PowerState>> {
        let Some(vm) = m.spec.source.vm.name.clone() else {
            return Ok(None);
        };
        self.vm_of.insert(m.name_any(), vm.clone());
        self.power_of(&vm).await
    }

    async fn power_of(&self, vm: &str) -> Result<Option<PowerState>> {
        let Some(source) = self.sources.get(vm) else {
            return Ok(None);
        };
        Ok(Some(
            ferry_vsphere::power::current_power_state(&self.session, source).await?,
        ))
    }

    /// Whether any migration of the run still holds its finalizer.
    async fn finalizers_left(&self) -> Result<bool> {
        let migrations = self.api.list(&ListParams::default()).await?;
        Ok(migrations.iter().any(|m| !m.finalizers().is_empty()))
    }
}

pub(crate) fn budget_used(m: &VirtualMachineMigration) -> i32 {
    m.status
        .as_ref()
        .and_then(|s| s.retry.as_ref())
        .map_or(0, |r| r.budget_used.iter().map(|b| b.used).sum())
}
