//! `ferry bench migrate --size 4GiB`: one whole migration per path (direct, staged raw, staged qcow2) in one lab,
//! through Ferry's controller, of a disk that is half random data and half zeros; and, in the same run, the
//! floor: the same disk downloaded from vcsim to a file. For each path it prints the wall time from the start of
//! Converting to verified (the next checkpoint, CreatingVM, entered), the ratio floor / path (the faster of the
//! floors measured right before and right after the path), the bytes read from
//! the source, the bytes written and allocated in the volume, and the conversion pod's peak RSS as its Job
//! reported it.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferry_api::{Phase, VirtualMachineMigration};
use ferry_datapath::report::JobReport;
use ferry_lab::LabState;
use ferry_vsphere::Session;
use ferry_vsphere::datastore::{Download, flat_disk};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::provision;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::controlplane::{LabGuard, bench_lab, namespace, scopeguard, start_controller};

const MIB: u64 = 1 << 20;

pub struct Options {
    pub size: u64,
    /// Each path's migration must succeed within this.
    pub timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    Direct,
    StagedRaw,
    StagedQcow2,
}

const PATHS: [Route; 3] = [Route::Direct, Route::StagedRaw, Route::StagedQcow2];

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::StagedRaw => "staged raw",
            Route::StagedQcow2 => "staged qcow2",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::StagedRaw => "staged-raw",
            Route::StagedQcow2 => "staged-qcow2",
        }
    }

    fn manifest(self, state: &LabState, ns: &str, vm: &str) -> serde_json::Value {
        let name = self.slug();
        match self {
            Route::Direct => ferry_lab::vsphere::demo::migration(state, ns, name, vm),
            Route::StagedRaw => ferry_lab::vsphere::demo::staged_migration(state, ns, name, vm),
            Route::StagedQcow2 => {
                let mut m = ferry_lab::vsphere::demo::staged_migration(state, ns, name, vm);
                m["spec"]["conversion"] = json!({"format": "qcow2"});
                m
            }
        }
    }
}

/// One path's migration, as measured.
pub struct PathRun {
    pub name: &'static str,
    /// The floor measured around this path, the faster of before and after: the same disk downloaded from vcsim
    /// to a file.
    pub floor: Duration,
    /// From entering Converting to entering CreatingVM: every disk converted, in its volume and verified.
    pub wall: Duration,
    /// Over every conversion pod's report (more than the disk if an attempt was retried).
    pub bytes_read: u64,
    /// Reported by the direct path's Job: data written, zeros punched instead.
    pub bytes_written: Option<u64>,
    /// The volume's allocated bytes after the migration (`du`).
    pub allocated: u64,
    /// The largest conversion pod's peak RSS, as its Job reported it.
    pub peak_rss: Option<u64>,
    pub conversion_pods: usize,
}

pub struct Report {
    pub size: u64,
    pub data: u64,
    pub runs: Vec<PathRun>,
}

impl Report {
    pub fn render(&self) -> String {
        let mut out = format!(
            "migrate benchmark: a {} MiB disk ({} MiB random data, the rest zeros), one migration per path, one lab\n",
            self.size / MIB,
            self.data / MIB
        );
        out += &format!(
            "  {:<13} {:>22} {:>8} {:>11} {:>17} {:>14} {:>20} {:>13} {:>5}\n",
            "path",
            "Converting to verified",
            "floor",
            "floor/path",
            "read from source",
            "written",
            "allocated in volume",
            "pod peak RSS",
            "pods"
        );
        let mib = |b: u64| format!("{} MiB", b / MIB);
        for run in &self.runs {
            out += &format!(
                "  {:<13} {:>20.1} s {:>6.1} s {:>11.2} {:>17} {:>14} {:>20} {:>13} {:>5}\n",
                run.name,
                run.wall.as_secs_f64(),
                run.floor.as_secs_f64(),
                self.ratio(run),
                mib(run.bytes_read),
                run.bytes_written.map_or("-".into(), mib),
                mib(run.allocated),
                run.peak_rss.map_or("-".into(), mib),
                run.conversion_pods,
            );
        }
        if let (Some(direct), Some(staged)) = (self.run("direct"), self.run("staged raw")) {
            out += &format!(
                "  direct is {:.2}x as fast as staged raw\n",
                staged.wall.as_secs_f64() / direct.wall.as_secs_f64()
            );
        }
        out
    }

    pub fn ratio(&self, run: &PathRun) -> f64 {
        run.floor.as_secs_f64() / run.wall.as_secs_f64()
    }

    fn run(&self, name: &str) -> Option<&PathRun> {
        self.runs.iter().find(|r| r.name == name)
    }
}

pub async fn run(options: &Options) -> Result<Report> {
    let dir = std::env::temp_dir().join(format!("ferry-bench-migrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _guard = LabGuard(dir.clone());
    eprintln!("lab: {}", dir.display());
    // Nothing to boot: the disk is data, and the benchmark ends its clock at CreatingVM.
    let lab = bench_lab(&dir, ferry_lab::lab::DEFAULT_VCSIM_VMS)?;
    let state = ferry_lab::up(&lab).await?.into_state();
    ferry_lab::control_plane::controller_process::apply_rbac(&state.tools, &state.kubeconfig)?;
    let endpoint = state.vcsim.clone().context("no vcsim")?;
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(600))?).await?;

    let half = (options.size / 2).div_ceil(MIB) * MIB;
    eprintln!(
        "making a {} MiB source disk, {} MiB of it data...",
        options.size / MIB,
        half / MIB
    );
    let disk = half_data_disk(&dir.join("source"), options.size, half)?;
    let vms = attach_to_vms(&session, &disk, PATHS.len()).await?;

    let client = state.client().await?;
    let (controller, _port) = start_controller(&state).await?;
    let _stop = scopeguard(controller);
    let mut runs = Vec::new();
    // Untimed: the first read of the freshly made extent would be the slowest.
    download_to_file(&session, &vms[0], &dir.join("floor.img")).await?;
    for (path, vm) in PATHS.into_iter().zip(&vms) {
        // The floor around each path, from the same VM, the faster of two: a shared machine's speed drifts over
        // minutes, and the faster floor gives the lower, more conservative ratio.
        let before = download_to_file(&session, vm, &dir.join("floor.img")).await?;
        eprintln!(
            "{}: the floor downloaded {} in {:.1} s; migrating it...",
            path.name(),
            vm.0,
            before.as_secs_f64()
        );
        let ns = namespace(&client, &state, &format!("bench-{}", path.slug()), 100).await?;
        let mut run = migrate_one(&client, &state, &ns, path, &vm.0, &disk, options.timeout)
            .await
            .with_context(|| format!("the {} migration", path.name()))?;
        let after = download_to_file(&session, vm, &dir.join("floor.img")).await?;
        run.floor = before.min(after);
        eprintln!("{}: {:.1} s", path.name(), run.wall.as_secs_f64());
        runs.push(run);
    }
    session.logout().await;
    Ok(Report {
        size: options.size,
        data: half,
        runs,
    })
}

/// A flat VMDK of `size` bytes: `data` bytes of incompressible data, then zeros (holes in the extent).
pub(crate) fn half_data_disk(
    dir: &Path,
    size: u64,
    data: u64,
) -> Result<ferry_lab::disks::FlatVmdk> {
    std::fs::create_dir_all(dir)?;
    let raw = dir.join("bench.raw");
    ferry_lab::disks::write_pattern(&raw, data, 4)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&raw)?
        .set_len(size)?;
    let sha256 = ferry_lab::disks::sha256_file(&raw)?;
    ferry_lab::disks::raw_to_flat_vmdk(&raw, "bench", sha256, size)
}

/// The disk linked into the first `count` of vcsim's VMs in place of their own, and each VM powered on.
pub(crate) async fn attach_to_vms(
    session: &Session,
    disk: &ferry_lab::disks::FlatVmdk,
    count: usize,
) -> Result<Vec<(String, ferry_vsphere::soap::MoRef)>> {
    let names = ["DC0_H0_VM0", "DC0_H0_VM1", "DC0_C0_RP0_VM0"];
    let mut vms = Vec::new();
    for name in names.into_iter().take(count) {
        let vm = inventory::find_vm(session, &VmSelector::Name(name.into())).await?;
        let original: Vec<i32> = inventory::describe_vm(session, &vm)
            .await?
            .disks
            .iter()
            .map(|d| d.key)
            .collect();
        // Linked, not uploaded: vcsim's datastore is a directory here, and the extent stays sparse.
        provision::attach_flat_vmdk_at(
            session,
            &vm,
            &disk.descriptor,
            &disk.extent,
            None,
            provision::Transfer::LinkIntoLocalDatastore,
        )
        .await
        .with_context(|| format!("attaching the disk to {name}"))?;
        provision::remove_disks(session, &vm, &original).await?;
        ferry_vsphere::power::power_on(session, &vm, Duration::from_secs(60)).await?;
        vms.push((name.to_string(), vm));
    }
    Ok(vms)
}

/// The floor: every byte of the VM's disk from vcsim's datastore into a local file, synced.
async fn download_to_file(
    session: &Session,
    vm: &(String, ferry_vsphere::soap::MoRef),
    to: &Path,
) -> Result<Duration> {
    let info = inventory::describe_vm(session, &vm.1).await?;
    let file = &info.disks.first().context("the VM has a disk")?.file;
    let flat = flat_disk(session, &info.datacenter, file).await?;
    let begun = Instant::now();
    let mut stream = Download::open(session, &info.datacenter, &flat.extent, 0).await?;
    let mut out = std::io::BufWriter::with_capacity(4 * MIB as usize, std::fs::File::create(to)?);
    while let Some(chunk) = stream.next_chunk().await? {
        out.write_all(&chunk)?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_data()?;
    let elapsed = begun.elapsed();
    std::fs::remove_file(to)?;
    Ok(elapsed)
}

async fn migrate_one(
    client: &kube::Client,
    state: &LabState,
    ns: &str,
    path: Route,
    vm: &str,
    disk: &ferry_lab::disks::FlatVmdk,
    timeout: Duration,
) -> Result<PathRun> {
    let reports = ConversionReports::watch(Api::namespaced(client.clone(), ns));
    ferry_lab::vsphere::demo::apply(client, ns, path.manifest(state, ns, vm)).await?;
    let migrations: Api<VirtualMachineMigration> = Api::namespaced(client.clone(), ns);
    let begun = Instant::now();
    let done = loop {
        let vmm = migrations.get(path.slug()).await?;
        let status = vmm.status.clone().unwrap_or_default();
        match status.phase {
            Some(Phase::Succeeded) => break status,
            Some(Phase::Failed | Phase::Cancelled) => bail!(
                "ended {:?}: {}",
                status.phase,
                status
                    .conditions
                    .iter()
                    .map(|c| format!("{} {}: {}", c.type_, c.reason, c.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            _ if begun.elapsed() > timeout => bail!("not done within {timeout:?}"),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    let entered = |phase: Phase| {
        done.checkpoints
            .iter()
            .find(|c| c.phase == phase)
            .map(|c| c.entered.0)
            .with_context(|| format!("no {phase:?} checkpoint"))
    };
    let wall =
        Duration::try_from(entered(Phase::CreatingVm)?.duration_since(entered(Phase::Converting)?))
            .context("CreatingVM before Converting")?;
    let disk_status = done.disks.first().context("no disk in status")?;
    anyhow::ensure!(
        disk_status.verified && disk_status.sha256.as_deref() == Some(disk.sha256.as_str()),
        "the disk is not verified against the source: {disk_status:?}"
    );
    let dv = disk_status.data_volume.as_deref().context("no volume")?;
    let allocated =
        std::fs::metadata(ferry_lab::volumes::volume_image(client, ns, dv).await?)?.blocks() * 512;
    let reports = reports.take();
    Ok(PathRun {
        name: path.name(),
        floor: Duration::ZERO,
        wall,
        bytes_read: reports.iter().map(|r| r.bytes_read).sum(),
        bytes_written: reports
            .iter()
            .filter_map(|r| r.bytes_written)
            .reduce(|a, b| a + b),
        allocated,
        peak_rss: reports.iter().filter_map(|r| r.peak_rss).max(),
        conversion_pods: reports.len(),
    })
}

/// What one conversion pod reported in its termination message.
struct Converted {
    bytes_read: u64,
    bytes_written: Option<u64>,
    peak_rss: Option<u64>,
}

/// Every conversion pod's report in a namespace, caught from a watch before the controller deletes the pod.
struct ConversionReports {
    seen: Arc<Mutex<BTreeMap<String, Converted>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ConversionReports {
    fn watch(pods: Api<Pod>) -> Self {
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(pods, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            futures::pin_mut!(stream);
            while let Some(Ok(pod)) = stream.next().await {
                let Some(found) = conversion_report(&pod) else {
                    continue;
                };
                let name = pod.metadata.name.unwrap_or_default();
                into.lock().unwrap().insert(name, found);
            }
        });
        Self { seen, task }
    }

    fn take(self) -> Vec<Converted> {
        self.task.abort();
        std::mem::take(&mut *self.seen.lock().unwrap())
            .into_values()
            .collect()
    }
}

fn conversion_report(pod: &Pod) -> Option<Converted> {
    let message = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())?;
    match JobReport::parse(&message)? {
        JobReport::Staged(s) => Some(Converted {
            bytes_read: s.bytes_read,
            bytes_written: None,
            peak_rss: s.peak_rss_bytes,
        }),
        JobReport::Written(w) => Some(Converted {
            bytes_read: w.bytes_read,
            bytes_written: Some(w.bytes_written),
            peak_rss: w.peak_rss_bytes,
        }),
        _ => None,
    }
}
