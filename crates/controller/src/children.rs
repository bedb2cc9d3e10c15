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

/// True when `child` is this migration's: it carries our UID label and a controller owner reference to it. Any
/// other object under a name we need is somebody else's: never adopted, acted on or deleted.
pub fn is_ours(child: &impl Resource, vmm: &VirtualMachineMigration) -> bool {
    let uid = uid(vmm);
    let meta = child.meta();
    meta.labels.as_ref().and_then(|l| l.get(UID_LABEL)) == Some(&uid)
        && meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid && o.controller == Some(true))
}

/// `child` (a `kind` under a name this migration needs), unless it is somebody else's: then a person must move it.
pub fn refuse_unless_ours<K: Resource>(
    child: Option<K>,
    vmm: &VirtualMachineMigration,
    kind: &str,
    reason: ferry_api::Reason,
) -> crate::error::Result<Option<K>> {
    match child {
        Some(found) if !is_ours(&found, vmm) => Err(crate::error::Failure::fixable(
            reason,
            format!(
                "{kind} {}/{} exists and is not this migration's (no {UID_LABEL}={} label and controller owner); \
                 delete or rename it, and the migration resumes",
                found.meta().namespace.as_deref().unwrap_or_default(),
                found.meta().name.as_deref().unwrap_or_default(),
                uid(vmm)
            ),
        )),
        other => Ok(other),
    }
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

/// The copy of the source into the volumes again that `spec.recopy` at `recopy` asked for: `<name>-recopy-<recopy>`.
pub fn recopy_job(vmm: &VirtualMachineMigration, recopy: i32) -> String {
    child_name(&vmm.name_any(), &format!("recopy-{recopy}"))
}

/// A warm migration's precopy round `round`, attempt `attempt`: `<name>-precopy-<round>-<attempt>`.
pub fn precopy_job(vmm: &VirtualMachineMigration, round: i32, attempt: i32) -> String {
    child_name(&vmm.name_any(), &format!("precopy-{round}-{attempt}"))
}

/// What every snapshot a warm migration takes on its source is named from: `ferry-<migration uid>-`.
pub fn snapshot_prefix(vmm: &VirtualMachineMigration) -> String {
    format!("ferry-{}-", uid(vmm))
}

/// The Job that is the first consumer of volumes that wait for one, whatever the attempt: `<name>-bind`.
pub fn bind_job(vmm: &VirtualMachineMigration) -> String {
    child_name(&vmm.name_any(), "bind")
}

/// The staging CA bundle CDI's importer trusts (`certConfigMap`): `<name>-staging-ca`.
pub fn staging_ca(vmm: &VirtualMachineMigration) -> String {
    child_name(&vmm.name_any(), "staging-ca")
}

/// A lent Provider's credentials, copied for the Jobs that read the source: `<name>-source-credentials`.
pub fn source_credentials(vmm: &VirtualMachineMigration) -> String {
    child_name(&vmm.name_any(), "source-credentials")
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

    #[test]
    fn only_a_child_with_our_label_and_controller_owner_is_ours() {
        let mut vmm = VirtualMachineMigration::new(
            "m",
            serde_json::from_value(serde_json::json!({
            "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}}}))
            .unwrap(),
        );
        vmm.metadata.uid = Some("u".into());
        vmm.metadata.namespace = Some("ns".into());
        let job = |labels: serde_json::Value, owners: serde_json::Value| {
            serde_json::from_value::<k8s_openapi::api::batch::v1::Job>(serde_json::json!({
                "metadata": {"name": "m-convert-1", "namespace": "ns", "labels": labels,
                             "ownerReferences": owners}}))
            .unwrap()
        };
        let owner = serde_json::to_value([owner(&vmm)]).unwrap();
        let ours = job(serde_json::json!(labels(&vmm, "convert")), owner.clone());
        assert!(is_ours(&ours, &vmm));
        let unlabelled = job(serde_json::json!({}), owner);
        assert!(!is_ours(&unlabelled, &vmm));
        let orphan = job(
            serde_json::json!(labels(&vmm, "convert")),
            serde_json::json!([]),
        );
        assert!(!is_ours(&orphan, &vmm));

        assert!(refuse_unless_ours(Some(ours), &vmm, "Job", ferry_api::Reason::JobExists).is_ok());
        let err = refuse_unless_ours(Some(orphan), &vmm, "Job", ferry_api::Reason::JobExists)
            .unwrap_err();
        assert_eq!(err.reason, ferry_api::Reason::JobExists);
        assert!(
            err.fixable && err.message.contains("Job ns/m-convert-1"),
            "{err}"
        );
        assert!(
            refuse_unless_ours(
                None::<k8s_openapi::api::batch::v1::Job>,
                &vmm,
                "Job",
                ferry_api::Reason::JobExists
            )
            .unwrap()
            .is_none()
        );
    }
}
