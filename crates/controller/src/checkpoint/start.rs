//! Starting. Desired: the VMI Running or Failed, or the VM in KubeVirt's crash loop, or the VMI's launcher pod
//! refused (the guest check judges them all), or the VM left Halted when `runStrategy: Halted`. Observed: the VM's run strategy and status, the VMI's
//! phase. Action: set the run strategy. Recorded: VMStarted.

use std::time::Duration;

use ferry_api::foreign::{VmSpec, VmStatus, VmiStatus};
use ferry_api::{Reason, RunStrategy};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::step::{Next, Step};
use crate::build::{self, vm_resource, vmi_resource};
use crate::children;
use crate::error::{Failure, Result};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let name = children::vm_name(step.vmm);
    let wanted = build::vm::run_strategy(step.vmm.spec.target.run_strategy);
    let vms = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vm_resource());
    let vm = vms.get_opt(&name).await?.ok_or_else(|| {
        Failure::transient(
            Reason::VMMissing,
            format!("VirtualMachine {name} is gone; it will be recreated"),
        )
    })?;
    if VmSpec::of(&vm).run_strategy.as_deref() != Some(wanted) {
        let patch = serde_json::json!({"spec": {"runStrategy": wanted}});
        vms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(Next::wait(
            "VMStarting",
            format!("runStrategy set to {wanted}"),
            Duration::from_secs(1),
        ));
    }
    if step.vmm.spec.target.run_strategy == RunStrategy::Halted {
        return Ok(Next::advance(
            "VMHaltedAsAsked",
            "runStrategy Halted: the VM is not started",
        ));
    }
    let vmis = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vmi_resource());
    let vmi = vmis.get_opt(&name).await?.map(|vmi| VmiStatus::of(&vmi));
    let phase = vmi
        .as_ref()
        .and_then(|vmi| vmi.phase.clone())
        .unwrap_or_else(|| "Absent".into());
    if let Some(refused) = vmi.as_ref().and_then(VmiStatus::pod_refused) {
        // The instance exists but its pod is refused (KubeVirt retries): the guest check says why, within its
        // timeout, and stops the VM keeping its volumes if nothing changes.
        return Ok(Next::advance(
            "VMIPodRefused",
            format!(
                "KubeVirt cannot create the launcher pod of VirtualMachineInstance {name}: {refused}; the guest \
                 check follows up"
            ),
        ));
    }
    if phase == "Absent"
        && let Some(refused) = VmStatus::of(&vm).start_refused()
    {
        // KubeVirt keeps trying; until it can, the migration says what it is told.
        return Ok(Next::wait(
            "VMICreateRefused",
            format!("KubeVirt cannot create VirtualMachineInstance {name}: {refused}"),
            Duration::from_secs(30),
        ));
    }
    if phase == "Absent"
        && let Some(looping) = VmStatus::of(&vm).crash_looping()
    {
        // Between KubeVirt's tries there is no instance to see fail: the guest check judges the crash loop,
        // within its timeout, and stops the VM keeping its volumes.
        return Ok(Next::advance(
            "VMIFailed",
            format!("VirtualMachine {name} is in {looping}; the guest check follows up"),
        ));
    }
    match phase.as_str() {
        "Running" => Ok(Next::advance(
            "VMIRunning",
            format!("VirtualMachineInstance {} is Running", vm.name_any()),
        )),
        // The guest check stops and keeps the VM: a failed start never costs the copy.
        "Failed" => Ok(Next::advance(
            "VMIFailed",
            format!("VirtualMachineInstance {name} failed to start; the guest check follows up"),
        )),
        other => Ok(Next::wait(
            "VMStarting",
            format!("VirtualMachineInstance {name} is {other}"),
            // VMIs are watched (by the target name in status): a started instance wakes this sooner.
            Duration::from_secs(30),
        )),
    }
}
