//! `spec.selector`: the VMs it chooses from the Provider's inventory, read once when the plan starts.

use ferry_api::{MigrationPlan, PlanSelector, Reason, SelectedVm};
use ferry_vsphere::VmSummary;
use ferry_vsphere::inventory;
use kube::ResourceExt;

use crate::checkpoint::source;
use crate::context::Context;
use crate::error::{Failure, Result};

/// As many VMs as `spec.vms` may list.
pub const MAX_SELECTED: usize = 2000;

/// Lists the Provider's VMs (below the selector's folder, if any) and keeps those it chooses.
pub async fn resolve(
    ctx: &Context,
    plan: &MigrationPlan,
    selector: &PlanSelector,
) -> Result<Vec<SelectedVm>> {
    let own = plan.namespace().unwrap_or_default();
    let ns = plan.spec.provider_ref.namespace_or(&own);
    let provider = source::provider_named(ctx, ns, &plan.spec.provider_ref.name).await?;
    let session = source::session_for(ctx, &provider).await?;
    let listed = match &selector.folder {
        Some(folder) => inventory::list_vms_in_folder(&session, folder).await?,
        None => inventory::list_vms(&session).await?,
    };
    choose(selector, &listed)
}

/// The listed VMs the selector chooses, by name; refused when they are more than a plan can hold.
pub fn choose(selector: &PlanSelector, listed: &[VmSummary]) -> Result<Vec<SelectedVm>> {
    let mut chosen: Vec<SelectedVm> = listed
        .iter()
        .filter(|vm| selector.matches(&vm.name, vm.power_state))
        .map(|vm| SelectedVm {
            name: vm.name.clone(),
            moref: vm.moref.clone(),
        })
        .collect();
    if chosen.len() > MAX_SELECTED {
        return Err(Failure::permanent(
            Reason::TooManyVMsSelected,
            format!(
                "spec.selector chose {} VMs, more than a plan holds ({MAX_SELECTED}): split them into several plans",
                chosen.len()
            ),
        ));
    }
    chosen.sort_by(|a, b| (&a.name, &a.moref).cmp(&(&b.name, &b.moref)));
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::PowerState;

    fn vm(name: &str, moref: &str, power: PowerState) -> VmSummary {
        VmSummary {
            moref: moref.into(),
            name: name.into(),
            power_state: Some(power),
            uuid: None,
            instance_uuid: None,
            guest_id: None,
        }
    }

    #[test]
    fn it_keeps_the_vms_the_pattern_and_power_state_choose_in_name_order() {
        let listed = [
            vm("web-2", "vm-2", PowerState::PoweredOn),
            vm("db-1", "vm-3", PowerState::PoweredOn),
            vm("web-1", "vm-1", PowerState::PoweredOn),
            vm("web-3", "vm-4", PowerState::PoweredOff),
        ];
        let selector = PlanSelector {
            name_pattern: Some("web-*".into()),
            power_state: Some(PowerState::PoweredOn),
            ..Default::default()
        };
        let chosen = choose(&selector, &listed).unwrap();
        let names: Vec<_> = chosen.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["web-1", "web-2"]);
        assert_eq!(chosen[0].moref, "vm-1");
    }

    #[test]
    fn more_vms_than_a_plan_holds_is_refused_with_what_to_do() {
        let listed: Vec<_> = (0..=MAX_SELECTED)
            .map(|i| vm(&format!("vm{i}"), &format!("vm-{i}"), PowerState::PoweredOn))
            .collect();
        let selector = PlanSelector {
            name_pattern: Some("*".into()),
            ..Default::default()
        };
        let err = choose(&selector, &listed).unwrap_err();
        assert_eq!(err.reason, Reason::TooManyVMsSelected);
        assert!(err.message.contains("2001 VMs"), "{}", err.message);
    }
}
