//! Plans in the views: `ferry get plans` (one line per plan) and `ferry describe plan NAME` (the plan's totals,
//! then one line per VM). Pure rendering.

use ferry_api::{MigrationPlan, PlanPhase};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{age, bytes, phase_name, table};

/// `plans`, `plan` and `mplan` name plans; anything else (or nothing) names migrations.
pub fn names_plans(kind: Option<&str>) -> bool {
    matches!(
        kind,
        Some("plans" | "plan" | "mplan" | "migrationplan" | "migrationplans")
    )
}

fn plan_phase(phase: Option<PlanPhase>) -> String {
    phase.map_or_else(|| "-".into(), |p| format!("{p:?}"))
}

pub fn render_list(plans: &[MigrationPlan], with_namespace: bool, now: Timestamp) -> String {
    let mut header = vec![
        "NAME",
        "PHASE",
        "VMS",
        "RUNNING",
        "WAITING",
        "SUCCEEDED",
        "FAILED",
        "PROGRESS",
        "ETA",
        "AGE",
    ];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for plan in plans {
        let s = plan.status.clone().unwrap_or_default();
        let created = plan
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0);
        let mut row = vec![
            plan.name_any(),
            plan_phase(s.phase),
            s.total.to_string(),
            s.running.to_string(),
            s.pending.to_string(),
            s.succeeded.to_string(),
            (s.failed + s.cancelled).to_string(),
            s.progress.unwrap_or_else(|| "-".into()),
            s.eta.unwrap_or_else(|| "-".into()),
            age(created, now),
        ];
        if with_namespace {
            row.insert(0, plan.namespace().unwrap_or_default());
        }
        rows.push(row);
    }
    table(&rows)
}

pub fn render(plan: &MigrationPlan, now: Timestamp) -> String {
    let s = plan.status.clone().unwrap_or_default();
    let created = plan
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let target = &plan.spec.target;
    let maps = super::map_names(target);
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<12}{value}\n"));
    line(
        "Plan:",
        format!(
            "{}/{}",
            plan.namespace().unwrap_or_default(),
            plan.name_any()
        ),
    );
    line(
        "Source:",
        format!(
            "Provider {}, {} VM(s) listed, at most {} at once{}",
            plan.spec.provider_ref,
            plan.spec.vms.len(),
            plan.spec.max_in_flight,
            if plan.spec.cancel { ", cancelled" } else { "" }
        ),
    );
    if let Some(selector) = &plan.spec.selector {
        let chosen = match &s.selected {
            Some(vms) => format!("chose {} VM(s)", vms.len()),
            None => "chooses when the plan starts".into(),
        };
        line("Selector:", format!("{selector}: {chosen}"));
    }
    match (&s.started_at, &plan.spec.start_time) {
        (Some(started), _) => line("Started:", format!("{} ago", age(started.0, now))),
        (None, Some(start)) => line("Starts:", start.0.to_string()),
        (None, None) => {}
    }
    line(
        "Maps:",
        if maps.is_empty() {
            "none (each migration's own target)".into()
        } else {
            maps.join(", ")
        },
    );
    line("Phase:", plan_phase(s.phase));
    line("Summary:", s.message.clone().unwrap_or_default());
    line(
        "Progress:",
        format!(
            "{} ({} of {})",
            s.progress.clone().unwrap_or_else(|| "-".into()),
            bytes(s.bytes_moved as f64),
            bytes(s.bytes_total as f64)
        ),
    );
    if let Some(throughput) = &s.throughput {
        let left = s
            .eta
            .as_ref()
            .map(|eta| format!(", {eta} left"))
            .unwrap_or_default();
        line("Throughput:", format!("{throughput}{left}"));
    }
    line("Age:", age(created, now));
    let mut rows = vec![
        ["VM", "MIGRATION", "PHASE", "REASON"]
            .map(String::from)
            .to_vec(),
    ];
    for vm in &s.vms {
        rows.push(vec![
            vm.vm.clone(),
            if vm.created {
                vm.migration.clone()
            } else {
                "-".into()
            },
            if vm.created {
                phase_name(vm.phase)
            } else {
                "Waiting".into()
            },
            vm.reason.clone().unwrap_or_default(),
        ]);
    }
    out.push('\n');
    out.push_str(&table(&rows));
    out
}

/// The plan's totals in one line, for `ferry watch plan`: `plan ns/name Running: 12 VMs, 3 running, 2 waiting,
/// 7 succeeded, 0 failed; 62% (1.2 GiB of 2.0 GiB), 5.0 MiB/s, about 2 min left`.
pub fn totals_line(plan: &MigrationPlan) -> String {
    let s = plan.status.clone().unwrap_or_default();
    let mut line = format!(
        "plan {}/{} {}: {} VMs, {} running, {} waiting, {} succeeded, {} failed",
        plan.namespace().unwrap_or_default(),
        plan.name_any(),
        plan_phase(s.phase),
        s.total,
        s.running,
        s.pending,
        s.succeeded,
        s.failed + s.cancelled
    );
    if s.bytes_total > 0 {
        line.push_str(&format!(
            "; {} ({} of {})",
            s.progress.clone().unwrap_or_else(|| "-".into()),
            bytes(s.bytes_moved as f64),
            bytes(s.bytes_total as f64)
        ));
    }
    if let Some(throughput) = &s.throughput {
        line.push_str(&format!(", {throughput}"));
    }
    if let Some(eta) = &s.eta {
        line.push_str(&format!(", {eta} left"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan() -> MigrationPlan {
        let mut plan: MigrationPlan = serde_json::from_value(json!({
            "apiVersion": "migration.platform.example/v1alpha1", "kind": "MigrationPlan",
            "metadata": {"name": "wave-1", "namespace": "apps", "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": {"providerRef": {"name": "vc"}, "maxInFlight": 2, "vms": [{"name": "web"}, {"name": "db"}],
                     "selector": {"folder": "/DC0/vm/app", "namePattern": "app-*"},
                     "target": {"networkMapRef": {"name": "site"}}},
            "status": {"phase": "Running", "total": 2, "running": 1, "pending": 1, "progress": "40%",
                       "startedAt": "2026-12-01T10:02:00Z", "selected": [],
                       "bytesPerSecond": 23860929, "throughput": "22.8 MiB/s", "eta": "about 5 min",
                       "bytesMoved": 4294967296i64, "bytesTotal": 10737418240i64,
                       "message": "0 of 2 VMs succeeded, 1 running, 1 waiting, 0 failed, 0 cancelled",
                       "vms": [{"vm": "web", "migration": "wave-1-web", "created": true, "phase": "Converting",
                                "reason": "Converting"},
                               {"vm": "db", "migration": "wave-1-db"}]}}))
        .unwrap();
        plan.metadata.uid = Some("u".into());
        plan
    }

    #[test]
    fn a_watched_plan_shows_its_totals_in_one_line() {
        assert_eq!(
            totals_line(&plan()),
            "plan apps/wave-1 Running: 2 VMs, 1 running, 1 waiting, 0 succeeded, 0 failed; \
             40% (4.0 GiB of 10.0 GiB), 22.8 MiB/s, about 5 min left"
        );
        let mut fresh = plan();
        fresh.status = None;
        assert_eq!(
            totals_line(&fresh),
            "plan apps/wave-1 -: 0 VMs, 0 running, 0 waiting, 0 succeeded, 0 failed"
        );
    }

    #[test]
    fn a_plan_reads_as_its_totals_then_one_line_per_vm() {
        let now: Timestamp = "2026-12-01T10:05:00Z".parse().unwrap();
        let out = render(&plan(), now);
        assert!(
            out.contains("Provider vc, 2 VM(s) listed, at most 2 at once"),
            "{out}"
        );
        assert!(
            out.contains("folder /DC0/vm/app, names app-*: chose 0 VM(s)"),
            "{out}"
        );
        assert!(out.contains("Started:    3m0s ago"), "{out}");
        assert!(out.contains("22.8 MiB/s, about 5 min left"), "{out}");
        assert!(out.contains("NetworkMap site"), "{out}");
        assert!(out.contains("40% (4.0 GiB of 10.0 GiB)"), "{out}");
        let web = out.lines().find(|l| l.starts_with("web")).unwrap();
        assert!(
            web.contains("wave-1-web") && web.contains("Converting"),
            "{web}"
        );
        let db = out.lines().find(|l| l.starts_with("db")).unwrap();
        assert!(db.contains("Waiting"), "{db}");
        let list = render_list(&[plan()], false, now);
        let row = list.lines().nth(1).unwrap();
        assert!(
            row.starts_with("wave-1")
                && row.contains("Running")
                && row.contains("40%")
                && row.contains("about 5 min")
                && row.contains("5m"),
            "{list}"
        );
        assert!(names_plans(Some("plans")) && !names_plans(Some("vmm")) && !names_plans(None));
    }
}
