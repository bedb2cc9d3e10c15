//! `ferry get [plans]`: one line per migration, or per plan.

use anyhow::Result;
use clap::Args;
use ferry_api::{MigrationPlan, VirtualMachineMigration};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;

use super::{Scope, age, phase_name, table};

#[derive(Args)]
pub struct GetArgs {
    /// `plans` lists MigrationPlans; without it, migrations.
    kind: Option<String>,
    #[command(flatten)]
    scope: Scope,
}

pub async fn run(args: GetArgs) -> Result<()> {
    let (client, namespace) = args.scope.client().await?;
    if super::plan::names_plans(args.kind.as_deref()) {
        let api = args.scope.api::<MigrationPlan>(&client, &namespace);
        let mut plans = api.list(&ListParams::default()).await?.items;
        plans.sort_by_key(|p| (p.namespace(), p.name_any()));
        if plans.is_empty() {
            println!("No plans.");
        } else {
            let all = args.scope.all_namespaces;
            print!(
                "{}",
                super::plan::render_list(&plans, all, Timestamp::now())
            );
        }
        return Ok(());
    }
    if let Some(kind) = args.kind.as_deref().filter(|k| !is_migrations(k)) {
        anyhow::bail!("ferry get lists migrations or plans, not {kind:?}");
    }
    let api = args
        .scope
        .api::<VirtualMachineMigration>(&client, &namespace);
    let mut items = api.list(&ListParams::default()).await?.items;
    items.sort_by_key(|m| (m.namespace(), m.name_any()));
    if items.is_empty() {
        let place = if args.scope.all_namespaces {
            "any namespace".to_string()
        } else {
            format!("namespace {namespace}")
        };
        println!("No migrations in {place}.");
        return Ok(());
    }
    print!(
        "{}",
        render(&items, args.scope.all_namespaces, Timestamp::now())
    );
    Ok(())
}

fn is_migrations(kind: &str) -> bool {
    matches!(
        kind,
        "migrations" | "migration" | "vmm" | "virtualmachinemigrations"
    )
}

pub fn render(items: &[VirtualMachineMigration], with_namespace: bool, now: Timestamp) -> String {
    let mut rows = vec![];
    let mut header = vec!["NAME", "PHASE", "PROGRESS", "TARGET", "AGE", "REASON"];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    rows.push(header.into_iter().map(String::from).collect());
    for m in items {
        let status = m.status.clone().unwrap_or_default();
        let created = m.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        let mut row = vec![
            m.name_any(),
            phase_name(status.phase),
            status.progress.unwrap_or_else(|| "-".into()),
            status.target_vm.unwrap_or_else(|| "-".into()),
            age(created, now),
            status.reason.unwrap_or_default(),
        ];
        if with_namespace {
            row.insert(0, m.namespace().unwrap_or_default());
        }
        rows.push(row);
    }
    table(&rows)
}
