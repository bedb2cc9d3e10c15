//! The conversion and verification Jobs: one container running `ferry`, under the restricted Pod Security
//! Standard, with credentials mounted from Secrets as files (never in argv or the environment). Each writes its
//! result, or its classed error, to the termination message.

use ferry_api::{
    DiskFormat, Provider, ProviderTls, SourceVmStatus, VirtualMachineMigration, VolumeMode,
};
use ferry_datapath::spec::{
    ConvertSpec, DiskSpec, RoundSpec, SourceSpec, SourceTrust, StagingSpec, VolumeSpec,
};
use ferry_datapath::staging::PartPlan;
use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, KeyToPath, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource,
    SecurityContext, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::children;

const SOURCE_CREDENTIALS: &str = "/run/ferry/source";
const STAGING_CREDENTIALS: &str = "/run/ferry/staging";
const DISK_MOUNT: &str = "/disk";
const DISK_DEVICE: &str = "/dev/ferry-disk";
/// The direct path's volumes: disk `i` at `/disks/<i>/disk.img`, or the device `/dev/ferry-disk-<i>`.
const DISKS_MOUNT: &str = "/disks";
/// CDI's importer and virt-launcher's qemu run as this user and group; a blank `disk.img` is theirs, mode 0660.
pub(super) const QEMU_ID: i64 = 107;

/// The VM's identity a conversion records in each staged disk's manifest: its BIOS uuid, else its instance UUID.
pub fn source_vm_uuid(source: &SourceVmStatus) -> String {
    source
        .uuid
        .clone()
        .or(source.instance_uuid.clone())
        .unwrap_or_default()
}

/// What `ferry convert` runs with: every disk discovery found (`source`, from the working status), staged under
/// the migration's own prefix, or written into its DataVolume's volume when the migration has no staging.
pub fn convert_spec(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    provider: &Provider,
) -> ConvertSpec {
    ConvertSpec {
        source: SourceSpec {
            url: provider.spec.url.clone(),
            credentials_dir: SOURCE_CREDENTIALS.into(),
            trust: source_trust(&provider.spec.tls),
            datacenter: source.datacenter.clone().unwrap_or_default(),
            vm_uuid: source_vm_uuid(source),
            instance_uuid: source.instance_uuid.clone(),
        },
        disks: source
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| DiskSpec {
                index: i as u32,
                file: d.file.clone(),
                capacity_bytes: d.capacity_bytes.max(0) as u64,
            })
            .collect(),
        format: vmm.spec.conversion.format,
        staging: vmm.spec.staging.as_ref().map(|staging| StagingSpec {
            url: children::staging_url(vmm).unwrap_or_default(),
            credentials_dir: staging
                .secret_ref
                .as_ref()
                .map(|_| STAGING_CREDENTIALS.into()),
            endpoint: staging.endpoint.clone(),
            region: None,
            ca_bundle: staging.ca_bundle.clone(),
        }),
        volumes: match vmm.spec.staging {
            Some(_) => vec![],
            None => volume_specs(vmm, source.disks.len() as u32),
        },
        parallel: 2,
        transfer: Default::default(),
        round: None,
    }
}

/// How a Provider says to trust its endpoint (admission allows exactly one of the three). The controller's own
/// session and the conversion Job both trust it this way.
pub fn source_trust(tls: &ProviderTls) -> SourceTrust {
    match (&tls.ca_bundle, &tls.thumbprint) {
        (Some(pem), _) => SourceTrust::CaBundle(pem.clone()),
        (None, Some(thumbprint)) => SourceTrust::Thumbprint(thumbprint.clone()),
        (None, None) => SourceTrust::Insecure,
    }
}

pub fn convert_job(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    provider: &Provider,
    attempt: i32,
    image: &str,
) -> Job {
    let spec = convert_spec(vmm, source, provider);
    let work = convert_work("convert", vmm, &spec, provider);
    job(vmm, &children::convert_job(vmm, attempt), image, work)
}

/// Job `name` runs a warm migration's `round`: the direct path's writer, copying each disk from the round's
/// snapshot (or, at cutover, from the powered-off source) whole or by the areas changed since its last round. Its
/// pods are writers like the conversion's (the same step label), so no two of them write a volume at once. A
/// delta holds up to about 96 MiB per disk in flight, within the writer's default memory.
pub fn round_job(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    provider: &Provider,
    name: &str,
    image: &str,
    round: RoundSpec,
) -> Job {
    let spec = ConvertSpec {
        round: Some(round),
        ..convert_spec(vmm, source, provider)
    };
    let work = convert_work("convert", vmm, &spec, provider);
    job(vmm, name, image, work)
}

/// Job `name` writes every disk from the source into its volume again, whichever route filled them: an
/// adaptation attempt may have left them half-adapted, or the source was changed on purpose (`spec.recopy`). The
/// same worker as the direct path's conversion, so the same guarantees: stale bytes cannot survive, and only a
/// read-back that hashes to the source counts.
pub fn rewrite_job(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    provider: &Provider,
    name: &str,
    image: &str,
) -> Job {
    let spec = ConvertSpec {
        staging: None,
        volumes: volume_specs(vmm, source.disks.len() as u32),
        ..convert_spec(vmm, source, provider)
    };
    let work = convert_work("rewrite", vmm, &spec, provider);
    job(vmm, name, image, work)
}

fn volume_specs(vmm: &VirtualMachineMigration, disks: u32) -> Vec<VolumeSpec> {
    (0..disks)
        .map(|index| VolumeSpec {
            index,
            path: disk_path(vmm, index).into(),
            block: block(vmm),
        })
        .collect()
}

/// `ferry convert` with `spec`: the source's credentials, and the staging credentials or the volumes.
fn convert_work(
    step: &'static str,
    vmm: &VirtualMachineMigration,
    spec: &ConvertSpec,
    provider: &Provider,
) -> Work {
    let memory_limit_mib = convert_memory_mib(spec);
    let json = serde_json::to_string(spec).expect("a spec serializes");
    let mut work = Work {
        step,
        args: vec![
            "convert".into(),
            "--quiet".into(),
            format!("--spec-json={json}"),
        ],
        volumes: vec![secret_volume(
            "source-credentials",
            &source_secret(vmm, provider),
            &SOURCE_KEYS,
        )],
        mounts: vec![mount("source-credentials", SOURCE_CREDENTIALS, true)],
        devices: vec![],
        memory_limit_mib,
        user: NOBODY_ID,
        // Disks are read in turn (or `parallel` at once, which is no slower); a volume is read back after it is
        // written.
        deadline_seconds: deadline_seconds(
            spec.disks.iter().map(|d| d.capacity_bytes).sum(),
            if spec.staging.is_some() { 1 } else { 2 },
        ),
        scratch_mib: None,
    };
    let staging_secret = vmm
        .spec
        .staging
        .as_ref()
        .and_then(|s| s.secret_ref.as_ref());
    match (&spec.staging, staging_secret) {
        (Some(_), Some(secret)) => {
            let keys = ["accessKeyId", "secretKey"];
            work.volumes
                .push(secret_volume("staging-credentials", &secret.name, &keys));
            work.mounts
                .push(mount("staging-credentials", STAGING_CREDENTIALS, true));
        }
        (Some(_), None) => {}
        (None, _) => {
            mount_disks(&mut work, vmm, spec.volumes.iter().map(|v| v.index), false);
            work.user = QEMU_ID;
        }
    }
    work
}

/// Every disk's volume, writable unless `read_only`, where [`disk_path`] says the Job finds it.
pub(super) fn mount_disks(
    work: &mut Work,
    vmm: &VirtualMachineMigration,
    indexes: impl IntoIterator<Item = u32>,
    read_only: bool,
) {
    for index in indexes {
        let name = format!("disk-{index}");
        work.volumes
            .push(claim_volume(&name, vmm, index, read_only));
        if block(vmm) {
            work.devices.push(VolumeDevice {
                name,
                device_path: disk_path(vmm, index),
            });
        } else {
            work.mounts
                .push(mount(&name, &format!("{DISKS_MOUNT}/{index}"), read_only));
        }
    }
}

pub(super) fn block(vmm: &VirtualMachineMigration) -> bool {
    crate::maps::volume_mode(vmm) == VolumeMode::Block
}

/// Where the direct path's conversion Job finds disk `index`'s volume.
pub(super) fn disk_path(vmm: &VirtualMachineMigration, index: u32) -> String {
    if block(vmm) {
        format!("{DISK_DEVICE}-{index}")
    } else {
        format!("{DISKS_MOUNT}/{index}/disk.img")
    }
}

pub(super) fn claim_volume(
    name: &str,
    vmm: &VirtualMachineMigration,
    disk: u32,
    read_only: bool,
) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: children::data_volume(vmm, disk as i32),
            read_only: read_only.then_some(true),
        }),
        ..Volume::default()
    }
}

/// The conversion Job's memory limit: 1 GiB, or more when large disks upload in large parts (S3 takes 10,000
/// parts, and each part is held whole in memory while it uploads, for `parallel` disks at once).
fn convert_memory_mib(spec: &ConvertSpec) -> u64 {
    if spec.staging.is_none() {
        // Writing a volume holds a few MiB per disk; the page cache it dirties is bounded by the limit itself.
        return DEFAULT_MEMORY_MIB;
    }
    let qcow2_held = u64::from(spec.format == DiskFormat::Qcow2);
    let upload = spec
        .disks
        .iter()
        .filter_map(|d| PartPlan::for_size(d.capacity_bytes))
        // A qcow2 holds its first part (the header's) until the end.
        .map(|plan| plan.memory_bytes() + qcow2_held * plan.part_bytes)
        .max()
        .unwrap_or(0);
    (512 + (spec.parallel as u64 * upload).div_ceil(1 << 20)).max(DEFAULT_MEMORY_MIB)
}

const DEFAULT_MEMORY_MIB: u64 = 1024;

/// A quantity in whole GiB where it is one (the limit every Job had before), else in MiB.
fn mebibytes(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// Reads the imported disk from the DataVolume's PVC and compares it with the source's sha256.
pub fn verify_job(
    vmm: &VirtualMachineMigration,
    disk: i32,
    attempt: i32,
    sha256: &str,
    size: i64,
    image: &str,
) -> Job {
    let block = block(vmm);
    let file = if block {
        DISK_DEVICE.to_string()
    } else {
        format!("{DISK_MOUNT}/disk.img")
    };
    let work = Work {
        step: "verify",
        args: vec![
            "verify".into(),
            format!("--file={file}"),
            format!("--sha256={sha256}"),
            format!("--size={size}"),
        ],
        volumes: vec![claim_volume("disk", vmm, disk as u32, true)],
        mounts: if block {
            vec![]
        } else {
            vec![mount("disk", DISK_MOUNT, true)]
        },
        devices: if block {
            vec![VolumeDevice {
                name: "disk".into(),
                device_path: DISK_DEVICE.into(),
            }]
        } else {
            vec![]
        },
        memory_limit_mib: DEFAULT_MEMORY_MIB,
        // As CDI's importer, which makes disk.img 0660 as 107 (its group root): storage without fsGroup support
        // (hostPath, local volumes) lets no other user read it.
        user: QEMU_ID,
        deadline_seconds: deadline_seconds(size.max(0) as u64, 1),
        scratch_mib: None,
    };
    job(vmm, &children::verify_job(vmm, disk, attempt), image, work)
}

/// The first consumer of volumes that wait for one (see `checkpoint::support::first_consumer`): one pod that
/// mounts every disk's volume read-only, so the scheduler binds them all on one node, and exits at once.
pub fn bind_job(
    vmm: &VirtualMachineMigration,
    indexes: impl IntoIterator<Item = u32>,
    image: &str,
) -> Job {
    let mut work = Work {
        step: "bind",
        args: vec!["--version".into()],
        volumes: vec![],
        mounts: vec![],
        devices: vec![],
        memory_limit_mib: DEFAULT_MEMORY_MIB,
        user: QEMU_ID,
        deadline_seconds: DEADLINE_START,
        scratch_mib: None,
    };
    mount_disks(&mut work, vmm, indexes, true);
    job(vmm, &children::bind_job(vmm), image, work)
}

/// What one Job does: its step (the container's name and the step label), its arguments to `ferry`, and what it
/// mounts.
pub(super) struct Work {
    pub step: &'static str,
    pub args: Vec<String>,
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
    pub devices: Vec<VolumeDevice>,
    pub memory_limit_mib: u64,
    /// The pod's user, group and fsGroup.
    pub user: i64,
    /// How long the Job may run, from its start, pods pending or pulling images included
    /// (`activeDeadlineSeconds`): see [`deadline_seconds`].
    pub deadline_seconds: i64,
    /// Local scratch space the pod writes (an `emptyDir` with this `sizeLimit`), requested so the scheduler
    /// places it where that much is free.
    pub scratch_mib: Option<u64>,
}

/// Before any byte moves: scheduling, pulling the image, logging in.
const DEADLINE_START: i64 = 30 * 60;

/// A Job moving bytes slower than this is stuck, not slow (a 100 GiB disk gets 3.6 h, plus the start).
pub(super) const SLOWEST_BYTES_PER_SECOND: u64 = 8 << 20;

/// A Job's deadline: time to start, then `bytes` at the slowest rate that still counts as progress at
/// `passes` passes (a verification reads its disk once; a conversion that writes a volume reads it back too). A
/// Job past it fails (DeadlineExceeded, from the Job controller), and the attempt is retried or the migration
/// fails and the source's power is restored: the source never stays off for a Job that hangs.
pub(super) fn deadline_seconds(bytes: u64, passes: u64) -> i64 {
    let moving = (bytes.saturating_mul(passes) / SLOWEST_BYTES_PER_SECOND).min(i64::MAX as u64 / 2);
    DEADLINE_START + moving as i64
}

/// The distroless image's unprivileged user.
const NOBODY_ID: i64 = 65532;

/// The keys of a Provider's Secret a Job reads.
pub const SOURCE_KEYS: [&str; 2] = ["user", "password"];

/// The Secret a Job reads the source's credentials from: the Provider's own, or, for a Provider lent from another
/// namespace (a pod mounts Secrets of its own namespace only), the migration's copy of it.
fn source_secret(vmm: &VirtualMachineMigration, provider: &Provider) -> String {
    match vmm.provider_is_lent() {
        true => children::source_credentials(vmm),
        false => provider.spec.secret_ref.name.clone(),
    }
}

/// The migration's copy of a lent Provider's credentials (`values` for [`SOURCE_KEYS`]), owned by the migration
/// so that it goes with it at the latest; none when the Provider is the migration's own.
pub fn lent_credentials(vmm: &VirtualMachineMigration, values: [String; 2]) -> Option<Secret> {
    if !vmm.provider_is_lent() {
        return None;
    }
    let data = SOURCE_KEYS
        .iter()
        .zip(values)
        .map(|(key, value)| (key.to_string(), ByteString(value.into_bytes())));
    Some(Secret {
        metadata: ObjectMeta {
            name: Some(children::source_credentials(vmm)),
            namespace: vmm.namespace(),
            labels: Some(children::labels(vmm, "convert")),
            owner_references: Some(vec![children::owner(vmm)]),
            ..Default::default()
        },
        data: Some(data.collect()),
        immutable: None,
        type_: Some("Opaque".into()),
        ..Default::default()
    })
}

fn secret_volume(name: &str, secret: &str, keys: &[&str]) -> Volume {
    let items = keys.iter().map(|key| KeyToPath {
        key: key.to_string(),
        path: key.to_string(),
        ..KeyToPath::default()
    });
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: Some(items.collect()),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn runtime_default_seccomp() -> Option<SeccompProfile> {
    Some(SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    })
}

/// CPU and memory requested, memory limited; scratch space requested and limited to what its `emptyDir` may hold.
fn resources(work: &Work) -> ResourceRequirements {
    let mut requests = BTreeMap::from([
        ("cpu".to_string(), Quantity("250m".into())),
        ("memory".to_string(), Quantity("256Mi".into())),
    ]);
    let mut limits = BTreeMap::from([(
        "memory".to_string(),
        Quantity(mebibytes(work.memory_limit_mib)),
    )]);
    if let Some(scratch) = work.scratch_mib {
        // The image's own few MiB of logs beside the scratch space.
        requests.insert("ephemeral-storage".into(), Quantity(mebibytes(scratch)));
        limits.insert(
            "ephemeral-storage".into(),
            Quantity(mebibytes(scratch + 1024)),
        );
    }
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(limits),
        ..ResourceRequirements::default()
    }
}

pub(super) fn job(vmm: &VirtualMachineMigration, name: &str, image: &str, work: Work) -> Job {
    let labels = children::labels(vmm, work.step);
    let resources = resources(&work);
    let container = Container {
        name: work.step.into(),
        image: Some(image.into()),
        command: Some(vec!["ferry".into()]),
        args: Some(work.args),
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(work.mounts),
        volume_devices: (!work.devices.is_empty()).then_some(work.devices),
        resources: Some(resources),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: runtime_default_seccomp(),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: vmm.namespace(),
            labels: Some(labels.clone()),
            annotations: vmm.metadata.generation.map(|generation| {
                BTreeMap::from([(
                    ferry_api::keys::SPEC_GENERATION_ANNOTATION.to_string(),
                    generation.to_string(),
                )])
            }),
            owner_references: Some(vec![children::owner(vmm)]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // Retries are the controller's, counted in the migration's status: a Job runs once.
            backoff_limit: Some(0),
            active_deadline_seconds: Some(work.deadline_seconds),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(work.user),
                        run_as_group: Some(work.user),
                        fs_group: Some(work.user),
                        seccomp_profile: runtime_default_seccomp(),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    volumes: Some(work.volumes),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn migration(block: bool) -> VirtualMachineMigration {
        let mode = if block { "Block" } else { "Filesystem" };
        let spec = json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
            "staging": {"url": "s3://b/p", "secretRef": {"name": "staging"}},
            "target": {"volumeMode": mode}});
        let mut vmm = VirtualMachineMigration::new("m", serde_json::from_value(spec).unwrap());
        vmm.metadata.uid = Some("u".into());
        vmm.metadata.namespace = Some("ns".into());
        vmm
    }

    fn pod(job: &Job) -> &PodSpec {
        job.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    #[test]
    fn a_job_has_time_to_start_and_to_move_its_bytes_at_the_slowest_rate_of_progress() {
        assert_eq!(deadline_seconds(0, 1), 1800);
        let hundred_gib = 100u64 << 30;
        assert_eq!(deadline_seconds(hundred_gib, 1), 1800 + 12_800);
        assert_eq!(deadline_seconds(hundred_gib, 2), 1800 + 25_600);
        assert!(deadline_seconds(u64::MAX, 2) > 0, "no overflow");
    }

    #[test]
    fn a_lent_providers_credentials_reach_the_job_through_the_migrations_own_copy() {
        let provider: Provider = serde_json::from_value(json!({
            "apiVersion": "migration.platform.example/v1alpha1", "kind": "Provider",
            "metadata": {"name": "p", "namespace": "admins"},
            "spec": {"type": "vsphere", "url": "https://vc/sdk", "secretRef": {"name": "vc"},
                     "tls": {"thumbprint": "AA"}}}))
        .unwrap();
        let source: SourceVmStatus = serde_json::from_value(json!({
            "name": "x", "moref": "vm-1", "cpus": 1, "coresPerSocket": 1, "memoryMib": 64, "snapshots": 0,
            "disks": [{"key": 1, "file": "[ds] x/x.vmdk", "capacityBytes": 1024}], "nics": []}))
        .unwrap();
        let secrets = |vmm: &VirtualMachineMigration| -> Vec<String> {
            pod(&convert_job(vmm, &source, &provider, 1, "img"))
                .volumes
                .iter()
                .flatten()
                .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
                .collect()
        };
        let values = || ["u".to_string(), "p".to_string()];
        let own = migration(false);
        assert!(lent_credentials(&own, values()).is_none());
        assert_eq!(secrets(&own), ["vc", "staging"]);

        let mut lent = migration(false);
        lent.spec.source.provider_ref.namespace = Some("admins".into());
        assert_eq!(secrets(&lent), ["m-source-credentials", "staging"]);
        let copy = lent_credentials(&lent, values()).unwrap();
        assert_eq!(copy.metadata.name.as_deref(), Some("m-source-credentials"));
        assert_eq!(copy.metadata.namespace.as_deref(), Some("ns"));
        assert!(children::is_ours(&copy, &lent), "labelled and owned");
        let keys: Vec<_> = copy.data.unwrap().into_keys().collect();
        assert_eq!(keys, ["password", "user"]);

        // Naming its own namespace is no loan.
        let mut named = migration(false);
        named.spec.source.provider_ref.namespace = Some("ns".into());
        assert!(lent_credentials(&named, values()).is_none());
    }

    #[test]
    fn jobs_run_once_restricted_with_credentials_as_files_only() {
        let provider: Provider = serde_json::from_value(json!({
            "apiVersion": "migration.platform.example/v1alpha1", "kind": "Provider",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"type": "vsphere", "url": "https://vc/sdk", "secretRef": {"name": "vc"},
                     "tls": {"thumbprint": "AA"}}}))
        .unwrap();
        let source: SourceVmStatus = serde_json::from_value(json!({
            "name": "x", "moref": "vm-1", "cpus": 1, "coresPerSocket": 1, "memoryMib": 64, "snapshots": 0,
            "disks": [{"key": 1, "file": "[ds] x/x.vmdk", "capacityBytes": 1024}], "nics": []}))
        .unwrap();
        let vmm = migration(false);
        let convert = convert_job(&vmm, &source, &provider, 2, "img");
        assert_eq!(convert.metadata.name.as_deref(), Some("m-convert-2"));
        assert_eq!(convert.spec.as_ref().unwrap().backoff_limit, Some(0));
        assert_eq!(
            convert.spec.as_ref().unwrap().active_deadline_seconds,
            Some(deadline_seconds(1024, 1)),
            "staged: each disk read once"
        );
        let spec = pod(&convert);
        let container = &spec.containers[0];
        assert!(container.env.is_none(), "no credentials in the environment");
        let args = container.args.as_ref().unwrap().join(" ");
        assert!(args.contains(SOURCE_CREDENTIALS) && !args.contains("\"password\":"));
        let secrets: Vec<_> = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect();
        assert_eq!(secrets, ["vc", "staging"]);
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(
            security.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        assert_eq!(spec.automount_service_account_token, Some(false));

        let memory = |job: &Job| {
            let limits = pod(job).containers[0]
                .resources
                .clone()
                .unwrap()
                .limits
                .unwrap();
            limits["memory"].0.clone()
        };
        assert_eq!(memory(&convert), "1Gi");
        // A 2 TiB disk uploads in 234 MiB parts, two in flight, for each of two disks at once.
        let mut large = source.clone();
        large.disks[0].capacity_bytes = 2 << 40;
        assert_eq!(
            memory(&convert_job(&vmm, &large, &provider, 1, "img")),
            format!("{}Mi", 512 + 2 * 2 * 234)
        );

        let verify = verify_job(&migration(true), 0, 1, "abc", 1024, "img");
        let container = &pod(&verify).containers[0];
        let device = &container.volume_devices.as_ref().unwrap()[0];
        assert_eq!(device.device_path, DISK_DEVICE);
        assert!(
            container
                .args
                .as_ref()
                .unwrap()
                .contains(&format!("--file={DISK_DEVICE}"))
        );
        // It reads what CDI's importer made as that importer's user: 107, no other, may read it on storage that
        // applies no fsGroup.
        let security = pod(&verify).security_context.clone().unwrap();
        assert_eq!(security.run_as_user, Some(QEMU_ID));
        assert_eq!(security.run_as_group, Some(QEMU_ID));
    }
}
