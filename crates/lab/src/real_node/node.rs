//! Starting a real node as lab components (containerd, the kubelet, kube-scheduler) and stopping it so that the
//! machine is as it was: the pods are deleted while the kubelet can still tear down their sandboxes, then
//! `host::restore` sweeps whatever outlived it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::host::{self, HostBefore};
use crate::control_plane::components::{Component, LabFiles, Ports};
use crate::control_plane::pki::CertFiles;
use crate::control_plane::probe::Probe;
use crate::control_plane::process::{Lifetime, ProcessSpec};
use crate::lab::LabState;

/// The kubelet's health port: fixed, like its API port 10250 (one real node per machine).
const KUBELET_HEALTHZ_PORT: u16 = 10248;
/// How long the kubelet gets to tear down the pods' sandboxes before the sweep kills what is left.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(45);
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A real node of a lab, as recorded in its state file: enough for `down` to stop it and restore the machine,
/// even after `ferry lab up` crashed half-way.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RealNode {
    /// The node's tools (`hack/tools.sh --node`).
    pub tools: PathBuf,
    /// `LAB/node`: containerd's root and state, the kubelet's root, configs and logs.
    pub dir: PathBuf,
    /// The Node's name: the machine's hostname, which the API server resolves to reach the kubelet.
    pub name: String,
    pub before: HostBefore,
}

impl RealNode {
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    fn ctr(&self, args: &[&str]) -> Result<String> {
        super::run(
            Command::new(self.tools.join("ctr"))
                .arg(format!("--address={}", self.socket().display()))
                .args(["--namespace", "k8s.io"])
                .args(args),
            &format!("ctr {}", args.join(" ")),
            "",
        )
    }

    /// Imports an OCI archive into containerd's Kubernetes namespace, where the kubelet finds its images.
    pub fn import_image(&self, archive: &Path) -> Result<()> {
        self.ctr(&["image", "import", &archive.display().to_string()])
            .map(drop)
            .with_context(|| format!("importing {}", archive.display()))
    }

    /// Gives an imported image a second name.
    pub fn tag_image(&self, source: &str, name: &str) -> Result<()> {
        self.ctr(&["image", "tag", "--force", source, name])
            .map(drop)
    }
}

fn hostname() -> Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    Ok(name.trim().to_lowercase())
}

/// Readies the machine for the real node of the lab in `state`, before the control plane starts (the API server
/// listens on the bridge): refuses a machine that cannot host it, records the machine (and saves the record) before
/// anything on it changes, and creates the bridge.
pub fn prepare(state: &mut LabState, tools: &Path) -> Result<()> {
    if let Some(why) = super::host_refusal(&state.dir) {
        bail!("{why}");
    }
    super::claim(Path::new(super::LOCK_FILE), &state.dir)?;
    state.real_node = Some(RealNode {
        tools: tools.to_path_buf(),
        dir: state.dir.join("node"),
        name: hostname()?,
        before: host::record_before()?,
    });
    state.save()?;
    host::create_bridge()
}

/// Starts the node [`prepare`]d: containerd (then the pause image and, with `ferry`, the `ferry` image: the
/// `Dockerfile` built by buildah with that binary), the kubelet until its Node is Ready, and kube-scheduler.
pub async fn start(
    state: &mut LabState,
    lifetime: Lifetime,
    lab: &LabFiles,
    ferry: Option<&Path>,
) -> Result<()> {
    let node = state
        .real_node
        .clone()
        .context("the real node was not prepared")?;
    write_configs(&node, lab.ca())?;
    host::share_mounts()?;
    crate::lab::start_component(state, lifetime, |_| Ok(containerd(&node))).await?;
    let pause = super::build_pause_image(&node.dir.join("images"))?;
    node.import_image(&pause)?;
    if let Some(ferry) = ferry {
        let started = Instant::now();
        let archive = super::image::build_ferry_image(
            &super::image::default_cache()?,
            ferry,
            super::image::FERRY_IMAGE,
        )?;
        node.import_image(&archive)?;
        let reference = super::oci::full_reference(super::image::FERRY_IMAGE);
        if !node
            .ctr(&["image", "ls", "--quiet"])?
            .lines()
            .any(|l| l == reference)
        {
            bail!(
                "{} did not name the image {reference} in containerd",
                archive.display()
            );
        }
        tracing::info!(
            "image {} (the Dockerfile's, built by buildah) ready in containerd in {:.1}s",
            super::image::FERRY_IMAGE,
            started.elapsed().as_secs_f64()
        );
    }

    let kubeconfig = state.kubeconfig.clone();
    crate::lab::start_component(state, lifetime, |_| Ok(kubelet(&node, &kubeconfig))).await?;
    wait_node_ready(&kubeconfig, &node.name).await?;
    crate::lab::start_component(state, lifetime, |ports| {
        Ok(scheduler(&node, &kubeconfig, lab.serving(), ports))
    })
    .await?;
    Ok(())
}

fn write_configs(node: &RealNode, ca: &Path) -> Result<()> {
    let containerd_dir = node.dir.join("containerd");
    let cni_conf = node.dir.join("cni");
    for dir in [&containerd_dir, &cni_conf, &containerd_dir.join("conf.d")] {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        node.dir.join("containerd.toml"),
        super::containerd_config(&containerd_dir, &node.tools.join("cni"), &cni_conf),
    )?;
    std::fs::write(
        cni_conf.join("10-ferry-lab.conflist"),
        serde_json::to_vec_pretty(&super::cni_conflist(&node.dir.join("ipam")))?,
    )?;
    std::fs::write(
        node.dir.join("kubelet.json"),
        serde_json::to_vec_pretty(&super::kubelet_config(&node.dir, ca, &node.socket()))?,
    )?;
    Ok(())
}

fn containerd(node: &RealNode) -> Component {
    let path = std::env::var("PATH").unwrap_or_default();
    Component {
        spec: ProcessSpec {
            name: "containerd".into(),
            // As PID 1 of a PID namespace of its own (with its own /proc, so a mount namespace too), so that pods
            // sharing the node's PIDs see containerd as the node's init: virt-handler enters the node's mount
            // namespace through /proc/1/ns/mnt, and this machine's PID 1 cannot be inspected. The mount namespace
            // keeps the machine's propagation, so the shared mounts (`host::SHARED_DIRS`) stay peers. When
            // containerd ends the kernel ends every process in its namespace; `--kill-child` ends containerd when
            // the lab stops `unshare`.
            program: "unshare".into(),
            args: vec![
                "--pid".into(),
                "--fork".into(),
                "--kill-child".into(),
                "--mount-proc".into(),
                "--propagation=unchanged".into(),
                node.tools.join("containerd").display().to_string(),
                format!("--config={}", node.dir.join("containerd.toml").display()),
            ],
            // containerd finds its shim on PATH.
            env: vec![("PATH".into(), format!("{}:{path}", node.tools.display()))],
        },
        ports: vec![],
        probe: Probe::UnixSocket {
            path: node.socket(),
        },
    }
}

fn kubelet(node: &RealNode, kubeconfig: &Path) -> Component {
    Component {
        spec: ProcessSpec {
            name: "kubelet".into(),
            program: node.tools.join("kubelet"),
            args: vec![
                format!("--config={}", node.dir.join("kubelet.json").display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                // KubeVirt hard-wires the kubelet's default root (virt-handler finds pods' volumes there, and
                // launcher sockets stay under the 108-byte limit); it is a fixed path `down` removes.
                format!("--root-dir={}", host::KUBELET_ROOT),
                format!("--cert-dir={}", node.dir.join("kubelet-pki").display()),
                "--v=1".into(),
            ],
            env: vec![],
        },
        ports: vec![],
        probe: Probe::HttpOk {
            port: KUBELET_HEALTHZ_PORT,
            path: "/healthz".into(),
        },
    }
}

fn scheduler(node: &RealNode, kubeconfig: &Path, serving: &CertFiles, ports: &Ports) -> Component {
    let port = ports.first();
    let path = kubeconfig.display();
    Component {
        spec: ProcessSpec {
            name: "kube-scheduler".into(),
            program: node.tools.join("kube-scheduler"),
            args: vec![
                format!("--kubeconfig={path}"),
                format!("--authentication-kubeconfig={path}"),
                format!("--authorization-kubeconfig={path}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--tls-cert-file={}", serving.cert.display()),
                format!("--tls-private-key-file={}", serving.key.display()),
                "--v=1".into(),
            ],
            env: vec![],
        },
        ports: vec![port],
        probe: Probe::Https {
            url: format!("https://127.0.0.1:{port}"),
            path: "/healthz".into(),
            kubeconfig: kubeconfig.to_path_buf(),
        },
    }
}

/// Waits until the Node is Ready, and schedulable: a lab started again in its directory finds the Node as its
/// `down` left it, cordoned ([`stop_pods`]), and nothing would be scheduled on it.
async fn wait_node_ready(kubeconfig: &Path, name: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: kube::Api<Node> =
        kube::Api::all(crate::control_plane::probe::client_for(kubeconfig, None).await?);
    let deadline = Instant::now() + NODE_READY_TIMEOUT;
    loop {
        let node = nodes.get_opt(name).await?;
        let ready = node.as_ref().is_some_and(|node| {
            node.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            let cordoned = node
                .and_then(|n| n.spec)
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            if cordoned {
                let uncordon = serde_json::json!({"spec": {"unschedulable": false}});
                nodes
                    .patch(
                        name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&uncordon),
                    )
                    .await?;
                tracing::info!("Node {name} uncordoned: the lab's last `down` cordoned it");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("Node {name} not Ready after {NODE_READY_TIMEOUT:?}; see the kubelet's log");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Cordons the node and deletes its pods while the kubelet and containerd still run, so the kubelet stops each
/// sandbox (its network torn down through CNI); waits until containerd runs no task, or [`DRAIN_TIMEOUT`].
/// Best effort: what it leaves, `host::restore` kills.
pub fn stop_pods(state: &LabState, node: &RealNode) {
    let kubectl = |args: &[&str]| {
        Command::new(state.tools.join("kubectl"))
            .arg(format!("--kubeconfig={}", state.kubeconfig.display()))
            // The API server may be gone already (a crashed lab): each call gives up, the sweep follows.
            .arg("--request-timeout=10s")
            .args(args)
            .output()
    };
    let _ = kubectl(&["cordon", &node.name]);
    let selector = format!("spec.nodeName={}", node.name);
    let _ = kubectl(&[
        "delete",
        "pods",
        "--all-namespaces",
        "--field-selector",
        &selector,
        "--grace-period=5",
        "--wait=false",
    ]);
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while Instant::now() < deadline {
        match node.ctr(&["--timeout=5s", "tasks", "list", "--quiet"]) {
            Ok(tasks) if tasks.trim().is_empty() => return,
            Ok(_) => std::thread::sleep(Duration::from_millis(500)),
            Err(_) => return,
        }
    }
    tracing::warn!("the real node's pods did not stop within {DRAIN_TIMEOUT:?}; killing them");
}

/// Restores the machine once the node's processes are stopped, and gives up the machine's claim; keeps the claim
/// while something is left, so no other node starts on a machine still changed. A lab whose claim another live
/// lab holds (its `up` failed before it claimed, or it was taken over) touches nothing.
pub fn release(state: &LabState, node: &RealNode) -> Result<()> {
    let lock = Path::new(super::LOCK_FILE);
    if !super::claim::may_touch(lock, &state.dir) {
        tracing::warn!(
            "the machine's real node is held by another lab; leaving it as it is ({})",
            lock.display()
        );
        return Ok(());
    }
    let leftovers = host::restore(
        &node.dir,
        &node.tools.join("containerd-shim-runc-v2"),
        &node.before,
    );
    if leftovers.is_empty() {
        super::release_claim(lock, &state.dir);
    } else {
        bail!(
            "the real node left the machine changed: {}; run `ferry lab down --dir {}` again",
            leftovers.join("; "),
            state.dir.display()
        );
    }
    Ok(())
}
