//! Ferry installed on a real node as a user installs it: with Helm from `charts/ferry`, or by `kubectl apply` of
//! `deploy/` (the chart rendered), unchanged, running the image built here under the name both give.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;

use crate::lab::LabState;

/// The repository's `deploy/`, next to the source this binary was built from.
pub const DEPLOY_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");
/// The repository's chart, next to the source this binary was built from.
pub const CHART_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/ferry");
/// The Helm release the lab installs.
pub const RELEASE: &str = "ferry";
pub const NAMESPACE: &str = "ferry-system";
pub const DEPLOYMENT: &str = "ferry-controller";
/// The leader's Lease (`ferry controller`'s default).
pub const LEASE: &str = "ferry-controller";
const AVAILABLE_TIMEOUT: Duration = Duration::from_secs(180);

/// What a user applies, in the README's order: the RBAC (with the namespace) before the admission policy, whose
/// binding lives in that namespace.
pub const DEPLOY_FILES: [&str; 4] = [
    "crds/ferry.yaml",
    "rbac/ferry-rbac.yaml",
    "rbac/ferry-admission.yaml",
    "controller.yaml",
];

/// `kubectl apply` of `deploy/`'s CRDs, RBAC, admission policy and Deployment, as [`DEPLOY_FILES`] orders them.
pub fn apply_deploy(state: &LabState, deploy: &Path) -> Result<()> {
    for part in DEPLOY_FILES {
        let path: PathBuf = deploy.join(part);
        super::run(
            Command::new(state.tools.join("kubectl"))
                .arg(format!("--kubeconfig={}", state.kubeconfig.display()))
                .args(["apply", "--server-side", "--force-conflicts"])
                .args(["--request-timeout=60s", "-f"])
                .arg(&path),
            &format!("kubectl apply -f {}", path.display()),
            "",
        )?;
    }
    Ok(())
}

/// `helm upgrade --install` of the chart with its defaults, as the README installs it. The namespace comes first,
/// with the restricted Pod Security level: Helm keeps its release record there, so it must exist before the
/// release (`--create-namespace` would make it without the label). Helm's own files stay in the lab's directory.
pub fn helm_install(state: &LabState, chart: &Path) -> Result<()> {
    let kubectl = |args: &[&str]| {
        let mut command = Command::new(state.tools.join("kubectl"));
        command
            .arg(format!("--kubeconfig={}", state.kubeconfig.display()))
            .args(args);
        command
    };
    let namespace = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{\"name\":\"{NAMESPACE}\",\
         \"labels\":{{\"pod-security.kubernetes.io/enforce\":\"restricted\"}}}}}}"
    );
    let manifest = state.dir.join("ferry-namespace.json");
    std::fs::write(&manifest, namespace)?;
    super::run(
        &mut kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &manifest.display().to_string(),
        ]),
        &format!("creating namespace {NAMESPACE}"),
        "",
    )?;
    let helm_home = state.dir.join("helm");
    super::run(
        Command::new(state.tools.join("helm"))
            .args(["upgrade", "--install", RELEASE])
            .arg(chart)
            .args(["--namespace", NAMESPACE, "--timeout", "120s"])
            .arg(format!("--kubeconfig={}", state.kubeconfig.display()))
            .env("HELM_CONFIG_HOME", helm_home.join("config"))
            .env("HELM_CACHE_HOME", helm_home.join("cache"))
            .env("HELM_DATA_HOME", helm_home.join("data")),
        &format!("helm upgrade --install {RELEASE} {}", chart.display()),
        " (hack/setup.sh builds helm with the lab's tools)",
    )?;
    Ok(())
}

/// What the Deployment and its Lease say now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    pub replicas: i32,
    pub updated: i32,
    pub available: i32,
    pub leader: Option<String>,
}

impl Rollout {
    /// Every replica of the newest template available, and one of them leads.
    pub fn complete(&self) -> bool {
        self.replicas > 0
            && self.updated == self.replicas
            && self.available == self.replicas
            && self.leader.is_some()
    }
}

pub async fn rollout(client: &kube::Client) -> Result<Rollout> {
    let deployments: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), NAMESPACE);
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), NAMESPACE);
    let deployment = deployments.get(DEPLOYMENT).await?;
    let status = deployment.status.unwrap_or_default();
    let spec_replicas = deployment.spec.replicas.unwrap_or(1);
    let leader = leases
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty());
    Ok(Rollout {
        replicas: spec_replicas,
        // The controller has seen the newest template only once observedGeneration catches up.
        updated: if status.observed_generation == deployment.metadata.generation {
            status.updated_replicas.unwrap_or(0)
        } else {
            0
        },
        available: status.available_replicas.unwrap_or(0),
        leader,
    })
}

/// Waits until the rollout is [`Rollout::complete`], printing each change.
pub async fn wait_rollout(client: &kube::Client) -> Result<Rollout> {
    let deadline = Instant::now() + AVAILABLE_TIMEOUT;
    let mut last = Rollout::default();
    loop {
        let now = rollout(client).await?;
        if now != last {
            tracing::info!(
                "{NAMESPACE}/{DEPLOYMENT}: {}/{} updated, {} available, leader {}",
                now.updated,
                now.replicas,
                now.available,
                now.leader.as_deref().unwrap_or("none")
            );
            last = now.clone();
        }
        if now.complete() {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!(
                "{NAMESPACE}/{DEPLOYMENT} did not roll out within {AVAILABLE_TIMEOUT:?}: {now:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
