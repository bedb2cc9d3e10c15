//! The lab: a real etcd, kube-apiserver, kube-controller-manager and vcsim on free loopback ports, all under one
//! directory. `up` is idempotent, and `down` leaves no process behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::control_plane::components::{self, Component, Ports};
use crate::control_plane::pki::Pki;
use crate::control_plane::process::{self, Lifetime, ProcessRecord};
use crate::control_plane::{controller_process, crds, probe};
pub use crate::minio::StagingEndpoint;
pub use crate::vsphere::vcsim::{VcsimEndpoint, VcsimRealism};

const STATE_FILE: &str = "lab.json";
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Attempts per component: a free port can be taken by someone else between our probe and the bind.
const START_ATTEMPTS: usize = 3;

/// What `up` needs.
#[derive(Clone, Debug)]
pub struct LabOptions {
    pub dir: PathBuf,
    pub tools: PathBuf,
    pub lifetime: Lifetime,
    /// The `ferry` binary that runs the node agent, CDI and KubeVirt stand-ins; None starts none.
    pub standins: Option<PathBuf>,
    /// Replace the empty disks of vcsim's demo VMs with bootable VMDKs, and add the Linux VMs (Debian 12, BIOS and
    /// EFI), building their images first if the recipe changed.
    pub demo_vms: bool,
    /// Run Ferry's controller (the `standins` binary) as the deploy/ ServiceAccount. Tests that run their own
    /// leave it out.
    pub controller: bool,
    /// vcsim's VMs per host and per resource pool (its `-vm`; the lab's default is 2).
    pub vcsim_vms: usize,
    /// The KubeVirt stand-in boots each VMI's disk in QEMU; false (`--no-boot`, for the control-plane benchmark
    /// only) reports guests ready without booting them.
    pub boot_guests: bool,
    /// Production-vCenter behaviours of vcsim (sessions on `/folder`, a datacenter in a folder, transfer faults,
    /// storage fixtures, SHA-1 host thumbprints); the default switches none on.
    pub vcsim_realism: VcsimRealism,
    /// MinIO compresses staged raw images, as a deployment with compression on does: a lab can then stage a
    /// mostly empty disk far larger than its own free space.
    pub compress_staging: bool,
    /// A real node (containerd, the kubelet, kube-scheduler) from the tools in this directory
    /// (`hack/tools.sh --node`) instead of the node agent. Needs root and runc; one per machine.
    pub real_node: Option<PathBuf>,
    /// With a real node: KubeVirt v1.9.0's own virt-controller, virt-handler and virt-launcher run the VMs, instead
    /// of the lab's KubeVirt stand-in.
    pub real_kubevirt: bool,
}

/// vcsim's VMs per host and per resource pool in an ordinary lab.
pub const DEFAULT_VCSIM_VMS: usize = 2;

/// The stand-ins `ferry lab up` starts, each a process of its own: `ferry lab standin <name> --dir DIR`.
pub const STANDINS: [&str; 3] = ["node", "cdi", "kubevirt"];
/// What a stand-in prints once it serves.
pub const STANDIN_READY: &str = "FERRY-STANDIN-READY ";

/// Everything a client of the lab needs, kept in `DIR/lab.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LabState {
    pub dir: PathBuf,
    pub tools: PathBuf,
    pub kubeconfig: PathBuf,
    pub api_url: String,
    pub vcsim: Option<VcsimEndpoint>,
    /// The S3 staging store (MinIO) migrations stage converted disks in.
    #[serde(default)]
    pub staging: Option<StagingEndpoint>,
    /// `http://127.0.0.1:PORT` of the controller's /metrics, /healthz and /readyz, when the lab runs it.
    #[serde(default)]
    pub controller: Option<String>,
    pub ports: Vec<u16>,
    pub processes: Vec<ProcessRecord>,
    /// The real node, when the lab runs one: what `down` needs to stop it and restore the machine.
    #[serde(default)]
    pub real_node: Option<crate::real_node::RealNode>,
}

impl LabState {
    fn empty(dir: &Path, tools: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            tools: tools.to_path_buf(),
            kubeconfig: dir.join("kubeconfig"),
            api_url: String::new(),
            vcsim: None,
            staging: None,
            controller: None,
            ports: Vec::new(),
            processes: Vec::new(),
            real_node: None,
        }
    }

    pub fn load(dir: &Path) -> Result<Option<Self>> {
        match std::fs::read(dir.join(STATE_FILE)) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                format!("reading {}", dir.join(STATE_FILE).display())
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn save(&self) -> Result<()> {
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(tmp, self.dir.join(STATE_FILE))?;
        Ok(())
    }

    /// True when every recorded process is still running.
    pub fn all_alive(&self) -> bool {
        !self.processes.is_empty() && self.processes.iter().all(|p| p.is_alive(&self.dir))
    }

    /// A client with the admin identity.
    pub async fn client(&self) -> Result<kube::Client> {
        probe::client_for(&self.kubeconfig, None).await
    }

    /// Shell exports for `. DIR/env`.
    pub fn env_file(&self) -> String {
        let mut out = format!(
            "# Written by `ferry lab up`; source it: . {dir}/env\n\
             export FERRY_LAB_DIR={dir}\nexport KUBECONFIG={kc}\nexport PATH={tools}:\"$PATH\"\n",
            dir = shell_quote(&self.dir),
            kc = shell_quote(&self.kubeconfig),
            tools = shell_quote(&self.tools),
        );
        if let Some(v) = &self.vcsim {
            out.push_str(&format!(
                "export VCSIM_URL={}\nexport VCSIM_USERNAME={}\nexport VCSIM_PASSWORD_FILE={}\n\
                 export VCSIM_CA_FILE={}\n",
                v.url,
                v.username,
                shell_quote(&v.password_file),
                shell_quote(&v.ca_file)
            ));
        }
        if let Some(s) = &self.staging {
            out.push_str(&format!(
                "export FERRY_STAGING_ENDPOINT={}\nexport FERRY_STAGING_CREDENTIALS_DIR={}\n",
                s.endpoint,
                shell_quote(&s.credentials_dir)
            ));
        }
        out
    }
}

fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// How `up` went.
pub enum UpOutcome {
    Started(LabState),
    AlreadyRunning(LabState),
}

impl UpOutcome {
    pub fn state(&self) -> &LabState {
        match self {
            UpOutcome::Started(s) | UpOutcome::AlreadyRunning(s) => s,
        }
    }
    pub fn into_state(self) -> LabState {
        match self {
            UpOutcome::Started(s) | UpOutcome::AlreadyRunning(s) => s,
        }
    }
}

/// Starts the lab in `options.dir`, unless it already runs there.
pub async fn up(options: &LabOptions) -> Result<UpOutcome> {
    std::fs::create_dir_all(&options.dir)?;
    let dir = options.dir.canonicalize()?;
    if let Some(existing) = LabState::load(&dir)? {
        if existing.all_alive() {
            if existing.real_node.is_some() != options.real_node.is_some() {
                let runs = if existing.real_node.is_some() {
                    "a real node"
                } else {
                    "the node agent"
                };
                bail!(
                    "the lab in {} already runs with {runs}; stop it first (`ferry lab down --dir {}`) to change its node",
                    dir.display(),
                    dir.display()
                );
            }
            return Ok(UpOutcome::AlreadyRunning(existing));
        }
        // A half-dead lab is stopped whole and started afresh.
        stop_all(&existing)?;
    }
    let mut state = LabState::empty(&dir, &options.tools);
    match start_all(&mut state, options).await {
        Ok(()) => {
            std::fs::write(dir.join("env"), state.env_file())?;
            Ok(UpOutcome::Started(state))
        }
        Err(e) => {
            if let Err(stop_error) = stop_all(&state) {
                tracing::warn!("cleaning up after a failed start: {stop_error:#}");
            }
            Err(e)
        }
    }
}

async fn start_all(state: &mut LabState, options: &LabOptions) -> Result<()> {
    let lifetime = options.lifetime;
    let dir = state.dir.clone();
    // Before anything starts: a machine that cannot host a real node is refused with nothing changed.
    if let Some(node_tools) = &options.real_node {
        crate::real_node::prepare(state, node_tools)?;
    }
    let pki = Pki::open_or_create(&dir.join("pki"))?;
    let ctx = components::LabFiles::prepare(&dir, &state.tools, &pki, options.real_node.is_some())?;

    let etcd = start_component(state, lifetime, |ports| ctx.etcd(ports)).await?;
    let api = start_component(state, lifetime, |ports| ctx.kube_apiserver(ports, &etcd)).await?;
    state.api_url = api.url.clone().unwrap_or_default();
    crds::install(&probe::client_for(&state.kubeconfig, None).await?).await?;
    start_component(state, lifetime, |ports| ctx.kube_controller_manager(ports)).await?;
    if options.real_node.is_some() {
        // The image holds the binary users run, not this lab's: built without the lab and vSphere provisioning.
        let shipped = match options.standins {
            Some(_) => Some(crate::real_node::image::shipped_binary()?),
            None => None,
        };
        crate::real_node::start(state, lifetime, &ctx, shipped.as_deref()).await?;
    }
    // Before anything writes a VM: from here on the API server admits what virt-api admits.
    start_component(state, lifetime, |ports| Ok(ctx.kubevirt_admission(ports))).await?;
    start_component(state, lifetime, |ports| Ok(ctx.cdi_admission(ports))).await?;
    // A real node runs CDI's own controller and importer, which the lab's provisioner gives volumes.
    let real_cdi = options.real_node.is_some() && options.standins.is_some();
    if real_cdi && let Some(node) = state.real_node.clone() {
        crate::real_node::cdi::images(&node)?;
        let client = probe::client_for(&state.kubeconfig, None).await?;
        crate::real_node::cdi::install(state, &node, &client).await?;
        if options.real_kubevirt {
            crate::real_node::kubevirt::images(&node)?;
            crate::real_node::kubevirt::install(state, &node, &client).await?;
        }
    }
    let vcsim = start_component(state, lifetime, |_| {
        let mut vcsim = ctx.vcsim(options.vcsim_vms);
        vcsim.spec.args.extend(options.vcsim_realism.args());
        Ok(vcsim)
    })
    .await?;
    let endpoint = crate::vsphere::vcsim::endpoint(&dir, vcsim.url)?;
    state.ports.push(endpoint.port()?);
    if options.demo_vms {
        crate::vsphere::demo::seed_demo_vms(&endpoint, &dir)
            .await
            .context("seeding the demo VMs")?;
        crate::vsphere::linux_vms::seed_lab_linux_vms(&endpoint, &dir).await?;
    }
    state.vcsim = Some(endpoint);
    state.save()?;
    start_component(state, lifetime, |ports| {
        ctx.minio(ports, options.compress_staging)
    })
    .await?;
    let minio_port = *state
        .ports
        .iter()
        .rev()
        .nth(1)
        .context("minio has no port")?;
    let ca = Pki::ca_cert_path(&dir.join("pki"));
    state.staging = Some(crate::minio::endpoint(
        &dir.join("staging"),
        ctx.serving_host(),
        minio_port,
        Some(&ca),
    ));
    state.save()?;
    if let Some(ferry) = &options.standins {
        for name in STANDINS {
            if (name == "node" || name == "cdi") && options.real_node.is_some() {
                continue;
            }
            if name == "kubevirt" && real_cdi && options.real_kubevirt {
                continue;
            }
            let extra = if name == "kubevirt" && !options.boot_guests {
                vec!["--no-boot".to_string()]
            } else {
                vec![]
            };
            start_component(state, lifetime, |_| {
                Ok(standin(ferry, &dir, name, extra.clone()))
            })
            .await?;
        }
        if real_cdi {
            start_component(state, lifetime, |_| {
                Ok(standin(ferry, &dir, "provisioner", vec![]))
            })
            .await?;
        }
        if options.controller {
            controller_process::apply_rbac(&state.tools, &state.kubeconfig)?;
            let kubeconfig = controller_process::kubeconfig(&dir, &state.api_url)?;
            let ready = start_component(state, lifetime, |ports| {
                Ok(controller_process::component(
                    ferry,
                    &kubeconfig,
                    ports.first(),
                    "ferry-lab",
                ))
            })
            .await?;
            state.controller = ready.url;
            state.save()?;
        }
    }
    Ok(())
}

fn standin(ferry: &Path, dir: &Path, name: &str, extra: Vec<String>) -> components::Component {
    components::Component {
        spec: process::ProcessSpec {
            name: format!("standin-{name}"),
            program: ferry.to_path_buf(),
            args: vec![
                "lab".into(),
                "standin".into(),
                name.into(),
                format!("--dir={}", dir.display()),
            ]
            .into_iter()
            .chain(extra)
            .collect(),
            env: vec![("RUST_LOG".into(), "info,kube=warn".into())],
        },
        ports: vec![],
        probe: probe::Probe::LogLine {
            prefix: STANDIN_READY.into(),
        },
    }
}

/// Starts one component and waits until its probe passes, retrying on fresh ports if it dies on start.
pub(crate) async fn start_component(
    state: &mut LabState,
    lifetime: Lifetime,
    make: impl Fn(&Ports) -> Result<Component>,
) -> Result<probe::Ready> {
    let mut last_error = None;
    for _ in 0..START_ATTEMPTS {
        let ports = Ports::allocate()?;
        let component = make(&ports)?;
        let log = state.dir.join(format!("{}.log", component.spec.name));
        let record = process::start(&component.spec, &log, lifetime)?;
        state.processes.push(record.clone());
        state.ports.extend(component.ports.iter().copied());
        state.save()?;
        match probe::wait_ready(&component.probe, &record, &state.dir).await {
            Ok(ready) => return Ok(ready),
            Err(e) => {
                tracing::warn!("{} did not become ready: {e:#}", component.spec.name);
                process::stop(&record, STOP_GRACE)?;
                state.processes.retain(|p| p != &record);
                state.ports.retain(|p| !component.ports.contains(p));
                state.save()?;
                last_error = Some(e);
            }
        }
    }
    Err(last_error.expect("at least one attempt"))
}

/// What `down` found and did.
#[derive(Debug)]
pub struct DownReport {
    pub stopped: Vec<String>,
    pub ports: Vec<u16>,
}

/// Stops every process of the lab in `dir`, newest first, and checks that its ports are closed.
pub fn down(dir: &Path) -> Result<DownReport> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("no lab at {}", dir.display()))?;
    let Some(state) = LabState::load(&dir)? else {
        return Ok(DownReport {
            stopped: vec![],
            ports: vec![],
        });
    };
    let stopped = stop_all(&state)?;
    std::fs::remove_file(dir.join(STATE_FILE))?;
    let _ = std::fs::remove_file(dir.join("env"));
    Ok(DownReport {
        stopped,
        ports: state.ports,
    })
}

fn stop_all(state: &LabState) -> Result<Vec<String>> {
    if let Some(node) = &state.real_node {
        crate::real_node::stop_pods(state, node);
    }
    let stopped = stop_processes(state);
    // The machine is restored even when a process or port would not go: a real node's changes must not wait.
    let restored = match &state.real_node {
        Some(node) => crate::real_node::release(state, node),
        None => Ok(()),
    };
    let stopped = stopped?;
    restored?;
    Ok(stopped)
}

fn stop_processes(state: &LabState) -> Result<Vec<String>> {
    let mut stopped = Vec::new();
    for record in state.processes.iter().rev() {
        if record.is_alive(&state.dir) {
            process::stop(record, STOP_GRACE)?;
            stopped.push(record.name.clone());
        }
    }
    for port in &state.ports {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !process::port_is_closed(*port) {
            if std::time::Instant::now() > deadline {
                bail!("port {port} is still open after the lab stopped");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(stopped)
}
