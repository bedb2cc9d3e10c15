//! The conformance scenarios and what is observed of them: a DataVolume's walk of phases, its status where it
//! waits and where it ends, the claims made for it, and the `disk.img` it leaves. Timestamps, uids and the
//! namespace's name are left out, so two CDIs can be compared.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_api::foreign::dv_resource;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DynamicObject, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Where the scenarios' sources are and the Secrets and ConfigMap they name.
pub struct Sources {
    /// `https://host:port/bucket/prefix`: the staged `source.raw` and `source.qcow2` are below it.
    pub base_url: String,
    /// The raw bytes both sources hold.
    pub raw: PathBuf,
}

pub const GOOD_SECRET: &str = "s3-credentials";
pub const WRONG_SECRET: &str = "s3-wrong-credentials";
pub const CA_CONFIG_MAP: &str = "s3-ca";
/// What each scenario asks for: small, so an import takes seconds under emulation.
pub const SIZE: &str = "64Mi";

#[derive(Clone, Copy, Debug)]
pub enum Scenario {
    BlankImmediate,
    BlankWaitForFirstConsumer,
    S3Raw,
    S3Qcow2,
    S3WrongCredentials,
    /// `spec.storage` without access modes, on a class whose provisioner CDI does not know.
    NoAccessModes,
    BlankBlock,
    S3RawBlock,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::BlankImmediate,
        Scenario::BlankWaitForFirstConsumer,
        Scenario::S3Raw,
        Scenario::S3Qcow2,
        Scenario::S3WrongCredentials,
        Scenario::NoAccessModes,
        Scenario::BlankBlock,
        Scenario::S3RawBlock,
    ];

    /// Also the DataVolume's name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::BlankImmediate => "blank-immediate",
            Scenario::BlankWaitForFirstConsumer => "blank-wffc",
            Scenario::S3Raw => "s3-raw",
            Scenario::S3Qcow2 => "s3-qcow2",
            Scenario::S3WrongCredentials => "s3-wrong-credentials",
            Scenario::NoAccessModes => "no-access-modes",
            Scenario::BlankBlock => "blank-block",
            Scenario::S3RawBlock => "s3-raw-block",
        }
    }

    fn data_volume(self, sources: &Sources) -> serde_json::Value {
        let s3 = |file: &str, secret: &str| {
            json!({"s3": {"url": format!("{}/{file}", sources.base_url), "secretRef": secret,
                          "certConfigMap": CA_CONFIG_MAP}})
        };
        let (source, class) = match self {
            Scenario::BlankImmediate | Scenario::NoAccessModes | Scenario::BlankBlock => {
                (json!({"blank": {}}), "lab-hostpath")
            }
            Scenario::BlankWaitForFirstConsumer => (json!({"blank": {}}), "lab-hostpath-wffc"),
            Scenario::S3Raw | Scenario::S3RawBlock => {
                (s3("source.raw", GOOD_SECRET), "lab-hostpath")
            }
            Scenario::S3Qcow2 => (s3("source.qcow2", GOOD_SECRET), "lab-hostpath"),
            Scenario::S3WrongCredentials => (s3("source.raw", WRONG_SECRET), "lab-hostpath"),
        };
        let mut storage =
            json!({"storageClassName": class, "resources": {"requests": {"storage": SIZE}}});
        if !matches!(self, Scenario::NoAccessModes) {
            storage["accessModes"] = json!(["ReadWriteOnce"]);
            let block = matches!(self, Scenario::BlankBlock | Scenario::S3RawBlock);
            storage["volumeMode"] = json!(if block { "Block" } else { "Filesystem" });
        }
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
               "metadata": {"name": self.name()}, "spec": {"source": source, "storage": storage}})
    }

    /// Whether the scenario waits where CDI waits for the claim's first consumer, then gives it one.
    fn has_consumer(self) -> bool {
        matches!(self, Scenario::BlankWaitForFirstConsumer)
    }

    /// Whether the scenario ends without a phase change to wait for (CDI refuses the DataVolume for good).
    fn ends_settled(self) -> bool {
        matches!(self, Scenario::NoAccessModes)
    }
}

/// What one scenario showed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// The phases in the order a watch saw them, repeats folded.
    pub walk: Vec<String>,
    /// The status while CDI waited for the claim's first consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Snapshot>,
    pub end: Snapshot,
    /// Every claim seen in the namespace while the scenario ran, by name.
    pub claims: BTreeMap<String, Claim>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub phase: String,
    pub progress: String,
    /// The importer's restarts, up to Ferry's limit (3): past it, only that there were more counts.
    pub restarts: i64,
    /// `type status reason: message`, in CDI's order.
    pub conditions: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub request: String,
    pub class: String,
    pub access_modes: Vec<String>,
    pub volume_mode: String,
    pub owner: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Image {
    pub size: u64,
    pub owner: String,
    pub mode: String,
    /// `zeros`, `source` (the raw source's bytes, then zeros to the end), or `other`.
    pub content: String,
}

/// The Secrets and ConfigMap the scenarios name, in `ns`.
pub async fn prepare(
    client: &Client,
    ns: &str,
    staging: &ferry_lab::lab::StagingEndpoint,
) -> anyhow::Result<()> {
    let mut good = staging.secret_data()?;
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    let secret = |name: &str, data: &BTreeMap<String, String>| Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some(data.clone()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret(GOOD_SECRET, &good))
        .await?;
    good.insert("secretKey".into(), "not-the-secret-key".into());
    secrets
        .create(&PostParams::default(), &secret(WRONG_SECRET, &good))
        .await?;
    let ca = staging.ca_bundle()?.unwrap_or_default();
    let config = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CA_CONFIG_MAP.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("ca.pem".to_string(), ca)])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &config)
        .await?;
    Ok(())
}

/// Runs `scenario` in `ns` and reports what it showed.
pub async fn run(
    client: &Client,
    ns: &str,
    scenario: Scenario,
    sources: &Sources,
) -> anyhow::Result<Observed> {
    let name = scenario.name();
    let dvs = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &dv_resource());
    let claims_seen = watch_claims(client.clone(), ns.to_string(), name.to_string());
    let walk = watch_walk(dvs.clone(), name.to_string());
    let dv: DynamicObject = serde_json::from_value(scenario.data_volume(sources))?;
    dvs.create(&PostParams::default(), &dv).await?;

    let mut observed = Observed::default();
    if scenario.has_consumer() {
        let waiting = settled(&dvs, name, Duration::from_secs(5), Duration::from_secs(60)).await?;
        observed.waiting = Some(snapshot(&waiting));
        consume(client, ns, name).await?;
    }
    let end = if scenario.ends_settled() {
        settled(&dvs, name, Duration::from_secs(8), Duration::from_secs(60)).await?
    } else {
        ended(&dvs, name, Duration::from_secs(300)).await?
    };
    observed.end = snapshot(&end);
    // Let the watches catch up with the end before reading them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    observed.walk = walk.finish();
    observed.claims = claims_seen.finish();
    observed.image = image(client, ns, name, &sources.raw).await?;
    Ok(observed)
}

/// A watch in the background and what it recorded so far.
struct Recorder<T> {
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<T>>,
}

impl<T: Clone + Default + Send + 'static> Recorder<T> {
    fn start<F: Future<Output = ()> + Send + 'static>(
        record: impl FnOnce(Arc<Mutex<T>>) -> F,
    ) -> Self {
        let seen = Arc::new(Mutex::new(T::default()));
        Recorder {
            task: tokio::spawn(record(seen.clone())),
            seen,
        }
    }

    fn finish(self) -> T {
        self.task.abort();
        self.seen.lock().unwrap().clone()
    }
}

/// The DataVolume's phases as a watch sees them.
fn watch_walk(dvs: Api<DynamicObject>, name: String) -> Recorder<Vec<String>> {
    Recorder::start(|walk: Arc<Mutex<Vec<String>>>| async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(dvs, config).applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(dv)) = stream.next().await {
            let phase = dv.data["status"]["phase"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let mut walk = walk.lock().unwrap();
            if !phase.is_empty() && walk.last() != Some(&phase) {
                walk.push(phase);
            }
        }
    })
}

/// The DataVolume's claim and CDI's scratch claim for it, as first seen.
fn watch_claims(client: Client, ns: String, prefix: String) -> Recorder<BTreeMap<String, Claim>> {
    Recorder::start(|seen: Arc<Mutex<BTreeMap<String, Claim>>>| async move {
        let claims = Api::<PersistentVolumeClaim>::namespaced(client, &ns);
        let stream = watcher(claims, watcher::Config::default()).applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(pvc)) = stream.next().await {
            let name = pvc.name_any();
            if name == prefix || name == format!("{prefix}-scratch") {
                seen.lock()
                    .unwrap()
                    .entry(name)
                    .or_insert_with(|| claim(&pvc));
            }
        }
    })
}

fn claim(pvc: &PersistentVolumeClaim) -> Claim {
    let spec = pvc.spec.clone().unwrap_or_default();
    Claim {
        request: spec
            .resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").map(|q| q.0.clone()))
            .unwrap_or_default(),
        class: spec.storage_class_name.unwrap_or_default(),
        access_modes: spec.access_modes.unwrap_or_default(),
        volume_mode: spec.volume_mode.unwrap_or_default(),
        owner: pvc
            .owner_references()
            .iter()
            .map(|o| format!("{}/{}", o.kind, o.name))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn snapshot(dv: &DynamicObject) -> Snapshot {
    let status = &dv.data["status"];
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let ns = dv.namespace().unwrap_or_default();
    Snapshot {
        phase: text(&status["phase"]),
        progress: text(&status["progress"]),
        restarts: status["restartCount"].as_i64().unwrap_or(0).min(3),
        conditions: status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                format!(
                    "{} {} {}: {}",
                    text(&c["type"]),
                    text(&c["status"]),
                    text(&c["reason"]),
                    without_ids(&text(&c["message"]).replace(&ns, "<ns>"))
                )
            })
            .collect(),
    }
}

/// `message` without the ids an S3 server gives each request (`request id: R, host id: H`).
fn without_ids(message: &str) -> String {
    let mut out = message.to_string();
    for label in ["request id: ", "host id: "] {
        if let Some(start) = out.find(label).map(|i| i + label.len()) {
            let end = out[start..]
                .find([',', ' '])
                .map_or(out.len(), |i| start + i);
            out.replace_range(start..end, "<id>");
        }
    }
    out
}

/// The DataVolume once its status (timestamps aside) has not changed for `quiet`.
async fn settled(
    dvs: &Api<DynamicObject>,
    name: &str,
    quiet: Duration,
    timeout: Duration,
) -> anyhow::Result<DynamicObject> {
    let deadline = Instant::now() + timeout;
    let (mut last, mut since) = (None, Instant::now());
    loop {
        let dv = dvs.get(name).await?;
        let now = snapshot(&dv);
        if last.as_ref() != Some(&now) {
            (last, since) = (Some(now), Instant::now());
        } else if since.elapsed() >= quiet {
            return Ok(dv);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name}: its status did not settle within {timeout:?}: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The DataVolume once it succeeded, failed, or its importer failed as often as Ferry gives it and is down
/// (what Ferry acts on: `DvState::Failed`).
async fn ended(
    dvs: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<DynamicObject> {
    let deadline = Instant::now() + timeout;
    loop {
        let dv = dvs.get(name).await?;
        let status = ferry_api::foreign::DataVolumeStatus::of(&dv);
        let importer_down = status
            .condition("Running")
            .is_some_and(|c| c.status == "False");
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
            || (status.restart_count.unwrap_or(0) >= 3 && importer_down)
        {
            return Ok(dv);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name} did not end within {timeout:?}: {:?}",
            snapshot(&dv)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A pod that mounts the claim and exits, as Ferry's first-consumer Job does; waits until it ended.
async fn consume(client: &Client, ns: &str, claim: &str) -> anyhow::Result<()> {
    let name = format!("{claim}-consumer");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 107, "runAsGroup": 107,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "consumer", "image": "ferry:0.1.0", "imagePullPolicy": "Never",
                            "args": ["--version"],
                            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [{"name": "disk", "mountPath": "/disk", "readOnly": true}]}],
            "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}],
        },
    }))?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let phase = pods
            .get(&name)
            .await?
            .status
            .and_then(|s| s.phase)
            .unwrap_or_default();
        if matches!(phase.as_str(), "Succeeded" | "Failed") {
            anyhow::ensure!(phase == "Succeeded", "the consumer pod {name} failed");
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the consumer pod {name} did not end: {phase}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the DataVolume's volume holds: `disk.img` in a Filesystem volume's directory, or a Block volume's device
/// (a `local` PV's, or the stand-in's file). A device's owner and mode on the host are not what a pod sees, so
/// they are not told.
async fn image(
    client: &Client,
    ns: &str,
    claim: &str,
    source: &Path,
) -> anyhow::Result<Option<Image>> {
    use std::os::unix::fs::MetadataExt;
    let Some(pvc) = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(claim)
        .await?
    else {
        return Ok(None);
    };
    let Some(volume) = pvc.spec.and_then(|s| s.volume_name) else {
        return Ok(None);
    };
    let spec = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await?
        .spec
        .unwrap_or_default();
    let block = spec.volume_mode.as_deref() == Some("Block");
    let Some(path) = spec
        .host_path
        .map(|h| PathBuf::from(h.path))
        .or(spec.local.map(|l| PathBuf::from(l.path)))
    else {
        return Ok(None);
    };
    let path = if block { path } else { path.join("disk.img") };
    let Ok(meta) = std::fs::metadata(&path) else {
        return Ok(None);
    };
    let (owner, mode) = match block {
        true => ("(device)".to_string(), "(device)".to_string()),
        false => (
            format!("{}:{}", meta.uid(), meta.gid()),
            format!("{:o}", meta.mode() & 0o7777),
        ),
    };
    let (size, content) = content(&path, source)?;
    Ok(Some(Image {
        size,
        owner,
        mode,
        content,
    }))
}

/// The image's size (a device's too) and what it holds: `zeros`; or what its first bytes, as many as the
/// source's, are (`source`, `zeros`, `other`), then what the rest is (`zeros`, or `stale` bytes).
fn content(image: &Path, source: &Path) -> anyhow::Result<(u64, String)> {
    let mut image = std::io::BufReader::new(std::fs::File::open(image)?);
    let source_len = std::fs::metadata(source)?.len();
    let mut source = std::io::BufReader::new(std::fs::File::open(source)?);
    let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let (mut head_zeros, mut head_source, mut tail_zeros) = (true, true, true);
    let (mut at, mut tail) = (0u64, false);
    loop {
        let n = read_full(&mut image, &mut a)?;
        if n == 0 {
            break;
        }
        let in_head = (source_len.saturating_sub(at) as usize).min(n);
        let m = read_full(&mut source, &mut b[..in_head])?;
        head_zeros &= a[..in_head].iter().all(|&x| x == 0);
        head_source &= m == in_head && a[..in_head] == b[..in_head];
        tail |= n > in_head;
        tail_zeros &= a[in_head..n].iter().all(|&x| x == 0);
        at += n as u64;
    }
    let head = match (head_source, head_zeros) {
        (true, _) if at >= source_len => "source",
        (_, true) => "zeros",
        _ => "other",
    };
    let content = match (head, tail, tail_zeros) {
        ("zeros", _, true) => "zeros".to_string(),
        (head, false, _) => head.to_string(),
        (head, true, true) => format!("{head}, then zeros"),
        (head, true, false) => format!("{head}, then stale"),
    };
    Ok((at, content))
}

fn read_full(reader: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}
