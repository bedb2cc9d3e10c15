//! The plan workload's part of a run: looking at the plan and its migrations, and the per-host limit judged from
//! what they recorded.

use anyhow::Result;
use ferry_api::keys::PLAN_UID_LABEL;
use ferry_api::{MigrationPlan, Phase, PlanPhase, VirtualMachineMigration};
use ferry_controller::surface::source_reads;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::lab::PLAN;
use super::oracles;
use super::run::{Run, budget_used};
use super::workload::PLAN_HOST_LIMIT;

impl Run {
    /// One look at the plan `p` and its migrations; its end once it has one. The conditions compared are every
    /// migration's, with its phase.
    pub async fn look_at_plan(&mut self) -> Result<Option<String>> {
        let plans: Api<MigrationPlan> = Api::namespaced(self.client.clone(), &self.ns);
        let Some(plan) = plans.get_opt(PLAN).await? else {
            return Ok(Some("Deleted".to_string()));
        };
        let migrations = self.plan_migrations(&plan).await?;
        for m in &migrations {
            self.observe(m).await?;
        }
        let status = plan.status.clone().unwrap_or_default();
        self.record.why = status.message.clone().unwrap_or_default();
        self.record.reason = migrations
            .iter()
            .filter_map(|m| m.status.as_ref()?.reason.clone())
            .collect::<Vec<_>>()
            .join(",");
        self.record.budget_used = migrations.iter().map(budget_used).sum();
        let Some(p) = status.phase.filter(|p| {
            matches!(
                p,
                PlanPhase::Succeeded | PlanPhase::Failed | PlanPhase::Cancelled
            )
        }) else {
            return Ok(None);
        };
        self.record.conditions = migrations
            .iter()
            .flat_map(|m| {
                let name = m.name_any();
                let status = m.status.clone().unwrap_or_default();
                let phase = (format!("{name} phase"), format!("{:?}", status.phase));
                status
                    .conditions
                    .into_iter()
                    .map(move |c| (format!("{name} {}", c.type_), c.status))
                    .chain([phase])
            })
            .collect();
        Ok(Some(format!("{p:?}")))
    }

    pub async fn plan_migrations(
        &self,
        plan: &MigrationPlan,
    ) -> Result<Vec<VirtualMachineMigration>> {
        let selector = format!("{PLAN_UID_LABEL}={}", plan.uid().unwrap_or_default());
        Ok(self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items)
    }
}

/// No host read by more migrations at once than the limit, from their recorded host and Converting intervals; a
/// succeeded migration must have recorded both, or the oracle would hold for nothing.
pub fn host_limit_violations(migrations: &[VirtualMachineMigration]) -> Vec<String> {
    let mut violations = vec![];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let mut reads: Vec<(String, Vec<(i64, i64)>)> = vec![];
    for m in migrations {
        let status = m.status.clone().unwrap_or_default();
        let host = status.source.as_ref().and_then(|s| s.host.clone());
        let intervals = source_reads(&status, now);
        match host {
            Some(host) if !intervals.is_empty() => reads.push((host, intervals)),
            // The oracle would hold for nothing: a migration that copied its disks recorded where from.
            _ if status.phase == Some(Phase::Succeeded) => violations.push(format!(
                "{} succeeded without a recorded host or Converting interval",
                m.name_any()
            )),
            _ => {}
        }
    }
    violations.extend(oracles::over_host_limit(&reads, PLAN_HOST_LIMIT as usize));
    violations
}
