//! The KubeVirt stand-in: VirtualMachines get VirtualMachineInstances per `runStrategy`, and each VMI really
//! boots its first disk in QEMU. When the guest prints the ready marker on COM1, the VMI's `AgentConnected` and
//! `Ready` conditions turn True. Only what virt-controller and virt-handler would do, nothing Ferry-specific.

use std::sync::Arc;
use std::time::Duration;

use ferry_api::foreign::{VmSpec, VmiStatus};
pub use ferry_api::foreign::{vm_resource, vmi_resource};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use super::qemu::{Guests, Machine};

/// What a guest prints on COM1 once it is up; the lab's demo disks print it from their boot sector.
pub const READY_MARKER: &str = "FERRY-GUEST-READY";
/// The serial line with the marker, recorded on the VMI for people and tests to read.
pub const MARKER_ANNOTATION: &str = "lab.ferry.dev/serial-marker";
const FINALIZER: &str = "lab.ferry.dev/stop-qemu";
const MANAGER: &str = "kubevirt-standin";
pub const NODE: &str = "lab-node";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Guest(String),
}

/// How the stand-in's virt-handler runs a VMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boot {
    /// Boot its first disk in QEMU; Ready once the guest prints the marker.
    Qemu,
    /// For `ferry bench controlplane` only: Running and Ready as soon as its first disk is imported, with no
    /// QEMU, so a thousand migrations do not start a thousand guests. Marked by the `NoBootBenchmark` reason.
    ReportReadyWithoutBooting,
}

/// The condition reason a VMI gets in `Boot::ReportReadyWithoutBooting`.
pub const NO_BOOT_REASON: &str = "NoBootBenchmark";

/// What the KubeVirt stand-in's reconciles share.
struct KubeVirt {
    client: Client,
    guests: Guests,
    boot: Boot,
}

/// Runs both controllers until `shutdown` resolves. `namespace: None` serves every namespace.
pub async fn run(
    client: Client,
    namespace: Option<&str>,
    state_dir: &std::path::Path,
    boot: Boot,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let ctx = Arc::new(KubeVirt {
        client: client.clone(),
        guests: Guests::new(state_dir)?,
        boot,
    });
    let api = |r: &ApiResource| match namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, r),
        None => Api::<DynamicObject>::all_with(client.clone(), r),
    };
    // One shutdown signal for both controllers.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let (mut rx_vm, mut rx_vmi) = (rx.clone(), rx);
    let vms = Controller::new_with(
        api(&vm_resource()),
        watcher::Config::default(),
        vm_resource(),
    )
    .owns_with(
        api(&vmi_resource()),
        vmi_resource(),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(async move {
        let _ = rx_vm.wait_for(|s| *s).await;
    })
    .run(reconcile_vm, error_policy, ctx.clone())
    .for_each(|_| async {});
    let vmis = Controller::new_with(
        api(&vmi_resource()),
        watcher::Config::default(),
        vmi_resource(),
    )
    .graceful_shutdown_on(async move {
        let _ = rx_vmi.wait_for(|s| *s).await;
    })
    .run(reconcile_vmi, error_policy, ctx.clone())
    .for_each(|_| async {});
    tokio::spawn(async move {
        shutdown.await;
        let _ = tx.send(true);
    });
    tokio::join!(vms, vmis);
    Ok(())
}

fn error_policy(_obj: Arc<DynamicObject>, error: &Error, _ctx: Arc<KubeVirt>) -> Action {
    tracing::warn!("kubevirt stand-in: {error}");
    Action::requeue(Duration::from_secs(2))
}

fn run_strategy(vm: &DynamicObject) -> String {
    VmSpec::of(vm)
        .run_strategy
        .unwrap_or_else(|| "Halted".into())
}

/// virt-controller's part: a VMI exists exactly when the run strategy says the VM runs.
async fn reconcile_vm(vm: Arc<DynamicObject>, ctx: Arc<KubeVirt>) -> Result<Action, Error> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let vmis = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &vmi_resource());
    let vms = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &vm_resource());
    let mut vmi = vmis.get_opt(&name).await?;
    let wants_running = matches!(
        run_strategy(&vm).as_str(),
        "Always" | "RerunOnFailure" | "Once"
    );
    if vm.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    match (&vmi, wants_running) {
        (None, true) => {
            let owner = vm
                .controller_owner_ref(&vm_resource())
                .expect("a stored VM has a uid");
            let template = &vm.data["spec"]["template"];
            let mut new = DynamicObject::new(&name, &vmi_resource()).within(&ns);
            new.metadata.labels =
                serde_json::from_value(template["metadata"]["labels"].clone()).ok();
            new.metadata.owner_references = Some(vec![owner]);
            new.data = json!({"spec": template["spec"].clone()});
            vmi = Some(vmis.create(&PostParams::default(), &new).await?);
        }
        (Some(existing), false) if existing.metadata.deletion_timestamp.is_none() => {
            vmis.delete(&name, &DeleteParams::default()).await?;
        }
        _ => {}
    }
    let vmi_status = vmi.as_ref().map(VmiStatus::of).unwrap_or_default();
    let vmi_ready = vmi_status.is_true("Ready");
    let vmi_phase = vmi_status.phase.as_deref().unwrap_or("");
    let printable = match (wants_running, &vmi) {
        (false, None) => "Stopped",
        (false, Some(_)) => "Stopping",
        (true, Some(_)) if vmi_phase == "Running" => "Running",
        (true, _) => "Starting",
    };
    let status = json!({
        "printableStatus": printable,
        "ready": vmi_ready,
        "created": vmi.is_some(),
        "runStrategy": run_strategy(&vm),
    });
    if vm.data["status"] != status {
        let patch =
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "status": status});
        vms.patch_status(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

fn guest_key(vmi: &DynamicObject) -> String {
    format!(
        "{}_{}_{}",
        vmi.namespace().unwrap_or_default(),
        vmi.name_any(),
        vmi.uid().unwrap_or_default()
    )
}

/// virt-handler's part: boot the guest, follow its serial port, report phases and conditions.
async fn reconcile_vmi(vmi: Arc<DynamicObject>, ctx: Arc<KubeVirt>) -> Result<Action, Error> {
    let ns = vmi.namespace().unwrap_or_default();
    let vmis = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &vmi_resource());
    finalizer(&vmis, FINALIZER, vmi, |event| async {
        match event {
            Event::Apply(vmi) => run_guest(&vmi, &ctx, &vmis).await,
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

async fn run_guest(
    vmi: &DynamicObject,
    ctx: &KubeVirt,
    vmis: &Api<DynamicObject>,
) -> Result<Action, Error> {
    let key = guest_key(vmi);
    let (phase, reason, requeue) = match boot_disk(vmi, ctx).await? {
        Err(waiting) => ("Scheduling", waiting, Duration::from_secs(2)),
        Ok(_) if ctx.boot == Boot::ReportReadyWithoutBooting => {
            ("Running", String::new(), Duration::from_secs(30))
        }
        Ok(disk) => {
            let machine = Machine {
                disk: &disk,
                memory_mib: memory_mib(vmi),
                cpus: 1,
            };
            ctx.guests
                .start(&key, &machine)
                .map_err(|e| Error::Guest(format!("{e:#}")))?;
            ("Running", String::new(), Duration::from_millis(500))
        }
    };
    let marker = ctx.guests.serial_line(&key, READY_MARKER);
    let booted = marker.is_some() || ctx.boot == Boot::ReportReadyWithoutBooting;
    let ready = phase == "Running" && booted;
    let (ready_reason, agent_reason) = match ctx.boot {
        Boot::Qemu => ("GuestReady", "GuestMarkerSeen"),
        Boot::ReportReadyWithoutBooting => (NO_BOOT_REASON, NO_BOOT_REASON),
    };
    let now = Timestamp::now().to_string();
    let condition = |type_: &str, ok: bool, why: &str| {
        let earlier = vmi.data["status"]["conditions"].as_array().and_then(|cs| {
            cs.iter()
                .find(|c| c["type"] == type_ && c["status"] == if ok { "True" } else { "False" })
                .cloned()
        });
        earlier.unwrap_or_else(|| {
            json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": why, "lastTransitionTime": now, "lastProbeTime": null})
        })
    };
    let waiting_reason = if phase == "Running" {
        "GuestNotReady"
    } else {
        "DiskNotReady"
    };
    let status = json!({
        "phase": phase,
        "nodeName": NODE,
        "reason": reason,
        "conditions": [
            condition("Ready", ready, if ready { ready_reason } else { waiting_reason }),
            condition("AgentConnected", ready, if ready { agent_reason } else { waiting_reason }),
        ],
    });
    let mut annotations = vmi.annotations().clone();
    if let Some(line) = &marker {
        annotations.insert(MARKER_ANNOTATION.to_string(), line.clone());
    }
    if vmi.data["status"] != status || vmi.annotations() != &annotations {
        let patch = json!({"metadata": {"annotations": annotations}, "status": status});
        vmis.patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(if ready {
        Action::requeue(Duration::from_secs(30))
    } else {
        Action::requeue(requeue)
    })
}

/// The first disk's image: its volume's PVC, bound to a hostPath PV holding `disk.img` (CDI's layout).
async fn boot_disk(
    vmi: &DynamicObject,
    ctx: &KubeVirt,
) -> Result<Result<std::path::PathBuf, String>, Error> {
    let spec = &vmi.data["spec"];
    let first_disk = spec["domain"]["devices"]["disks"][0]["name"]
        .as_str()
        .unwrap_or_default();
    let volume = spec["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == first_disk))
        .cloned()
        .unwrap_or(Value::Null);
    let claim = volume["dataVolume"]["name"]
        .as_str()
        .or(volume["persistentVolumeClaim"]["claimName"].as_str());
    let Some(claim) = claim else {
        return Ok(Err(format!(
            "the first disk {first_disk:?} has no dataVolume or persistentVolumeClaim volume"
        )));
    };
    let ns = vmi.namespace().unwrap_or_default();
    let Some(pvc) = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns)
        .get_opt(claim)
        .await?
    else {
        return Ok(Err(format!("PVC {claim} does not exist yet")));
    };
    let Some(pv_name) = pvc
        .spec
        .and_then(|s| s.volume_name)
        .filter(|n| !n.is_empty())
    else {
        return Ok(Err(format!("PVC {claim} is not bound yet")));
    };
    let pv = Api::<PersistentVolume>::all(ctx.client.clone())
        .get(&pv_name)
        .await?;
    let Some(path) = pv
        .spec
        .and_then(|s| s.host_path)
        .map(|h| std::path::PathBuf::from(h.path))
    else {
        return Ok(Err(format!("PV {pv_name} is not a hostPath volume")));
    };
    let image = if path.is_dir() {
        path.join("disk.img")
    } else {
        path
    };
    Ok(if image.exists() {
        Ok(image)
    } else {
        Err(format!("{} does not exist yet", image.display()))
    })
}

fn memory_mib(vmi: &DynamicObject) -> u64 {
    let domain = &vmi.data["spec"]["domain"];
    let quantity = domain["memory"]["guest"]
        .as_str()
        .or(domain["resources"]["requests"]["memory"].as_str())
        .unwrap_or("64Mi");
    let (number, unit) = quantity.split_at(
        quantity
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(quantity.len()),
    );
    let n: u64 = number.parse().unwrap_or(64);
    let mib = match unit {
        "Gi" => n * 1024,
        "Mi" => n,
        "G" => n * 1000 * 1000 * 1000 / (1 << 20),
        "M" => n * 1000 * 1000 / (1 << 20),
        _ => n / (1 << 20),
    };
    mib.clamp(16, 2048)
}
