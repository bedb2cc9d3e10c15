//! The `ferry` command line: one binary for the controller, the lab and the tools around them.

mod controller;
#[cfg(feature = "lab")]
mod demo;
mod inventory;
#[cfg(feature = "lab")]
mod lab;
mod plan_create;
mod rbac;
mod ui;
mod views;
mod worker;

use clap::{Parser, Subcommand};

// glibc's malloc spent about a quarter of the controller's CPU (perf during `ferry bench controlplane`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "ferry", version, about = "Migrate VMware VMs to KubeVirt")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the migration controller (leader election, metrics and health on --metrics-addr, JSON logs).
    Controller(controller::ControllerArgs),
    /// Run the local lab: a real control plane and vSphere simulator on this machine.
    #[cfg(feature = "lab")]
    Lab(lab::LabArgs),
    /// Not in this binary: the shipped image is built without the lab (feature `lab`).
    #[cfg(not(feature = "lab"))]
    #[command(hide = true)]
    Lab(NotBuiltIn),
    /// Print every CustomResourceDefinition as YAML (`ferry crds | kubectl apply -f -`).
    Crds,
    /// Print the controller's RBAC for chosen namespaces only (`ferry rbac --namespace a,b | kubectl apply -f -`).
    Rbac(rbac::RbacArgs),
    /// Benchmarks that print ratios against baselines measured in the same run.
    #[cfg(feature = "lab")]
    Bench(ferry_bench::BenchArgs),
    /// Not in this binary: the shipped image is built without the benchmarks (feature `lab`).
    #[cfg(not(feature = "lab"))]
    #[command(hide = true)]
    Bench(NotBuiltIn),
    /// Stream, convert, checksum and stage disks (the conversion Job's entrypoint).
    Convert(worker::ConvertArgs),
    /// Prove an imported disk holds the source's bytes (the verification Job's entrypoint).
    Verify(worker::VerifyArgs),
    /// Adapts the migrated guest on its volumes with virt-v2v (the adaptation Job's entrypoint).
    Adapt(worker::AdaptArgs),
    /// List migrations: phase, progress, target, age and reason.
    Get(views::get::GetArgs),
    /// Show one migration: its spec, checkpoints, conditions, disks, Events, and what to do when it stopped.
    Describe(views::describe::DescribeArgs),
    /// Follow migrations live: progress bars per migration and disk, throughput and ETA.
    Watch(views::watch::WatchArgs),
    /// List the VMs of a vSphere endpoint, or describe one, as Ferry sees them.
    Inventory(inventory::InventoryArgs),
    /// Write MigrationPlans from a Provider's inventory.
    Plan(plan_create::PlanArgs),
    /// Serve a live web dashboard on this machine: plans, migrations, hosts' disk slots and Events (read-only, with
    /// your kubeconfig).
    Ui(ui::UiArgs),
    /// Print a shell completion script: `source <(ferry completion bash)`, or save it where your shell loads
    /// completions from (`ferry completion zsh > "${fpath[1]}/_ferry"`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The name `ferry` runs under: as a kubectl plugin (`kubectl-ferry` on PATH, run as `kubectl ferry ...`), its help
/// and errors name the command a user typed.
fn command_name(argv0: Option<&std::ffi::OsStr>) -> &'static str {
    let file = argv0.map(std::path::Path::new).and_then(|p| p.file_name());
    match file.and_then(|f| f.to_str()) {
        Some("kubectl-ferry") => "kubectl ferry",
        _ => "ferry",
    }
}

fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let argv0 = std::env::args_os().next();
    let matches = Cli::command()
        .bin_name(command_name(argv0.as_deref()))
        .get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// A command left out of this build: its arguments are taken whole so that any use of it gets the one clear error.
#[cfg(not(feature = "lab"))]
#[derive(clap::Args)]
struct NotBuiltIn {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
}

#[cfg(not(feature = "lab"))]
fn not_built_in(command: &str) -> anyhow::Result<()> {
    anyhow::bail!(
        "`ferry {command}` is not built into this binary: it is the shipped controller image, built without the \
         lab, benchmarks and vSphere provisioning (feature `lab`). Run it from a build with default features: \
         cargo build --bin ferry"
    )
}

fn main() -> std::process::ExitCode {
    let cli = parse();
    // The controller waits on the API server far more than it computes (under a tenth of a core for 1,000
    // migrations): one thread serves it, without the wake-ups across threads of a work-stealing pool, which cost
    // about a tenth of its CPU in parking and switching (perf, `ferry bench controlplane`).
    let mut runtime = match cli.command {
        Command::Controller(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match runtime.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Errors print as a chain of causes, never as a Debug dump or a backtrace.
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn,kube_client=off,kube_lease_manager=warn".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // The controller logs JSON for log pipelines, with the migration's key from the reconcile span.
    if matches!(cli.command, Command::Controller(_)) {
        logs.json().with_current_span(true).init();
    } else {
        logs.init();
    }
    match cli.command {
        Command::Controller(args) => controller::run(args).await,
        #[cfg(feature = "lab")]
        Command::Lab(args) => lab::run(args).await,
        #[cfg(not(feature = "lab"))]
        Command::Lab(_) => not_built_in("lab"),
        Command::Inventory(args) => inventory::run(args).await,
        Command::Plan(args) => plan_create::run(args).await,
        Command::Get(args) => views::get::run(args).await,
        Command::Describe(args) => views::describe::run(args).await,
        Command::Watch(args) => views::watch::run(args).await,
        Command::Ui(args) => ui::run(args).await,
        Command::Convert(args) => worker::convert(args).await,
        Command::Verify(args) => worker::verify(args).await,
        Command::Adapt(args) => worker::adapt(args).await,
        #[cfg(feature = "lab")]
        Command::Bench(args) => ferry_bench::run(args).await,
        #[cfg(not(feature = "lab"))]
        Command::Bench(_) => not_built_in("bench"),
        Command::Rbac(args) => rbac::run(args),
        Command::Completion { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "ferry", &mut std::io::stdout());
            Ok(())
        }
        Command::Crds => {
            print!("{}", ferry_api::crds::to_yaml()?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_as_a_kubectl_plugin_it_is_named_as_typed() {
        let name = |p: &str| command_name(Some(std::ffi::OsStr::new(p)));
        assert_eq!(name("/usr/local/bin/kubectl-ferry"), "kubectl ferry");
        assert_eq!(name("kubectl-ferry"), "kubectl ferry");
        assert_eq!(name("/usr/local/bin/ferry"), "ferry");
        assert_eq!(command_name(None), "ferry");
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
