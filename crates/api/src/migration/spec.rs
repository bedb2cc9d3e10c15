//! The desired state of a migration, as a user writes it.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    DiskFormat, LocalObjectReference, ProviderReference, SecretReference,
    VirtualMachineMigrationStatus,
};

/// A rule shared by the migration and the plan (whose spec carries the same fields): (CEL, message).
pub(crate) const AGENT_NEEDS_A_START: (&str, &str) = (
    "!has(self.spec.guestCheck) || !has(self.spec.guestCheck.agent) || self.spec.guestCheck.agent != 'Required' || !has(self.spec.target.runStrategy) || self.spec.target.runStrategy != 'Halted'",
    "spec.guestCheck.agent Required needs the VM started: with spec.target.runStrategy Halted the guest is never checked",
);

/// See [`AGENT_NEEDS_A_START`].
pub(crate) const QCOW2_NEEDS_STAGING: (&str, &str) = (
    "has(self.spec.staging) || !has(self.spec.conversion) || !has(self.spec.conversion.format) || self.spec.conversion.format != 'qcow2'",
    "spec.conversion.format qcow2 is a staging format: set spec.staging, or leave the format raw to write the volumes directly",
);

/// See [`AGENT_NEEDS_A_START`].
pub(crate) const WARM_IS_DIRECT: (&str, &str) = (
    "!has(self.spec.warm) || !has(self.spec.staging)",
    "spec.warm writes the volumes directly, round after round: remove spec.staging",
);

/// Migrates one VM. `source` and `target` cannot change once set; `cancel` can only go from false to true.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "migration.platform.example",
    version = "v1alpha1",
    kind = "VirtualMachineMigration",
    doc = "Migrates one VM from vSphere to KubeVirt. The controller alone writes status.",
    namespaced,
    status = "VirtualMachineMigrationStatus",
    shortname = "vmm",
    category = "migrations",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Progress", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "Target", type_ = "string", json_path = ".status.targetVM"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("has(self.spec.target.name) || self.metadata.name.size() <= 63")
        .message("metadata.name is longer than 63 characters, so spec.target.name must name the VM (a DNS-1123 label)"),
    validation = Rule::new(AGENT_NEEDS_A_START.0).message(AGENT_NEEDS_A_START.1),
    validation = Rule::new(QCOW2_NEEDS_STAGING.0).message(QCOW2_NEEDS_STAGING.1),
    validation = Rule::new("has(self.spec.staging) == has(oldSelf.spec.staging)")
        .message("spec.staging cannot be added or removed once a migration exists: create a new migration instead"),
    validation = Rule::new(WARM_IS_DIRECT.0).message(WARM_IS_DIRECT.1),
    validation = Rule::new("has(self.spec.warm) == has(oldSelf.spec.warm)")
        .message("spec.warm cannot be added or removed once a migration exists: create a new migration instead")
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineMigrationSpec {
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.source is immutable: create a new migration instead"))]
    pub source: SourceSpec,
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.target is immutable: create a new migration instead"))]
    pub target: TargetSpec,
    #[serde(default)]
    pub conversion: ConversionSpec,
    /// Stage each disk in an object store and let CDI import it from there. Unset (the default): the conversion
    /// Job writes each disk straight into a blank DataVolume, and no object store is needed.
    /// It can be corrected in place (a misspelled Secret, a wrong endpoint), but not added or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<StagingSpec>,
    #[serde(default)]
    pub retry: RetrySpec,
    /// How Ferry decides that the migrated guest came up. It can change while the migration runs.
    #[serde(default)]
    pub guest_check: GuestCheckSpec,
    /// Ask for a clean stop: everything created is removed and the source power state restored if asked.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self || !oldSelf").message("spec.cancel cannot go back to false once a migration was cancelled"))]
    pub cancel: bool,
    /// Raise it to have the source copied again into the same volumes, once the source guest was changed on
    /// purpose while the migration waits to adapt it: a hibernated Windows (GuestFilesystemUnwritable) booted and
    /// shut down fully, then powered off. Read while the guest is adapted; it can only grow.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    #[x_kube(validation = Rule::new("self >= oldSelf").message("spec.recopy can only grow"))]
    pub recopy: i32,
    /// Copy while the source runs, then cut over with a short downtime (see [`crate::WarmSpec`]). Unset: the
    /// source is powered off first and copied whole. It cannot be added or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<crate::WarmSpec>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl VirtualMachineMigrationSpec {
    /// Whether `spec.recopy` asks for a copy the volumes do not hold yet.
    pub fn recopy_wanted(&self, status: &crate::VirtualMachineMigrationStatus) -> bool {
        self.recopy > status.recopied
    }
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceSpec {
    /// The Provider that holds the VM: in this namespace unless `namespace` names the one that lends it.
    pub provider_ref: ProviderReference,
    pub vm: VmSelector,
    #[serde(default)]
    pub power_off: PowerOffSpec,
    /// Power the source back on if the migration is cancelled or fails, and only then.
    #[serde(default)]
    pub restore_power_state: bool,
}

/// Exactly one way to find the VM.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("[has(self.name), has(self.inventoryPath), has(self.uuid), has(self.moref)].exists_one(x, x)")
        .message("vm needs exactly one of name, inventoryPath, uuid or moref")
)]
pub struct VmSelector {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 80))]
    pub name: Option<String>,
    /// For example `/DC0/vm/legacy-source-vm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 2048), pattern(r"^/.+"))]
    pub inventory_path: Option<String>,
    /// The BIOS or instance UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(
        r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    ))]
    pub uuid: Option<String>,
    /// The managed object ID, for example `vm-42`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 80), pattern(r"^[A-Za-z0-9_.:-]+$"))]
    pub moref: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerOffSpec {
    #[serde(default)]
    pub mode: PowerOffMode,
    /// How long a graceful guest shutdown may take before the VM is powered off.
    #[serde(default = "default_shutdown_timeout")]
    #[schemars(range(min = 10, max = 3600))]
    pub timeout_seconds: i32,
}

impl VirtualMachineMigration {
    /// The namespace of the Provider the migration reads from (its own, unless the Provider is lent).
    pub fn provider_namespace(&self) -> &str {
        let own = self.metadata.namespace.as_deref().unwrap_or_default();
        self.spec.source.provider_ref.namespace_or(own)
    }

    /// Whether the migration reads from a Provider another namespace lends.
    pub fn provider_is_lent(&self) -> bool {
        let own = self.metadata.namespace.as_deref().unwrap_or_default();
        self.spec.source.provider_ref.is_lent(own)
    }
}

impl Default for PowerOffSpec {
    fn default() -> Self {
        Self {
            mode: PowerOffMode::default(),
            timeout_seconds: default_shutdown_timeout(),
        }
    }
}

fn default_shutdown_timeout() -> i32 {
    300
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum PowerOffMode {
    /// Guest shutdown, then a forced power-off after `timeoutSeconds`.
    #[default]
    Graceful,
    /// Power off at once.
    Force,
    /// Never touch power: fail if the VM is on.
    RequireOff,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TargetSpec {
    /// The KubeVirt VM's name; defaults to the migration's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(crate::DNS_LABEL))]
    pub name: Option<String>,
    /// Every disk's StorageClass. Unset: the class `storageMapRef` gives the disk's datastore, else the
    /// cluster's default StorageClass.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(crate::DNS_SUBDOMAIN))]
    pub storage_class_name: Option<String>,
    /// Every disk's volume mode. Unset: the mode `storageMapRef` gives the disk's datastore, else `Filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<VolumeMode>,
    /// A `NetworkMap` in this namespace for the source networks `networks` does not list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_map_ref: Option<LocalObjectReference>,
    /// A `StorageMap` in this namespace: the StorageClass, volume mode and access mode of each disk by its
    /// datastore, where `storageClassName` and `volumeMode` are unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_map_ref: Option<LocalObjectReference>,
    #[serde(default)]
    pub run_strategy: RunStrategy,
    /// Where each source network goes. Every NIC's network must be mapped, here or in `networkMapRef`; an entry
    /// here wins over the map's for the same source.
    #[serde(default)]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["source".into()]))]
    pub networks: Vec<NetworkMapping>,
    /// The disk bus and NIC model the guest gets. Unset: `Compatibility`, or `Virtio` when the guest is adapted
    /// (`conversion.guestAdaptation: VirtV2v`), since only then is it sure to have virtio drivers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<DeviceModel>,
    /// What preflight does about a NIC whose address VMware Tools reported as configured by hand, mapped to the
    /// pod network (masquerade, where the guest must take the pod's DHCP address): `Warn` (the condition
    /// `StaticAddressOnPodNetwork` and an Event), or `Refuse` before the source is touched.
    #[serde(default)]
    pub static_address_on_pod_network: StaticAddressPolicy,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum StaticAddressPolicy {
    #[default]
    Warn,
    Refuse,
}

/// Which devices the KubeVirt VM gives the guest.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeviceModel {
    /// SATA disks and e1000e NICs: drivers every x86 guest has, so an unadapted guest boots (slower I/O).
    Compatibility,
    /// virtio-blk disks and virtio-net NICs: fast, but only for guests that have the virtio drivers in their
    /// initramfs (Linux) or installed (Windows).
    Virtio,
    /// Keep the source's buses: SCSI (LSI Logic, PVSCSI) becomes KubeVirt's `scsi` bus, which is virtio-scsi;
    /// SATA and IDE become SATA; NVMe becomes virtio; vmxnet3 becomes virtio-net; e1000 and e1000e stay.
    Source,
}

/// How the migrated guest is judged. VMware guests run VMware Tools, not the QEMU guest agent, so by default
/// the agent is a bonus: the VM running steadily for `settleSeconds` is enough, and an answering agent proves
/// more, sooner.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.settleSeconds < self.timeoutSeconds")
        .message("guestCheck.settleSeconds must be shorter than guestCheck.timeoutSeconds")
)]
pub struct GuestCheckSpec {
    /// Unset: `Optional`, or `Required` when guest adaptation installs the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<GuestAgent>,
    /// How long the VM must run without a crash or restart when no agent answers.
    #[serde(default = "default_settle_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub settle_seconds: i32,
    /// How long after the VM started the guest may take; then the VM is stopped and kept for a person to look.
    #[serde(default = "default_guest_timeout")]
    #[schemars(range(min = 60, max = 86400))]
    pub timeout_seconds: i32,
}

impl Default for GuestCheckSpec {
    fn default() -> Self {
        Self {
            agent: None,
            settle_seconds: default_settle_seconds(),
            timeout_seconds: default_guest_timeout(),
        }
    }
}

fn default_settle_seconds() -> i32 {
    60
}

fn default_guest_timeout() -> i32 {
    900
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum GuestAgent {
    /// The guest runs qemu-guest-agent: success needs its answer.
    Required,
    /// Success on a steady run; the agent's answer, if it comes, is recorded and ends the wait early.
    Optional,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum VolumeMode {
    #[default]
    Filesystem,
    Block,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum RunStrategy {
    #[default]
    Always,
    Halted,
}

/// One source network (or port group) and exactly one destination.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("[has(self.pod), has(self.multus), has(self.ignored)].exists_one(x, x)")
        .message("each network mapping needs exactly one of pod, multus or ignored")
)]
pub struct NetworkMapping {
    /// The vSphere network or port group name, as `ferry inventory` shows it.
    #[schemars(length(min = 1, max = 256))]
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodNetwork>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multus: Option<MultusNetwork>,
    /// Drop NICs on this network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignored: Option<IgnoredNetwork>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct PodNetwork {}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct IgnoredNetwork {}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultusNetwork {
    /// A NetworkAttachmentDefinition, as `name` or `namespace/name`.
    #[schemars(
        length(min = 1, max = 317),
        pattern(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub network_name: String,
}

#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.virtioWin) || (has(self.guestAdaptation) && self.guestAdaptation == 'VirtV2v')")
        .message("conversion.virtioWin is used only by guest adaptation: set conversion.guestAdaptation VirtV2v, or remove virtioWin"),
    validation = Rule::new("!has(self.firstBootTool) || (has(self.guestAdaptation) && self.guestAdaptation == 'VirtV2v')")
        .message("conversion.firstBootTool is used only by guest adaptation: set conversion.guestAdaptation VirtV2v, or remove firstBootTool"),
    validation = Rule::new("!has(self.preserveStaticIPs) || !self.preserveStaticIPs || (has(self.guestAdaptation) && self.guestAdaptation == 'VirtV2v')")
        .message("conversion.preserveStaticIPs is done by guest adaptation: set conversion.guestAdaptation VirtV2v, or remove preserveStaticIPs")
)]
pub struct ConversionSpec {
    #[serde(default)]
    pub format: DiskFormat,
    #[serde(default)]
    pub guest_adaptation: GuestAdaptation,
    /// The virtio-win drivers virt-v2v installs into a Windows guest (viostor, vioscsi, netkvm, the QEMU guest
    /// agent's MSI): a Windows guest cannot be adapted without them. Linux guests do not use them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio_win: Option<VirtioWinSource>,
    /// The Windows first-boot tool, `rhsrvany.exe` (or `pvvxsvc.exe`), which virt-v2v installs as a service to
    /// run its first-boot scripts (installing the drivers with pnputil and the QEMU guest agent, removing VMware
    /// Tools, setting static addresses): a Windows guest cannot be adapted without it. Linux guests do not use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_boot_tool: Option<FirstBootToolSource>,
    /// Give a Windows guest's NICs the static addresses VMware Tools reported for them (with the guest's default
    /// gateway and DNS servers), by a first-boot script virt-v2v installs: Windows binds its addresses to the
    /// adapter, and the new virtio adapter would come up without them. Refused before the source is touched when
    /// the tools reported no address. Linux guests keep their own configuration.
    #[serde(
        default,
        rename = "preserveStaticIPs",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub preserve_static_ips: bool,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum GuestAdaptation {
    #[default]
    None,
    VirtV2v,
}

/// Where the virtio-win drivers are: exactly one of a PersistentVolumeClaim or an image, mounted read-only into
/// the adaptation Job, and the ISO or directory inside it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("[has(self.persistentVolumeClaim), has(self.image)].exists_one(x, x)")
        .message("conversion.virtioWin needs exactly one of persistentVolumeClaim or image")
)]
pub struct VirtioWinSource {
    /// The name of a PersistentVolumeClaim in the migration's namespace that holds the drivers.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(crate::DNS_SUBDOMAIN))]
    pub persistent_volume_claim: Option<String>,
    /// An OCI image that holds the drivers, mounted as an image volume (the cluster needs the ImageVolume
    /// feature), for example KubeVirt's `quay.io/kubevirt/virtio-container-disk:<KubeVirt version>`, which holds
    /// the virtio-win ISO alone in `disk/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), pattern(r"^[^\s]+$"))]
    pub image: Option<String>,
    /// Inside the volume: the virtio-win ISO, or a directory. Unset: the volume's root. A directory that holds
    /// nothing but one ISO image (directly, or through directories that each hold only one entry, as the container
    /// disk's `disk/` does; `lost+found` does not count) stands for that ISO; any other directory must hold the
    /// ISO's unpacked contents.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("!self.startsWith('/')")
            .message("virtioWin.path is relative to the volume's root: it must not start with /"),
        validation = Rule::new("!self.matches('(^|/)[.][.](/|$)')")
            .message("virtioWin.path must stay inside the volume: it must not contain ..")
    )]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,
}

/// Where the Windows first-boot tool is: exactly one of a PersistentVolumeClaim or an image, mounted read-only
/// into the adaptation Job, and the file or the directory holding it inside.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("[has(self.persistentVolumeClaim), has(self.image)].exists_one(x, x)")
        .message("conversion.firstBootTool needs exactly one of persistentVolumeClaim or image")
)]
pub struct FirstBootToolSource {
    /// The name of a PersistentVolumeClaim in the migration's namespace that holds the tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(crate::DNS_SUBDOMAIN))]
    pub persistent_volume_claim: Option<String>,
    /// An OCI image that holds the tool, mounted as an image volume (the cluster needs the ImageVolume feature).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), pattern(r"^[^\s]+$"))]
    pub image: Option<String>,
    /// Inside the volume: `rhsrvany.exe` or `pvvxsvc.exe`, or the directory holding it (virt-v2v's
    /// `VIRT_TOOLS_DATA_DIR`, where it also finds `pnp_wait.exe` when present). Unset: the volume's root.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("!self.startsWith('/')")
            .message("firstBootTool.path is relative to the volume's root: it must not start with /"),
        validation = Rule::new("!self.matches('(^|/)[.][.](/|$)')")
            .message("firstBootTool.path must stay inside the volume: it must not contain ..")
    )]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,
}

/// A volume the adaptation Job mounts read-only, and a path inside it: the drivers or the first-boot tool.
pub trait MountedFiles {
    /// The field, for messages: `conversion.virtioWin`.
    const FIELD: &'static str;
    fn claim(&self) -> Option<&str>;
    fn image(&self) -> Option<&str>;
    fn path(&self) -> Option<&str>;

    /// `path` as admission checks it: relative and never above the volume's root; empty for the root itself.
    fn relative_path(&self) -> Result<&str, String> {
        let field = Self::FIELD;
        let path = self.path().unwrap_or_default();
        if path.starts_with('/') {
            return Err(format!(
                "{field}.path {path} must be relative to the volume's root"
            ));
        }
        if path.split('/').any(|segment| segment == "..") {
            return Err(format!(
                "{field}.path {path} must stay inside the volume (no ..)"
            ));
        }
        Ok(path)
    }
}

impl MountedFiles for VirtioWinSource {
    const FIELD: &'static str = "conversion.virtioWin";
    fn claim(&self) -> Option<&str> {
        self.persistent_volume_claim.as_deref()
    }
    fn image(&self) -> Option<&str> {
        self.image.as_deref()
    }
    fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }
}

impl MountedFiles for FirstBootToolSource {
    const FIELD: &'static str = "conversion.firstBootTool";
    fn claim(&self) -> Option<&str> {
        self.persistent_volume_claim.as_deref()
    }
    fn image(&self) -> Option<&str> {
        self.image.as_deref()
    }
    fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }
}

/// Where converted disks are staged, and how CDI reads them back.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.secretRef)")
        .message("an s3:// staging URL needs secretRef naming a Secret with accessKeyId and secretKey"),
    validation = Rule::new(
        "!(has(self.endpoint) && self.endpoint.startsWith('http://')) || (has(self.insecure) && self.insecure)"
    )
    .message(
        "staging over plain http:// sends the disks and the signed requests unencrypted: use https:// (with caBundle for a private CA), or set insecure: true to accept that"
    ),
    validation = Rule::new("!has(self.caBundle) || !has(self.insecure)")
        .message("staging caBundle and insecure exclude each other: a CA is for https, insecure for plain http")
)]
pub struct StagingSpec {
    /// `s3://bucket` or `s3://bucket/prefix`: the conversion Job, the controller and CDI's importer all reach
    /// staging through the S3 API (`endpoint` names a store outside AWS).
    #[x_kube(
        validation = Rule::new("self.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^ ]*)?$')")
            .message("staging url must be s3://bucket or s3://bucket/prefix (the S3 API; set endpoint for MinIO, Ceph RGW or another store)"),
        validation = Rule::new("!self.matches('^[a-z0-9]+://[^/]*@')")
            .message("staging url must not carry credentials: put them in the Secret named by secretRef")
    )]
    #[schemars(length(min = 8, max = 2048))]
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,
    /// For s3 outside AWS (MinIO, Ceph RGW, ...): the endpoint both the conversion Job and CDI use, for example
    /// `https://minio.storage.svc:9000`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("self.matches('^https?://[^/@ ]+/?$')")
            .message("staging endpoint must be http(s)://host[:port], without a path or credentials")
    )]
    #[schemars(length(min = 8, max = 512))]
    pub endpoint: Option<String>,
    /// PEM certificates of the CAs that sign the staging endpoint's certificate, when not a public CA: the
    /// controller, the conversion Job and CDI's importer (through a ConfigMap Ferry creates) all trust them.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.contains('-----BEGIN CERTIFICATE-----')")
        .message("staging caBundle must hold PEM certificates (-----BEGIN CERTIFICATE-----)"))]
    #[schemars(length(max = 65536))]
    pub ca_bundle: Option<String>,
    /// Allow a plain `http://` endpoint. The migration then carries the condition `InsecureStaging`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self")
        .message("staging insecure may only be set to true; leave it out to require https"))]
    pub insecure: Option<bool>,
}

impl StagingSpec {
    /// True when the staging endpoint is plain http (allowed only with `insecure: true`).
    pub fn plain_http(&self) -> bool {
        self.endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"))
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetrySpec {
    /// Bounded retries per step (a failed conversion or import) before the migration fails.
    #[serde(default = "default_retry_budget")]
    #[schemars(range(min = 0, max = 10))]
    pub budget: i32,
}

impl Default for RetrySpec {
    fn default() -> Self {
        Self {
            budget: default_retry_budget(),
        }
    }
}

fn default_retry_budget() -> i32 {
    3
}
