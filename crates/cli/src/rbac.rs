//! `ferry rbac`: deploy/rbac/ferry-rbac.yaml for a controller that serves chosen namespaces only. The same
//! roles; the ClusterRoleBinding that grants them everywhere becomes one RoleBinding in each chosen namespace, so
//! the controller holds no Job, Secret or pod right outside them (its one cluster-scoped right reads
//! StorageClasses). Run the controller with the same `--namespace` list.

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

const BASE: &str = include_str!("../../../deploy/rbac/ferry-rbac.yaml");
/// The binding of deploy/rbac/ferry-rbac.yaml that grants the controller's role in every namespace.
const EVERYWHERE: &str = "ferry-controller";
const DEFAULT_ACCOUNT: (&str, &str) = ("ferry-system", "ferry");

#[derive(Args)]
pub struct RbacArgs {
    /// The namespaces the controller serves (repeat the flag, or separate them by commas). Include those that
    /// lend Providers to the others.
    #[arg(long = "namespace", value_delimiter = ',', required = true)]
    namespaces: Vec<String>,
    /// The controller's ServiceAccount, as namespace/name (its Lease lives in that namespace).
    #[arg(long, default_value = "ferry-system/ferry")]
    service_account: String,
}

pub fn run(args: RbacArgs) -> Result<()> {
    let (ns, name) = args
        .service_account
        .split_once('/')
        .context("--service-account takes namespace/name")?;
    let docs = namespaced(&args.namespaces, (ns, name))?;
    print!("{}", serde_saphyr::to_string_multiple(&docs)?);
    Ok(())
}

/// The RBAC documents for a controller running as `account` (namespace, name) that serves `namespaces`.
pub fn namespaced(namespaces: &[String], account: (&str, &str)) -> Result<Vec<Value>> {
    let chosen: Vec<&String> = namespaces.iter().filter(|n| !n.is_empty()).collect();
    if chosen.is_empty() {
        bail!("name at least one namespace");
    }
    for ns in chosen.iter().chain([&&account.0.to_string()]) {
        if !is_dns_label(ns) {
            bail!("{ns:?} is not a namespace name");
        }
    }
    // Another account gets bindings of its own: applying them leaves the default install's alone.
    let suffix = match account == DEFAULT_ACCOUNT {
        true => String::new(),
        false => format!(":{}:{}", account.0, account.1),
    };
    let base: Vec<Value> =
        serde_saphyr::from_str_multiple(BASE).context("deploy/rbac/ferry-rbac.yaml")?;
    let mut out = Vec::new();
    for mut doc in base {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match kind.as_str() {
            "Namespace" => doc["metadata"]["name"] = account.0.into(),
            "ServiceAccount" => {
                doc["metadata"]["name"] = account.1.into();
                doc["metadata"]["namespace"] = account.0.into();
            }
            "ClusterRoleBinding" if name == EVERYWHERE => {
                for ns in &chosen {
                    out.push(json!({
                        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": {"name": format!("{EVERYWHERE}{suffix}"), "namespace": ns},
                        "roleRef": doc["roleRef"],
                        "subjects": [subject(account)],
                    }));
                }
                continue;
            }
            "ClusterRoleBinding" | "RoleBinding" => {
                doc["metadata"]["name"] = format!("{name}{suffix}").into();
                doc["subjects"] = json!([subject(account)]);
            }
            _ => {}
        }
        if kind == "Role" || kind == "RoleBinding" {
            doc["metadata"]["namespace"] = account.0.into();
        }
        out.push(doc);
    }
    Ok(out)
}

fn subject(account: (&str, &str)) -> Value {
    json!({"kind": "ServiceAccount", "name": account.1, "namespace": account.0})
}

fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(docs: &[Value]) -> Vec<String> {
        docs.iter()
            .map(|d| {
                format!(
                    "{} {}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["namespace"].as_str().unwrap_or(""),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn the_everywhere_binding_becomes_one_role_binding_per_namespace() {
        let docs = namespaced(&["team-a".into(), "team-b".into()], DEFAULT_ACCOUNT).unwrap();
        let kinds = kinds(&docs);
        assert!(
            !kinds.contains(&"ClusterRoleBinding /ferry-controller".to_string()),
            "{kinds:?}"
        );
        for expected in [
            "RoleBinding team-a/ferry-controller",
            "RoleBinding team-b/ferry-controller",
            "ClusterRole /ferry-controller",
            "ClusterRoleBinding /ferry-controller-storageclasses",
            "RoleBinding ferry-system/ferry-leader-election",
        ] {
            assert!(
                kinds.contains(&expected.to_string()),
                "{expected} in {kinds:?}"
            );
        }
        let binding = docs
            .iter()
            .find(|d| d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == "team-a")
            .unwrap();
        assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "ferry", "namespace": "ferry-system"}])
        );
    }

    #[test]
    fn another_account_gets_bindings_of_its_own_and_bad_names_are_refused() {
        let docs = namespaced(&["team-a".into()], ("ops", "mover")).unwrap();
        let kinds = kinds(&docs);
        for expected in [
            "Namespace /ops",
            "ServiceAccount ops/mover",
            "RoleBinding team-a/ferry-controller:ops:mover",
            "ClusterRoleBinding /ferry-controller-storageclasses:ops:mover",
            "Role ops/ferry-leader-election",
            "RoleBinding ops/ferry-leader-election:ops:mover",
        ] {
            assert!(
                kinds.contains(&expected.to_string()),
                "{expected} in {kinds:?}"
            );
        }
        assert!(namespaced(&[], DEFAULT_ACCOUNT).is_err());
        assert!(namespaced(&["Team_A".into()], DEFAULT_ACCOUNT).is_err());
    }
}
