//! `ferry controller`: the migration controller, against the current kubeconfig or the in-cluster identity.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ferry_controller::watched::Watched;
use ferry_controller::{Config, RunOptions};

#[derive(Args)]
pub struct ControllerArgs {
    /// A kubeconfig; without it, $KUBECONFIG, ~/.kube/config or the pod's ServiceAccount.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Serve /metrics, /healthz, /readyz and /readyz/leader here.
    #[arg(long, default_value = "127.0.0.1:8080")]
    metrics_addr: Option<SocketAddr>,
    /// The image conversion and verification Jobs run; its entrypoint must be `ferry`.
    #[arg(long, env = "FERRY_WORKER_IMAGE", default_value = concat!("ferry:", env!("CARGO_PKG_VERSION")))]
    worker_image: String,
    /// The namespace of the leader-election Lease: the controller's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ferry-system")]
    lease_namespace: String,
    #[arg(long, default_value = "ferry-controller")]
    lease_name: String,
    /// The lease holder's name; a restarted process with the same identity leads again at once.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    #[arg(long, default_value_t = 15)]
    lease_seconds: u64,
    /// Serve only these namespaces (repeat the flag, or separate them by commas); none serves every namespace.
    /// With deploy/rbac/namespaced/, the controller holds rights in these namespaces only.
    #[arg(long = "namespace", env = "FERRY_NAMESPACES", value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Reconciles in flight at once (memory and API load stay bounded however many migrations run).
    #[arg(long, default_value_t = 32)]
    max_concurrent_reconciles: u16,
    /// Of those, at most this many for one namespace's objects, so one tenant cannot hold them all.
    #[arg(long, env = "FERRY_MAX_RECONCILES_PER_NAMESPACE", default_value_t = 16)]
    max_reconciles_per_namespace: u16,
}

pub async fn run(args: ControllerArgs) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig or in-cluster identity")?,
    };
    // With the `chaos` feature, this client carries the fault plan of FERRY_CHAOS_PLAN.
    let client = ferry_controller::client(config)?;
    let identity = args.identity.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| format!("ferry-{}", std::process::id()))
    });
    let options = RunOptions {
        config: Config {
            worker_image: args.worker_image,
            max_concurrent_reconciles: args.max_concurrent_reconciles.max(1),
            max_reconciles_per_namespace: args.max_reconciles_per_namespace.max(1),
            ..Config::default()
        },
        metrics_addr: args.metrics_addr,
        lease_namespace: args.lease_namespace,
        lease_name: args.lease_name,
        identity,
        lease_seconds: args.lease_seconds,
        watched: Watched::from_names(args.namespaces),
    };
    ferry_controller::run(client, options).await
}
