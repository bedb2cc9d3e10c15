//! The KubeVirt stand-in. virt-controller's part (here): a VirtualMachine gets VirtualMachineInstances as its
//! `runStrategy` says, a VMI that failed before it ever ran counts as a start failure with KubeVirt's crash-loop
//! backoff, and `printableStatus` follows. virt-handler's and virt-launcher's part (`handler.rs`): each VMI runs
//! as a QEMU domain shaped by its spec (`domain.rs`); `Ready` means the domain runs, `AgentConnected` that the
//! guest's own qemu-guest-agent answered. Only what KubeVirt would do, nothing Ferry-specific.

pub mod accel;
pub mod agent;
pub mod domain;
mod handler;
pub mod multus;
mod pci;
pub mod qemu;
mod volumes;

pub use handler::pod_address;

use std::sync::Arc;
use std::time::Duration;

use ferry_api::foreign::VmiStatus;
pub use ferry_api::foreign::{vm_resource, vmi_resource};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use qemu::Guests;

/// What the lab's demo disks print on COM1 once booted; recorded on the VMI for people and tests, never a
/// condition.
pub const READY_MARKER: &str = "FERRY-GUEST-READY";
/// The serial line with the marker, recorded on the VMI for people and tests to read.
pub const MARKER_ANNOTATION: &str = "lab.ferry.dev/serial-marker";
pub(super) const MANAGER: &str = "kubevirt-standin";
/// The name its warnings carry.
const NAME: &str = "kubevirt stand-in";
pub const NODE: &str = "lab-node";
/// virt-controller's longest crash-loop backoff.
const MAX_BACKOFF_SECONDS: i64 = 300;

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
    /// Run the VMI's domain in QEMU, as virt-launcher would.
    Qemu,
    /// For `ferry bench controlplane` only: Running, Ready and AgentConnected (an address per NIC) as soon as
    /// its volumes are imported, with no QEMU, so a thousand migrations do not start a thousand guests. Marked by the
    /// `NoBootBenchmark` reason.
    ReportReadyWithoutBooting,
}

/// The condition reason a VMI gets in `Boot::ReportReadyWithoutBooting`.
pub const NO_BOOT_REASON: &str = "NoBootBenchmark";

/// The identities the stand-in writes as, so KubeVirt's admission treats its writes as it treats KubeVirt's own:
/// virt-controller creates and schedules VMIs, virt-handler updates those on its node.
#[derive(Clone)]
pub struct Identities {
    pub controller: Client,
    pub handler: Client,
}

/// virt-controller's and virt-handler's ServiceAccounts in a default install (namespace `kubevirt`).
pub const CONTROLLER_USER: &str = "system:serviceaccount:kubevirt:kubevirt-controller";
pub const HANDLER_USER: &str = "system:serviceaccount:kubevirt:kubevirt-handler";
/// What a node-bound ServiceAccount token carries, and KubeVirt's node restriction reads.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

impl Identities {
    /// `kubeconfig`'s identity impersonating virt-controller, and virt-handler on the lab's node. The roles they
    /// need are KubeVirt's own, installed with its admission (`tools/kubevirt-admission`).
    pub async fn impersonated(kubeconfig: &std::path::Path) -> anyhow::Result<Self> {
        use crate::control_plane::probe::client_impersonating;
        Ok(Self {
            controller: client_impersonating(kubeconfig, CONTROLLER_USER, &[]).await?,
            handler: client_impersonating(kubeconfig, HANDLER_USER, &[(NODE_NAME_EXTRA, NODE)])
                .await?,
        })
    }
}

/// What the KubeVirt stand-in's reconciles share.
pub(super) struct KubeVirt {
    /// Watches and finalizers; writes go as `identities` say.
    pub(super) client: Client,
    pub(super) identities: Identities,
    pub(super) guests: Guests,
    pub(super) boot: Boot,
    pub(super) state_dir: std::path::PathBuf,
}

/// Runs both controllers until `shutdown` resolves. `namespace: None` serves every namespace.
pub async fn run(
    client: Client,
    identities: Identities,
    namespace: Option<&str>,
    state_dir: &std::path::Path,
    boot: Boot,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let guests = Guests::new(state_dir)?;
    let ctx = Arc::new(KubeVirt {
        client: client.clone(),
        identities,
        state_dir: state_dir.canonicalize()?,
        guests,
        boot,
    });
    if boot == Boot::Qemu {
        // Probe KVM while the controllers start; the first guest waits for the answer.
        let scratch = ctx.state_dir.clone();
        tokio::task::spawn_blocking(move || accel::detect(&scratch));
    }
    let api = |r: &ApiResource| super::scoped_dynamic(&client, namespace, r);
    // One shutdown signal for both controllers.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let (mut rx_vm, mut rx_vmi) = (rx.clone(), rx);
    let vm_controller = Controller::new_with(
        api(&vm_resource()),
        watcher::Config::default(),
        vm_resource(),
    )
    .owns_with(
        api(&vmi_resource()),
        vmi_resource(),
        watcher::Config::default(),
    );
    let vms = super::run_controller(
        NAME,
        vm_controller,
        async move {
            let _ = rx_vm.wait_for(|s| *s).await;
        },
        reconcile_vm,
        ctx.clone(),
    );
    let vmi_controller = Controller::new_with(
        api(&vmi_resource()),
        watcher::Config::default(),
        vmi_resource(),
    );
    let vmis = super::run_controller(
        NAME,
        vmi_controller,
        async move {
            let _ = rx_vmi.wait_for(|s| *s).await;
        },
        handler::reconcile_vmi,
        ctx.clone(),
    );
    tokio::spawn(async move {
        shutdown.await;
        let _ = tx.send(true);
    });
    tokio::join!(vms, vmis);
    Ok(())
}

/// `spec.runStrategy`, or the deprecated `spec.running`; neither means Halted.
fn run_strategy(vm: &DynamicObject) -> String {
    match (
        vm.data["spec"]["runStrategy"].as_str(),
        &vm.data["spec"]["running"],
    ) {
        (Some(s), _) => s.to_string(),
        (None, Value::Bool(true)) => "Always".into(),
        _ => "Halted".into(),
    }
}

/// What virt-controller reads of a VMI.
#[derive(Clone, Debug, PartialEq)]
pub struct VmiView {
    pub uid: String,
    pub phase: String,
    pub deleting: bool,
    /// It reached Running once (`phaseTransitionTimestamps`).
    pub ever_running: bool,
}

impl VmiView {
    fn of(vmi: &DynamicObject) -> Self {
        let status = &vmi.data["status"];
        Self {
            uid: vmi.uid().unwrap_or_default(),
            phase: VmiStatus::of(vmi).phase.unwrap_or_default(),
            deleting: vmi.metadata.deletion_timestamp.is_some(),
            ever_running: status["phaseTransitionTimestamps"]
                .as_array()
                .is_some_and(|ts| ts.iter().any(|t| t["phase"] == "Running")),
        }
    }

    pub fn is_final(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// `status.startFailure`: consecutive VMIs that failed before they ran.
#[derive(Clone, Debug, PartialEq)]
pub struct StartFailure {
    pub count: u32,
    pub last_failed_uid: String,
    pub retry_after: Timestamp,
}

impl StartFailure {
    fn of(vm: &DynamicObject) -> Option<Self> {
        let f = &vm.data["status"]["startFailure"];
        Some(Self {
            count: u32::try_from(f["consecutiveFailCount"].as_u64()?).ok()?,
            last_failed_uid: f["lastFailedVMIUID"].as_str()?.to_string(),
            retry_after: f["retryAfterTimestamp"].as_str()?.parse().ok()?,
        })
    }

    fn to_json(&self) -> Value {
        json!({"consecutiveFailCount": self.count, "lastFailedVMIUID": self.last_failed_uid,
               "retryAfterTimestamp": self.retry_after.to_string()})
    }
}

fn restarts_failed(strategy: &str) -> bool {
    matches!(strategy, "Always" | "RerunOnFailure" | "Once")
}

/// virt-controller's backoff after `count` start failures: 10 s × count², plus up to half again at random
/// (`jitter` in 0..1) so failing VMs spread out, at most five minutes.
pub fn backoff_seconds(count: u32, jitter: f64) -> i64 {
    let delay = 10 * i64::from(count.max(1)).pow(2);
    let spread = ((delay / 2 + 1) as f64 * jitter.clamp(0.0, 0.999)) as i64;
    (delay + spread).min(MAX_BACKOFF_SECONDS)
}

/// The start failure after seeing `vmi`: cleared once a VMI ran (or nothing restarts it), counted once per
/// VMI that ended without ever running.
pub fn sync_start_failure(
    previous: Option<StartFailure>,
    vmi: Option<&VmiView>,
    strategy: &str,
    now: Timestamp,
    jitter: f64,
) -> Option<StartFailure> {
    if vmi.is_some_and(|v| v.ever_running) || !restarts_failed(strategy) {
        return None;
    }
    let Some(vmi) = vmi.filter(|v| v.is_final()) else {
        return previous;
    };
    if previous
        .as_ref()
        .is_some_and(|p| p.last_failed_uid == vmi.uid)
    {
        return previous;
    }
    let count = previous.map_or(1, |p| p.count + 1);
    Some(StartFailure {
        count,
        last_failed_uid: vmi.uid.clone(),
        retry_after: now + SignedDuration::from_secs(backoff_seconds(count, jitter)),
    })
}

/// What virt-controller does next for a VM.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Create,
    /// Delete the VMI; `restart` records a start request (RerunOnFailure after a failure).
    Delete {
        restart: bool,
    },
    /// Start again once the crash-loop backoff is over.
    WaitForBackoff(Duration),
    Nothing,
}

/// The run strategy's decision. `applied`: the VM's status already shows this strategy (so RerunOnFailure and
/// Once have started their VMI); `start_requested`: a start request is pending.
pub fn decide(
    strategy: &str,
    vmi: Option<&VmiView>,
    start_requested: bool,
    applied: bool,
    backoff_left: Duration,
) -> Step {
    let start = || {
        if backoff_left.is_zero() {
            Step::Create
        } else {
            Step::WaitForBackoff(backoff_left)
        }
    };
    let live = vmi.filter(|v| !v.deleting);
    match strategy {
        "Always" => match (vmi, live) {
            (_, Some(v)) if v.is_final() => Step::Delete { restart: false },
            (None, _) => start(),
            _ => Step::Nothing,
        },
        "RerunOnFailure" => match (vmi, live) {
            (_, Some(v)) if v.phase == "Failed" => Step::Delete { restart: true },
            (_, Some(v)) if v.phase == "Succeeded" => Step::Delete { restart: false },
            (None, _) if start_requested || !applied => start(),
            _ => Step::Nothing,
        },
        "Once" => match vmi {
            None if !applied => start(),
            _ => Step::Nothing,
        },
        "Halted" => match live {
            Some(_) => Step::Delete { restart: false },
            None => Step::Nothing,
        },
        // Manual: started and stopped through the API's subresources, which the lab does not serve.
        _ => Step::Nothing,
    }
}

/// `status.printableStatus`, KubeVirt's order of checks for what the lab can show.
pub fn printable_status(
    vm_deleting: bool,
    strategy: &str,
    vmi: Option<&VmiView>,
    creating: bool,
    start_failure: Option<&StartFailure>,
) -> &'static str {
    let crash_loop =
        !creating && restarts_failed(strategy) && start_failure.is_some_and(|f| f.count > 0);
    if vm_deleting {
        return "Terminating";
    }
    match vmi {
        Some(v) if !v.is_final() && (v.deleting || strategy == "Halted") => "Stopping",
        Some(v) if v.phase == "Running" => "Running",
        Some(v) if !v.is_final() => "Starting",
        None if creating => "Starting",
        _ if crash_loop => "CrashLoopBackOff",
        _ => "Stopped",
    }
}

/// virt-controller's `Failure` condition for a VMI it could not create; its transition time stays while the
/// message does.
fn failure_condition(vm: &DynamicObject, message: String, now: Timestamp) -> Value {
    let earlier = vm.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Failure"))
        .filter(|c| c["message"] == message.as_str());
    let since = earlier
        .map(|c| c["lastTransitionTime"].clone())
        .unwrap_or_else(|| json!(now.to_string()));
    json!({"type": "Failure", "status": "True", "reason": "FailedCreate", "message": message,
        "lastProbeTime": null, "lastTransitionTime": since})
}

/// virt-controller's `syncConditions`: the VM's `Ready` is its VMI's (or says there is none), every other
/// condition of the VMI is copied and kept once the VMI is gone, and a sync error is the `Failure` condition. A
/// condition is replaced only when its status or reason changes.
fn vm_conditions(
    vm: &DynamicObject,
    vmi: Option<&DynamicObject>,
    failure: Option<Value>,
    now: Timestamp,
) -> Vec<Value> {
    const NOT_COPIED: [&str; 3] = ["Ready", "Failure", "RestartRequired"];
    let mut conditions: Vec<Value> = vm.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] != "Failure")
        .cloned()
        .collect();
    let update = |conditions: &mut Vec<Value>, new: Value| match conditions
        .iter_mut()
        .find(|c| c["type"] == new["type"])
    {
        Some(old) if old["status"] != new["status"] || old["reason"] != new["reason"] => *old = new,
        Some(_) => {}
        None => conditions.push(new),
    };
    let missing = |reason: &str, message: &str| {
        json!({"type": "Ready", "status": "False", "reason": reason, "message": message,
               "lastProbeTime": now.to_string(), "lastTransitionTime": now.to_string()})
    };
    let vmi_conditions: Vec<Value> = vmi
        .and_then(|v| v.data["status"]["conditions"].as_array().cloned())
        .unwrap_or_default();
    let ready = match vmi {
        None => missing("VMINotExists", "VMI does not exist"),
        Some(_) => vmi_conditions
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
            .unwrap_or_else(|| {
                missing("VMIConditionMissing", "VMI is missing the Ready condition")
            }),
    };
    update(&mut conditions, ready);
    if let Some(failure) = failure {
        conditions.push(failure);
    }
    if vmi.is_some() {
        let copied: Vec<&Value> = vmi_conditions
            .iter()
            .filter(|c| !NOT_COPIED.iter().any(|t| c["type"] == *t))
            .collect();
        for c in &copied {
            update(&mut conditions, (*c).clone());
        }
        conditions.retain(|c| {
            NOT_COPIED.iter().any(|t| c["type"] == *t)
                || copied.iter().any(|v| v["type"] == c["type"])
        });
    }
    conditions
}

/// The VMI virt-controller creates from the VM's template.
fn new_vmi(vm: &DynamicObject) -> DynamicObject {
    let owner = vm
        .controller_owner_ref(&vm_resource())
        .expect("a stored VM has a uid");
    let template = &vm.data["spec"]["template"];
    let mut new = DynamicObject::new(&vm.name_any(), &vmi_resource())
        .within(&vm.namespace().unwrap_or_default());
    new.metadata.labels = serde_json::from_value(template["metadata"]["labels"].clone()).ok();
    new.metadata.annotations =
        serde_json::from_value(template["metadata"]["annotations"].clone()).ok();
    new.metadata.owner_references = Some(vec![owner]);
    new.data = json!({"spec": template["spec"].clone()});
    new
}

/// virt-controller's part: a VMI exists as the run strategy says; the VM's status tells how it goes.
async fn reconcile_vm(vm: Arc<DynamicObject>, ctx: Arc<KubeVirt>) -> Result<Action, Error> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let controller = ctx.identities.controller.clone();
    let vmis = Api::<DynamicObject>::namespaced_with(controller.clone(), &ns, &vmi_resource());
    let vms = Api::<DynamicObject>::namespaced_with(controller, &ns, &vm_resource());
    let strategy = run_strategy(&vm);
    let vm_deleting = vm.metadata.deletion_timestamp.is_some();
    let mut vmi = vmis.get_opt(&name).await?;
    let view = vmi.as_ref().map(VmiView::of);
    let now = Timestamp::now();
    let jitter = (agent::random_id() % 1000) as f64 / 1000.0;
    let start_failure =
        sync_start_failure(StartFailure::of(&vm), view.as_ref(), &strategy, now, jitter);
    let backoff_left = start_failure
        .as_ref()
        .map(|f| f.retry_after.duration_since(now))
        .filter(|d| d.is_positive())
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    let status = &vm.data["status"];
    let mut start_requested = status["stateChangeRequests"]
        .as_array()
        .is_some_and(|rs| rs.iter().any(|r| r["action"] == "Start"));
    let applied = status["runStrategy"] == strategy.as_str();
    let step = if vm_deleting {
        Step::Nothing
    } else {
        decide(
            &strategy,
            view.as_ref(),
            start_requested,
            applied,
            backoff_left,
        )
    };
    let mut creating = false;
    let mut requeue = Duration::from_secs(30);
    // virt-controller's sync error, kept on the VM as its `Failure` condition until a sync succeeds.
    let mut sync_failure = None;
    match &step {
        Step::Create => match vmis.create(&PostParams::default(), &new_vmi(&vm)).await {
            Ok(created) => {
                vmi = Some(created);
                start_requested = false;
                creating = true;
            }
            // Refused (admission, quota): said on the VM, and tried again as virt-controller does.
            Err(kube::Error::Api(refused)) if refused.code < 500 => {
                sync_failure = Some(format!("Failure while starting VMI: {}", refused.message));
                requeue = Duration::from_secs(10);
            }
            Err(e) => return Err(e.into()),
        },
        Step::Delete { restart } => {
            vmis.delete(&name, &DeleteParams::default()).await?;
            start_requested |= *restart;
            requeue = Duration::from_secs(1);
        }
        Step::WaitForBackoff(left) => requeue = *left,
        Step::Nothing => {}
    }
    let view = vmi.as_ref().map(VmiView::of);
    let printable = printable_status(
        vm_deleting,
        &strategy,
        view.as_ref(),
        creating,
        start_failure.as_ref(),
    );
    let mut new_status = json!({
        "printableStatus": printable,
        "ready": vmi.as_ref().is_some_and(|v| VmiStatus::of(v).is_true("Ready")),
        "created": vmi.is_some(),
        "runStrategy": strategy,
    });
    if let Some(failure) = &start_failure {
        new_status["startFailure"] = failure.to_json();
    }
    let failure = sync_failure.map(|message| failure_condition(&vm, message, now));
    let conditions = vm_conditions(&vm, vmi.as_ref(), failure, now);
    if !conditions.is_empty() {
        new_status["conditions"] = json!(conditions);
    }
    if start_requested {
        new_status["stateChangeRequests"] = json!([{"action": "Start"}]);
    }
    if vm.data["status"] != new_status {
        let patch =
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "status": new_status});
        vms.patch_status(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(Action::requeue(requeue))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(phase: &str, ever_running: bool) -> VmiView {
        VmiView {
            uid: format!("uid-{phase}"),
            phase: phase.into(),
            deleting: false,
            ever_running,
        }
    }

    #[test]
    fn run_strategies_create_and_delete_as_kubevirt() {
        let none = Duration::ZERO;
        let failed = vmi("Failed", true);
        let succeeded = vmi("Succeeded", true);
        let running = vmi("Running", true);
        assert_eq!(decide("Always", None, false, true, none), Step::Create);
        assert_eq!(
            decide("Always", Some(&failed), false, true, none),
            Step::Delete { restart: false }
        );
        assert_eq!(
            decide("Always", Some(&succeeded), false, true, none),
            Step::Delete { restart: false }
        );
        assert_eq!(
            decide("Always", Some(&running), false, true, none),
            Step::Nothing
        );
        let wait = Duration::from_secs(12);
        assert_eq!(
            decide("Always", None, false, true, wait),
            Step::WaitForBackoff(wait)
        );
        // RerunOnFailure: a new VMI after a failure, none after a clean shutdown.
        assert_eq!(
            decide("RerunOnFailure", Some(&failed), false, true, none),
            Step::Delete { restart: true }
        );
        assert_eq!(
            decide("RerunOnFailure", Some(&succeeded), false, true, none),
            Step::Delete { restart: false }
        );
        assert_eq!(
            decide("RerunOnFailure", None, true, true, none),
            Step::Create
        );
        assert_eq!(
            decide("RerunOnFailure", None, false, true, none),
            Step::Nothing
        );
        assert_eq!(
            decide("RerunOnFailure", None, false, false, none),
            Step::Create
        );
        assert_eq!(decide("Once", None, false, false, none), Step::Create);
        assert_eq!(decide("Once", None, false, true, none), Step::Nothing);
        assert_eq!(
            decide("Once", Some(&failed), false, true, none),
            Step::Nothing
        );
        assert_eq!(
            decide("Halted", Some(&running), false, true, none),
            Step::Delete { restart: false }
        );
        assert_eq!(decide("Halted", None, false, true, none), Step::Nothing);
        let mut going = running.clone();
        going.deleting = true;
        assert_eq!(
            decide("Halted", Some(&going), false, true, none),
            Step::Nothing
        );
        assert_eq!(
            decide("Always", Some(&going), false, true, none),
            Step::Nothing
        );
    }

    #[test]
    fn vmis_that_never_ran_back_off_and_a_run_clears_the_count() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let early = vmi("Failed", false);
        let first = sync_start_failure(None, Some(&early), "Always", now, 0.0).unwrap();
        assert_eq!(first.count, 1);
        assert_eq!(first.retry_after, now + SignedDuration::from_secs(10));
        // The same VMI is counted once.
        assert_eq!(
            sync_start_failure(Some(first.clone()), Some(&early), "Always", now, 0.5),
            Some(first.clone())
        );
        let mut next = vmi("Failed", false);
        next.uid = "uid-2".into();
        let second =
            sync_start_failure(Some(first.clone()), Some(&next), "Always", now, 0.0).unwrap();
        assert_eq!(
            (second.count, second.last_failed_uid.as_str()),
            (2, "uid-2")
        );
        assert_eq!(second.retry_after, now + SignedDuration::from_secs(40));
        assert_eq!(
            sync_start_failure(Some(second.clone()), None, "Always", now, 0.0),
            Some(second.clone()),
            "kept while no VMI exists"
        );
        assert_eq!(
            sync_start_failure(
                Some(second.clone()),
                Some(&vmi("Failed", true)),
                "Always",
                now,
                0.0
            ),
            None,
            "a VMI that ran clears it"
        );
        assert_eq!(
            sync_start_failure(Some(second), None, "Halted", now, 0.0),
            None
        );
        assert_eq!(backoff_seconds(1, 0.0), 10);
        assert_eq!(backoff_seconds(1, 0.999), 15);
        assert_eq!(backoff_seconds(3, 0.0), 90);
        assert_eq!(backoff_seconds(9, 0.5), MAX_BACKOFF_SECONDS);
    }

    #[test]
    fn printable_status_follows_the_vmi_and_the_backoff() {
        let failure = StartFailure {
            count: 2,
            last_failed_uid: "x".into(),
            retry_after: Timestamp::now(),
        };
        let running = vmi("Running", true);
        let scheduling = vmi("Scheduling", false);
        let failed = vmi("Failed", false);
        assert_eq!(
            printable_status(true, "Always", Some(&running), false, None),
            "Terminating"
        );
        assert_eq!(
            printable_status(false, "Always", Some(&running), false, None),
            "Running"
        );
        assert_eq!(
            printable_status(false, "Halted", Some(&running), false, None),
            "Stopping"
        );
        assert_eq!(
            printable_status(false, "Always", Some(&scheduling), true, None),
            "Starting"
        );
        assert_eq!(
            printable_status(false, "Always", None, true, Some(&failure)),
            "Starting"
        );
        assert_eq!(
            printable_status(false, "Always", Some(&failed), false, Some(&failure)),
            "CrashLoopBackOff"
        );
        assert_eq!(
            printable_status(false, "Always", None, false, Some(&failure)),
            "CrashLoopBackOff"
        );
        assert_eq!(
            printable_status(false, "Halted", None, false, Some(&failure)),
            "Stopped"
        );
        assert_eq!(
            printable_status(false, "Always", Some(&failed), false, None),
            "Stopped"
        );
        assert_eq!(
            printable_status(false, "Halted", None, false, None),
            "Stopped"
        );
    }
}
