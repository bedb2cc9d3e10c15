//! Validating (guest). Desired: the guest booted and answered. Observed: the VMI's Ready and AgentConnected
//! conditions. Action: none until then; then the hand-over: the VM and its DataVolumes stop being owned by the
//! migration, and its Jobs and staged images are removed. Recorded: GuestReady, then Ready.

use std::time::Duration;

use ferry_api::foreign::VmiStatus;
use ferry_api::{Phase, Reason, RunStrategy};
use kube::api::DynamicObject;
use kube::{Api, ResourceExt};

use super::{Next, Step};
use crate::build::vmi_resource;
use crate::children;
use crate::error::{Failure, Result};
use crate::owned::Owned;

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let name = children::vm_name(step.vmm);
    if step.vmm.spec.target.run_strategy != RunStrategy::Halted {
        let vmi =
            Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vmi_resource())
                .get_opt(&name)
                .await?;
        let status = vmi.as_ref().map(VmiStatus::of).unwrap_or_default();
        let (ready, agent) = (status.is_true("Ready"), status.is_true("AgentConnected"));
        if !(ready && agent) {
            let entered = step
                .status
                .checkpoints
                .iter()
                .find(|c| c.phase == Phase::ValidatingGuest)
                .map(|c| c.entered.0)
                .unwrap_or(step.now.0);
            let waited = step.now.0.duration_since(entered).as_secs().max(0) as u64;
            if waited > step.ctx.config.guest_ready_timeout.as_secs() {
                return Err(Failure::permanent(
                    Reason::GuestNotReady,
                    format!(
                        "the guest of {name} did not report ready within {}s (Ready={ready}, AgentConnected={agent}); \
                         check its console: drivers for the disk bus or the boot firmware may be missing",
                        step.ctx.config.guest_ready_timeout.as_secs()
                    ),
                ));
            }
            return Ok(Next::wait(
                "WaitingForGuest",
                format!("VMI {name}: Ready={ready}, AgentConnected={agent}"),
                Duration::from_secs(15),
            ));
        }
    }
    hand_over(step).await?;
    Ok(Next::advance(
        "GuestReady",
        format!("the guest of {name} booted and answered; the VM and its disks are handed over"),
    ))
}

/// Idempotent: what is already handed over or removed is skipped.
async fn hand_over(step: &Step<'_>) -> Result<()> {
    let owned = Owned::of(step.ctx, step.vmm);
    owned.release_kept_kinds().await?;
    owned.delete_jobs().await?;
    let staging = crate::staging::open(step.ctx, step.vmm).await?;
    for object in crate::staging::object_names(step.status.disks.len()) {
        staging.delete(&object).await?;
    }
    Ok(())
}
