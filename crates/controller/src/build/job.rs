//! The conversion and verification Jobs: one container running `ferry`, under the restricted Pod Security
//! Standard, with credentials mounted from Secrets as files (never in argv or the environment). Each writes its
//! result, or its classed error, to the termination message.

use ferry_api::{Provider, ProviderTls, SourceVmStatus, VirtualMachineMigration, VolumeMode};
use ferry_datapath::spec::{ConvertSpec, DiskSpec, SourceSpec, SourceTrust, StagingSpec};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use serde_json::json;

use crate::children;

const SOURCE_CREDENTIALS: &str = "/run/ferry/source";
const STAGING_CREDENTIALS: &str = "/run/ferry/staging";
const SCRATCH: &str = "/scratch";
const DISK_MOUNT: &str = "/disk";
const DISK_DEVICE: &str = "/dev/ferry-disk";

/// What `ferry convert` runs with: every disk discovery found (`source`, from the working status), staged under
/// the migration's own prefix.
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
            vm_uuid: source
                .uuid
                .clone()
                .or(source.instance_uuid.clone())
                .unwrap_or_default(),
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
        staging: StagingSpec {
            url: children::staging_url(vmm),
            credentials_dir: vmm
                .spec
                .staging
                .secret_ref
                .as_ref()
                .map(|_| STAGING_CREDENTIALS.into()),
            endpoint: vmm.spec.staging.endpoint.clone(),
            region: None,
        },
        scratch_dir: SCRATCH.into(),
        parallel: 2,
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
    let spec =
        serde_json::to_string(&convert_spec(vmm, source, provider)).expect("a spec serializes");
    let mut volumes = vec![
        json!({"name": "source-credentials", "secret": {"secretName": provider.spec.secret_ref.name,
            "items": [{"key": "user", "path": "user"}, {"key": "password", "path": "password"}]}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mut mounts = vec![
        json!({"name": "source-credentials", "mountPath": SOURCE_CREDENTIALS, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    if let Some(secret) = &vmm.spec.staging.secret_ref {
        volumes.push(json!({"name": "staging-credentials", "secret": {"secretName": secret.name,
            "items": [{"key": "accessKeyId", "path": "accessKeyId"}, {"key": "secretKey", "path": "secretKey"}]}}));
        mounts.push(json!({"name": "staging-credentials", "mountPath": STAGING_CREDENTIALS, "readOnly": true}));
    }
    job(
        vmm,
        &children::convert_job(vmm, attempt),
        "convert",
        image,
        vec![
            "convert".into(),
            "--quiet".into(),
            format!("--spec-json={spec}"),
        ],
        volumes,
        mounts,
        vec![],
    )
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
    let claim = children::data_volume(vmm, disk);
    let block = vmm.spec.target.volume_mode == VolumeMode::Block;
    let volumes = vec![
        json!({"name": "disk", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}),
    ];
    let (mounts, devices, file) = if block {
        (
            vec![],
            vec![json!({"name": "disk", "devicePath": DISK_DEVICE})],
            DISK_DEVICE.to_string(),
        )
    } else {
        (
            vec![json!({"name": "disk", "mountPath": DISK_MOUNT, "readOnly": true})],
            vec![],
            format!("{DISK_MOUNT}/disk.img"),
        )
    };
    job(
        vmm,
        &children::verify_job(vmm, disk, attempt),
        "verify",
        image,
        vec![
            "verify".into(),
            format!("--file={file}"),
            format!("--sha256={sha256}"),
            format!("--size={size}"),
        ],
        volumes,
        mounts,
        devices,
    )
}

#[allow(clippy::too_many_arguments)]
fn job(
    vmm: &VirtualMachineMigration,
    name: &str,
    step: &str,
    image: &str,
    args: Vec<String>,
    volumes: Vec<serde_json::Value>,
    mounts: Vec<serde_json::Value>,
    devices: Vec<serde_json::Value>,
) -> Job {
    let labels = children::labels(vmm, step);
    let mut container = json!({
        "name": step,
        "image": image,
        "command": ["ferry"],
        "args": args,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    });
    if !devices.is_empty() {
        container["volumeDevices"] = json!(devices);
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": vmm.namespace(),
            "labels": labels,
            "ownerReferences": [children::owner(vmm)],
        },
        "spec": {
            // Retries are the controller's, counted in the migration's status: a Job runs once.
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }))
    .expect("a Job built from known fields")
}
