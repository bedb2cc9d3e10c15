//! One DataVolume per disk, importing the staged image through CDI's s3 source.

use ferry_api::foreign::DataVolumeStatus;
use ferry_api::{DiskStatus, VirtualMachineMigration, VolumeMode};
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::json;

use crate::children;

/// The http(s) URL CDI reads a staged `s3://bucket/key` from: `<endpoint>/<bucket>/<key>`.
pub fn s3_http_url(staged: &str, endpoint: Option<&str>) -> Option<String> {
    let rest = staged.strip_prefix("s3://")?;
    let endpoint = endpoint.unwrap_or("https://s3.amazonaws.com");
    Some(format!("{}/{rest}", endpoint.trim_end_matches('/')))
}

pub fn data_volume(
    vmm: &VirtualMachineMigration,
    disk: &DiskStatus,
    storage_class: Option<&str>,
) -> Option<DynamicObject> {
    let url = s3_http_url(
        disk.staged_url.as_deref()?,
        vmm.spec.staging.endpoint.as_deref(),
    )?;
    let mut source = json!({"url": url});
    if let Some(secret) = &vmm.spec.staging.secret_ref {
        source["secretRef"] = json!(secret.name);
    }
    let mut storage = json!({
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": match vmm.spec.target.volume_mode { VolumeMode::Block => "Block", VolumeMode::Filesystem => "Filesystem" },
        "resources": {"requests": {"storage": disk.capacity_bytes.to_string()}},
    });
    if let Some(class) = storage_class {
        storage["storageClassName"] = json!(class);
    }
    let object = json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {
            "name": children::data_volume(vmm, disk.index),
            "namespace": vmm.namespace(),
            "labels": children::labels(vmm, "import"),
            "ownerReferences": [children::owner(vmm)],
            // Import at once instead of waiting for the VM to consume the volume.
            "annotations": {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"},
        },
        "spec": {"source": {"s3": source}, "storage": storage},
    });
    serde_json::from_value(object).ok()
}

/// What CDI reports about a DataVolume.
#[derive(Clone, Debug, PartialEq)]
pub enum DvState {
    Absent,
    /// Being deleted: wait until it is gone before creating it again.
    Terminating,
    InProgress {
        phase: String,
        progress: Option<String>,
    },
    Succeeded,
    Failed {
        message: String,
    },
}

pub fn dv_state(dv: Option<&DynamicObject>) -> DvState {
    let Some(dv) = dv else { return DvState::Absent };
    if dv.metadata.deletion_timestamp.is_some() {
        return DvState::Terminating;
    }
    let status = DataVolumeStatus::of(dv);
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    let progress = status.progress.clone().filter(|p| p != "N/A");
    match phase.as_str() {
        "Succeeded" => DvState::Succeeded,
        "Failed" => {
            let message = status.message_of(&["Ready", "Running"]);
            let message = message.unwrap_or("the import failed").to_string();
            DvState::Failed { message }
        }
        _ => DvState::InProgress { phase, progress },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_objects_are_read_over_the_endpoint() {
        assert_eq!(
            s3_http_url(
                "s3://ferry-staging/ns/m-uid/disk-0.raw",
                Some("http://127.0.0.1:9000/")
            )
            .unwrap(),
            "http://127.0.0.1:9000/ferry-staging/ns/m-uid/disk-0.raw"
        );
        assert_eq!(
            s3_http_url("s3://b/k", None).unwrap(),
            "https://s3.amazonaws.com/b/k"
        );
        assert!(s3_http_url("file:///x", None).is_none());
    }

    #[test]
    fn cdi_phases_map_to_states() {
        let dv = |status: serde_json::Value| -> DynamicObject {
            serde_json::from_value(
                json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "d"}, "status": status}),
            )
            .unwrap()
        };
        assert_eq!(dv_state(None), DvState::Absent);
        assert_eq!(
            dv_state(Some(&dv(json!({"phase": "Succeeded"})))),
            DvState::Succeeded
        );
        assert_eq!(
            dv_state(Some(&dv(
                json!({"phase": "ImportInProgress", "progress": "12.5%"})
            ))),
            DvState::InProgress {
                phase: "ImportInProgress".into(),
                progress: Some("12.5%".into())
            }
        );
        let failed = dv(
            json!({"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "message": "boom"}]}),
        );
        assert_eq!(
            dv_state(Some(&failed)),
            DvState::Failed {
                message: "boom".into()
            }
        );
    }
}
