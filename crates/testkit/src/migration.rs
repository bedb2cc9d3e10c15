//! Running Ferry's controller against a test lab, as it runs in a cluster: the `ferry controller` process with the
//! identity of the deploy/ ServiceAccount under deploy/ RBAC, and the Provider, Secrets and migrations a user
//! writes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use ferry_lab::process::{self, Lifetime, ProcessRecord, ProcessSpec};
use kube::Client;
use serde_json::Value;

use crate::TestLab;

pub use ferry_lab::controller_process::SERVICE_ACCOUNT;
pub use ferry_lab::demo::{PROVIDER, STAGING_SECRET, VSPHERE_SECRET};

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
        let state = lab.state();
        ferry_lab::controller_process::apply_rbac(&state.tools, &state.kubeconfig)?;
        let kubeconfig = ferry_lab::controller_process::kubeconfig(lab.dir(), &state.api_url)?;
        let metrics_port = process::free_port()?;
        let spec = ferry_lab::controller_process::component(
            ferry,
            &kubeconfig,
            metrics_port,
            "ferry-test",
        )
        .spec;
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

pub use ferry_lab::demo::{apply, apply_secret};

/// The Provider for the lab's vcsim, its credentials Secret, and the staging Secret, in `ns`.
pub async fn create_provider(client: &Client, lab: &TestLab, ns: &str) -> Result<()> {
    ferry_lab::demo::create_provider(client, lab.state(), ns).await
}

/// A migration of the lab VM `vm` with every vcsim network on the pod network, written straight into its
/// volumes.
pub fn migration(lab: &TestLab, ns: &str, name: &str, vm: &str) -> Value {
    ferry_lab::demo::migration(lab.state(), ns, name, vm)
}

/// [`migration`], staged in the lab's MinIO.
pub fn staged_migration(lab: &TestLab, ns: &str, name: &str, vm: &str) -> Value {
    ferry_lab::demo::staged_migration(lab.state(), ns, name, vm)
}
