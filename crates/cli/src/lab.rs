//! `ferry lab up | down | status`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};
use ferry_lab::{LabOptions, LabState, Lifetime, UpOutcome};

#[derive(Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Subcommand)]
enum LabCommand {
    /// Start the lab (or report that it already runs) and write DIR/env.
    Up {
        #[command(flatten)]
        dir: DirArg,
        #[command(flatten)]
        node: NodeArg,
    },
    /// Stop every lab process and check that its ports are closed.
    Down(DirArg),
    /// Bring the lab up if needed, migrate demo VMs with live progress, and print a summary.
    Demo {
        #[command(flatten)]
        dir: DirArg,
        /// Source VMs to migrate (repeat the flag); default: the single-disk and the three-disk demo VM.
        #[arg(long = "vm")]
        vms: Vec<String>,
        /// Migrate them as one MigrationPlan, through a NetworkMap and a StorageMap.
        #[arg(long)]
        plan: bool,
        /// Migrate the lab's phony Windows VMs (Windows Server 2022 on BIOS, Windows 11 on UEFI with Secure Boot)
        /// with guest adaptation, with the lab's fake virtio-win drivers and first-boot tool, and print what was
        /// checked in each adapted volume and what no lab can check.
        #[arg(long, conflicts_with = "plan")]
        windows: bool,
        /// With `real`, Ferry is installed (its Deployment, the image built here) instead of running as a
        /// process, and its Jobs run as containers.
        #[command(flatten)]
        node: NodeArg,
        /// On a real node, how Ferry is installed: `helm` (charts/ferry with its defaults) or `manifests`
        /// (`kubectl apply` of deploy/, the chart rendered).
        #[arg(long, value_enum, default_value_t = InstallKind::Helm)]
        install: InstallKind,
    },
    /// Say whether the lab runs, and where.
    Status(DirArg),
    /// Crash and fail the controller at every write of a workload, judged against a fault-free run (feature chaos).
    #[cfg(feature = "chaos")]
    Chaos(ferry_chaos::ChaosArgs),
    /// Run one stand-in (node, cdi, kubevirt, or the volume provisioner of a real node with real CDI) against the lab
    /// in DIR; `ferry lab up` starts them.
    #[command(hide = true)]
    Standin {
        #[arg(value_parser = ["node", "cdi", "kubevirt", "provisioner"])]
        name: String,
        #[arg(long)]
        dir: PathBuf,
        /// KubeVirt only, for `ferry bench controlplane`: report guests ready without booting them in QEMU.
        #[arg(long)]
        no_boot: bool,
    },
    /// Write a raw demo disk: a boot sector that prints MARKER on COM1, then pseudo-random data.
    MakeDisk {
        /// Size in MiB (a whole number), for example 64MiB.
        #[arg(long, default_value = "64MiB")]
        size: String,
        #[arg(long)]
        marker: String,
        out: PathBuf,
    },
}

/// How the demo installs Ferry on a real node.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum InstallKind {
    Helm,
    Manifests,
}

/// Which node runs the lab's pods.
#[derive(Args, Clone, Copy)]
pub struct NodeArg {
    /// `agent`: Ferry's node agent runs each pod's command as a process (the default for a new lab; no root
    /// needed). `real`: a kubelet, containerd and runc run pods as containers on a CNI bridge (root, runc; one per
    /// machine; builds its tools with `hack/tools.sh --node` on first use). Unset, a lab already running in the
    /// directory keeps the node it runs with.
    #[arg(long = "node", value_enum)]
    pub kind: Option<NodeKind>,
    /// With `--node real`: `real` runs KubeVirt v1.9.0's own virt-controller, virt-handler and virt-launcher
    /// (software emulation; the default); `standin` the lab's KubeVirt stand-in, which starts QEMU itself.
    #[arg(long = "kubevirt", value_enum, default_value_t = KubevirtKind::Real)]
    pub kubevirt: KubevirtKind,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum KubevirtKind {
    Real,
    Standin,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Agent,
    Real,
}

#[derive(Args)]
pub struct DirArg {
    /// The lab's directory: state, logs, certificates and kubeconfig live here.
    #[arg(long, default_value = ".lab", env = "FERRY_LAB_DIR")]
    pub dir: PathBuf,
}

pub async fn run(args: LabArgs) -> Result<()> {
    match args.command {
        LabCommand::Demo {
            dir,
            vms,
            plan,
            windows,
            node,
            install,
        } => crate::demo::run(dir.dir, vms, plan, windows, node, install).await,
        #[cfg(feature = "chaos")]
        LabCommand::Chaos(args) => ferry_chaos::run(args).await,
        LabCommand::Up {
            dir: DirArg { dir },
            node,
        } => {
            let started = Instant::now();
            let options = options_for(dir, node)?;
            let outcome = ferry_lab::up(&options).await?;
            let verb = match outcome {
                UpOutcome::Started(_) => "started",
                UpOutcome::AlreadyRunning(_) => "already running",
            };
            let state = outcome.state();
            println!("lab {verb} in {:.1}s", started.elapsed().as_secs_f64());
            print_summary(state).await;
            println!(
                "\nuse it:  . {}/env && kubectl get --raw /readyz",
                state.dir.display()
            );
            Ok(())
        }
        LabCommand::Down(DirArg { dir }) => {
            let report = ferry_lab::down(&dir)?;
            if report.stopped.is_empty() {
                println!("no lab process was running in {}", dir.display());
            } else {
                println!(
                    "stopped {}; ports {:?} closed",
                    report.stopped.join(", "),
                    report.ports
                );
            }
            Ok(())
        }
        LabCommand::Standin { name, dir, no_boot } => standin(&name, &dir, no_boot).await,
        LabCommand::MakeDisk { size, marker, out } => {
            let mib: u64 = size.trim_end_matches("MiB").parse().map_err(|_| {
                anyhow::anyhow!("--size {size:?}: give a whole number of MiB, like 64MiB")
            })?;
            let sha = ferry_lab::vsphere::bootdisk::make_boot_disk(&out, mib << 20, &marker)?;
            println!("{}  {} ({mib} MiB, marker {marker:?})", sha, out.display());
            Ok(())
        }
        LabCommand::Status(DirArg { dir }) => {
            match LabState::load(&dir.canonicalize().unwrap_or(dir.clone()))? {
                Some(state) if state.all_alive() => {
                    println!("lab running");
                    print_summary(&state).await;
                }
                Some(_) => println!(
                    "lab in {} is partly down: run `ferry lab up` again",
                    dir.display()
                ),
                None => println!("no lab in {}", dir.display()),
            }
            Ok(())
        }
    }
}

/// The whole lab, as `up` and `demo` start it: stand-ins, demo VMs and the controller, outliving this command,
/// with a vCenter as strict as production (sessions on `/folder` that idle out, the datacenter in a folder,
/// disks Ferry must refuse, SHA-1 host thumbprints).
pub fn options(dir: PathBuf) -> Result<LabOptions> {
    Ok(LabOptions {
        dir,
        tools: ferry_lab::control_plane::tools::bin_dir()?,
        lifetime: Lifetime::Detached,
        standins: Some(std::env::current_exe()?),
        demo_vms: true,
        controller: true,
        vcsim_vms: ferry_lab::lab::DEFAULT_VCSIM_VMS,
        boot_guests: true,
        vcsim_realism: ferry_lab::lab::VcsimRealism::production_like(),
        compress_staging: false,
        real_node: None,
        real_kubevirt: false,
    })
}

/// The lab's options with the node `kind`: a real node's lab runs no controller process (Ferry is installed
/// from deploy/ onto it instead).
/// The node a lab in `dir` runs with: the one asked for, else the running lab's, else the node agent.
pub fn node_kind(dir: &std::path::Path, node: NodeArg) -> NodeKind {
    node.kind.unwrap_or_else(|| {
        let running = dir
            .canonicalize()
            .ok()
            .and_then(|d| LabState::load(&d).ok().flatten());
        match running {
            Some(lab) if lab.all_alive() && lab.real_node.is_some() => NodeKind::Real,
            _ => NodeKind::Agent,
        }
    })
}

pub fn options_for(dir: PathBuf, node: NodeArg) -> Result<LabOptions> {
    let real = node_kind(&dir, node) == NodeKind::Real;
    let mut options = options(dir)?;
    if real {
        // Refused before the node's tools are built (minutes, the first time).
        let dir = options.dir.canonicalize().unwrap_or(options.dir.clone());
        if let Some(why) = ferry_lab::real_node::host_refusal(&dir) {
            anyhow::bail!("{why}");
        }
        options.real_node = Some(ferry_lab::control_plane::tools::node_bin_dir()?);
        options.controller = false;
        options.real_kubevirt = node.kubevirt == KubevirtKind::Real;
    }
    Ok(options)
}

pub async fn print_summary(state: &LabState) {
    println!("  dir                      {}", state.dir.display());
    println!("  kube-apiserver           {}", state.api_url);
    if let Some(v) = &state.vcsim {
        println!(
            "  vcsim                    {} (user {}, password in {})",
            v.url,
            v.username,
            v.password_file.display()
        );
    }
    if let Some(url) = &state.controller {
        println!("  ferry controller         {url}/metrics, /healthz, /readyz, /readyz/leader");
    }
    if let Some(node) = &state.real_node {
        println!(
            "  real node                {} (containerd {}, bridge {})",
            node.name,
            node.socket().display(),
            ferry_lab::real_node::BRIDGE
        );
    }
    println!("  CDI                      {}", cdi_running(state));
    println!(
        "  KubeVirt                 {}",
        kubevirt_running(state).await
    );
    if let Some(s) = &state.staging {
        println!(
            "  staging (S3, MinIO)      {} bucket {}",
            s.endpoint, s.bucket
        );
    }
    match admission_webhooks(state).await {
        Ok(hooks) if hooks.is_empty() => println!("  admission webhooks       none registered"),
        Ok(hooks) => {
            for (i, hook) in hooks.iter().enumerate() {
                let label = if i == 0 { "admission webhooks" } else { "" };
                println!("  {label:<24} {hook}");
            }
        }
        Err(e) => println!("  admission webhooks       unknown: {e:#}"),
    }
    for p in &state.processes {
        println!("  {:<24} pid {:<8} log {}", p.name, p.pid, p.log.display());
    }
}

/// Which CDI fills the lab's DataVolumes: CDI's own on a real node (beside the lab's provisioner), or the stand-in.
fn cdi_running(state: &LabState) -> String {
    let runs = |name: &str| state.processes.iter().any(|p| p.name == name);
    match (runs("standin-provisioner"), runs("standin-cdi")) {
        (true, _) => format!(
            "CDI v1.65.0's controller and importer (Deployment {}/{}), volumes by the lab's provisioner",
            ferry_lab::real_node::cdi::NAMESPACE,
            ferry_lab::real_node::cdi::DEPLOYMENT
        ),
        (false, true) => "the lab's CDI stand-in (ferry lab standin cdi)".into(),
        (false, false) => "none".into(),
    }
}

/// Which KubeVirt runs the lab's VMs: the stand-in (a lab process), or KubeVirt's own components on the real node.
async fn kubevirt_running(state: &LabState) -> String {
    use ferry_lab::real_node::kubevirt::{CONTROLLER, HANDLER, NAMESPACE};
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
    if state.processes.iter().any(|p| p.name == "standin-kubevirt") {
        return "the lab's KubeVirt stand-in (ferry lab standin kubevirt), QEMU started by it"
            .into();
    }
    let Ok(client) = state.client().await else {
        return "unknown (the API server does not answer)".into();
    };
    let handler = kube::Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .get_opt(HANDLER)
        .await;
    let controller = kube::Api::<Deployment>::namespaced(client, NAMESPACE)
        .get_opt(CONTROLLER)
        .await;
    match (handler, controller) {
        (Ok(Some(handler)), Ok(Some(controller))) => format!(
            "KubeVirt v1.9.0's {CONTROLLER} ({} ready) and {HANDLER} ({} ready), launchers under software emulation",
            controller
                .status
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
            handler.status.map_or(0, |s| s.number_ready)
        ),
        _ => "none".into(),
    }
}

/// The webhooks the API server calls, as it has them registered: `configuration/webhook -> url`.
async fn admission_webhooks(state: &LabState) -> Result<Vec<String>> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
    };
    use kube::api::{Api, ListParams};
    let client = state.client().await?;
    let line = |config: &Option<String>, webhook: &str, to: &WebhookClientConfig| {
        let url = to.url.clone().unwrap_or_else(|| "(a Service)".into());
        format!(
            "{}/{webhook} -> {url}",
            config.as_deref().unwrap_or_default()
        )
    };
    let list = ListParams::default();
    let mut lines = Vec::new();
    for config in Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&list)
        .await?
    {
        let hooks = config.webhooks.iter().flatten();
        lines.extend(hooks.map(|h| line(&config.metadata.name, &h.name, &h.client_config)));
    }
    for config in Api::<ValidatingWebhookConfiguration>::all(client)
        .list(&list)
        .await?
    {
        let hooks = config.webhooks.iter().flatten();
        lines.extend(hooks.map(|h| line(&config.metadata.name, &h.name, &h.client_config)));
    }
    Ok(lines)
}

async fn standin(name: &str, dir: &std::path::Path, no_boot: bool) -> Result<()> {
    use ferry_lab::standins::{cdi, kubevirt, node, provisioner};
    let state =
        LabState::load(dir)?.ok_or_else(|| anyhow::anyhow!("no lab in {}", dir.display()))?;
    let client = state.client().await?;
    client.apiserver_version().await?;
    let state_dir = state.dir.join(format!("standin-{name}"));
    let shutdown = async {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
        }
    };
    println!("{}{name}", ferry_lab::lab::STANDIN_READY);
    match name {
        "node" => {
            let config = node::NodeAgentConfig {
                ferry_binary: std::env::current_exe()?,
                state_dir,
            };
            node::run(client, None, config, shutdown).await
        }
        "cdi" => cdi::run(client, None, &state_dir, shutdown).await,
        "provisioner" => provisioner::run(client, &state_dir, shutdown).await,
        _ => {
            let boot = if no_boot {
                kubevirt::Boot::ReportReadyWithoutBooting
            } else {
                kubevirt::Boot::Qemu
            };
            let identities = kubevirt::Identities::impersonated(&state.kubeconfig).await?;
            kubevirt::run(client, identities, None, &state_dir, boot, shutdown).await
        }
    }
}
