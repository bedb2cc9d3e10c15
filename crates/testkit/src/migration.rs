//! Running Ferry's controller against a test lab, as it runs in a cluster: the `ferry controller` process with the
//! identity of the deploy/ ServiceAccount under deploy/ RBAC, and the Provider, Secrets and migrations a user
//! writes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use ferry_lab::control_plane::process::{self, Lifetime, ProcessRecord};
use kube::Client;
use serde_json::Value;

use crate::TestLab;

pub use ferry_lab::control_plane::controller_process::SERVICE_ACCOUNT;
pub use ferry_lab::vsphere::demo::{PROVIDER, STAGING_SECRET, VSPHERE_SECRET};

/// `ferry controller` as the deploy/ ServiceAccount, stopped on drop (and by the parent-death signal).
pub struct ControllerProcess {
    record: Option<ProcessRecord>,
    ferry: PathBuf,
    kubeconfig: PathBuf,
    pub log: PathBuf,
    /// The port of the current run: every launch takes a fresh one, since a port freed by a killed controller can
    /// be taken at once as the local port of any outgoing connection on the machine.
    pub metrics_port: u16,
    starts: u32,
    /// Flags beyond the deploy/ defaults (the namespaces served, the Lease).
    extra_args: Vec<String>,
}

/// Launches of one (re)start: a controller that exits before it leads (its port taken between choosing it and
/// binding it) is started again on another port.
const LAUNCH_ATTEMPTS: u32 = 3;

impl ControllerProcess {
    pub async fn start(lab: &TestLab, ferry: &Path) -> Result<Self> {
        let state = lab.state();
        ferry_lab::control_plane::controller_process::apply_rbac(&state.tools, &state.kubeconfig)?;
        let kubeconfig =
            ferry_lab::control_plane::controller_process::kubeconfig(lab.dir(), &state.api_url)?;
        let mut controller = Self {
            record: None,
            ferry: ferry.to_path_buf(),
            kubeconfig,
            log: lab.dir().join("ferry-controller.log"),
            metrics_port: 0,
            starts: 0,
            extra_args: vec![],
        };
        controller.launch().await?;
        Ok(controller)
    }

    /// `ferry controller` as ServiceAccount `namespace/name`, with whatever RBAC the caller gave it (none here),
    /// its Lease in `namespace`, and `args` added.
    pub async fn start_as(
        lab: &TestLab,
        ferry: &Path,
        (namespace, name): (&str, &str),
        args: &[&str],
    ) -> Result<Self> {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let groups = [
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{namespace}"),
            "system:authenticated",
        ];
        let kubeconfig = ferry_lab::control_plane::components::write_identity_kubeconfig(
            lab.dir(),
            &lab.state().api_url,
            &user,
            &groups,
        )?;
        let mut extra_args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        extra_args.push(format!("--lease-namespace={namespace}"));
        let mut controller = Self {
            record: None,
            ferry: ferry.to_path_buf(),
            kubeconfig,
            log: lab
                .dir()
                .join(format!("ferry-controller-{namespace}-{name}.log")),
            metrics_port: 0,
            starts: 0,
            extra_args,
        };
        controller.launch().await?;
        Ok(controller)
    }

    async fn launch(&mut self) -> Result<()> {
        for attempt in 1..=LAUNCH_ATTEMPTS {
            if self.launch_once().await? {
                return Ok(());
            }
            eprintln!(
                "the controller exited before leading (attempt {attempt}); starting it again"
            );
        }
        anyhow::bail!(
            "the controller exited before leading {LAUNCH_ATTEMPTS} times; its last log: {}",
            self.current_log().display()
        )
    }

    /// Starts one run and waits until it leads (true) or exits (false).
    async fn launch_once(&mut self) -> Result<bool> {
        self.starts += 1;
        self.metrics_port = process::free_port()?;
        let mut spec = ferry_lab::control_plane::controller_process::component(
            &self.ferry,
            &self.kubeconfig,
            self.metrics_port,
            "ferry-test",
        )
        .spec;
        spec.args.extend(self.extra_args.iter().cloned());
        let log = self.current_log();
        let record = process::start(&spec, &log, Lifetime::TiedToThisProcess)?;
        // Ready once it leads: /readyz/leader answers 200.
        let url = format!("http://127.0.0.1:{}/readyz/leader", self.metrics_port);
        let what = format!("the controller to lead (its log: {})", log.display());
        let ferry = self.ferry.clone();
        let led = crate::eventually(&what, Duration::from_secs(60), || async {
            if !record.is_alive(&ferry) {
                return Some(false);
            }
            let out = std::process::Command::new("curl")
                .args(["-fsS", &url])
                .output()
                .ok()?;
            out.status.success().then_some(true)
        })
        .await;
        if led {
            self.record = Some(record);
        }
        Ok(led)
    }

    fn current_log(&self) -> PathBuf {
        self.log.with_extension(format!("{}.log", self.starts))
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

    /// How many times the controller was launched: 1 means it never had to start again.
    pub fn launches(&self) -> u32 {
        self.starts
    }

    /// True while the current run's process lives.
    pub fn is_running(&self) -> bool {
        self.record
            .as_ref()
            .is_some_and(|record| record.is_alive(&self.ferry))
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

pub use ferry_lab::vsphere::demo::{apply, apply_secret};

/// The Provider for the lab's vcsim, its credentials Secret, and the staging Secret, in `ns`.
pub async fn create_provider(client: &Client, lab: &TestLab, ns: &str) -> Result<()> {
    ferry_lab::vsphere::demo::create_provider(client, lab.state(), ns).await
}

/// A migration of the lab VM `vm` with every vcsim network on the pod network, written straight into its
/// volumes.
pub fn migration(lab: &TestLab, ns: &str, name: &str, vm: &str) -> Value {
    ferry_lab::vsphere::demo::migration(lab.state(), ns, name, vm)
}

/// [`migration`], staged in the lab's MinIO.
pub fn staged_migration(lab: &TestLab, ns: &str, name: &str, vm: &str) -> Value {
    ferry_lab::vsphere::demo::staged_migration(lab.state(), ns, name, vm)
}
