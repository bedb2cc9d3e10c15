//! Running Ferry's controller against a test lab, as it runs in a cluster: the `ferry controller` process with the
//! identity of the deploy/ ServiceAccount under deploy/ RBAC, and the Provider, Secrets and migrations a user
//! writes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_lab::process::{self, Lifetime, ProcessRecord, ProcessSpec};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::TestLab;

pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:ferry-system:ferry";
pub const PROVIDER: &str = "vcsim";
pub const VSPHERE_SECRET: &str = "vcsim-credentials";
pub const STAGING_SECRET: &str = "staging-credentials";
/// vcsim's VMs sit on the distributed port group; its standalone-host model calls it "VM Network".
pub const SOURCE_NETWORKS: [&str; 2] = ["DC0_DVPG0", "VM Network"];

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// Applies deploy/rbac (namespace ferry-system, ServiceAccount, ClusterRole, Lease Role).
pub fn apply_rbac(lab: &TestLab) -> Result<()> {
    let out = lab
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(repo_file("deploy/rbac/ferry-rbac.yaml"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl apply rbac: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `ferry controller` as the deploy/ ServiceAccount, stopped on drop (and by the parent-death signal).
pub struct ControllerProcess {
    record: Option<ProcessRecord>,
    spec: ProcessSpec,
    pub log: PathBuf,
    pub metrics_port: u16,
    starts: u32,
}

impl ControllerProcess {
    pub async fn start(lab: &TestLab, ferry: &Path) -> Result<Self> {
        apply_rbac(lab)?;
        let kubeconfig = lab.kubeconfig_for(
            SERVICE_ACCOUNT,
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:ferry-system",
                "system:authenticated",
            ],
        )?;
        let metrics_port = process::free_port()?;
        let spec = ProcessSpec {
            name: "ferry-controller".into(),
            program: ferry.to_path_buf(),
            args: vec![
                "controller".into(),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--metrics-addr=127.0.0.1:{metrics_port}"),
                "--identity=ferry-test".into(),
                "--lease-seconds=5".into(),
                "--guest-ready-timeout=300".into(),
            ],
            env: vec![(
                "RUST_LOG".into(),
                "info,kube=warn,kube_lease_manager=warn".into(),
            )],
        };
        let mut controller = Self {
            record: None,
            spec,
            log: lab.dir().join("ferry-controller.log"),
            metrics_port,
            starts: 0,
        };
        controller.launch().await?;
        Ok(controller)
    }

    async fn launch(&mut self) -> Result<()> {
        self.starts += 1;
        let log = self.log.with_extension(format!("{}.log", self.starts));
        self.record = Some(process::start(
            &self.spec,
            &log,
            Lifetime::TiedToThisProcess,
        )?);
        // Ready once it leads: /readyz answers 200.
        let url = format!("http://127.0.0.1:{}/readyz", self.metrics_port);
        let what = format!("the controller to lead (its log: {})", log.display());
        crate::eventually(&what, Duration::from_secs(60), || async {
            let out = std::process::Command::new("curl")
                .args(["-fsS", &url])
                .output()
                .ok()?;
            out.status.success().then_some(())
        })
        .await;
        Ok(())
    }

    /// SIGKILL, as a node failure or an OOM kill would.
    pub fn kill(&mut self) {
        if let Some(record) = self.record.take() {
            process::kill_group(&record);
        }
    }

    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.launch().await
    }

    pub fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        std::process::Command::new("curl")
            .args(["-fsS", &url])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    }

    /// Every log line of every run so far.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                std::fs::read_to_string(self.log.with_extension(format!("{i}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            let _ = process::stop(&record, Duration::from_secs(5));
        }
    }
}

/// The Provider for the lab's vcsim, its credentials Secret, and the staging Secret, in `ns`.
pub async fn create_provider(client: &Client, lab: &TestLab, ns: &str) -> Result<()> {
    let state = lab.state();
    let vcsim = state.vcsim.as_ref().context("the lab has no vcsim")?;
    let staging = state
        .staging
        .as_ref()
        .context("the lab has no staging store")?;
    let password = std::fs::read_to_string(&vcsim.password_file)?;
    apply_secret(
        client,
        ns,
        VSPHERE_SECRET,
        json!({"user": vcsim.username, "password": password.trim()}),
    )
    .await?;
    apply_secret(client, ns, STAGING_SECRET, json!(staging.secret_data()?)).await?;
    let ca = std::fs::read_to_string(&vcsim.ca_file)?;
    apply(client, ns, json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "Provider",
        "metadata": {"name": PROVIDER, "namespace": ns},
        "spec": {"type": "vsphere", "url": vcsim.url, "secretRef": {"name": VSPHERE_SECRET}, "tls": {"caBundle": ca}},
    }))
    .await
}

pub async fn apply_secret(client: &Client, ns: &str, name: &str, data: Value) -> Result<()> {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns}, "stringData": data,
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("ferry-test").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// Server-side applies any manifest with apiVersion, kind and metadata.name.
pub async fn apply(client: &Client, ns: &str, manifest: Value) -> Result<()> {
    let (group_version, kind) = (
        manifest["apiVersion"].as_str().unwrap_or_default(),
        manifest["kind"].as_str().unwrap_or_default(),
    );
    let (group, version) = group_version
        .rsplit_once('/')
        .unwrap_or(("", group_version));
    let resource =
        kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, kind));
    let api = Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), ns, &resource);
    let name = manifest["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply("ferry-test").force(),
        &Patch::Apply(&manifest),
    )
    .await
    .with_context(|| format!("applying {kind} {ns}/{name}"))?;
    Ok(())
}

/// A migration of the lab VM `vm` with every vcsim network on the pod network, staged in the lab's MinIO.
pub fn migration(lab: &TestLab, ns: &str, name: &str, vm: &str) -> Value {
    let staging = lab
        .state()
        .staging
        .clone()
        .expect("the lab has a staging store");
    let networks: Vec<Value> = SOURCE_NETWORKS
        .iter()
        .map(|n| json!({"source": n, "pod": {}}))
        .collect();
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "VirtualMachineMigration",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "source": {"providerRef": {"name": PROVIDER}, "vm": {"name": vm}, "restorePowerState": true},
            "target": {"networks": networks},
            "staging": {"url": staging.url("migrations"), "endpoint": staging.endpoint, "secretRef": {"name": STAGING_SECRET}},
        },
    })
}
