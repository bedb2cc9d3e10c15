//! CreatingVM. Desired: the VirtualMachine exists with the source's shape, owned by the migration. Observed: the
//! VM object. Action: create it if absent (Halted), update its template if it differs. Recorded: VMCreated.

use ferry_api::Reason;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, ResourceExt};

use super::step::{Next, Step};
use crate::build::{self, vm_resource};
use crate::children;
use crate::error::{Failure, Result};

pub async fn run(step: &mut Step<'_>) -> Result<Next> {
    let ns = step.vmm.namespace().unwrap_or_default();
    let source = super::support::source::recorded(step.status)?;
    let desired = build::vm::adapted_virtual_machine(
        step.vmm,
        source.clone(),
        step.status.adaptation.as_ref(),
    );
    let name = desired.name_any();
    let vms = Api::<DynamicObject>::namespaced_with(step.ctx.client.clone(), &ns, &vm_resource());
    let Some(observed) = vms.get_opt(&name).await? else {
        ferry_kube::create::create_if_absent(&vms, &desired).await?;
        return Ok(Next::persist(
            "VMCreated",
            format!("VirtualMachine {name} created"),
        ));
    };
    if !children::is_ours(&observed, step.vmm) {
        return Err(Failure::fixable(
            Reason::TargetVMExists,
            format!(
                "VirtualMachine {ns}/{name} exists and is not this migration's; delete or rename it"
            ),
        ));
    }
    if step.status.target_vm_uid.is_none() {
        step.status.target_vm_uid = observed.uid();
    }
    if !ferry_kube::apply::is_subset(build::vm::shape(&desired), build::vm::shape(&observed)) {
        let patch = serde_json::json!({"spec": {"template": build::vm::shape(&desired)}});
        let stored = vms
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        // The cluster's admission rewrote what was just written (a mutating webhook, a normalised value):
        // writing it again would loop forever, so the VM is kept as admitted, and the message says where.
        if let Some(path) = ferry_kube::apply::first_difference(
            build::vm::shape(&desired),
            build::vm::shape(&stored),
        ) {
            return Ok(Next::advance(
                "VMCreated",
                format!(
                    "VirtualMachine {name} kept as the cluster admitted it: admission rewrites spec.template{path}"
                ),
            ));
        }
        return Ok(Next::persist(
            "VMUpdated",
            format!("VirtualMachine {name} brought back to the source's shape"),
        ));
    }
    Ok(Next::advance(
        "VMCreated",
        format!(
            "VirtualMachine {name}: {} vCPU, {} MiB, {} disk(s), {} NIC(s)",
            source.cpus,
            source.memory_mib,
            source.disks.len(),
            desired.data["spec"]["template"]["spec"]["networks"]
                .as_array()
                .map_or(0, Vec::len)
        ),
    ))
}
