//! Migrations interrupted on purpose: cancelled or deleted at each checkpoint, failing and retrying within their
//! budget, and a controller killed with SIGKILL again and again. Same lab and controller setup as `migrate.rs`.

mod support;

use std::time::Duration;

use ferry_api::keys::{HOLD_ANNOTATION, step_selector};
use ferry_api::{Phase, PowerState};
use ferry_controller::surface::{Route, itinerary};
use ferry_testkit::migration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::*;

fn phase_name(phase: Phase) -> String {
    serde_json::to_value(phase)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// Nothing labelled with `uid` in `ns` (children, their pods and volumes), and nothing staged.
async fn nothing_left(client: &kube::Client, ns: &str, name: &str, uid: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    ferry_testkit::eventually(
        &format!("everything of {name} to be gone"),
        Duration::from_secs(95),
        || async {
            let left = children_left(client, ns, uid).await;
            if !left.is_empty() {
                if std::time::Instant::now() > deadline {
                    println!("{name}: still there: {left:?}");
                }
                return None;
            }
            let vmi = kube::Api::<kube::api::DynamicObject>::namespaced_with(
                client.clone(),
                ns,
                &resource("kubevirt.io", "v1", "VirtualMachineInstance"),
            );
            vmi.get_opt(name).await.unwrap().is_none().then_some(())
        },
    )
    .await;
    assert!(
        staged_objects(ns, name, uid, 1).await.is_empty(),
        "{name}: staged objects remain"
    );
}

/// Creates a migration held at `phase` (the guest check: caught while the VM boots) and waits until it is there.
async fn caught_at(
    client: &kube::Client,
    ns: &str,
    name: &str,
    vm: &str,
    (route, phase): (Route, Phase),
) -> String {
    let mut manifest = if route.staged {
        migration::staged_migration(lab().await, ns, name, vm)
    } else {
        migration::migration(lab().await, ns, name, vm)
    };
    if route.adapted {
        manifest["spec"]["conversion"]["guestAdaptation"] = json!("VirtV2v");
    }
    if phase != Phase::ValidatingGuest {
        manifest["metadata"]["annotations"] = json!({HOLD_ANNOTATION: phase_name(phase)});
    }
    migration::apply(client, ns, manifest).await.unwrap();
    let caught = wait_for_phase(client, ns, name, phase, Duration::from_secs(300)).await;
    caught.uid().unwrap()
}

async fn interrupt_at_every_checkpoint(vm: &str, prefix: &str, cancel: bool) {
    let _source = source_lock(vm).await;
    let (client, ns) = setup(prefix).await;
    let api = migrations(&client, ns.name());
    // Each checkpoint of the direct itinerary is caught: held before it (its action not yet taken, everything
    // before it done), or, for the guest check, while the booted VM runs. Then the staged path's own rows.
    let direct = itinerary(Route::DIRECT)
        .into_iter()
        .map(|p| (Route::DIRECT, p));
    let staged = [Phase::Converting, Phase::Importing].map(|p| (Route::STAGED, p));
    // Held before virt-v2v runs; `linux_guest` stops a real adaptation midway.
    let adapted = [(Route::DIRECT.adapted(), Phase::Adapting)];
    for (i, (route, phase)) in direct.chain(staged).chain(adapted).enumerate() {
        set_source_power(vm, true).await;
        let name = format!("{prefix}-{i}");
        let uid = caught_at(&client, ns.name(), &name, vm, (route, phase)).await;
        if cancel {
            let patch = json!({"spec": {"cancel": true}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            let done = wait_for_phase(
                &client,
                ns.name(),
                &name,
                Phase::Cancelled,
                Duration::from_secs(120),
            )
            .await;
            assert!(done.status.unwrap().cleaned_up);
            ferry_testkit::eventually("the finalizer to go", Duration::from_secs(30), || async {
                api.get(&name)
                    .await
                    .unwrap()
                    .finalizers()
                    .is_empty()
                    .then_some(())
            })
            .await;
        } else {
            api.delete(&name, &DeleteParams::default()).await.unwrap();
            ferry_testkit::eventually(
                &format!("{name} to be deleted"),
                Duration::from_secs(120),
                || async { api.get_opt(&name).await.unwrap().is_none().then_some(()) },
            )
            .await;
        }
        nothing_left(&client, ns.name(), &name, &uid).await;
        assert_eq!(
            source_power(vm).await,
            PowerState::PoweredOn,
            "{name} at {phase:?} ({route:?}): the source power is restored"
        );
    }
}

#[tokio::test]
async fn cancelling_at_each_checkpoint_removes_everything_and_restores_power() {
    interrupt_at_every_checkpoint("DC0_C0_RP0_VM0", "cancel", true).await;
}

#[tokio::test]
async fn deleting_at_each_checkpoint_removes_everything_and_restores_power() {
    interrupt_at_every_checkpoint("DC0_C0_RP0_VM1", "delete", false).await;
}

/// DataVolumes the controller created in `ns`, from the audit log.
async fn dv_creates(ns: &str) -> usize {
    lab()
        .await
        .audit_requests_by(migration::SERVICE_ACCOUNT)
        .iter()
        .filter(|r| {
            r.verb == "create" && r.code == 201 && r.resource == "datavolumes" && r.namespace == ns
        })
        .count()
}

/// The lab's fault switches: fail this many conversion pods and imports.
fn faults(convert_pods: u32, imports: u32) -> ConfigMap {
    fault_switches(json!({"fail-pods": convert_pods.to_string(),
        "fail-pods-selector": step_selector("convert"), "fail-imports": imports.to_string()}))
}

fn fault_switches(data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": "lab-faults"}, "data": data})).unwrap()
}

/// Migrates `vm` (powered on first) as `manifest` says, with the lab's fault switches set, until `phase`; the
/// switches are removed again before it returns.
async fn migrate_with_faults(
    client: &kube::Client,
    ns: &str,
    vm: &str,
    switches: ConfigMap,
    manifest: serde_json::Value,
    phase: Phase,
) -> ferry_api::VirtualMachineMigration {
    set_source_power(vm, true).await;
    let config_maps = kube::Api::<ConfigMap>::namespaced(client.clone(), ns);
    config_maps
        .create(&Default::default(), &switches)
        .await
        .unwrap();
    let name = manifest["metadata"]["name"].as_str().unwrap().to_string();
    migration::apply(client, ns, manifest).await.unwrap();
    let reached = wait_for_phase(client, ns, &name, phase, Duration::from_secs(600)).await;
    config_maps
        .delete("lab-faults", &DeleteParams::default())
        .await
        .unwrap();
    reached
}

fn budget_used(status: &ferry_api::VirtualMachineMigrationStatus, phase: Phase) -> i32 {
    status
        .retry
        .iter()
        .flat_map(|r| &r.budget_used)
        .find(|b| b.phase == phase)
        .map_or(0, |b| b.used)
}

#[tokio::test]
async fn failures_within_the_budget_are_retried_and_past_it_fail_with_cleanup() {
    let vm = "DC0_H0_VM0";
    let _source = source_lock(vm).await;
    let (client, ns) = setup("retry").await;
    let manifest = async |name| migration::staged_migration(lab().await, ns.name(), name, vm);

    // Written directly: one blank volume fails to allocate, and one conversion pod is killed while it writes.
    // Both are retried; the second attempt rewrites the volume whole and reads it back equal to the source.
    let kill_writer = fault_switches(json!({"fail-imports": "1", "kill-pods": "1",
        "kill-pods-selector": step_selector("convert")}));
    let done = migrate_with_faults(
        &client,
        ns.name(),
        vm,
        kill_writer,
        migration::migration(lab().await, ns.name(), "direct", vm),
        Phase::Succeeded,
    )
    .await;
    let status = done.status.unwrap();
    assert_eq!(
        (
            budget_used(&status, Phase::Allocating),
            budget_used(&status, Phase::Converting)
        ),
        (1, 1),
        "{:?}",
        status.retry
    );
    assert!(
        status.disks.iter().all(|d| d.verified),
        "{:?}",
        status.disks
    );

    // Staged: one conversion and one import fail once: both are retried and the migration succeeds.
    let done = migrate_with_faults(
        &client,
        ns.name(),
        vm,
        faults(1, 1),
        manifest("once").await,
        Phase::Succeeded,
    )
    .await;
    let status = done.status.unwrap();
    assert_eq!(
        (
            budget_used(&status, Phase::Converting),
            budget_used(&status, Phase::Importing)
        ),
        (1, 1),
        "{:?}",
        status.retry
    );

    // Corrupt content re-imports the disk: the verification finds the mismatch, the DataVolume goes, and its
    // new copy waits until the old claim is gone (the chaos suite found a re-import that found the previous
    // claim instead). A verifier that dies without a result only runs again, on the same DataVolume.
    let dv_creates_before = dv_creates(ns.name()).await;
    let verify_fails = fault_switches(json!({"corrupt-imports": "1", "fail-pods": "1",
        "fail-pods-selector": step_selector("verify")}));
    let done = migrate_with_faults(
        &client,
        ns.name(),
        vm,
        verify_fails,
        manifest("reverify").await,
        Phase::Succeeded,
    )
    .await;
    let status = done.status.unwrap();
    assert_eq!(
        budget_used(&status, Phase::Importing),
        2,
        "{:?}",
        status.retry
    );
    assert_eq!(status.disks[0].verify_failures, 2, "{:?}", status.disks);
    assert_eq!(
        dv_creates(ns.name()).await - dv_creates_before,
        2,
        "one import, and one re-import after the mismatch (none after the failed verifier)"
    );

    // Past the budget: Failed, with everything removed and the source powered on again.
    let mut exhausted = manifest("exhausted").await;
    exhausted["spec"]["retry"] = json!({"budget": 1});
    let failed = migrate_with_faults(
        &client,
        ns.name(),
        vm,
        faults(3, 0),
        exhausted,
        Phase::Failed,
    )
    .await;
    let uid = failed.uid().unwrap();
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("JobFailed"), "{status:?}");
    assert!(
        status
            .message
            .unwrap_or_default()
            .contains("retry budget of 1 spent")
    );
    ferry_testkit::eventually(
        "cleanup after the failure",
        Duration::from_secs(60),
        || async {
            let vmm = migrations(&client, ns.name())
                .get("exhausted")
                .await
                .unwrap();
            (vmm.status.as_ref().is_some_and(|s| s.cleaned_up) && vmm.finalizers().is_empty())
                .then_some(())
        },
    )
    .await;
    nothing_left(&client, ns.name(), "exhausted", &uid).await;
    assert_eq!(
        source_power(vm).await,
        PowerState::PoweredOn,
        "restorePowerState powers the source on after a failure"
    );
}

#[tokio::test]
async fn a_controller_killed_ten_times_still_migrates_with_one_of_everything() {
    let vm = "DC0_H0_VM1";
    let _source = source_lock(vm).await;
    set_source_power(vm, true).await;
    let (client, ns) = setup("restarts").await;
    migration::apply(
        &client,
        ns.name(),
        migration::migration(lab().await, ns.name(), "survivor", vm),
    )
    .await
    .unwrap();
    // Ten SIGKILLs at pseudo-random moments, each followed by a restart.
    let pauses = (Duration::from_millis(100), Duration::from_millis(900));
    kill_controller_at_random(&client, ns.name(), "survivor", 10, pauses, 20261129).await;
    let done = wait_for_phase(
        &client,
        ns.name(),
        "survivor",
        Phase::Succeeded,
        Duration::from_secs(600),
    )
    .await;
    let status = done.status.unwrap();
    assert!(
        status
            .retry
            .as_ref()
            .is_none_or(|r| r.budget_used.is_empty()),
        "no retry was needed: {:?}",
        status.retry
    );
    // A create cut short by the SIGKILL can be stored yet audited as failed (the request's context ends while
    // etcd commits), so count what was made and what was removed, not only 201s. Names are deterministic: a
    // second object of the same kind needs the first one deleted.
    let audit = lab().await.audit_requests_by(migration::SERVICE_ACCOUNT);
    let trail = |resource: &str| {
        let trail: Vec<_> = audit
            .iter()
            .filter(|r| {
                r.resource == resource
                    && r.namespace == ns.name()
                    && (r.verb == "create" || r.verb == "delete")
            })
            .map(|r| format!("{} {} {}", r.verb, r.name, r.code))
            .collect();
        println!("{resource}: {trail:?}");
        trail
    };
    let stored = |trail: &[String], verb: &str, code: &str| {
        trail
            .iter()
            .filter(|t| t.starts_with(verb) && t.ends_with(code))
            .count()
    };
    let jobs = trail("jobs");
    let job_names: std::collections::BTreeSet<_> =
        jobs.iter().filter_map(|t| t.split(' ').nth(1)).collect();
    assert_eq!(
        job_names.len(),
        1,
        "one conversion Job, which wrote and read back every volume: {jobs:?}"
    );
    assert!(
        stored(&jobs, "create", " 201") <= 1 && stored(&jobs, "delete", " 200") <= 1,
        "the Job was made once and removed once, at handover: {jobs:?}"
    );
    for (plural, kind, group, count) in [
        ("datavolumes", "DataVolume", "cdi.kubevirt.io", 3),
        ("virtualmachines", "VirtualMachine", "kubevirt.io", 1),
    ] {
        let trail = trail(plural);
        assert_eq!(
            stored(&trail, "delete", " 200"),
            0,
            "no {kind} was replaced: {trail:?}"
        );
        assert!(stored(&trail, "create", " 201") <= count, "{trail:?}");
        let version = if group == "kubevirt.io" {
            "v1"
        } else {
            "v1beta1"
        };
        let present = kube::Api::<kube::api::DynamicObject>::namespaced_with(
            client.clone(),
            ns.name(),
            &resource(group, version, kind),
        )
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len();
        assert_eq!(present, count, "one {kind} per disk (or VM): {trail:?}");
    }
    let power = status.power.unwrap();
    assert_eq!(
        power.original,
        Some(PowerState::PoweredOn),
        "recorded before the power-off"
    );
    assert_eq!(source_power(vm).await, PowerState::PoweredOff);
}

/// Cleanup waits for its own VM's instance, never for another under the target's name (an instance a
/// person started by hand). Before, deleting the migration waited for that instance forever.
#[tokio::test]
async fn cleanup_ends_beside_an_instance_that_is_not_ours() {
    let vm = "DC0_C0_RP0_VM1";
    let _source = source_lock(vm).await;
    set_source_power(vm, true).await;
    let (client, ns) = setup("foreign-vmi").await;
    let name = "beside-a-stranger";
    caught_at(
        &client,
        ns.name(),
        name,
        vm,
        (Route::DIRECT, Phase::Converting),
    )
    .await;
    let api = migrations(&client, ns.name());
    let target = api
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .target_vm
        .unwrap();
    // A bare instance under the target's name: it waits in Scheduling for a volume that never comes.
    let vmis = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        ns.name(),
        &resource("kubevirt.io", "v1", "VirtualMachineInstance"),
    );
    let stranger = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": target},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "64Mi"}},
                 "volumes": [{"name": "d", "dataVolume": {"name": "never"}}]},
    });
    vmis.create(
        &Default::default(),
        &serde_json::from_value(stranger).unwrap(),
    )
    .await
    .unwrap();

    api.delete(name, &DeleteParams::default()).await.unwrap();
    ferry_testkit::eventually(
        &format!("{name} to be deleted beside the stranger's instance"),
        Duration::from_secs(120),
        || async { api.get_opt(name).await.unwrap().is_none().then_some(()) },
    )
    .await;
    assert_eq!(source_power(vm).await, PowerState::PoweredOn);
    assert!(
        vmis.get_opt(&target).await.unwrap().is_some(),
        "somebody else's instance was deleted"
    );
}

/// S3 refuses CDI's importer (a wrong key, as after a rotated Secret; the refusal is MinIO's own): CDI restarts
/// the importer without end, as real CDI does (`cdi_conformance`), and Ferry ends the attempt after three restarts
/// with CDI's own message, charged to the import's budget. The next attempt, a new DataVolume, succeeds.
#[tokio::test]
async fn an_import_s3_refuses_fails_with_cdis_own_message_is_charged_and_retried() {
    let vm = "DC0_H0_VM0";
    let _source = source_lock(vm).await;
    let (client, ns) = setup("refused").await;
    let refuse = fault_switches(
        json!({"refuse-imports": "3", "refuse-imports-selector": "name=refused-disk-0"}),
    );
    let done = migrate_with_faults(
        &client,
        ns.name(),
        vm,
        refuse,
        migration::staged_migration(lab().await, ns.name(), "refused", vm),
        Phase::Succeeded,
    )
    .await;
    let status = done.status.unwrap();
    assert_eq!(
        budget_used(&status, Phase::Importing),
        1,
        "{:?}",
        status.retry
    );
    let events =
        kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns.name())
            .list(&Default::default())
            .await
            .unwrap();
    let told = events
        .items
        .iter()
        .filter_map(|e| e.message.as_deref())
        .find(|m| m.contains("CDI's importer failed 3 times"))
        .unwrap_or_else(|| panic!("no event tells the failed import: {:?}", events.items));
    assert!(
        told.contains("Unable to connect to s3 data source: could not get s3 object")
            && told.contains("SignatureDoesNotMatch"),
        "{told}"
    );
    assert!(
        !told.contains(
            &lab()
                .await
                .state()
                .staging
                .clone()
                .unwrap()
                .secret_data()
                .unwrap()["secretKey"]
        )
    );
}
