//! ValidatingGuest. Desired: proof that the migrated guest came up, as much as the guest can give: its QEMU agent
//! answering, or, from a guest without one, the VM running without a crash or restart for `settleSeconds`.
//! Observed: the VM and its VMI (phase, Ready and AgentConnected, what the agent reported). Action: on success the
//! hand-over (the VM and its DataVolumes stop being owned by the migration; Jobs and staged images go); on failure
//! the VM is stopped and kept with its disks, and the source powered on if asked. Recorded: `status.guest`, then
//! GuestReady and Ready, or GuestNotReady for a person to look at.

use std::time::Duration;

use ferry_api::foreign::{VmSpec, VmStatus, VmiStatus};
use ferry_api::{
    GuestAdaptation, GuestAgent, GuestEvidence, GuestStatus, Phase, Reason, RunStrategy,
    VirtualMachineMigration,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::step::{Next, Step};
use super::support::cleanup;
use crate::build::{vm_resource, vmi_resource};
use crate::children;
use crate::error::{Failure, Result};
use crate::owned::Owned;

mod identity;
mod judge;

pub use judge::{Check, Observed, Verdict, judge};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let name = children::vm_name(step.vmm);
    if step.vmm.spec.target.run_strategy == RunStrategy::Halted {
        step.status.guest = Some(GuestStatus {
            message: "runStrategy Halted: the VM was not started, so the guest was not checked"
                .into(),
            ..Default::default()
        });
        hand_over(step).await?;
        return Ok(Next::advance(
            "VMHandedOver",
            format!("{name} was left Halted as asked and is handed over"),
        ));
    }
    let ns = step.vmm.namespace().unwrap_or_default();
    let client = step.ctx.client.clone();
    let vms = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &vm_resource());
    let vmis = Api::<DynamicObject>::namespaced_with(client, &ns, &vmi_resource());
    let vm = vms.get_opt(&name).await?;
    let vmi = vmis.get_opt(&name).await?;
    let halted = vm
        .as_ref()
        .is_none_or(|vm| VmSpec::of(vm).run_strategy.as_deref() == Some("Halted"));
    // A check that failed stays failed until a person starts the VM again; its window then starts anew.
    let failed_at = guest_failure(step.status);
    if let Some((_, message)) = &failed_at
        && halted
    {
        let message = message.clone();
        return match contain(step, &vms, vmi.is_some()).await? {
            Some(wait) => Ok(wait),
            None => Err(Failure::fixable(Reason::GuestNotReady, message)),
        };
    }
    let entered = step
        .status
        .checkpoints
        .iter()
        .find(|c| c.phase == Phase::ValidatingGuest)
        .map_or(step.now.0, |c| c.entered.0);
    let window_start = match failed_at {
        Some((at, _)) => vmi
            .as_ref()
            .and_then(|v| v.creation_timestamp())
            .map_or(step.now.0, |created| created.0.max(at)),
        None => entered,
    };
    let observed = Observed::read(vm.as_ref(), vmi.as_ref());
    let windows = step
        .status
        .source
        .as_ref()
        .is_some_and(crate::build::vm::is_windows);
    let network = step.status.source.as_ref().map_or_else(Vec::new, |source| {
        let names = step
            .status
            .adaptation
            .as_ref()
            .and_then(|a| a.interface_names.as_ref());
        let on_pod = vm
            .as_ref()
            .map(|vm| identity::pod_network_macs(&vm.data))
            .unwrap_or_default();
        identity::expected(source, names, &on_pod)
    });
    let verdict = judge(
        &check(step.vmm, windows, network),
        &observed,
        window_start,
        step.now.0,
    );
    match verdict {
        Verdict::Proven(guest) => {
            let message = guest.message.clone();
            step.status.guest = Some(guest);
            hand_over(step).await?;
            Ok(Next::advance(
                "GuestReady",
                format!("{name}: {message}; the VM and its disks are handed over"),
            ))
        }
        Verdict::Waiting {
            reason,
            message,
            recheck,
        } => Ok(Next::wait(reason, message, recheck)),
        Verdict::Failed { cause } => {
            step.status.guest = Some(GuestStatus {
                evidence: GuestEvidence::NotProven,
                message: cause.clone(),
                ..Default::default()
            });
            let message = failure_message(step.vmm, &name, &cause, step.status.disks.len());
            // Stopping takes a moment: later passes finish it (and power the source on) from the recorded error.
            contain(step, &vms, vmi.is_some()).await?;
            Err(Failure::fixable(Reason::GuestNotReady, message))
        }
    }
}

/// What an adapted Windows guest's first boot adds to the check's timeout: virt-v2v's first-boot service installs
/// the drivers, the guest agent and removes VMware Tools, and Windows reboots for them before the agent answers.
pub const WINDOWS_FIRST_BOOT: Duration = Duration::from_secs(600);

/// What the spec asks of the guest check, with the defaults resolved; `windows` as vSphere called the guest.
fn check(
    vmm: &VirtualMachineMigration,
    windows: bool,
    network: Vec<identity::ExpectedNic>,
) -> Check {
    let spec = &vmm.spec.guest_check;
    let adapted = vmm.spec.conversion.guest_adaptation == GuestAdaptation::VirtV2v;
    let first_boot = if adapted && windows {
        WINDOWS_FIRST_BOOT
    } else {
        Duration::ZERO
    };
    Check {
        agent_required: spec.agent.unwrap_or(if adapted {
            GuestAgent::Required
        } else {
            GuestAgent::Optional
        }) == GuestAgent::Required,
        settle: Duration::from_secs(spec.settle_seconds.max(0) as u64),
        timeout: Duration::from_secs(spec.timeout_seconds.max(0) as u64) + first_boot,
        network,
        network_must_match: !windows,
    }
}

/// When and why the guest check last failed, if it is the error on record.
fn guest_failure(status: &ferry_api::VirtualMachineMigrationStatus) -> Option<(Timestamp, String)> {
    let error = status.retry.as_ref()?.last_error.as_ref()?;
    (error.phase == Phase::ValidatingGuest && error.reason == Reason::GuestNotReady.as_str())
        .then(|| (error.time.0, error.message.clone()))
}

/// What went wrong, what Ferry did about it and what a person can do, in one message that stays the same on
/// every later pass (so it is recorded once).
fn failure_message(vmm: &VirtualMachineMigration, name: &str, cause: &str, disks: usize) -> String {
    let source = if vmm.spec.source.restore_power_state {
        "the source VM is powered on again once the target has stopped (restorePowerState)"
    } else {
        "the source VM stays powered off (restorePowerState is false): power it on in vSphere if you need it"
    };
    format!(
        "{cause}. VirtualMachine {name} is stopped (runStrategy Halted) and kept with its {disks} DataVolume(s); \
         nothing was deleted, and {source}. Look at its console (virtctl console {name}): a guest without virtio \
         drivers needs target.devices Compatibility or conversion.guestAdaptation VirtV2v. Start the VM \
         (virtctl start {name}) to check it again, or delete this migration to remove the VM and its disks"
    )
}

/// Stops the target and, once its instance is gone, powers the source on if asked. `Some` while the instance
/// is still going away.
async fn contain(
    step: &mut Step<'_>,
    vms: &Api<DynamicObject>,
    instance_exists: bool,
) -> Result<Option<Next>> {
    let name = children::vm_name(step.vmm);
    if let Some(vm) = vms.get_opt(&name).await?
        && VmSpec::of(&vm).run_strategy.as_deref() != Some("Halted")
    {
        let patch = serde_json::json!({"spec": {"runStrategy": "Halted"}});
        vms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(Some(stopping(&name)));
    }
    if instance_exists {
        return Ok(Some(stopping(&name)));
    }
    cleanup::restore_power(step).await?;
    Ok(None)
}

fn stopping(name: &str) -> Next {
    Next::wait(
        "StoppingTarget",
        format!("stopping VirtualMachine {name} after a failed guest check"),
        Duration::from_secs(2),
    )
}

/// Idempotent: what is already handed over or removed is skipped.
async fn hand_over(step: &Step<'_>) -> Result<()> {
    let owned = Owned::of(step.ctx, step.vmm);
    owned.release_kept_kinds().await?;
    owned.delete_jobs().await?;
    super::support::credentials::take_back(step.ctx, step.vmm).await?;
    if crate::staging::staged(step.vmm) {
        let staging = crate::staging::open(step.ctx, step.vmm).await?;
        staging
            .delete_all(&crate::staging::object_names(step.status.disks.len()))
            .await?;
    }
    Ok(())
}

impl Observed {
    fn read(vm: Option<&DynamicObject>, vmi: Option<&DynamicObject>) -> Self {
        let status = vmi.map(VmiStatus::of).unwrap_or_default();
        let since = |type_: &str| {
            status
                .condition(type_)
                .filter(|c| c.status == "True")
                .map(|c| {
                    c.last_transition_time
                        .as_deref()
                        .or(c.last_probe_time.as_deref())
                        .and_then(|t| t.parse::<Timestamp>().ok())
                        .or_else(|| vmi.and_then(|v| v.creation_timestamp()).map(|t| t.0))
                        .unwrap_or(Timestamp::UNIX_EPOCH)
                })
        };
        Observed {
            vm_exists: vm.is_some(),
            vm_status: vm.and_then(|vm| VmStatus::of(vm).printable_status),
            vmi_phase: vmi.map(|_| status.phase.clone().unwrap_or_else(|| "Pending".into())),
            ready_since: since("Ready"),
            agent_connected: status.is_true("AgentConnected"),
            agent_since: since("AgentConnected"),
            os: status
                .guest_os_info
                .as_ref()
                .and_then(|os| os.pretty_name.clone().or(os.name.clone())),
            ip_addresses: status
                .interfaces
                .iter()
                .flat_map(|i| {
                    if i.ip_addresses.is_empty() {
                        i.ip_address.iter().cloned().collect()
                    } else {
                        i.ip_addresses.clone()
                    }
                })
                .collect(),
            interfaces: identity::seen(&status.interfaces),
            pod_refused: status.pod_refused().map(String::from),
            not_synchronized: status.not_synchronized(),
            conditions: status
                .conditions
                .iter()
                .map(|c| match &c.reason {
                    Some(reason) if !reason.is_empty() => {
                        format!("{}={} ({reason})", c.type_, c.status)
                    }
                    _ => format!("{}={}", c.type_, c.status),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VMI as KubeVirt v1.9.0's virt-handler reported it on the lab's real node (Ferry's Debian 12 guest under
    /// software emulation, masquerade on the pod network), trimmed to what the check reads.
    const VMI: &str = include_str!("guest/kubevirt-v1.9.0-vmi-agent-connected.json");

    fn vmi(guest_os_info: serde_json::Value) -> DynamicObject {
        let mut vmi: serde_json::Value = serde_json::from_str(VMI).unwrap();
        vmi["status"]["guestOSInfo"] = guest_os_info;
        serde_json::from_value(vmi).unwrap()
    }

    fn vm() -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "ferry-linux-bios", "namespace": "ferry-demo"},
            "status": {"printableStatus": "Running", "ready": true}}))
        .unwrap()
    }

    fn at(rfc3339: &str) -> Timestamp {
        rfc3339.parse().unwrap()
    }

    #[test]
    fn an_adapted_windows_guest_gets_time_for_its_first_boot_and_nothing_else_does() {
        let migration = |adaptation: &str| {
            VirtualMachineMigration::new(
                "m",
                serde_json::from_value(serde_json::json!({
                    "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
                    "conversion": {"guestAdaptation": adaptation},
                    "guestCheck": {"timeoutSeconds": 300}}))
                .unwrap(),
            )
        };
        let adapted = migration("VirtV2v");
        assert_eq!(
            check(&adapted, true, vec![]).timeout,
            Duration::from_secs(300) + WINDOWS_FIRST_BOOT
        );
        assert!(check(&adapted, true, vec![]).agent_required);
        assert_eq!(
            check(&adapted, false, vec![]).timeout,
            Duration::from_secs(300)
        );
        assert_eq!(
            check(&migration("None"), true, vec![]).timeout,
            Duration::from_secs(300),
            "no first-boot service without adaptation"
        );
    }

    #[test]
    fn kubevirts_agent_answer_is_waited_on_until_it_has_said_what_os_runs() {
        let check = Check {
            agent_required: true,
            settle: Duration::from_secs(60),
            timeout: Duration::from_secs(900),
            network: vec![],
            network_must_match: true,
        };
        // KubeVirt marks the agent connected (a probe time, no transition time) and reports the masquerade
        // interface's address from the domain before it has asked the agent about the guest.
        let connected = Observed::read(Some(&vm()), Some(&vmi(serde_json::json!({}))));
        assert_eq!(connected.agent_since, Some(at("2026-12-06T09:49:12Z")));
        assert_eq!(connected.ip_addresses, ["10.88.0.19"]);
        let verdict = judge(
            &check,
            &connected,
            at("2026-12-06T09:48:43Z"),
            at("2026-12-06T09:49:13Z"),
        );
        let Verdict::Waiting {
            reason, message, ..
        } = verdict
        else {
            panic!("an answer without the guest's OS is not yet the proof: {verdict:?}");
        };
        assert_eq!(reason, "WaitingForGuestInfo");
        assert_eq!(
            message,
            "the guest agent answered; waiting until 09:50:12 UTC for the guest's OS"
        );

        let as_reported =
            serde_json::from_str::<serde_json::Value>(VMI).unwrap()["status"]["guestOSInfo"]
                .clone();
        let reported = Observed::read(Some(&vm()), Some(&vmi(as_reported)));
        let Verdict::Proven(guest) = judge(
            &check,
            &reported,
            at("2026-12-06T09:48:43Z"),
            at("2026-12-06T09:49:22Z"),
        ) else {
            panic!("the agent said what runs");
        };
        assert_eq!(
            guest.message,
            "guest agent answered: Debian GNU/Linux 12 (bookworm), 10.88.0.19"
        );
    }
}
