//! The observed state of a migration. Written only by the controller, through the status subresource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ErrorClass, Firmware, PowerState};

/// The checkpoint the controller is converging to, or how the migration ended.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum Phase {
    Discovering,
    /// Preflight: pure checks before any side effect.
    Validating,
    /// Blank volumes for the disks, before the source is touched (the direct path only).
    Allocating,
    /// A warm migration copies while the source runs, one round per `warm.precopyIntervalSeconds`, until cutover.
    Precopying,
    /// Source power per policy.
    Preparing,
    Converting,
    Importing,
    /// virt-v2v adapts the copies on the volumes to KubeVirt (`conversion.guestAdaptation: VirtV2v` only).
    Adapting,
    #[serde(rename = "CreatingVM")]
    CreatingVm,
    Starting,
    /// The guest booted and answered.
    ValidatingGuest,
    /// Removing what was created after a cancel or delete.
    Cancelling,
    Succeeded,
    Failed,
    /// A person can fix the cause in place (for example create a missing StorageClass); then it resumes.
    ManualInterventionRequired,
    Cancelled,
}

impl Phase {
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Cancelled)
    }
}

/// The condition types, in the order the checkpoints make them true; `Ready` comes last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionType {
    SourceDiscovered,
    Validated,
    DiskConverted,
    DiskImported,
    GuestAdapted,
    VmCreated,
    VmStarted,
    GuestReady,
    /// A warning, True while the staging endpoint is plain http (`spec.staging.insecure`).
    InsecureStaging,
    /// A warning, True when the source has a vTPM: its contents stay in vSphere and the VM's starts empty.
    TpmNotCarried,
    /// A warning, True when a NIC with an address configured by hand goes to the pod network, where it cannot work.
    StaticAddressOnPodNetwork,
    /// A warning, True when a NIC with an address configured by hand goes to a multus network but nothing carries
    /// the address to the NIC the guest will see.
    StaticAddressNotKept,
    Ready,
}

impl ConditionType {
    pub const ALL: [ConditionType; 13] = [
        ConditionType::SourceDiscovered,
        ConditionType::Validated,
        ConditionType::DiskConverted,
        ConditionType::DiskImported,
        ConditionType::GuestAdapted,
        ConditionType::VmCreated,
        ConditionType::VmStarted,
        ConditionType::GuestReady,
        ConditionType::InsecureStaging,
        ConditionType::TpmNotCarried,
        ConditionType::StaticAddressOnPodNetwork,
        ConditionType::StaticAddressNotKept,
        ConditionType::Ready,
    ];

    /// The warnings: True while what they say holds, and an Event when they turn True.
    pub const WARNINGS: [ConditionType; 4] = [
        ConditionType::InsecureStaging,
        ConditionType::TpmNotCarried,
        ConditionType::StaticAddressOnPodNetwork,
        ConditionType::StaticAddressNotKept,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::SourceDiscovered => "SourceDiscovered",
            ConditionType::Validated => "Validated",
            ConditionType::DiskConverted => "DiskConverted",
            ConditionType::DiskImported => "DiskImported",
            ConditionType::GuestAdapted => "GuestAdapted",
            ConditionType::VmCreated => "VMCreated",
            ConditionType::VmStarted => "VMStarted",
            ConditionType::GuestReady => "GuestReady",
            ConditionType::InsecureStaging => "InsecureStaging",
            ConditionType::TpmNotCarried => "TPMNotCarried",
            ConditionType::StaticAddressOnPodNetwork => "StaticAddressOnPodNetwork",
            ConditionType::StaticAddressNotKept => "StaticAddressNotKept",
            ConditionType::Ready => "Ready",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineMigrationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// A one-line summary for people: what is happening, or what went wrong and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The specific reason of the last error or of the current wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Disk bytes moved over total, for example `42%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    #[serde(default, rename = "targetVM", skip_serializing_if = "Option::is_none")]
    pub target_vm: Option<String>,
    /// The uid of the VirtualMachine this migration created: cleanup waits for that VM's instance to go, and for
    /// no other instance that happens to have its name.
    #[serde(
        default,
        rename = "targetVMUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_vm_uid: Option<String>,
    /// What discovery found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceVmStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerStatus>,
    #[serde(default)]
    pub disks: Vec<DiskStatus>,
    /// Where each source network the NICs use goes, as Validating resolved it from the target and the
    /// NetworkMap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<crate::NetworkMapping>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryStatus>,
    /// When each checkpoint was entered.
    #[serde(default)]
    pub checkpoints: Vec<CheckpointTime>,
    /// What guest adaptation found and did (`conversion.guestAdaptation: VirtV2v`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptation: Option<AdaptationStatus>,
    /// An adaptation attempt ended without showing that it left the volumes as they were (its pod was lost, or it
    /// failed during or after its commit): they are rewritten from the source before the next attempt, so a
    /// half-adapted disk is never adapted again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rewrite_volumes: bool,
    /// The `spec.recopy` the volumes were last copied for: each disk's `sha256` is the source's after that copy.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recopied: i32,
    /// What the guest check observed on the migrated VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<GuestStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Everything the migration created was removed (after a failure or a cancel), and power restored if asked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cleaned_up: bool,
    /// Disk reads granted on the source's ESXi host under the Provider's `maxConcurrentDisksPerHost`: set before
    /// the source is powered off or read, cleared once its disks are copied or the migration has cleaned up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_slot: Option<HostSlot>,
    /// A warm migration's rounds and the snapshot it holds on the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<crate::WarmStatus>,
}

/// A grant of disk reads on one ESXi host.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostSlot {
    /// The host's name, for example `esx-07.example.com`.
    pub host: String,
    /// The host's managed object id, for example `host-42`, which identifies it when names repeat.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host_moref: String,
    /// Disks the grant counts against the host's limit.
    pub disks: i32,
    pub granted: MicroTime,
}

/// The guest virt-v2v inspected and adapted. The disks' adapted sha256 are in `disks[].adaptedSha256`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdaptationStatus {
    /// For people, for example `Debian GNU/Linux 12.15 (debian12), x86_64, BIOS, root on disk 0`.
    pub os: String,
    /// `linux`, `windows`, …
    pub os_type: String,
    /// `debian`, `rhel`, `windows`, …
    pub distro: String,
    /// libosinfo's id, for example `debian12`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub osinfo: String,
    pub arch: String,
    /// `BIOS` or `UEFI` as the guest is installed; empty when virt-v2v did not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub firmware: String,
    /// The disk (index) holding the root file system: the VM boots from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_disk: Option<i32>,
    /// What a Windows guest keeps its hardware clock in, read from its SYSTEM hive; absent for other guests, or
    /// when the hive could not be read (the VM's clock then runs in UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<GuestClockStatus>,
    /// The names a Linux guest's NICs keep inside it, each pinned to its MAC by a systemd `.link` file written
    /// before virt-v2v ran, so configuration naming them (`ens192`) still applies on KubeVirt; absent for guests
    /// whose names are not Ferry's to keep (Windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_names: Option<InterfaceNamesStatus>,
    /// How long virt-v2v took, in seconds.
    #[serde(default)]
    pub seconds: i64,
}

/// What the guest's network configuration named, and which names Ferry kept.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceNamesStatus {
    /// Each name kept, with the MAC of the NIC that keeps it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<KeptInterfaceName>,
    /// Names the configuration uses that Ferry left alone, each with the reason (no NIC with its MAC or
    /// addresses, two NICs for one name, a kernel name on a VM with several NICs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_alone: Vec<String>,
    /// Why the guest's configuration could not be read; nothing was written then.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeptInterfaceName {
    /// The interface's name in the guest, for example `ens192`.
    pub name: String,
    pub mac: String,
}

/// A Windows guest's clock: Windows reads the hardware clock as local time unless `RealTimeIsUniversal` is set.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestClockStatus {
    /// `UTC`, or `LocalTime` in `windowsZone`.
    pub rtc: GuestRtc,
    /// Windows' name of the guest's zone (`TimeZoneKeyName`), for example `W. Europe Standard Time`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub windows_zone: String,
    /// The IANA zone the VM's clock runs in (KubeVirt's `clock.timezone`), for example `Europe/Berlin`; empty
    /// when it runs in UTC, including a local-time guest whose zone has no IANA name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GuestRtc {
    #[default]
    #[serde(rename = "UTC")]
    Utc,
    LocalTime,
}

/// What was proven about the migrated guest, and how.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestStatus {
    /// `AgentAnswered`, `RanSteadily` (no agent, so the guest's own boot was not observed) or `NotProven`.
    pub evidence: GuestEvidence,
    /// For people, for example `agent answered: Debian GNU/Linux 12 (bookworm), 10.0.2.2`.
    pub message: String,
    /// The OS the guest agent reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// The guest's IP addresses, as its agent reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    /// Whether each NIC with an address configured by hand on VMware (as VMware Tools reported it) has it again,
    /// under which name, as the guest agent reports it: `network identity kept: …`, or what changed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GuestEvidence {
    /// The QEMU guest agent inside the guest answered: the OS is up.
    AgentAnswered,
    /// The VM ran without a crash or restart for the settle time; nothing inside the guest was observed.
    RanSteadily,
    /// The check failed or has not concluded.
    #[default]
    NotProven,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointTime {
    pub phase: Phase,
    /// Microseconds: most checkpoints of a small VM take less than a second.
    pub entered: MicroTime,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceVmStatus {
    pub name: String,
    pub moref: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_uuid: Option<String>,
    /// The endpoint's own instance UUID (`about.instanceUuid`) when the VM was found: every power operation and
    /// Job first checks that the Provider still reaches this vCenter and the moref still names this VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcenter_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_os: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// EFI Secure Boot (`bootOptions.efiSecureBootEnabled`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_boot: bool,
    /// A virtual TPM (`VirtualTPM`). Its contents (BitLocker's keys among them) stay in vSphere, sealed by its key
    /// provider; the VM gets a new, empty persistent one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub vtpm: bool,
    /// The disks' device keys in the source's boot order (`bootOptions.bootOrder`); empty when it has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub boot_order: Vec<i32>,
    /// The datacenter whose datastores hold the disks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datacenter: Option<String>,
    /// The ESXi host the VM ran on when it was discovered (`runtime.host`), by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// That host's managed object id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_moref: Option<String>,
    pub cpus: i32,
    pub cores_per_socket: i32,
    pub memory_mib: i64,
    /// Snapshots of the VM; its disks are then read through their chains.
    #[serde(default)]
    pub snapshots: i32,
    /// Changed Block Tracking is on (`config.changeTrackingEnabled`), as a warm migration needs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub change_tracking: bool,
    #[serde(default)]
    pub disks: Vec<SourceDisk>,
    #[serde(default)]
    pub nics: Vec<SourceNic>,
    /// What VMware Tools reported of the guest's routes and name servers; absent when they reported none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_network: Option<GuestNetworkStatus>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceDisk {
    pub key: i32,
    /// For example `[datastore1] vm/vm.vmdk`.
    pub file: String,
    pub capacity_bytes: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
    /// `scsi`, `sata`, `ide` or `nvme`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// The backing's UUID, which the target disk's serial number derives from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The vSphere backing type, for example `VirtualDiskFlatVer2BackingInfo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing: Option<String>,
    #[serde(default)]
    pub thin: bool,
    /// Snapshot delta files below the disk.
    #[serde(default)]
    pub snapshot_chain: i32,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceNic {
    pub mac: String,
    pub network: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The addresses VMware Tools reported on this NIC when the VM was discovered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<GuestIpAddress>,
}

/// An address of the guest's, as VMware Tools reported it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestIpAddress {
    pub address: String,
    pub prefix_length: i32,
    /// `manual` (configured by hand in the guest: a static address), `dhcp`, `linklayer`, `random` or `other`.
    pub origin: String,
}

impl SourceNic {
    /// The addresses VMware Tools reported as configured by hand, as `address/prefix`.
    pub fn static_addresses(&self) -> Vec<String> {
        self.ip_addresses
            .iter()
            .filter(|a| a.is_static())
            .map(|a| format!("{}/{}", a.address, a.prefix_length))
            .collect()
    }
}

impl GuestIpAddress {
    pub fn is_static(&self) -> bool {
        self.origin == "manual"
    }

    pub fn is_ipv6(&self) -> bool {
        self.address.contains(':')
    }
}

/// The guest's routes and name servers, as VMware Tools reported them when the VM was discovered.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestNetworkStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub default_gateways: Vec<GuestGateway>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_servers: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestGateway {
    pub address: String,
    /// The NIC it is reached through, as an index into `source.nics`, when the tools said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<i32>,
}

impl GuestNetworkStatus {
    /// The default gateway of `address`'s family for NIC `nic`: its own, else the guest's only one of that family.
    pub fn gateway_for(&self, nic: usize, address: &GuestIpAddress) -> Option<&str> {
        let family: Vec<&GuestGateway> = self
            .default_gateways
            .iter()
            .filter(|g| g.address.contains(':') == address.is_ipv6())
            .collect();
        let only = match family.as_slice() {
            [only] => Some(only),
            _ => None,
        };
        family
            .iter()
            .find(|g| g.nic == Some(nic as i32))
            .or(only)
            .map(|g| g.address.as_str())
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerStatus {
    /// Recorded before Ferry changes anything, so that it can be restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<PowerState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<PowerState>,
    /// The vSphere task in flight (its moref), so that a restarted controller follows it instead of repeating it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// When a guest shutdown was asked for; the forced power-off waits `timeoutSeconds` from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_requested: Option<Time>,
    #[serde(default)]
    pub restored: bool,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    pub index: i32,
    pub source_file: String,
    pub capacity_bytes: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default)]
    pub bytes_moved: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<String>,
    /// Import progress as CDI reports it, for example `45.23%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Where its volume goes, as Validating resolved it from the target and the StorageMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<DiskStorage>,
    /// The imported content was read back and matched `sha256`.
    #[serde(default)]
    pub verified: bool,
    /// The volume's sha256 after guest adaptation changed it (`sha256` stays the source's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapted_sha256: Option<String>,
    /// Failed verifications and imports of this disk so far; the next verification Job is
    /// `<name>-verify-<index>-<verifyFailures + 1>`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify_failures: i32,
}

impl DiskStatus {
    /// How far this disk is, from 0 to 1: converted counts half, imported (and verified) the other half. The
    /// controller's plan totals, `ferry watch` and `ferry ui` all count progress this way.
    pub fn done_fraction(&self) -> f64 {
        let converted = if self.sha256.is_some() { 0.5 } else { 0.0 };
        let imported = self
            .progress
            .as_deref()
            .and_then(|p| p.trim_end_matches('%').parse::<f64>().ok())
            .unwrap_or(0.0)
            / 200.0;
        let imported = if self.verified {
            0.5
        } else {
            imported.clamp(0.0, 0.5)
        };
        converted + imported
    }
}

impl VirtualMachineMigrationStatus {
    /// Bytes done (by [`DiskStatus::done_fraction`]) and the total capacity of the disks.
    pub fn bytes_done(&self) -> (f64, i64) {
        let total: i64 = self.disks.iter().map(|d| d.capacity_bytes).sum();
        let done = self
            .disks
            .iter()
            .map(|d| d.done_fraction() * d.capacity_bytes as f64)
            .sum();
        (done, total)
    }
}

/// A disk's volume: its StorageClass (none: the cluster's default), volume mode and access mode.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStorage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    pub volume_mode: crate::VolumeMode,
    pub access_mode: crate::AccessMode,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// Attempts survive restarts here, so backoff and budgets do too.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryStatus {
    /// Attempts in the current checkpoint.
    pub attempts: i32,
    /// Bounded retries used, per checkpoint that has a budget.
    #[serde(default)]
    pub budget_used: Vec<BudgetUse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<ErrorStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<Time>,
    /// UIDs of the failed Jobs and DataVolumes already charged to a budget: each failure is charged once, and
    /// recorded before the failed object is removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub charged: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetUse {
    pub phase: Phase,
    pub used: i32,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorStatus {
    pub class: ErrorClass,
    pub reason: String,
    pub message: String,
    pub phase: Phase,
    pub time: Time,
}
