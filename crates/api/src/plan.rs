//! `MigrationPlan`: many VMs of one Provider, migrated with shared settings, at most `maxInFlight` at a time.
//! The plan creates one `VirtualMachineMigration` per VM (owned by the plan, named deterministically), so each VM
//! keeps everything a single migration has (checkpoints, retries, cancel, cleanup), and the plan's status adds
//! them up.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::migration::spec::{AGENT_NEEDS_A_START, QCOW2_NEEDS_STAGING};
use crate::{
    ConversionSpec, GuestCheckSpec, LocalObjectReference, Phase, PowerOffSpec, RetrySpec,
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
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(self.spec.target.name)")
        .message("spec.target.name would give every VM one name: set spec.vms[].targetName instead"),
    validation = Rule::new(QCOW2_NEEDS_STAGING.0).message(QCOW2_NEEDS_STAGING.1),
    validation = Rule::new(AGENT_NEEDS_A_START.0).message(AGENT_NEEDS_A_START.1)
)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPlanSpec {
    /// The Provider (same namespace) that holds every VM.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.providerRef is immutable: create a new plan instead"))]
    pub provider_ref: LocalObjectReference,
    /// The VMs, each found as a migration's `source.vm` is. More may be added while the plan runs; removing one
    /// does not cancel its migration (cancel that migration itself).
    #[schemars(length(min = 1, max = 2000))]
    pub vms: Vec<PlanVm>,
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
}

fn default_max_in_flight() -> i32 {
    10
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
    /// One entry per VM, in the order of `spec.vms`.
    #[serde(default)]
    pub vms: Vec<PlanVmStatus>,
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
