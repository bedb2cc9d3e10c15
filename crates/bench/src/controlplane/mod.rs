//! `ferry bench controlplane --migrations N`: N single-disk migrations of 1 MiB VMs in one lab (real API
//! server, etcd, kube-controller-manager, vcsim; Jobs through the node agent, imports through the CDI stand-in;
//! the KubeVirt stand-in in its `--no-boot` mode), first as the floor (a straight-line script, no controller),
//! then through Ferry's controller. It prints wall times and their ratio, the controller's CPU and peak RSS, API
//! requests per migration by verb (from the audit log), and reconciles per migration with their latency.

mod floor;
mod measure;
mod report;
mod sources;
mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_api::{Phase, VirtualMachineMigration};
use ferry_lab::control_plane::process::{self, Lifetime, ProcessRecord};
use ferry_lab::{LabOptions, LabState};
use ferry_vsphere::soap::MoRef;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

pub use report::Report;

const FLOOR_USER: &str = "ferry-bench-floor";
/// Migrations applied at once while starting Ferry's run.
const APPLY_PARALLEL: usize = 32;

pub struct Options {
    pub migrations: usize,
    /// Every migration must succeed within this, in each of the two runs.
    pub timeout: Duration,
    /// Ferry's run is one `MigrationPlan` of every VM, not one migration each.
    pub plan: bool,
    /// ESXi hosts in vcsim, the VMs spread evenly over them; none: vcsim's four, half the VMs on one.
    pub hosts: Option<usize>,
    /// The Provider's `maxConcurrentDisksPerHost` in Ferry's run.
    pub disks_per_host: i32,
}

/// Stops the lab and removes its directory however the benchmark ends.
pub(crate) struct LabGuard(pub(crate) PathBuf);

impl Drop for LabGuard {
    fn drop(&mut self) {
        let _ = ferry_lab::down(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn run(options: &Options) -> Result<Report> {
    let n = options.migrations;
    let dir = std::env::temp_dir().join(format!("ferry-bench-cp-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _guard = LabGuard(dir.clone());
    eprintln!("lab: {}", dir.display());
    let started = Instant::now();
    // vcsim puts this many on each standalone host and in its cluster: two places, or one per host.
    let places = options.hosts.unwrap_or(2);
    let vcsim_vms = n.div_ceil(places).max(ferry_lab::lab::DEFAULT_VCSIM_VMS);
    let mut lab = bench_lab(&dir, vcsim_vms)?;
    lab.vcsim_realism.hosts = options.hosts;
    let state = ferry_lab::up(&lab).await?.into_state();
    ferry_lab::control_plane::controller_process::apply_rbac(&state.tools, &state.kubeconfig)?;
    let endpoint = state.vcsim.clone().context("no vcsim")?;
    let vms = sources::source_vms(&endpoint, &state.dir, n).await?;
    eprintln!(
        "lab up and {n} VMs seeded in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    let client = state.client().await?;

    let floor_ns = namespace(&client, &state, "bench-floor", 100).await?;
    let session =
        ferry_vsphere::Session::connect(endpoint.connect_config(Duration::from_secs(120))?).await?;
    // An identity of its own, so the audit log tells the floor's requests from the stand-ins' (admin).
    let floor_kubeconfig = ferry_lab::control_plane::components::write_identity_kubeconfig(
        &state.dir,
        &state.api_url,
        FLOOR_USER,
        &["system:masters"],
    )?;
    let floor_client = ferry_lab::control_plane::probe::client_for(&floor_kubeconfig, None).await?;
    let floor = floor::Floor::new(floor_client, session, &floor_ns).await?;
    let begun = Instant::now();
    let outcomes = futures::future::join_all(vms.iter().enumerate().map(|(i, (name, vm))| {
        let manifest = manifest(&state, &floor_ns, i, name);
        let floor = &floor;
        async move {
            tokio::time::timeout(options.timeout, floor.migrate(manifest, vm))
                .await
                .unwrap_or_else(|_| bail!("{name}: not done within the timeout"))
        }
    }))
    .await;
    let floor_wall = begun.elapsed();
    drop(floor);
    if let Some(Err(e)) = outcomes.iter().find(|o| o.is_err()) {
        bail!(
            "the floor's straight-line migration failed, so the lab cannot run this benchmark: {e:#}"
        );
    }
    eprintln!("floor: {n} migrations in {:.1}s", floor_wall.as_secs_f64());

    let session =
        ferry_vsphere::Session::connect(endpoint.connect_config(Duration::from_secs(120))?).await?;
    sources::power_on(&session, &vms).await?;
    session.logout().await;
    let ferry_ns = namespace(&client, &state, "bench-ferry", options.disks_per_host).await?;
    let ferry = ferry_run(&client, &state, &ferry_ns, &vms, options).await?;

    let audit = |user: &str, ns: &str| measure::requests_by_verb(&state.dir, user, ns);
    Ok(Report {
        migrations: n,
        disks_per_host: options.disks_per_host,
        plan: options.plan,
        floor_wall,
        floor_requests: audit(FLOOR_USER, &floor_ns)?,
        ferry_requests: audit(
            ferry_lab::control_plane::controller_process::SERVICE_ACCOUNT,
            &ferry_ns,
        )?,
        ferry_write_content: measure::writes_by_content(
            &state.dir,
            ferry_lab::control_plane::controller_process::SERVICE_ACCOUNT,
            &ferry_ns,
        )?,
        ferry,
    })
}

/// A benchmark's lab in `dir`: the stand-ins from this binary, guests reported ready without booting, no
/// controller (each benchmark starts its own), and nothing seeded.
pub(crate) fn bench_lab(dir: &std::path::Path, vcsim_vms: usize) -> Result<LabOptions> {
    Ok(LabOptions {
        dir: dir.to_path_buf(),
        tools: ferry_lab::control_plane::tools::bin_dir()?,
        lifetime: Lifetime::TiedToThisProcess,
        standins: Some(std::env::current_exe()?),
        demo_vms: false,
        controller: false,
        vcsim_vms,
        boot_guests: false,
        vcsim_realism: Default::default(),
        compress_staging: false,
        real_node: None,
        real_kubevirt: false,
    })
}

/// A namespace with the lab's Provider (at most `disks_per_host` disks read at once per host) and Secrets.
pub(crate) async fn namespace(
    client: &kube::Client,
    state: &LabState,
    name: &str,
    disks_per_host: i32,
) -> Result<String> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    ferry_lab::vsphere::demo::create_provider(client, state, name).await?;
    Api::<ferry_api::Provider>::namespaced(client.clone(), name)
        .patch(
            ferry_lab::vsphere::demo::PROVIDER,
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"limits": {"maxConcurrentDisksPerHost": disks_per_host}}}),
            ),
        )
        .await?;
    Ok(name.to_string())
}

/// One plan of every VM, with the settings of [`manifest`], all of them allowed in flight at once (the
/// per-host limit still holds).
fn plan(state: &LabState, ns: &str, vms: &[(String, MoRef)]) -> serde_json::Value {
    let template = manifest(state, ns, 0, "template")["spec"].clone();
    let names: Vec<_> = vms.iter().map(|(name, _)| json!({"name": name})).collect();
    json!({
        "apiVersion": ferry_api::API_VERSION, "kind": "MigrationPlan",
        "metadata": {"name": "bench", "namespace": ns},
        "spec": {
            "providerRef": template["source"]["providerRef"], "vms": names,
            "maxInFlight": vms.len().clamp(1, 500),
            "restorePowerState": template["source"]["restorePowerState"],
            "target": template["target"], "staging": template["staging"], "guestCheck": template["guestCheck"],
        },
    })
}

/// Staged, as the floor's straight-line script migrates (its steps are the staged path's), so the two compare.
fn manifest(state: &LabState, ns: &str, i: usize, vm: &str) -> serde_json::Value {
    ferry_lab::vsphere::demo::staged_migration(state, ns, &format!("m-{i:05}"), vm)
}

/// What Ferry's run measured.
pub struct FerryRun {
    pub wall: Duration,
    pub succeeded: usize,
    /// Migrations not Succeeded at the end, by phase.
    pub unfinished: BTreeMap<String, usize>,
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
    pub reconciles: measure::Reconciles,
    /// Per ESXi host, the most migrations that were reading their source at once (from their recorded
    /// Converting intervals; each has one disk).
    pub host_peaks: BTreeMap<String, usize>,
}

async fn ferry_run(
    client: &kube::Client,
    state: &LabState,
    ns: &str,
    vms: &[(String, MoRef)],
    options: &Options,
) -> Result<FerryRun> {
    let timeout = options.timeout;
    let (controller, port) = start_controller(state).await?;
    let pid = controller.pid;
    let stop = scopeguard(controller);
    let cpu_before = measure::cpu_seconds(pid)?;
    let begun = Instant::now();
    if options.plan {
        ferry_lab::vsphere::demo::apply(client, ns, plan(state, ns, vms)).await?;
    } else {
        futures::stream::iter(vms.iter().enumerate().map(|(i, (name, _))| {
            ferry_lab::vsphere::demo::apply(client, ns, manifest(state, ns, i, name))
        }))
        .buffer_unordered(APPLY_PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
    }
    let migrations =
        watch::Watched::<VirtualMachineMigration>::new(Api::namespaced(client.clone(), ns));
    let mut last_print = Instant::now();
    let (succeeded, unfinished) = loop {
        let phases = migrations.phases();
        let done = phases.get("Succeeded").copied().unwrap_or_default();
        let terminal: usize = ["Succeeded", "Failed", "Cancelled"]
            .iter()
            .filter_map(|p| phases.get(*p))
            .sum();
        if terminal == vms.len() || begun.elapsed() > timeout {
            let mut unfinished = phases;
            unfinished.remove("Succeeded");
            break (done, unfinished);
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "ferry: {done}/{} Succeeded after {:.0}s {phases:?}",
                vms.len(),
                begun.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let wall = begun.elapsed();
    let cpu_seconds = measure::cpu_seconds(pid)? - cpu_before;
    let host_peaks = host_peaks(&migrations.objects());
    let peak_rss_mib = measure::peak_rss_mib(pid)?;
    let metrics = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-fsS", "--max-time", "10"])
            .arg(format!("http://127.0.0.1:{port}/metrics"))
            .output()
    })
    .await??;
    drop(stop);
    Ok(FerryRun {
        wall,
        succeeded,
        unfinished,
        cpu_seconds,
        peak_rss_mib,
        reconciles: measure::Reconciles::parse(&String::from_utf8_lossy(&metrics.stdout)),
        host_peaks,
    })
}

/// Per source host, the most migrations recorded reading it at once.
fn host_peaks(migrations: &[std::sync::Arc<VirtualMachineMigration>]) -> BTreeMap<String, usize> {
    let mut reads: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for m in migrations {
        let Some(status) = m.status.as_ref() else {
            continue;
        };
        let host = status
            .source
            .as_ref()
            .and_then(|s| s.host.clone())
            .unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now().as_microsecond();
        reads
            .entry(host)
            .or_default()
            .extend(ferry_controller::surface::source_reads(status, now));
    }
    reads
        .into_iter()
        .map(|(host, spans)| (host, ferry_controller::surface::most_at_once(&spans)))
        .collect()
}

/// The controller as the deploy/ ServiceAccount, leading.
pub(crate) async fn start_controller(state: &LabState) -> Result<(ProcessRecord, u16)> {
    let kubeconfig =
        ferry_lab::control_plane::controller_process::kubeconfig(&state.dir, &state.api_url)?;
    let port = process::free_port()?;
    let component = ferry_lab::control_plane::controller_process::component(
        &std::env::current_exe()?,
        &kubeconfig,
        port,
        "ferry-bench",
    );
    let log = state.dir.join("bench-controller.log");
    let record = process::start(&component.spec, &log, Lifetime::TiedToThisProcess)?;
    if let Err(e) =
        ferry_lab::control_plane::probe::wait_ready(&component.probe, &record, &state.dir).await
    {
        let _ = process::stop(&record, Duration::from_secs(5));
        return Err(e.context("starting the controller"));
    }
    Ok((record, port))
}

/// Stops the controller when dropped.
pub(crate) fn scopeguard(record: ProcessRecord) -> impl Drop {
    struct Stop(ProcessRecord);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = process::stop(&self.0, Duration::from_secs(10));
        }
    }
    Stop(record)
}

impl watch::Watched<VirtualMachineMigration> {
    /// Migrations by phase, from the watch's cache.
    fn phases(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for vmm in self.objects() {
            let phase = vmm
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .and_then(|p: Phase| serde_json::to_value(p).ok())
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_else(|| "Pending".into());
            *out.entry(phase).or_default() += 1;
        }
        out
    }
}
