//! virt-handler's and virt-launcher's part of the KubeVirt stand-in: a VMI waits in Scheduling until every
//! volume's image exists, then its domain starts (Scheduled) and runs (Running, `Ready`); while a Multus network's
//! NetworkAttachmentDefinition is missing it stays Scheduled without a domain. While it runs, the guest agent is
//! polled over its channel; only an answer makes `AgentConnected` True and fills `guestOSInfo`
//! and `interfaces`. A guest that powers off ends Succeeded, a domain that dies ends Failed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};

use super::agent::{self, AgentReport, GuestInterface, GuestIpAddress, GuestOsInfo};
use super::domain::{Domain, Firmware, Launch, Network, Nic, Ovmf};
use super::multus;
use super::qemu::DomainState;
use super::volumes::{self, VolumeFacts};
use super::{
    Boot, Error, KubeVirt, MARKER_ANNOTATION, NO_BOOT_REASON, NODE, READY_MARKER, vmi_resource,
};

const FINALIZER: &str = "lab.ferry.dev/stop-qemu";
/// How long one agent request may take; a guest without an agent costs each poll this much.
const AGENT_TIMEOUT: Duration = Duration::from_secs(2);
/// virt-launcher polls the agent every few seconds.
const AGENT_POLL: Duration = Duration::from_secs(3);
/// KubeVirt lists at most this many interfaces that only the guest agent knows.
const GUEST_ONLY_INTERFACES: usize = 10;

fn guest_key(vmi: &DynamicObject) -> String {
    format!(
        "{}_{}_{}",
        vmi.namespace().unwrap_or_default(),
        vmi.name_any(),
        vmi.uid().unwrap_or_default()
    )
}

pub(super) async fn reconcile_vmi(
    vmi: Arc<DynamicObject>,
    ctx: Arc<KubeVirt>,
) -> Result<Action, Error> {
    let ns = vmi.namespace().unwrap_or_default();
    let vmis = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &vmi_resource());
    // Deleted: the domain stops, KubeVirt's finalizer goes first, and the change brings the VMI back here for the
    // stand-in's own (removing both at once would race the finalizer helper's index-based patch).
    if vmi.metadata.deletion_timestamp.is_some()
        && vmi.finalizers().iter().any(|f| f == KUBEVIRT_VMI_FINALIZER)
    {
        // First said, as virt-handler reports the domain going down; the VM copies it while the VMI is there.
        if let Some(status) = terminating_status(&vmi, Timestamp::now()) {
            let mut updated = (*vmi).clone();
            updated.data["status"] = status;
            replace(&vmi, &updated, &ctx).await?;
            return Ok(Action::await_change());
        }
        ctx.guests
            .stop(&guest_key(&vmi))
            .map_err(|e| Error::Guest(format!("{e:#}")))?;
        release_kubevirt_finalizer(&vmi, &ctx).await?;
        return Ok(Action::await_change());
    }
    finalizer(&vmis, FINALIZER, vmi, |event| async {
        match event {
            Event::Apply(vmi) => run_guest(&vmi, &ctx).await,
            Event::Cleanup(vmi) => {
                ctx.guests
                    .stop(&guest_key(&vmi))
                    .map_err(|e| Error::Guest(format!("{e:#}")))?;
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Guest(other.to_string()),
    })
}

/// KubeVirt's VMI mutator adds this to every VMI it admits; virt-controller removes it once the VMI's launcher
/// pod is gone, so a VMI is never deleted while its domain may still run.
pub(super) const KUBEVIRT_VMI_FINALIZER: &str = "kubevirt.io/foregroundDeleteVirtualMachine";

/// The domain is stopped: as virt-controller does once the launcher pod is gone, drop KubeVirt's finalizer. A
/// merge patch carrying the resourceVersion, so a stale copy is refused (409) and tried again.
async fn release_kubevirt_finalizer(vmi: &DynamicObject, ctx: &KubeVirt) -> Result<(), Error> {
    let finalizers = vmi.finalizers();
    if !finalizers.iter().any(|f| f == KUBEVIRT_VMI_FINALIZER) {
        return Ok(());
    }
    let kept: Vec<&String> = finalizers
        .iter()
        .filter(|f| *f != KUBEVIRT_VMI_FINALIZER)
        .collect();
    let patch =
        json!({"metadata": {"resourceVersion": vmi.resource_version(), "finalizers": kept}});
    Api::<DynamicObject>::namespaced_with(
        ctx.identities.controller.clone(),
        &vmi.namespace().unwrap_or_default(),
        &vmi_resource(),
    )
    .patch(
        &vmi.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Where a VMI is, as virt-handler reports it.
#[derive(Clone, Debug, PartialEq)]
enum Phase {
    /// Scheduled, but virt-launcher cannot set up a NIC's pod link (why, in its words) and tries again: the NAD of
    /// a Multus network is missing, so nothing attached the link.
    NetworkSetupFailed(String),
    /// Waiting for a volume (why), or for the launcher pod to start, which real KubeVirt always walks through.
    Scheduling(Option<String>),
    Scheduled,
    Running {
        paused: bool,
    },
    Succeeded,
    /// Why, as a condition reason and message.
    Failed(&'static str, String),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::NetworkSetupFailed(_) => "Scheduled",
            Phase::Scheduling(_) => "Scheduling",
            Phase::Scheduled => "Scheduled",
            Phase::Running { .. } => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed(..) => "Failed",
        }
    }
}

async fn run_guest(vmi: &DynamicObject, ctx: &KubeVirt) -> Result<Action, Error> {
    let key = guest_key(vmi);
    let current = vmi.data["status"]["phase"].as_str().unwrap_or("");
    if matches!(current, "Succeeded" | "Failed") {
        // Final: the domain is gone for good; its console stays until the VMI does.
        ctx.guests
            .halt(&key)
            .map_err(|e| Error::Guest(format!("{e:#}")))?;
        return Ok(Action::await_change());
    }
    let uid = vmi.uid().unwrap_or_default();
    let domain = Domain::from_vmi(&vmi.data["spec"], &uid);
    let phase = match &domain {
        Err(refused) => Phase::Failed("SyncFailed", refused.clone()),
        Ok(_) if ctx.boot == Boot::ReportReadyWithoutBooting && current == "Running" => {
            Phase::Running { paused: false }
        }
        Ok(domain) if matches!(current, "" | "Pending" | "Scheduling") => {
            let mut domain = domain.clone();
            let network = attach_networks(&mut domain, vmi, ctx).await?;
            match volume_images(&domain, vmi, ctx).await? {
                Err(waiting) => Phase::Scheduling(Some(waiting)),
                Ok(_) if ctx.boot == Boot::ReportReadyWithoutBooting => {
                    Phase::Running { paused: false }
                }
                Ok(_) if current != "Scheduling" => Phase::Scheduling(None),
                Ok(images) => match network {
                    Err(missing) => Phase::NetworkSetupFailed(missing),
                    Ok(()) => {
                        start(&domain, &images, vmi, &key, ctx).await?;
                        Phase::Scheduled
                    }
                },
            }
        }
        Ok(domain) => match ctx.guests.state(&key).await {
            DomainState::Starting => Phase::Scheduled,
            DomainState::Running => Phase::Running { paused: false },
            DomainState::Paused(_) => Phase::Running { paused: true },
            DomainState::ShutDown => Phase::Succeeded,
            DomainState::Crashed(why) => Phase::Failed("GuestCrashed", why),
            // Never started: virt-launcher retries its network setup until the NAD is there.
            DomainState::Absent => match attach_networks(&mut domain.clone(), vmi, ctx).await? {
                Err(missing) => Phase::NetworkSetupFailed(missing),
                Ok(()) => Phase::Failed(
                    "GuestCrashed",
                    "the domain is gone (the stand-in restarted?)".into(),
                ),
            },
        },
    };
    if matches!(phase, Phase::Succeeded | Phase::Failed(..)) {
        ctx.guests
            .halt(&key)
            .map_err(|e| Error::Guest(format!("{e:#}")))?;
    }
    let agent = match (&phase, ctx.boot) {
        (Phase::Running { paused: false }, Boot::Qemu) => {
            agent::poll(&ctx.guests.files(&key).agent_socket, AGENT_TIMEOUT).await
        }
        _ => None,
    };
    let nics = domain.as_ref().map(|d| d.nics.as_slice()).unwrap_or(&[]);
    let facts = volumes::observe(&ctx.client, vmi).await?;
    let status = vmi_status(
        vmi,
        &phase,
        Seen {
            boot: ctx.boot,
            nics,
            agent: agent.as_ref(),
            volumes: &facts,
        },
        Timestamp::now(),
    );
    let mut annotations = vmi.annotations().clone();
    if let Some(line) = ctx.guests.serial_line(&key, READY_MARKER) {
        annotations.insert(MARKER_ANNOTATION.to_string(), line);
    }
    if vmi.data["status"] != status || vmi.annotations() != &annotations {
        let mut updated = vmi.clone();
        updated.metadata.annotations = Some(annotations);
        updated.data["status"] = status;
        replace(vmi, &updated, ctx).await?;
    }
    Ok(match phase {
        Phase::NetworkSetupFailed(_) | Phase::Scheduling(Some(_)) => {
            Action::requeue(Duration::from_secs(2))
        }
        Phase::Scheduling(None) => Action::requeue(Duration::from_millis(500)),
        Phase::Scheduled => Action::requeue(Duration::from_millis(500)),
        Phase::Running { .. } if ctx.boot == Boot::ReportReadyWithoutBooting => {
            Action::requeue(Duration::from_secs(30))
        }
        Phase::Running { .. } => Action::requeue(AGENT_POLL),
        Phase::Succeeded | Phase::Failed(..) => Action::await_change(),
    })
}

/// Attaches the domain's Multus NICs (`multus::attach`); `Err` is virt-launcher's words for a NIC nothing attached.
async fn attach_networks(
    domain: &mut Domain,
    vmi: &DynamicObject,
    ctx: &KubeVirt,
) -> Result<Result<(), String>, Error> {
    let ns = vmi.namespace().unwrap_or_default();
    Ok(multus::attach(domain, &ns, &ctx.client).await?)
}

/// Writes `updated` over `vmi`. Until the VMI is on this node it is virt-controller's to schedule; from then on
/// virt-handler's. Both write with an update, the one verb virt-handler's role has on VMIs: a stale copy is
/// refused (409) and retried.
async fn replace(
    vmi: &DynamicObject,
    updated: &DynamicObject,
    ctx: &KubeVirt,
) -> Result<(), Error> {
    let writer = if vmi.data["status"]["nodeName"] == NODE {
        &ctx.identities.handler
    } else {
        &ctx.identities.controller
    };
    Api::<DynamicObject>::namespaced_with(
        writer.clone(),
        &vmi.namespace().unwrap_or_default(),
        &vmi_resource(),
    )
    .replace(&vmi.name_any(), &PostParams::default(), updated)
    .await?;
    Ok(())
}

/// The status of a VMI whose domain shuts down: the agent gone, not Ready since its pod terminates; the other
/// conditions stay. None when the VMI says so already.
fn terminating_status(vmi: &DynamicObject, now: Timestamp) -> Option<Value> {
    let old = &vmi.data["status"];
    let now = now.to_string();
    let mut conditions: Vec<Value> = old["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] != "AgentConnected" && c["type"] != "Ready")
        .cloned()
        .collect();
    conditions.insert(
        0,
        condition(
            vmi,
            &now,
            "Ready",
            "False",
            "PodTerminating",
            "virt-launcher pod is terminating",
        ),
    );
    let mut status = old.clone();
    status["conditions"] = json!(conditions);
    (status != *old).then_some(status)
}

/// Starts the domain: KVM when it works here, the VMI's own copy of the OVMF variables for EFI.
async fn start(
    domain: &Domain,
    images: &BTreeMap<String, PathBuf>,
    vmi: &DynamicObject,
    key: &str,
    ctx: &KubeVirt,
) -> Result<(), Error> {
    let scratch = ctx.state_dir.clone();
    let accel = tokio::task::spawn_blocking(move || super::accel::detect(&scratch))
        .await
        .map_err(|e| Error::Guest(e.to_string()))?;
    let files = ctx.guests.files(key);
    let name = format!("{}_{}", vmi.namespace().unwrap_or_default(), vmi.name_any());
    let args = domain
        .qemu_args(&Launch {
            name: &name,
            accel,
            images,
            serial_log: &files.serial_log,
            agent_socket: &files.agent_socket,
            qmp_socket: &files.qmp_socket,
            efi_vars: &files.efi_vars,
        })
        .map_err(Error::Guest)?;
    let vars = match domain.firmware {
        Firmware::Efi { secure_boot } => Some(Ovmf::files(secure_boot).1),
        Firmware::Bios => None,
    };
    ctx.guests
        .start(key, args, vars.as_deref())
        .map_err(|e| Error::Guest(format!("{e:#}")))
}

/// Every disk's image: its volume's PVC, bound to a hostPath PV holding `disk.img` (CDI's layout) or a Block
/// volume's device; or why
/// the VMI cannot be scheduled yet.
async fn volume_images(
    domain: &Domain,
    vmi: &DynamicObject,
    ctx: &KubeVirt,
) -> Result<Result<BTreeMap<String, PathBuf>, String>, Error> {
    let ns = vmi.namespace().unwrap_or_default();
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    let pvs = Api::<PersistentVolume>::all(ctx.client.clone());
    let mut images = BTreeMap::new();
    for disk in &domain.disks {
        let claim = &disk.claim;
        let Some(pvc) = pvcs.get_opt(claim).await? else {
            return Ok(Err(format!("PVC {claim} does not exist yet")));
        };
        let Some(pv_name) = pvc
            .spec
            .and_then(|s| s.volume_name)
            .filter(|n| !n.is_empty())
        else {
            return Ok(Err(format!("PVC {claim} is not bound yet")));
        };
        let Some(pv) = pvs.get_opt(&pv_name).await? else {
            return Ok(Err(format!("PV {pv_name} does not exist")));
        };
        // A hostPath (a directory with CDI's `disk.img`, or a Block volume's file), or a local device.
        let spec = pv.spec.unwrap_or_default();
        let Some(path) = spec
            .host_path
            .map(|h| PathBuf::from(h.path))
            .or(spec.local.map(|l| PathBuf::from(l.path)))
        else {
            return Ok(Err(format!(
                "PV {pv_name} is neither a hostPath nor a local volume"
            )));
        };
        let image = if path.is_dir() {
            path.join("disk.img")
        } else {
            path
        };
        if !image.exists() {
            return Ok(Err(format!("{} does not exist yet", image.display())));
        }
        images.insert(disk.name.clone(), image);
    }
    Ok(Ok(images))
}

/// A condition as KubeVirt writes it; the transition time stays while the status does not change.
fn condition(
    vmi: &DynamicObject,
    now: &str,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Value {
    let earlier = vmi.data["status"]["conditions"].as_array().and_then(|cs| {
        cs.iter()
            .find(|c| {
                c["type"] == type_
                    && c["status"] == status
                    && c["reason"].as_str().unwrap_or("") == reason
                    && c["message"].as_str().unwrap_or("") == message
            })
            .cloned()
    });
    earlier.unwrap_or_else(|| {
        // Real KubeVirt (v1.9.0, seen on the lab's real node) stamps `AgentConnected` with a probe time and leaves
        // its transition time null; its other conditions the other way round.
        // Those of the volumes it writes with neither.
        let mut c = match type_ {
            "AgentConnected" => {
                json!({"type": type_, "status": status, "lastTransitionTime": null, "lastProbeTime": now})
            }
            "DataVolumesReady" | "LiveMigratable" | "StorageLiveMigratable" => {
                json!({"type": type_, "status": status, "lastTransitionTime": null, "lastProbeTime": null})
            }
            _ => {
                json!({"type": type_, "status": status, "lastTransitionTime": now, "lastProbeTime": null})
            }
        };
        if !reason.is_empty() {
            c["reason"] = json!(reason);
        }
        if !message.is_empty() {
            c["message"] = json!(message);
        }
        c
    })
}

/// What this reconcile saw of the VMI's domain, agent and volumes.
struct Seen<'a> {
    boot: Boot,
    nics: &'a [Nic],
    agent: Option<&'a AgentReport>,
    volumes: &'a VolumeFacts,
}

/// The VMI's whole status after this reconcile.
fn vmi_status(vmi: &DynamicObject, phase: &Phase, seen: Seen, now: Timestamp) -> Value {
    let Seen {
        boot,
        nics,
        agent,
        volumes,
    } = seen;
    let old = &vmi.data["status"];
    let now = now.to_string();
    let cond = |type_: &str, ok: bool, reason: &str, message: &str| {
        let status = if ok { "True" } else { "False" };
        condition(vmi, &now, type_, status, reason, message)
    };
    let said = |type_: &str, (status, reason, message): volumes::Said| {
        condition(vmi, &now, type_, status, reason, &message)
    };
    let bench = boot == Boot::ReportReadyWithoutBooting;
    let mut conditions = match phase {
        Phase::NetworkSetupFailed(why) => vec![
            cond(
                "Ready",
                false,
                "GuestNotRunning",
                "Guest VM is not reported as running",
            ),
            cond(
                "Synchronized",
                false,
                "Synchronizing with the Domain failed.",
                why,
            ),
        ],
        Phase::Scheduling(Some(waiting)) => vec![
            cond("PodScheduled", false, "Unschedulable", waiting),
            cond(
                "Ready",
                false,
                "PodNotExists",
                "virt-launcher pod has not yet been scheduled",
            ),
        ],
        Phase::Scheduling(None) | Phase::Scheduled => vec![cond(
            "Ready",
            false,
            "GuestNotRunning",
            "Guest VM is not reported as running",
        )],
        Phase::Running { .. } if bench => vec![
            cond("Ready", true, NO_BOOT_REASON, ""),
            cond("AgentConnected", true, NO_BOOT_REASON, ""),
        ],
        Phase::Running { paused } => {
            let mut cs = vec![cond("Ready", !paused, "", "")];
            if *paused {
                cs.push(cond("Paused", true, "PausedByUser", "the domain is paused"));
            }
            // KubeVirt removes the condition while the agent is away rather than writing False.
            if agent.is_some() {
                cs.push(cond("AgentConnected", true, "", ""));
            }
            cs
        }
        Phase::Succeeded => vec![cond(
            "Ready",
            false,
            "PodTerminating",
            "virt-launcher pod is terminating",
        )],
        Phase::Failed(reason, message) => vec![
            cond(
                "Ready",
                false,
                "PodTerminating",
                "virt-launcher pod is terminating",
            ),
            cond("Synchronized", false, reason, message),
        ],
    };
    // virt-controller's verdict on the DataVolumes, from the start; virt-handler's on migration, while the
    // domain runs.
    if let Some(dvs) = volumes::data_volumes_ready(volumes) {
        conditions.push(said("DataVolumesReady", dvs));
    }
    if matches!(phase, Phase::Running { .. } | Phase::NetworkSetupFailed(_)) {
        conditions.push(said("LiveMigratable", volumes::live_migratable(volumes)));
        conditions.push(said(
            "StorageLiveMigratable",
            volumes::storage_live_migratable(),
        ));
    }
    let mut status = Map::new();
    status.insert("phase".into(), json!(phase.name()));
    status.insert("conditions".into(), json!(conditions));
    let mut transitions = old["phaseTransitionTimestamps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if old["phase"] != phase.name() {
        transitions.push(json!({"phase": phase.name(), "phaseTransitionTimestamp": now}));
    }
    status.insert("phaseTransitionTimestamps".into(), json!(transitions));
    // The domain exists from Scheduled on; a VMI refused before that never had one.
    let defined = match phase {
        Phase::Scheduling(_) => false,
        Phase::Failed(..) => !old["nodeName"].is_null(),
        _ => true,
    };
    if defined {
        let pod = pod_address(&vmi.uid().unwrap_or_default());
        status.insert("nodeName".into(), json!(NODE));
        if bench {
            // The guest it pretends to be has an agent, so it reports its addresses with it.
            let pretended = matches!(phase, Phase::Running { .. }).then(|| pretended_guest(nics));
            status.insert(
                "interfaces".into(),
                json!(interfaces_status(nics, pretended.as_deref(), &pod)),
            );
        } else if let Phase::NetworkSetupFailed(_) = phase {
            // No domain: no NIC to show.
            status.insert("interfaces".into(), json!([]));
        } else {
            status.insert("machine".into(), json!({"type": "q35"}));
            status.insert(
                "interfaces".into(),
                json!(interfaces_status(
                    nics,
                    agent.map(|a| a.interfaces.as_slice()),
                    &pod
                )),
            );
        }
    }
    // KubeVirt keeps the last OS the agent reported.
    let os = agent
        .map(|a| os_info_status(&a.os))
        .filter(|os| !os.as_object().is_none_or(Map::is_empty))
        .unwrap_or_else(|| old["guestOSInfo"].clone());
    if !os.is_null() {
        status.insert("guestOSInfo".into(), os);
    }
    Value::Object(status)
}

/// `status.guestOSInfo` from `guest-get-osinfo`, KubeVirt's field names.
pub fn os_info_status(os: &GuestOsInfo) -> Value {
    let mut info = Map::new();
    for (key, value) in [
        ("name", &os.name),
        ("kernelRelease", &os.kernel_release),
        ("version", &os.version),
        ("prettyName", &os.pretty_name),
        ("versionId", &os.version_id),
        ("kernelVersion", &os.kernel_version),
        ("machine", &os.machine),
        ("id", &os.id),
    ] {
        if let Some(v) = value.as_ref().filter(|v| !v.is_empty()) {
            info.insert(key.into(), json!(v));
        }
    }
    Value::Object(info)
}

/// What the agent of a `--no-boot` guest would report: one address per NIC, in QEMU's user network.
fn pretended_guest(nics: &[Nic]) -> Vec<GuestInterface> {
    nics.iter()
        .enumerate()
        .map(|(i, nic)| GuestInterface {
            name: format!("eth{i}"),
            hardware_address: Some(nic.mac.clone()),
            ip_addresses: vec![GuestIpAddress {
                ip_address_type: "ipv4".into(),
                ip_address: format!("10.0.2.{}", 15 + i),
                prefix: 24,
            }],
        })
        .collect()
}

/// The address of the launcher pod the VMI would run in. The lab has no pod network: an address in the range
/// the real node's pods get (10.88.0.0/16), stable for the VMI, routed nowhere.
pub fn pod_address(vmi_uid: &str) -> String {
    let h = ferry_api::names::fnv1a(vmi_uid.as_bytes());
    format!("10.88.{}.{}", (h >> 8) % 256, 2 + h % 250)
}

/// `status.interfaces` as KubeVirt merges them: the domain's NICs first (`domain`), joined by MAC with what
/// the agent reports (`domain, guest-agent`: the guest's name for it and its addresses), then up to ten
/// interfaces only the guest knows (`guest-agent`). The loopback is never listed. The NIC on the pod network
/// is the pod's `eth0` and shows the pod's address `pod` from the start, whatever the guest says (masquerade).
pub fn interfaces_status(nics: &[Nic], agent: Option<&[GuestInterface]>, pod: &str) -> Vec<Value> {
    let reported: Vec<&GuestInterface> = agent
        .unwrap_or_default()
        .iter()
        .filter(|i| i.name != "lo")
        .collect();
    let same_mac = |i: &GuestInterface, mac: &str| {
        i.hardware_address
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case(mac))
    };
    let mut statuses = vec![];
    for nic in nics {
        let mut status = json!({"name": nic.name, "mac": nic.mac, "infoSource": "domain",
                                "queueCount": 1, "linkState": "up"});
        let on_pod_network = matches!(nic.network, Network::Pod { .. });
        if on_pod_network {
            status["podInterfaceName"] = json!("eth0");
            status["ipAddress"] = json!(pod);
            status["ipAddresses"] = json!([pod]);
        }
        if let Some(guest) = reported.iter().find(|i| same_mac(i, &nic.mac)) {
            let (v4, v6): (Vec<_>, Vec<_>) = guest
                .ip_addresses
                .iter()
                .partition(|a| a.ip_address_type == "ipv4");
            let ips: Vec<&str> = v4
                .iter()
                .chain(v6.iter())
                .map(|a| a.ip_address.as_str())
                .collect();
            status["interfaceName"] = json!(guest.name);
            status["infoSource"] = json!("domain, guest-agent");
            if let Some(first) = ips.first().filter(|_| !on_pod_network) {
                status["ipAddress"] = json!(first);
                status["ipAddresses"] = json!(ips);
            }
        }
        statuses.push(status);
    }
    let guest_only = reported
        .iter()
        .filter(|i| !nics.iter().any(|n| same_mac(i, &n.mac)))
        .take(GUEST_ONLY_INTERFACES);
    for guest in guest_only {
        let ips: Vec<&str> = guest
            .ip_addresses
            .iter()
            .map(|a| a.ip_address.as_str())
            .collect();
        let primary = guest
            .ip_addresses
            .iter()
            .find(|a| a.ip_address_type == "ipv4")
            .map(|a| a.ip_address.as_str())
            .or(ips.first().copied());
        let mut status = json!({"interfaceName": guest.name, "infoSource": "guest-agent"});
        if let Some(mac) = &guest.hardware_address {
            status["mac"] = json!(mac);
        }
        if let Some(primary) = primary {
            status["ipAddress"] = json!(primary);
            status["ipAddresses"] = json!(ips);
        }
        statuses.push(status);
    }
    statuses
}

#[cfg(test)]
mod tests {
    use super::super::agent::GuestIpAddress;
    use super::super::domain::Network;
    use super::*;

    fn ip(kind: &str, address: &str) -> GuestIpAddress {
        GuestIpAddress {
            ip_address_type: kind.into(),
            ip_address: address.into(),
            prefix: 24,
        }
    }

    #[test]
    fn interfaces_join_the_domain_and_the_agent_by_mac() {
        let nic = Nic {
            name: "nic-0".into(),
            device: "e1000e",
            mac: "00:50:56:01:02:03".into(),
            boot_order: None,
            network: Network::Pod {
                gateway: "10.0.2.1".into(),
                guest: "10.0.2.2".into(),
                cidr: "10.0.2.0/24".into(),
            },
        };
        let agent = vec![
            GuestInterface {
                name: "lo".into(),
                hardware_address: Some("00:00:00:00:00:00".into()),
                ip_addresses: vec![ip("ipv4", "127.0.0.1")],
            },
            GuestInterface {
                name: "ens3".into(),
                hardware_address: Some("00:50:56:01:02:03".into()),
                ip_addresses: vec![
                    ip("ipv6", "fe80::250:56ff:fe01:203"),
                    ip("ipv6", "fd00::2"),
                    ip("ipv4", "10.0.2.2"),
                ],
            },
            GuestInterface {
                name: "docker0".into(),
                hardware_address: Some("02:42:00:00:00:01".into()),
                ip_addresses: vec![ip("ipv6", "fd01::1"), ip("ipv4", "172.17.0.1")],
            },
        ];
        assert_eq!(
            interfaces_status(std::slice::from_ref(&nic), None, "10.88.0.7"),
            [
                json!({"name": "nic-0", "mac": "00:50:56:01:02:03", "infoSource": "domain",
                    "queueCount": 1, "linkState": "up", "podInterfaceName": "eth0",
                    "ipAddress": "10.88.0.7", "ipAddresses": ["10.88.0.7"]})
            ]
        );
        assert_eq!(
            interfaces_status(std::slice::from_ref(&nic), Some(&agent), "10.88.0.7"),
            [
                json!({"name": "nic-0", "mac": "00:50:56:01:02:03", "infoSource": "domain, guest-agent",
                       "queueCount": 1, "linkState": "up", "interfaceName": "ens3", "podInterfaceName": "eth0",
                       "ipAddress": "10.88.0.7", "ipAddresses": ["10.88.0.7"]}),
                json!({"interfaceName": "docker0", "infoSource": "guest-agent", "mac": "02:42:00:00:00:01",
                       "ipAddress": "172.17.0.1", "ipAddresses": ["fd01::1", "172.17.0.1"]}),
            ]
        );
        // A NIC off the pod network (Multus) shows what the guest says of it.
        let multus = Nic {
            network: Network::Multus {
                network_name: "lan".into(),
                bridge: None,
            },
            ..nic.clone()
        };
        assert_eq!(
            interfaces_status(&[multus], Some(&agent), "10.88.0.7")[0],
            json!({"name": "nic-0", "mac": "00:50:56:01:02:03", "infoSource": "domain, guest-agent",
                   "queueCount": 1, "linkState": "up", "interfaceName": "ens3",
                   "ipAddress": "10.0.2.2", "ipAddresses": ["10.0.2.2", "fe80::250:56ff:fe01:203", "fd00::2"]})
        );
    }

    #[test]
    fn os_info_uses_kubevirt_names() {
        let os = GuestOsInfo {
            id: Some("debian".into()),
            name: Some("Debian GNU/Linux".into()),
            pretty_name: Some("Debian GNU/Linux 12 (bookworm)".into()),
            version: Some("12 (bookworm)".into()),
            version_id: Some("12".into()),
            kernel_release: Some("6.1.0-28-amd64".into()),
            kernel_version: None,
            machine: Some("x86_64".into()),
        };
        assert_eq!(
            os_info_status(&os),
            json!({"name": "Debian GNU/Linux", "kernelRelease": "6.1.0-28-amd64", "version": "12 (bookworm)",
                   "prettyName": "Debian GNU/Linux 12 (bookworm)", "versionId": "12", "machine": "x86_64",
                   "id": "debian"})
        );
    }

    fn stored(status: Value) -> DynamicObject {
        serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "uid": "u"}, "status": status}),
        )
        .unwrap()
    }

    fn seen<'a>(agent: Option<&'a AgentReport>, volumes: &'a VolumeFacts) -> Seen<'a> {
        Seen {
            boot: Boot::Qemu,
            nics: &[],
            agent,
            volumes,
        }
    }

    #[test]
    fn ready_means_running_and_agent_connected_needs_an_answer() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        // One DataVolume, Ready, on a claim that is not shared.
        let facts = VolumeFacts {
            data_volumes: vec!["True".into()],
            not_shared: Some(volumes::Unshared::Claim("boot".into())),
        };
        let running_with = |agent: bool| -> Vec<(String, String)> {
            let mut types = vec![("Ready".into(), "True".into())];
            if agent {
                types.push(("AgentConnected".into(), "True".into()));
            }
            types.extend([
                ("DataVolumesReady".into(), "True".into()),
                ("LiveMigratable".into(), "False".into()),
                ("StorageLiveMigratable".into(), "True".into()),
            ]);
            types
        };
        let vmi = stored(json!({"phase": "Scheduled"}));
        let running = vmi_status(
            &vmi,
            &Phase::Running { paused: false },
            seen(None, &facts),
            now,
        );
        let types = |s: &Value| -> Vec<(String, String)> {
            s["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["type"].as_str().unwrap().into(),
                        c["status"].as_str().unwrap().into(),
                    )
                })
                .collect()
        };
        assert_eq!(types(&running), running_with(false));
        assert_eq!(running["phase"], "Running");
        assert_eq!(running["nodeName"], NODE);
        assert_eq!(running["phaseTransitionTimestamps"][0]["phase"], "Running");
        assert!(running.get("guestOSInfo").is_none());

        let report = AgentReport {
            os: GuestOsInfo {
                name: Some("Debian GNU/Linux".into()),
                ..Default::default()
            },
            interfaces: vec![],
        };
        let answered = vmi_status(
            &stored(running.clone()),
            &Phase::Running { paused: false },
            seen(Some(&report), &facts),
            now,
        );
        assert_eq!(types(&answered), running_with(true));
        assert_eq!(answered["guestOSInfo"]["name"], "Debian GNU/Linux");
        assert_eq!(
            answered["phaseTransitionTimestamps"]
                .as_array()
                .unwrap()
                .len(),
            1,
            "no new transition while the phase stays"
        );
        // The agent went away: the condition goes, the OS stays.
        let away = vmi_status(
            &stored(answered),
            &Phase::Running { paused: false },
            seen(None, &facts),
            now,
        );
        assert_eq!(types(&away), running_with(false));
        assert_eq!(away["guestOSInfo"]["name"], "Debian GNU/Linux");

        let failed = vmi_status(
            &stored(away),
            &Phase::Failed("GuestCrashed", "QEMU exited".into()),
            seen(None, &facts),
            now,
        );
        assert_eq!(
            types(&failed),
            [
                ("Ready".into(), "False".into()),
                ("Synchronized".into(), "False".into()),
                ("DataVolumesReady".into(), "True".into())
            ]
        );
        assert_eq!(failed["conditions"][1]["message"], "QEMU exited");
        let waiting = vmi_status(
            &stored(json!({})),
            &Phase::Scheduling(Some("PVC boot is not bound yet".into())),
            seen(None, &facts),
            now,
        );
        assert_eq!(
            waiting["conditions"][0]["message"],
            "PVC boot is not bound yet"
        );
        assert!(waiting.get("nodeName").is_none());
        // Scheduled, but the NIC of a missing NAD has no pod link: virt-launcher's words, no NIC shown.
        let why = "failed to configure vmi network: setup failed, err: pod link (pod0e6b58809dd) is missing";
        let unattached = vmi_status(
            &stored(json!({})),
            &Phase::NetworkSetupFailed(why.into()),
            seen(None, &facts),
            now,
        );
        assert_eq!(unattached["phase"], "Scheduled");
        assert_eq!(
            types(&unattached)[..2],
            [
                ("Ready".into(), "False".into()),
                ("Synchronized".into(), "False".into())
            ]
        );
        assert_eq!(
            unattached["conditions"][1]["reason"],
            "Synchronizing with the Domain failed."
        );
        assert_eq!(unattached["conditions"][1]["message"], why);
        assert_eq!(unattached["interfaces"], json!([]));
    }
}
