//! One migration at a time per source VM. Two migrations of one VM would power it off twice, and one's cancel
//! could power it back on while the other's copy boots with the same MAC addresses. Before a migration first
//! touches its source (Preparing records the original power state), it looks for another active migration of the
//! same VM, in any namespace: one that has touched the source already holds it until it ends; of those about to
//! touch it (Preparing), the oldest goes first. The others wait (`SourceVMInUse`), naming the one ahead. One
//! still in its checks (or stopped in them for a person) holds nothing. The rule is the same from every side, so
//! two migrations never both go ahead once each sees the other in the watch cache.

use std::time::Duration;

use ferry_api::{SourceVmStatus, VirtualMachineMigration};
use kube::ResourceExt;

use crate::checkpoint::step::{Next, Step};

/// How often a waiting migration looks again (the one ahead may take hours; a look is a cache read).
const RECHECK: Duration = Duration::from_secs(30);

/// Where the VM lives and which it is: the vCenter's and the VM's instance UUIDs when vSphere reported them,
/// else the Provider and the moref.
/// Borrowed: every waiting migration compares its key with every other migration's.
#[derive(Debug, PartialEq, Eq)]
pub struct VmKey<'a> {
    endpoint: Endpoint<'a>,
    vm: &'a str,
}

#[derive(Debug, PartialEq, Eq)]
enum Endpoint<'a> {
    VCenter(&'a str),
    /// The Provider's namespace and name.
    Provider(&'a str, &'a str),
}

pub fn key<'a>(vmm: &'a VirtualMachineMigration, source: &'a SourceVmStatus) -> VmKey<'a> {
    let endpoint = match source.vcenter_uuid.as_deref() {
        Some(uuid) => Endpoint::VCenter(uuid),
        None => Endpoint::Provider(vmm.provider_namespace(), &vmm.spec.source.provider_ref.name),
    };
    let vm = source.instance_uuid.as_deref().unwrap_or(&source.moref);
    VmKey { endpoint, vm }
}

/// Whether `vmm` has touched its source (recorded its original power state) and not ended.
fn holds_source(vmm: &VirtualMachineMigration) -> bool {
    vmm.status
        .as_ref()
        .is_some_and(|s| s.power.is_some() && !s.phase.is_some_and(ferry_api::Phase::is_terminal))
}

/// Active and discovered: a migration that may go ahead of `vmm` for its source.
fn contends(vmm: &VirtualMachineMigration) -> Option<&SourceVmStatus> {
    let status = vmm.status.as_ref()?;
    if status.phase.is_some_and(ferry_api::Phase::is_terminal) {
        return None;
    }
    status.source.as_ref()
}

/// The order of migrations that have not touched the source yet: oldest first, then by namespace and name.
fn order(vmm: &VirtualMachineMigration) -> (Option<String>, String, String) {
    (
        vmm.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        vmm.namespace().unwrap_or_default(),
        vmm.name_any(),
    )
}

/// The migration ahead of `me` (which has not touched its source, discovered as `source`) for the same VM, if
/// any. Pure.
pub fn ahead<'a>(
    me: &VirtualMachineMigration,
    source: &SourceVmStatus,
    others: impl IntoIterator<Item = &'a VirtualMachineMigration>,
) -> Option<&'a VirtualMachineMigration> {
    let mine = key(me, source);
    let mut first: Option<&VirtualMachineMigration> = None;
    for other in others {
        if other.metadata.uid == me.metadata.uid {
            continue;
        }
        let Some(theirs) = contends(other) else {
            continue;
        };
        if key(other, theirs) != mine {
            continue;
        }
        if holds_source(other) {
            return Some(other);
        }
        let about_to =
            other.status.as_ref().and_then(|s| s.phase) == Some(ferry_api::Phase::Preparing);
        if about_to && order(other) < order(me) && first.is_none_or(|f| order(other) < order(f)) {
            first = Some(other);
        }
    }
    first
}

/// A wait while another migration has, or goes first for, this migration's source VM; None to go ahead.
pub fn wait_for_another(step: &Step<'_>, source: &SourceVmStatus) -> Option<Next> {
    if step.status.power.is_some() {
        return None;
    }
    let store = step.ctx.slots.store()?;
    let migrations = store.state();
    let other = ahead(step.vmm, source, migrations.iter().map(|m| &**m))?;
    let phase = other
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .map(|p| format!("{p:?}"))
        .unwrap_or_default();
    Some(Next::wait(
        "SourceVMInUse",
        format!(
            "source VM {} is being migrated by {}/{} ({phase}); this migration waits until that one ends, so \
             that nothing here powers it off or on meanwhile",
            source.name,
            other.namespace().unwrap_or_default(),
            other.name_any()
        ),
        RECHECK,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::{Phase, PowerStatus, VirtualMachineMigrationStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn source(instance: &str) -> SourceVmStatus {
        SourceVmStatus {
            name: "web-1".into(),
            moref: "vm-42".into(),
            instance_uuid: Some(instance.into()),
            vcenter_uuid: Some("vc-1".into()),
            ..Default::default()
        }
    }

    fn migration(
        ns: &str,
        name: &str,
        created_secs: i64,
        phase: Phase,
        touched: bool,
    ) -> VirtualMachineMigration {
        let mut vmm: VirtualMachineMigration = serde_json::from_value(serde_json::json!({
            "apiVersion": ferry_api::API_VERSION, "kind": "VirtualMachineMigration",
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
            "spec": {"source": {"providerRef": {"name": "vc"}, "vm": {"name": "web-1"}},
                     "target": {"name": name}},
        }))
        .unwrap();
        vmm.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created_secs).unwrap(),
        ));
        vmm.status = Some(VirtualMachineMigrationStatus {
            phase: Some(phase),
            source: Some(source("5012-aaaa")),
            power: touched.then(PowerStatus::default),
            ..Default::default()
        });
        vmm
    }

    #[test]
    fn of_two_about_to_touch_it_the_oldest_goes_first_and_the_younger_waits() {
        let old = migration("a", "old", 0, Phase::Preparing, false);
        let young = migration("b", "young", 10, Phase::Preparing, false);
        let all = [old.clone(), young.clone()];
        assert!(ahead(&old, &source("5012-aaaa"), &all).is_none());
        assert_eq!(
            ahead(&young, &source("5012-aaaa"), &all).map(|m| m.name_any()),
            Some("old".into())
        );
    }

    #[test]
    fn one_that_touched_the_source_holds_it_even_against_an_older_one() {
        let old = migration("a", "old", 0, Phase::Validating, false);
        let holder = migration("b", "young", 10, Phase::Converting, true);
        let all = [old.clone(), holder];
        assert_eq!(
            ahead(&old, &source("5012-aaaa"), &all).map(|m| m.name_any()),
            Some("young".into())
        );
    }

    #[test]
    fn an_older_one_still_in_its_checks_holds_nothing() {
        let stopped = migration("a", "stopped", 0, Phase::ManualInterventionRequired, false);
        let checking = migration("a", "checking", 0, Phase::Validating, false);
        let me = migration("b", "me", 10, Phase::Preparing, false);
        let all = [stopped, checking, me.clone()];
        assert!(ahead(&me, &source("5012-aaaa"), &all).is_none());
    }

    #[test]
    fn ended_migrations_and_other_vms_are_no_contenders() {
        let me = migration("a", "me", 10, Phase::Validating, false);
        let done = migration("a", "done", 0, Phase::Succeeded, true);
        let mut other_vm = migration("a", "other", 0, Phase::Converting, true);
        other_vm.status.as_mut().unwrap().source = Some(source("5012-bbbb"));
        let all = [me.clone(), done, other_vm];
        assert!(ahead(&me, &source("5012-aaaa"), &all).is_none());
    }

    #[test]
    fn without_instance_uuids_the_provider_and_moref_name_the_vm() {
        let mut bare = source("x");
        bare.instance_uuid = None;
        bare.vcenter_uuid = None;
        let a = migration("a", "a", 0, Phase::Validating, false);
        let expected = VmKey {
            endpoint: Endpoint::Provider("a", "vc"),
            vm: "vm-42",
        };
        assert_eq!(key(&a, &bare), expected);
    }
}
