//! Where the Go-built tools live. They are built once by `hack/tools.sh` into a cache outside the repo.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The environment variable that points at an already built tool directory.
pub const TOOLS_BIN_ENV: &str = "FERRY_TOOLS_BIN";

const BUILD_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hack/tools.sh");

/// The environment variable that points at an already built directory of a real node's tools.
pub const NODE_TOOLS_BIN_ENV: &str = "FERRY_NODE_TOOLS_BIN";

/// The directory holding etcd, kube-apiserver, kube-controller-manager, kubectl and vcsim.
/// Builds them on first use when this binary still sits in its source checkout.
pub fn bin_dir() -> Result<PathBuf> {
    built(TOOLS_BIN_ENV, &[])
}

/// The directory holding a real node's kubelet, kube-scheduler, containerd and CNI plugins (`hack/tools.sh
/// --node`), built on first use like [`bin_dir`].
pub fn node_bin_dir() -> Result<PathBuf> {
    built(NODE_TOOLS_BIN_ENV, &["--node"])
}

fn built(env: &str, args: &[&str]) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(env) {
        return Ok(PathBuf::from(dir));
    }
    let script = PathBuf::from(BUILD_SCRIPT);
    if !script.exists() {
        bail!(
            "the lab's tools are not found: set {env} to the directory that `{}` printed",
            ["hack/tools.sh"]
                .iter()
                .chain(args)
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed ({})", script.display(), output.status);
    }
    let dir = String::from_utf8(output.stdout)?.trim().to_string();
    Ok(PathBuf::from(dir))
}
