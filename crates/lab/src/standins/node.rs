//! The node agent: the lab's kubelet. It registers Node `lab-node`, binds unscheduled pods that fit it, and runs
//! each pod's container as a local process isolated with bubblewrap: images named `ferry` run the local `ferry`
//! binary, Secret/ConfigMap/PVC/emptyDir/hostPath volumes are mounted at their paths, and pod status (phases,
//! container states, termination message) is written as a kubelet does, so the real job controller counts it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Binding, ConfigMap, Container, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    Pod, PodSpec, Secret,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::kubevirt::NODE;

const MANAGER: &str = "lab-node-agent";
/// Paths that stay read-only system directories inside the sandbox; volumes cannot be mounted below them. The
/// kernel in `/boot` and the package database in `/var/lib` are what libguestfs builds its appliance from, and
/// libosinfo's `usb.ids` links there too (`/var/lib/usbutils`), as in the image.
const SYSTEM_DIRS: [&str; 8] = [
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/var/lib",
];

pub struct NodeAgentConfig {
    /// The binary that images named `ferry` run.
    pub ferry_binary: PathBuf,
    pub state_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Local(String),
}

/// What the node agent's reconciles share.
struct NodeAgent {
    client: Client,
    config: NodeAgentConfig,
    running: super::Tasks,
    /// A container slot per pod the node runs at once; the rest wait, Pending, as on a full node.
    slots: tokio::sync::Semaphore,
}

/// Pods the node runs at once: the kubelet's default `--max-pods`.
pub const MAX_PODS: usize = 110;

pub async fn run(
    client: Client,
    namespace: Option<&str>,
    config: NodeAgentConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.state_dir)?;
    register_node(&client).await?;
    let pods = super::scoped::<Pod>(&client, namespace);
    let ctx = Arc::new(NodeAgent {
        client,
        config,
        running: Mutex::default(),
        slots: tokio::sync::Semaphore::new(MAX_PODS),
    });
    let controller = Controller::new(pods, watcher::Config::default());
    super::run_controller("node agent", controller, shutdown, reconcile, ctx.clone()).await;
    super::abort_all(&ctx.running);
    Ok(())
}

fn node_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), NODE.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
    ])
}

async fn register_node(client: &Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": node_labels()}});
    nodes
        .patch(
            NODE,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&node),
        )
        .await?;
    let now = Timestamp::now().to_string();
    let resources = json!({"cpu": "2", "memory": "16Gi", "pods": "110"});
    let status = json!({"apiVersion": "v1", "kind": "Node", "status": {
        "capacity": resources, "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "LabNodeAgentReady",
                        "message": "the lab's node agent runs pods as local processes",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }});
    nodes
        .patch_status(
            NODE,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await?;
    Ok(())
}

fn pod_dir(ctx: &NodeAgent, pod: &Pod) -> PathBuf {
    ctx.config.state_dir.join(pod.uid().unwrap_or_default())
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<NodeAgent>) -> Result<Action, Error> {
    let ns = pod.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    match spec.node_name.as_deref() {
        None | Some("") => {
            let fits = spec
                .node_selector
                .clone()
                .unwrap_or_default()
                .iter()
                .all(|(k, v)| node_labels().get(k) == Some(v));
            if fits && !volumes_bind_first(&ctx.client, &ns, &spec).await? {
                // As the scheduler's volume binding: the pod waits, Pending, while its claims bind.
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            if fits {
                let binding = Binding {
                    metadata: kube::api::ObjectMeta {
                        name: pod.metadata.name.clone(),
                        ..Default::default()
                    },
                    target: ObjectReference {
                        kind: Some("Node".into()),
                        name: Some(NODE.into()),
                        ..Default::default()
                    },
                };
                pods.create_subresource::<Binding, Binding>(
                    "binding",
                    &pod.name_any(),
                    &PostParams::default(),
                    &binding,
                )
                .await?;
            }
            return Ok(Action::await_change());
        }
        Some(NODE) => {}
        Some(_) => return Ok(Action::await_change()),
    }
    if pod.metadata.deletion_timestamp.is_some() {
        // A kubelet confirms a graceful delete once its containers stopped.
        if let Some(task) = ctx
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid)
        {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(pod_dir(&ctx, &pod));
        let force = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match pods.delete(&pod.name_any(), &force).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    if matches!(phase.as_str(), "Succeeded" | "Failed") {
        return Ok(Action::await_change());
    }
    let mut running = ctx.running.lock().unwrap_or_else(|p| p.into_inner());
    if !running.contains_key(&uid) {
        let (pod, ctx2) = ((*pod).clone(), ctx.clone());
        running.insert(uid, tokio::spawn(async move { run_pod(pod, ctx2).await }));
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Whether the pod's claims are ready for it to be bound to this node. A WaitForFirstConsumer claim not yet bound
/// gets this node as its selected node, as the scheduler writes it, and the pod waits until the claim binds.
/// Other claims are left as they are: a missing or unbound one fails the pod when it starts, as before.
async fn volumes_bind_first(client: &Client, ns: &str, spec: &PodSpec) -> Result<bool, Error> {
    use super::cdi::SELECTED_NODE;
    use k8s_openapi::api::storage::v1::StorageClass;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let mut ready = true;
    for volume in spec.volumes.iter().flatten() {
        let Some(source) = &volume.persistent_volume_claim else {
            continue;
        };
        let Some(claim) = claims.get_opt(&source.claim_name).await? else {
            continue;
        };
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let class = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone());
        if bound || class.is_none() {
            continue;
        }
        let mode = Api::<StorageClass>::all(client.clone())
            .get_opt(class.as_deref().unwrap_or_default())
            .await?
            .and_then(|c| c.volume_binding_mode);
        if mode.as_deref() != Some("WaitForFirstConsumer") {
            continue;
        }
        ready = false;
        if !claim.annotations().contains_key(SELECTED_NODE) {
            let patch = json!({"metadata": {"annotations": {SELECTED_NODE: NODE}}});
            claims
                .patch(
                    &source.claim_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
    }
    Ok(ready)
}

/// Runs the pod's container to its end and records each state, as a kubelet with `restartPolicy: Never` does.
async fn run_pod(pod: Pod, ctx: Arc<NodeAgent>) {
    let Ok(_slot) = ctx.slots.acquire().await else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    let started = Timestamp::now().to_string();
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let injected = super::faults::take(
        &ctx.client,
        &ns,
        super::faults::FAIL_PODS,
        &name,
        pod.labels(),
    )
    .await;
    let killed = !matches!(injected, Ok(true))
        && matches!(
            super::faults::take(
                &ctx.client,
                &ns,
                super::faults::KILL_PODS,
                &name,
                pod.labels()
            )
            .await,
            Ok(true)
        );
    let outcome = if matches!(injected, Ok(true)) {
        Outcome {
            exit_code: 1,
            reason: "Error".into(),
            message: "the lab's fault switch failed this pod".into(),
            started: started.clone(),
        }
    } else {
        run_container(&pod, &ctx, &pods, &started, killed).await
    };
    if let Err(e) = write_status(&pods, &pod, terminated_status(&pod, &outcome)).await {
        tracing::warn!(pod = %pod.name_any(), "recording the pod's end: {e}");
    }
}

/// How long a pod the fault switch kills runs before its SIGKILL: long enough to be midway.
const KILLED_AFTER: Duration = Duration::from_millis(300);

/// Runs the container; `killed` SIGKILLs it after [`KILLED_AFTER`] (exit 137, as a kubelet reports it), or
/// discards its result if it ended sooner.
async fn run_container(
    pod: &Pod,
    ctx: &NodeAgent,
    pods: &Api<Pod>,
    started: &str,
    killed: bool,
) -> Outcome {
    let started = started.to_string();
    match prepare(pod, ctx).await {
        Err(e) => Outcome {
            exit_code: 128,
            reason: "CreateContainerConfigError".into(),
            message: e,
            started: started.clone(),
        },
        Ok(mut command) => {
            let _ = write_status(pods, pod, running_status(pod, &started)).await;
            let deadline = pod
                .spec
                .as_ref()
                .and_then(|s| s.active_deadline_seconds)
                .map(|s| Duration::from_secs(s.max(0) as u64));
            let waited = match deadline {
                // Killed midway, or, when it ends sooner, right before it could report: either way the
                // kubelet sees exit 137 and no result, so the fault always strikes.
                _ if killed => {
                    let _ = tokio::time::timeout(KILLED_AFTER, command.status()).await;
                    tracing::info!(pod = %pod.name_any(), "killed by the lab's fault switch");
                    return Outcome {
                        exit_code: 137,
                        reason: "Error".into(),
                        message: String::new(),
                        started: started.clone(),
                    };
                }
                Some(limit) => tokio::time::timeout(limit, command.status()).await.ok(),
                None => Some(command.status().await),
            };
            let message = std::fs::read(pod_dir(ctx, pod).join("termination-log"))
                .map(|m| String::from_utf8_lossy(&m[..m.len().min(4096)]).to_string())
                .unwrap_or_default();
            match waited {
                None => Outcome {
                    exit_code: 137,
                    reason: "DeadlineExceeded".into(),
                    message,
                    started: started.clone(),
                },
                Some(Err(e)) => Outcome {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: e.to_string(),
                    started: started.clone(),
                },
                Some(Ok(status)) => {
                    let code = status.code().unwrap_or(137);
                    let reason = if code == 0 { "Completed" } else { "Error" };
                    Outcome {
                        exit_code: code,
                        reason: reason.into(),
                        message,
                        started: started.clone(),
                    }
                }
            }
        }
    }
}

struct Outcome {
    exit_code: i32,
    reason: String,
    message: String,
    started: String,
}

fn container(pod: &Pod) -> Option<&Container> {
    pod.spec.as_ref().and_then(|s| s.containers.first())
}

fn running_status(pod: &Pod, started: &str) -> serde_json::Value {
    let c = container(pod).cloned().unwrap_or_default();
    json!({"phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": started,
        "conditions": conditions(true),
        "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": true, "restartCount": 0,
                               "started": true, "state": {"running": {"startedAt": started}}}]})
}

fn terminated_status(pod: &Pod, o: &Outcome) -> serde_json::Value {
    let c = container(pod).cloned().unwrap_or_default();
    let phase = if o.exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    };
    let mut status = json!({"phase": phase, "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": o.started,
        "conditions": conditions(false),
        "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": false, "restartCount": 0,
            "started": false, "state": {"terminated": {"exitCode": o.exit_code, "reason": o.reason, "message": o.message,
            "startedAt": o.started, "finishedAt": Timestamp::now().to_string()}}}]});
    if o.reason == "DeadlineExceeded" {
        status["reason"] = json!("DeadlineExceeded");
        status["message"] = json!("the pod ran longer than its activeDeadlineSeconds");
    }
    status
}

fn conditions(ready: bool) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    let c = |t: &str, s: bool| json!({"type": t, "status": if s { "True" } else { "False" }, "lastTransitionTime": now});
    json!([
        c("PodScheduled", true),
        c("Initialized", true),
        c("ContainersReady", ready),
        c("Ready", ready)
    ])
}

async fn write_status(
    pods: &Api<Pod>,
    pod: &Pod,
    status: serde_json::Value,
) -> Result<(), kube::Error> {
    let patch = json!({"status": status});
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

/// The sandboxed command for the pod's one container, with its volumes materialized.
async fn prepare(pod: &Pod, ctx: &NodeAgent) -> Result<tokio::process::Command, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.containers.len() != 1 || spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(
            "the lab's node runs pods with exactly one container and no init containers".into(),
        );
    }
    let container = &spec.containers[0];
    let image = container.image.clone().unwrap_or_default();
    let repository = image
        .split(['@', ':'])
        .next()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap_or_default();
    if repository != "ferry" {
        return Err(format!(
            "image {image:?} is not known to the lab node: only images named ferry run (as the local ferry binary)"
        ));
    }
    let mut args: Vec<String> = container
        .command
        .clone()
        .unwrap_or_default()
        .into_iter()
        .skip(1)
        .collect();
    args.extend(container.args.clone().unwrap_or_default());

    let dir = pod_dir(ctx, pod);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let termination = dir.join("termination-log");
    std::fs::write(&termination, b"").map_err(|e| e.to_string())?;
    let termination_path = container
        .termination_message_path
        .clone()
        .unwrap_or_else(|| "/dev/termination-log".into());

    let mut sandbox: Vec<String> = vec!["--tmpfs".into(), "/".into()];
    for system in SYSTEM_DIRS.iter().filter(|d| Path::new(d).exists()) {
        sandbox.extend(["--ro-bind".into(), system.to_string(), system.to_string()]);
    }
    sandbox.extend(["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"].map(String::from));
    sandbox.extend([
        "--ro-bind".into(),
        ctx.config.ferry_binary.display().to_string(),
        "/ferry/bin/ferry".into(),
    ]);
    let volumes = materialize_volumes(pod, ctx, &dir).await?;
    for mount in container.volume_mounts.clone().unwrap_or_default() {
        if SYSTEM_DIRS.iter().any(|d| mount.mount_path.starts_with(d)) {
            return Err(format!(
                "mountPath {} is inside a system directory of the lab's sandbox",
                mount.mount_path
            ));
        }
        let (source, read_only) = volumes
            .get(&mount.name)
            .ok_or_else(|| format!("volume {} is not defined", mount.name))?;
        let ro = *read_only || mount.read_only.unwrap_or(false);
        sandbox.extend([
            if ro { "--ro-bind" } else { "--bind" }.into(),
            source.display().to_string(),
            mount.mount_path.clone(),
        ]);
    }
    // A Block volume's PV is a file standing for the device; it appears at the device path (after `--dev`).
    for device in container.volume_devices.clone().unwrap_or_default() {
        let (source, read_only) = volumes
            .get(&device.name)
            .ok_or_else(|| format!("volume {} is not defined", device.name))?;
        if !source.is_file() {
            return Err(format!(
                "volume {} is used as a device, but its volume is not a Block volume (the lab's devices are files)",
                device.name
            ));
        }
        sandbox.extend([
            if *read_only { "--ro-bind" } else { "--bind" }.into(),
            source.display().to_string(),
            device.device_path.clone(),
        ]);
    }
    sandbox.extend([
        "--bind".into(),
        termination.display().to_string(),
        termination_path,
    ]);
    sandbox.extend(
        [
            "--unshare-pid",
            "--unshare-ipc",
            "--die-with-parent",
            "--new-session",
            "--",
        ]
        .map(String::from),
    );
    sandbox.push("/ferry/bin/ferry".into());
    sandbox.extend(args);

    let mut command = tokio::process::Command::new("bwrap");
    command
        .args(&sandbox)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .kill_on_drop(true);
    for (name, value) in environment(pod, container, ctx).await? {
        command.env(name, value);
    }
    let log = std::fs::File::create(dir.join("container.log")).map_err(|e| e.to_string())?;
    command
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    Ok(command)
}

async fn environment(
    pod: &Pod,
    container: &Container,
    ctx: &NodeAgent,
) -> Result<Vec<(String, String)>, String> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = Vec::new();
    for var in container.env.clone().unwrap_or_default() {
        let value = match (var.value, var.value_from) {
            (Some(v), _) => v,
            (None, Some(from)) => {
                if let Some(key) = from.secret_key_ref {
                    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
                        .get(&key.name)
                        .await
                        .map_err(|e| e.to_string())?;
                    let bytes = secret
                        .data
                        .unwrap_or_default()
                        .remove(&key.key)
                        .ok_or_else(|| format!("Secret {} has no key {}", key.name, key.key))?;
                    String::from_utf8_lossy(&bytes.0).to_string()
                } else if let Some(field) = from.field_ref {
                    match field.field_path.as_str() {
                        "metadata.name" => pod.name_any(),
                        "metadata.namespace" => ns.clone(),
                        "metadata.uid" => pod.uid().unwrap_or_default(),
                        other => {
                            return Err(format!(
                                "fieldRef {other} is not supported by the lab node"
                            ));
                        }
                    }
                } else {
                    return Err(format!(
                        "env {} uses a source the lab node does not support",
                        var.name
                    ));
                }
            }
            (None, None) => String::new(),
        };
        out.push((var.name, value));
    }
    Ok(out)
}

/// Each volume as a host path, and whether it must stay read-only.
async fn materialize_volumes(
    pod: &Pod,
    ctx: &NodeAgent,
    dir: &Path,
) -> Result<HashMap<String, (PathBuf, bool)>, String> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = HashMap::new();
    for volume in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
    {
        let target = dir.join("volumes").join(&volume.name);
        let entry = if let Some(secret) = volume.secret {
            let name = secret.secret_name.unwrap_or_default();
            let found = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
                .get(&name)
                .await
                .map_err(|e| format!("Secret {name}: {e}"))?;
            let files = found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            write_files(&target, files)?;
            (target, true)
        } else if let Some(config_map) = volume.config_map {
            let found = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
                .get(&config_map.name)
                .await
                .map_err(|e| format!("ConfigMap {}: {e}", config_map.name))?;
            let files = found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            write_files(&target, files)?;
            (target, true)
        } else if let Some(claim) = volume.persistent_volume_claim {
            let pvc = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns)
                .get(&claim.claim_name)
                .await
                .map_err(|e| e.to_string())?;
            let pv_name = pvc
                .spec
                .and_then(|s| s.volume_name)
                .ok_or_else(|| format!("PVC {} is not bound", claim.claim_name))?;
            let pv = Api::<PersistentVolume>::all(ctx.client.clone())
                .get(&pv_name)
                .await
                .map_err(|e| e.to_string())?;
            let path = pv
                .spec
                .and_then(|s| s.host_path)
                .map(|h| h.path)
                .ok_or_else(|| format!("PV {pv_name} is not a hostPath volume"))?;
            (PathBuf::from(path), claim.read_only.unwrap_or(false))
        } else if let Some(host) = volume.host_path {
            (PathBuf::from(host.path), false)
        } else if volume.empty_dir.is_some() {
            std::fs::create_dir_all(&target).map_err(|e| e.to_string())?;
            (target, false)
        } else {
            return Err(format!(
                "volume {} has a type the lab node does not support",
                volume.name
            ));
        };
        out.insert(volume.name, entry);
    }
    Ok(out)
}

fn write_files(dir: &Path, files: BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    for (name, bytes) in files {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o400)
            .open(dir.join(&name))
            .map_err(|e| e.to_string())?;
        file.write_all(&bytes).map_err(|e| e.to_string())?;
    }
    Ok(())
}
