//! `MigrationPlan`: many VMs of one Provider, migrated with shared settings, at most `maxInFlight` at a time.
//! The plan creates one `VirtualMachineMigration` per VM (owned by the plan, named deterministically), so each VM
//! keeps everything a single migration has (checkpoints, retries, cancel, cleanup), and the plan's status adds
//! them up.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::migration::spec::{AGENT_NEEDS_A_START, QCOW2_NEEDS_STAGING, WARM_IS_DIRECT};
use crate::{
    ConversionSpec, GuestCheckSpec, Phase, PowerOffSpec, PowerState, ProviderReference, RetrySpec,
    StagingSpec, TargetSpec, VmSelector,
};

/// Migrates many VMs of one Provider. VMs may be added while it runs; `cancel` stops those not finished.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "migration.platform.example",
    version = "v1alpha1",
    kind = "MigrationPlan",
    doc = "Migrates many VMs of one Provider, at most maxInFlight at once, one VirtualMachineMigration per VM.",
    namespaced,
    status = "MigrationPlanStatus",
    shortname = "mplan",
    category = "migrations",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "VMs", type_ = "integer", json_path = ".status.total"),
    printcolumn(name = "Running", type_ = "integer", json_path = ".status.running"),
    printcolumn(name = "Succeeded", type_ = "integer", json_path = ".status.succeeded"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failed"),
    printcolumn(name = "Progress", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "ETA", type_ = "string", json_path = ".status.eta"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(self.spec.target.name)")
        .message("spec.target.name would give every VM one name: set spec.vms[].targetName instead"),
    validation = Rule::new(QCOW2_NEEDS_STAGING.0).message(QCOW2_NEEDS_STAGING.1),
    validation = Rule::new(AGENT_NEEDS_A_START.0).message(AGENT_NEEDS_A_START.1),
    validation = Rule::new("size(self.spec.vms) > 0 || has(self.spec.selector)")
        .message("a plan needs VMs: list them in spec.vms, or choose them with spec.selector"),
    validation = Rule::new(WARM_IS_DIRECT.0).message(WARM_IS_DIRECT.1),
    validation = Rule::new("has(self.spec.warm) == has(oldSelf.spec.warm)")
        .message("spec.warm cannot be added or removed once a plan exists: create a new plan instead")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.selector) == has(oldSelf.selector) && (!has(self.selector) || self.selector == oldSelf.selector)")
        .message("spec.selector is resolved once, when the plan starts, and cannot change: add VMs to spec.vms instead")
)]
pub struct MigrationPlanSpec {
    /// The Provider that holds every VM: in this namespace unless `namespace` names the one that lends it.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.providerRef is immutable: create a new plan instead"))]
    pub provider_ref: ProviderReference,
    /// The VMs, each found as a migration's `source.vm` is. More may be added while the plan runs; removing one
    /// does not cancel its migration (cancel that migration itself).
    #[serde(default)]
    #[schemars(length(max = 2000))]
    pub vms: Vec<PlanVm>,
    /// More VMs, chosen from the Provider's inventory once, when the plan starts; `status.selected` records
    /// them, and they are migrated with `vms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<PlanSelector>,
    /// Nothing starts (and `selector` is not resolved) before this time. Unset: at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// Migrations of this plan running at once (the Provider's per-host disk limit applies too).
    #[serde(default = "default_max_in_flight")]
    #[schemars(range(min = 1, max = 500))]
    pub max_in_flight: i32,
    #[serde(default)]
    pub power_off: PowerOffSpec,
    /// Power a source back on if its migration is cancelled or fails, and only then.
    #[serde(default)]
    pub restore_power_state: bool,
    /// Every VM's target, except its name (`vms[].targetName`, else the VM's name as a DNS label). Name maps in
    /// `networkMapRef` and `storageMapRef` to share them with other plans.
    #[serde(default)]
    pub target: TargetSpec,
    #[serde(default)]
    pub conversion: ConversionSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<StagingSpec>,
    #[serde(default)]
    pub retry: RetrySpec,
    #[serde(default)]
    pub guest_check: GuestCheckSpec,
    /// Stop: no more migrations start, and those not finished are cancelled (finished ones stay).
    #[serde(default)]
    #[x_kube(validation = Rule::new("self || !oldSelf").message("spec.cancel cannot go back to false once a plan was cancelled"))]
    pub cancel: bool,
    /// Every VM migrated warm (see [`crate::WarmSpec`]). `cutover` and `cutoverAt` reach every migration of the
    /// plan, also those created later: a migration that starts after the cutover was asked for cuts over after its
    /// first round. It cannot be added or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<crate::WarmSpec>,
}

fn default_max_in_flight() -> i32 {
    10
}

/// Chooses VMs from the inventory: those below `folder` whose names match `namePattern`, in `powerState`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.folder) || has(self.namePattern)")
        .message("spec.selector needs a folder or a namePattern: a plan never selects a whole vCenter by accident")
)]
pub struct PlanSelector {
    /// A VM folder's inventory path, for example `/DC0/vm/web`: every VM below it, at any depth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2048), pattern(r"^/.+"))]
    pub folder: Option<String>,
    /// VM names to take, as a glob: `*` matches any run of characters, `?` one; for example `web-*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 200))]
    pub name_pattern: Option<String>,
    /// Only VMs in this power state. Unset: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
}

impl PlanSelector {
    /// Whether a VM named `name`, in `power`, is chosen (the folder is applied by the listing).
    pub fn matches(&self, name: &str, power: Option<PowerState>) -> bool {
        self.name_pattern
            .as_deref()
            .is_none_or(|pattern| glob_matches(pattern, name))
            && self.power_state.is_none_or(|wanted| power == Some(wanted))
    }
}

/// `folder /DC0/vm/web, names web-*, power state PoweredOn`: what `ferry plan create` and `ferry describe plan` say.
impl std::fmt::Display for PlanSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(folder) = &self.folder {
            parts.push(format!("folder {folder}"));
        }
        if let Some(pattern) = &self.name_pattern {
            parts.push(format!("names {pattern}"));
        }
        if let Some(power) = self.power_state {
            parts.push(format!("power state {power:?}"));
        }
        f.write_str(&parts.join(", "))
    }
}

/// `*` matches any run of characters (also none), `?` exactly one; everything else itself.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and the text position it currently stands for up to.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// One VM of a plan: exactly one of `name`, `inventoryPath`, `uuid` or `moref`, as in a migration.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("[has(self.name), has(self.inventoryPath), has(self.uuid), has(self.moref)].exists_one(x, x)")
        .message("each of spec.vms needs exactly one of name, inventoryPath, uuid or moref")
)]
pub struct PlanVm {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 80))]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2048), pattern(r"^/.+"))]
    pub inventory_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(
        r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    ))]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 80), pattern(r"^[A-Za-z0-9_.:-]+$"))]
    pub moref: Option<String>,
    /// The KubeVirt VM's name. Unset: the VM's name (or other key) made a DNS label.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(crate::DNS_LABEL))]
    pub target_name: Option<String>,
}

impl PlanVm {
    pub fn selector(&self) -> VmSelector {
        VmSelector {
            name: self.name.clone(),
            inventory_path: self.inventory_path.clone(),
            uuid: self.uuid.clone(),
            moref: self.moref.clone(),
        }
    }

    /// How the plan names this VM to people and in names: its name, path, uuid or moref.
    pub fn key(&self) -> &str {
        [&self.name, &self.inventory_path, &self.uuid, &self.moref]
            .into_iter()
            .find_map(|k| k.as_deref())
            .unwrap_or_default()
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PlanPhase {
    /// `spec.startTime` has not come yet: nothing started.
    Scheduled,
    /// Migrations run or wait for a place in `maxInFlight`.
    Running,
    /// Every VM migrated.
    Succeeded,
    /// Every migration ended, and at least one did not succeed.
    Failed,
    /// `cancel`: the unfinished migrations are being cancelled.
    Cancelling,
    /// `cancel`: every unfinished migration was cancelled.
    Cancelled,
}

/// What the plan's migrations add up to.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPlanStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PlanPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// A one-line summary for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// VMs in the plan.
    #[serde(default)]
    pub total: i32,
    /// VMs whose migration is not created yet (waiting for `maxInFlight`).
    #[serde(default)]
    pub pending: i32,
    /// Migrations created and not ended.
    #[serde(default)]
    pub running: i32,
    #[serde(default)]
    pub succeeded: i32,
    #[serde(default)]
    pub failed: i32,
    #[serde(default)]
    pub cancelled: i32,
    /// Disk bytes moved over the total of the migrations that know their disks, for example `42%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    #[serde(default)]
    pub bytes_moved: i64,
    #[serde(default)]
    pub bytes_total: i64,
    /// Bytes moved per second since the plan started, averaged.
    #[serde(default)]
    pub bytes_per_second: i64,
    /// `bytesPerSecond` for people, for example `38 MiB/s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<String>,
    /// Time left at `throughput`, for example `about 25 min`; VMs whose size is not known yet are counted at
    /// the average size of those that are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
    /// When the plan started: its start time came and it began creating migrations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// What `spec.selector` chose when the plan started, by name; unset until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected: Option<Vec<SelectedVm>>,
    /// One entry per VM: those of `spec.vms` in order, then those selected.
    #[serde(default)]
    pub vms: Vec<PlanVmStatus>,
}

/// A VM `spec.selector` chose: migrated by its moref, named by its name.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectedVm {
    pub name: String,
    pub moref: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanVmStatus {
    /// The VM as `spec.vms` names it.
    pub vm: String,
    /// Its `VirtualMachineMigration`.
    pub migration: String,
    /// The plan created that migration (it may since have been deleted by hand: then it is created again).
    #[serde(default)]
    pub created: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_matches_runs_and_single_characters() {
        for (pattern, name, expected) in [
            ("web-*", "web-01", true),
            ("web-*", "web-", true),
            ("web-*", "db-01", false),
            ("*-0?", "app-01", true),
            ("*-0?", "app-010", false),
            ("*a*b*", "xxaxxbxx", true),
            ("*a*b*", "xxbxxaxx", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("*", "", true),
            ("?", "", false),
        ] {
            assert_eq!(glob_matches(pattern, name), expected, "{pattern} {name}");
        }
    }

    #[test]
    fn a_selector_takes_name_and_power_together() {
        let selector = PlanSelector {
            name_pattern: Some("web-*".into()),
            power_state: Some(PowerState::PoweredOn),
            ..Default::default()
        };
        assert!(selector.matches("web-1", Some(PowerState::PoweredOn)));
        assert!(!selector.matches("web-1", Some(PowerState::PoweredOff)));
        assert!(!selector.matches("web-1", None));
        assert!(!selector.matches("db-1", Some(PowerState::PoweredOn)));
        assert!(PlanSelector::default().matches("any", None));
    }

    #[test]
    fn a_selector_reads_as_its_filters() {
        let selector = PlanSelector {
            folder: Some("/DC0/vm/web".into()),
            name_pattern: Some("web-*".into()),
            power_state: Some(PowerState::PoweredOn),
        };
        assert_eq!(
            selector.to_string(),
            "folder /DC0/vm/web, names web-*, power state PoweredOn"
        );
    }
}
