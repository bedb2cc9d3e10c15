//! Ferry's controller as the lab runs it: the `ferry controller` process, unchanged, with the identity of the
//! deploy/ ServiceAccount under the deploy/ RBAC, as it runs in a cluster.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result};

use crate::control_plane::components::Component;
use crate::control_plane::probe::Probe;
use crate::control_plane::process::ProcessSpec;

pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:ferry-system:ferry";
const GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:ferry-system",
    "system:authenticated",
];
const RBAC: &str = include_str!("../../../../deploy/rbac/ferry-rbac.yaml");
const ADMISSION: &str = include_str!("../../../../deploy/rbac/ferry-admission.yaml");
const PROVIDERS: &str = include_str!("../../../../deploy/rbac/ferry-providers.yaml");

/// Applies deploy/rbac (namespace ferry-system, ServiceAccount, ClusterRole, Lease Role, and the admission policy
/// on the Jobs the ServiceAccount creates) with the lab's kubectl.
pub fn apply_rbac(tools: &Path, kubeconfig: &Path) -> Result<()> {
    let mut kubectl = std::process::Command::new(tools.join("kubectl"))
        .env("KUBECONFIG", kubeconfig)
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    kubectl
        .stdin
        .take()
        .context("kubectl stdin")?
        .write_all(format!("{RBAC}\n---\n{ADMISSION}\n---\n{PROVIDERS}").as_bytes())?;
    let out = kubectl.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "applying deploy/rbac: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A kubeconfig with the ServiceAccount's identity (a client certificate the lab's CA signs).
pub fn kubeconfig(lab_dir: &Path, api_url: &str) -> Result<PathBuf> {
    crate::control_plane::components::write_identity_kubeconfig(
        lab_dir,
        api_url,
        SERVICE_ACCOUNT,
        &GROUPS,
    )
}

/// The controller process, ready once `/readyz/leader` answers 200 (it leads).
pub fn component(ferry: &Path, kubeconfig: &Path, metrics_port: u16, identity: &str) -> Component {
    Component {
        spec: ProcessSpec {
            name: "ferry-controller".into(),
            program: ferry.to_path_buf(),
            args: vec![
                "controller".into(),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--metrics-addr=127.0.0.1:{metrics_port}"),
                format!("--identity={identity}"),
                // One replica that restarts with the same identity leads again at once; a short lease keeps a
                // crashed one from blocking another for long.
                "--lease-seconds=5".into(),
            ],
            env: vec![
                (
                    "RUST_LOG".into(),
                    "info,kube=warn,kube_lease_manager=warn".into(),
                ),
                // As deploy/controller.yaml: mimalloc returns freed memory at once (about 20 MiB less peak RSS).
                ("MIMALLOC_PURGE_DELAY".into(), "0".into()),
                ("MIMALLOC_ARENA_EAGER_COMMIT".into(), "0".into()),
            ],
        },
        ports: vec![metrics_port],
        probe: Probe::HttpOk {
            port: metrics_port,
            path: "/readyz/leader".into(),
        },
    }
}
