//! One DataVolume per disk: blank, for the conversion Job to write into (the direct path), or importing the staged
//! image through CDI's s3 source.

use ferry_api::{DiskStatus, DiskStorage, VirtualMachineMigration, VolumeMode};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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
    placement: &DiskStorage,
) -> Option<DynamicObject> {
    let staging = vmm.spec.staging.as_ref()?;
    let url = s3_http_url(disk.staged_url.as_deref()?, staging.endpoint.as_deref())?;
    let mut source = json!({"url": url});
    if let Some(secret) = &staging.secret_ref {
        source["secretRef"] = json!(secret.name);
    }
    if staging.ca_bundle.is_some() {
        source["certConfigMap"] = json!(children::staging_ca(vmm));
    }
    let storage = storage(disk.capacity_bytes, placement);
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

/// The key CDI's importer finds the CA bundle under: it mounts the whole ConfigMap and trusts every file in it.
pub const STAGING_CA_KEY: &str = "ca.pem";

/// The ConfigMap holding `spec.staging.caBundle` for CDI's importer (`certConfigMap`); None without a bundle.
pub fn staging_ca(vmm: &VirtualMachineMigration) -> Option<ConfigMap> {
    let bundle = vmm.spec.staging.as_ref()?.ca_bundle.clone()?;
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(children::staging_ca(vmm)),
            namespace: vmm.namespace(),
            labels: Some(children::labels(vmm, "import")),
            owner_references: Some(vec![children::owner(vmm)]),
            ..Default::default()
        },
        data: Some([(STAGING_CA_KEY.to_string(), bundle)].into()),
        ..Default::default()
    })
}

/// A blank DataVolume for disk `disk` of `capacity` bytes, which the conversion Job writes into. Sized through
/// `spec.storage`, so CDI adds the StorageClass's filesystem overhead on Filesystem volumes (`spec.pvc` would
/// not). No immediate binding: on a WaitForFirstConsumer class the conversion pod is the first consumer, so
/// the volumes land where it runs (as Forklift's cold migrations do).
pub fn blank_data_volume(
    vmm: &VirtualMachineMigration,
    disk: i32,
    capacity: i64,
    placement: &DiskStorage,
) -> Option<DynamicObject> {
    let object = json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {
            "name": children::data_volume(vmm, disk),
            "namespace": vmm.namespace(),
            "labels": children::labels(vmm, "import"),
            "ownerReferences": [children::owner(vmm)],
        },
        "spec": {"source": {"blank": {}}, "storage": storage(whole_mebibytes(capacity), placement)},
    });
    serde_json::from_value(object).ok()
}

/// CDI refuses sizes under 1 MiB and rounds to whole MiB; a disk's capacity is rounded up to them.
fn whole_mebibytes(bytes: i64) -> i64 {
    (bytes.max(1) as u64).next_multiple_of(1 << 20) as i64
}

fn storage(bytes: i64, placement: &DiskStorage) -> serde_json::Value {
    let mut storage = json!({
        "accessModes": [placement.access_mode.as_str()],
        "volumeMode": match placement.volume_mode { VolumeMode::Block => "Block", VolumeMode::Filesystem => "Filesystem" },
        "resources": {"requests": {"storage": bytes.to_string()}},
    });
    if let Some(class) = &placement.storage_class_name {
        storage["storageClassName"] = json!(class);
    }
    storage
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
    fn a_private_staging_ca_reaches_cdi_through_a_config_map_of_ours() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let spec = json!({"source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
                          "staging": {"url": "s3://b/p", "secretRef": {"name": "s"},
                                      "endpoint": "https://minio:9000", "caBundle": pem}});
        let mut vmm = VirtualMachineMigration::new("m", serde_json::from_value(spec).unwrap());
        vmm.metadata.uid = Some("u".into());
        vmm.metadata.namespace = Some("ns".into());
        let disk = DiskStatus {
            staged_url: Some("s3://b/p/ns/m-u/disk-0.raw".into()),
            capacity_bytes: 1 << 30,
            ..Default::default()
        };
        let dv = data_volume(&vmm, &disk, &DiskStorage::default()).unwrap();
        let source = &dv.data["spec"]["source"]["s3"];
        assert_eq!(source["certConfigMap"], json!(children::staging_ca(&vmm)));
        assert_eq!(
            source["url"],
            json!("https://minio:9000/b/p/ns/m-u/disk-0.raw")
        );
        let ca = staging_ca(&vmm).unwrap();
        assert_eq!(ca.metadata.name, Some(children::staging_ca(&vmm)));
        assert!(children::is_ours(&ca, &vmm));
        assert_eq!(ca.data.unwrap()[STAGING_CA_KEY], pem);
        let mut without = vmm.clone();
        without.spec.staging.as_mut().unwrap().ca_bundle = None;
        assert!(staging_ca(&without).is_none());
        let dv = data_volume(&without, &disk, &DiskStorage::default()).unwrap();
        assert!(
            dv.data["spec"]["source"]["s3"]
                .get("certConfigMap")
                .is_none()
        );
    }

    #[test]
    fn blank_volumes_are_sized_in_whole_mebibytes_through_spec_storage() {
        let spec = json!({"source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
                          "target": {"volumeMode": "Block"}});
        let mut vmm = VirtualMachineMigration::new("m", serde_json::from_value(spec).unwrap());
        vmm.metadata.uid = Some("u".into());
        vmm.metadata.namespace = Some("ns".into());
        let placement = DiskStorage {
            storage_class_name: Some("fast".into()),
            volume_mode: VolumeMode::Block,
            access_mode: ferry_api::AccessMode::ReadWriteMany,
        };
        let dv = blank_data_volume(&vmm, 1, (1 << 30) + 1, &placement).unwrap();
        assert_eq!(dv.metadata.name.as_deref(), Some("m-disk-1"));
        assert_eq!(dv.data["spec"]["source"], json!({"blank": {}}));
        let storage = &dv.data["spec"]["storage"];
        assert_eq!(
            storage["resources"]["requests"]["storage"],
            json!(((1u64 << 30) + (1 << 20)).to_string())
        );
        assert_eq!(storage["volumeMode"], "Block");
        assert_eq!(storage["storageClassName"], "fast");
        assert_eq!(storage["accessModes"], json!(["ReadWriteMany"]));
        assert!(dv.data["spec"].get("pvc").is_none());
        assert!(
            dv.metadata.annotations.is_none(),
            "the conversion pod binds it"
        );
    }
}
