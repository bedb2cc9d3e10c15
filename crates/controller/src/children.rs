//! What a migration creates, named deterministically (a restarted controller finds it instead of making a second
//! one) and labelled with the migration's UID (so cleanup finds all of it, and nothing else).

use std::collections::BTreeMap;

use ferry_api::VirtualMachineMigration;
use ferry_api::names::child_name;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use ferry_api::keys::{MANAGED_BY, MANAGED_BY_LABEL};
pub use ferry_api::keys::{MANAGER, MIGRATED_BY_ANNOTATION, NAME_LABEL, STEP_LABEL, UID_LABEL};

pub fn uid(vmm: &VirtualMachineMigration) -> String {
    vmm.uid().unwrap_or_default()
}

pub fn labels(vmm: &VirtualMachineMigration, step: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (UID_LABEL.to_string(), uid(vmm)),
        (NAME_LABEL.to_string(), child_name(&vmm.name_any(), "")),
        (STEP_LABEL.to_string(), step.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ])
}

pub fn uid_selector(vmm: &VirtualMachineMigration) -> String {
    ferry_api::keys::uid_selector(&uid(vmm))
}

/// The merge patch that hands a child over to its user: no owner (so deleting the migration keeps it), none of
/// our labels (so cleanup never finds it), and where it came from.
pub fn release_patch(vmm: &VirtualMachineMigration) -> serde_json::Value {
    let from = format!("{}/{}", vmm.namespace().unwrap_or_default(), vmm.name_any());
    serde_json::json!({"metadata": {
        "ownerReferences": null,
        "labels": {UID_LABEL: null, NAME_LABEL: null, STEP_LABEL: null},
        "annotations": {MIGRATED_BY_ANNOTATION: from},
    }})
}

pub fn owner(vmm: &VirtualMachineMigration) -> OwnerReference {
    vmm.controller_owner_ref(&())
        .expect("a stored migration has a uid")
}

/// One conversion Job per attempt: `<name>-convert-<attempt>`.
pub fn convert_job(vmm: &VirtualMachineMigration, attempt: i32) -> String {
    child_name(&vmm.name_any(), &format!("convert-{attempt}"))
}

/// One verification Job per disk and attempt: `<name>-verify-<disk>-<attempt>`.
pub fn verify_job(vmm: &VirtualMachineMigration, disk: i32, attempt: i32) -> String {
    child_name(&vmm.name_any(), &format!("verify-{disk}-{attempt}"))
}

/// One adaptation Job per attempt: `<name>-adapt-<attempt>`.
pub fn adapt_job(vmm: &VirtualMachineMigration, attempt: i32) -> String {
    child_name(&vmm.name_any(), &format!("adapt-{attempt}"))
}

/// One rewrite of the volumes from the source per adaptation attempt that may have changed them:
/// `<name>-rewrite-<attempt>`.
pub fn rewrite_job(vmm: &VirtualMachineMigration, attempt: i32) -> String {
    child_name(&vmm.name_any(), &format!("rewrite-{attempt}"))
}

/// One DataVolume per disk, whatever the attempt: `<name>-disk-<disk>`.
pub fn data_volume(vmm: &VirtualMachineMigration, disk: i32) -> String {
    child_name(&vmm.name_any(), &format!("disk-{disk}"))
}

pub fn vm_name(vmm: &VirtualMachineMigration) -> String {
    vmm.spec
        .target
        .name
        .clone()
        .unwrap_or_else(|| vmm.name_any())
}

/// The migration's own folder in staging: `<url>/<namespace>/<name>-<uid>`, so cleanup never touches another's.
/// None on the direct path.
pub fn staging_url(vmm: &VirtualMachineMigration) -> Option<String> {
    let staging = vmm.spec.staging.as_ref()?;
    Some(format!(
        "{}/{}/{}-{}",
        staging.url.trim_end_matches('/'),
        vmm.namespace().unwrap_or_default(),
        vmm.name_any(),
        uid(vmm)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_stay_valid_labels_and_distinct() {
        let mut vmm = VirtualMachineMigration::new(
            &"a".repeat(63),
            serde_json::from_value(serde_json::json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}},
            "staging": {"url": "s3://b/p"}}))
            .unwrap(),
        );
        vmm.metadata.uid = Some("u".into());
        for name in [
            convert_job(&vmm, 1),
            convert_job(&vmm, 2),
            verify_job(&vmm, 0, 1),
            data_volume(&vmm, 0),
        ] {
            assert!(name.len() <= 63, "{name}");
        }
        assert_ne!(convert_job(&vmm, 1), convert_job(&vmm, 2));
        assert_ne!(data_volume(&vmm, 0), data_volume(&vmm, 1));
    }
}
