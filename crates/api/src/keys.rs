//! Every label, annotation, finalizer and field-manager name Ferry reads or writes, defined once and built from
//! the API group, so a key cannot be misspelled in one place and not in another.
//!
//! All are `&'static str` constants: they can be used in `format!`, `json!` and label selectors alike. Keys that
//! belong only to the lab (`lab.ferry.dev/...`) live in the lab.

/// The API group as a literal, so that [`concat!`] can build keys from it at compile time.
macro_rules! group {
    () => {
        "migration.platform.example"
    };
}
pub(crate) use group;

/// Holds a migration until the controller has cleaned up what it created.
pub const FINALIZER: &str = concat!(group!(), "/cleanup");

/// `hold-before: <Checkpoint>` stops a migration before it runs that checkpoint (the value is a phase name).
pub const HOLD_ANNOTATION: &str = concat!(group!(), "/hold-before");

/// On every child: the UID of the migration that made it (cleanup and observers select by it).
pub const UID_LABEL: &str = concat!(group!(), "/uid");
/// On every child: the migration's name (as a DNS label).
pub const NAME_LABEL: &str = concat!(group!(), "/migration");
/// On every child: which step made it (`convert`, `verify`, `import`, `vm`).
pub const STEP_LABEL: &str = concat!(group!(), "/step");
/// On a plan's migrations: the plan's name, and its UID (the plan selects its migrations by it).
pub const PLAN_LABEL: &str = concat!(group!(), "/plan");
pub const PLAN_UID_LABEL: &str = concat!(group!(), "/plan-uid");
/// Left on a handed-over VM and its disks: where they came from.
pub const MIGRATED_BY_ANNOTATION: &str = concat!(group!(), "/migrated-by");

/// On a Job: the migration's `metadata.generation` it was made from. A refusal that a change to the migration can
/// fix (the drivers it names) waits until the migration is newer than the Job that refused.
pub const SPEC_GENERATION_ANNOTATION: &str = concat!(group!(), "/spec-generation");

/// The well-known label naming the tool that manages an object, and Ferry's value for it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "ferry";

/// The controller's field manager (server-side apply) and the reporter of its Events.
pub const MANAGER: &str = "ferry-controller";

/// A label selector matching everything a migration with this UID made.
pub fn uid_selector(uid: &str) -> String {
    format!("{UID_LABEL}={uid}")
}

/// A label selector matching what one step of any migration made, for example `step_selector("convert")`.
pub fn step_selector(step: &str) -> String {
    format!("{STEP_LABEL}={step}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_keeps_the_spelling_users_and_clusters_already_rely_on() {
        assert_eq!(crate::GROUP, "migration.platform.example");
        assert_eq!(crate::API_VERSION, "migration.platform.example/v1alpha1");
        assert_eq!(FINALIZER, "migration.platform.example/cleanup");
        assert_eq!(HOLD_ANNOTATION, "migration.platform.example/hold-before");
        assert_eq!(UID_LABEL, "migration.platform.example/uid");
        assert_eq!(
            SPEC_GENERATION_ANNOTATION,
            "migration.platform.example/spec-generation"
        );
        assert_eq!(NAME_LABEL, "migration.platform.example/migration");
        assert_eq!(STEP_LABEL, "migration.platform.example/step");
        assert_eq!(
            MIGRATED_BY_ANNOTATION,
            "migration.platform.example/migrated-by"
        );
        assert_eq!(MANAGED_BY_LABEL, "app.kubernetes.io/managed-by");
        assert_eq!(MANAGED_BY, "ferry");
        assert_eq!(MANAGER, "ferry-controller");
    }

    #[test]
    fn the_kinds_are_in_the_group_the_keys_are_built_from() {
        use kube::Resource;
        assert_eq!(crate::VirtualMachineMigration::group(&()), crate::GROUP);
        assert_eq!(crate::Provider::group(&()), crate::GROUP);
        assert_eq!(
            crate::VirtualMachineMigration::api_version(&()),
            crate::API_VERSION
        );
    }

    #[test]
    fn selectors_are_key_equals_value() {
        assert_eq!(uid_selector("u-1"), "migration.platform.example/uid=u-1");
        assert_eq!(
            step_selector("convert"),
            "migration.platform.example/step=convert"
        );
    }
}
