//! The reconcile tier: one `reconcile()` each, against the exact requests it must make (see [`fixtures`]).
//! No lab, no network: each test runs in milliseconds.

mod fixtures;

use std::time::Duration;

use ferry_api::{FINALIZER, VirtualMachineMigration};
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::reconcile::HOLD_ANNOTATION;
use fixtures::{ApiServer, Exchange};

const KEY: &str = "apps/web";
const EARLIER: &str = "2026-01-01T00:00:00Z";

/// The migration `apps/web` as read at resourceVersion 100, with our finalizer, `status` and the spec changes
/// of `spec` merged in.
fn migration(status: Value, spec: Value) -> Value {
    let mut object = json!({
        "apiVersion": "migration.platform.example/v1alpha1",
        "kind": "VirtualMachineMigration",
        "metadata": {
            "name": "web", "namespace": "apps", "uid": "6f1c2a9e-0000-4000-8000-000000000001",
            "resourceVersion": "100", "generation": 1, "finalizers": [FINALIZER],
        },
        "spec": {
            "source": {"providerRef": {"name": "vc"}, "vm": {"name": "web-vm"}},
            "target": {"networks": [{"source": "VM Network", "pod": {}}]},
            "staging": {"url": "http://staging.example/ferry"},
            "retry": {"budget": 1},
        },
        "status": status,
    });
    if let Some(changes) = spec.as_object() {
        for (k, v) in changes {
            object["spec"][k] = v.clone();
        }
    }
    object
}

/// The GET of Provider `apps/vc`, answered with one whose Secret is `vc-creds`.
fn provider_vc() -> Exchange {
    Exchange::get("/apis/migration.platform.example/v1alpha1/namespaces/apps/providers/vc").reply(json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "Provider",
        "metadata": {"name": "vc", "namespace": "apps", "generation": 1},
        "spec": {"type": "vsphere", "url": "https://vc.example/sdk", "secretRef": {"name": "vc-creds"},
            "tls": {"insecureSkipVerify": true}},
    }))
}

fn vmm(object: Value) -> VirtualMachineMigration {
    serde_json::from_value(object).expect("a VirtualMachineMigration")
}

/// What discovery recorded: one 1 GiB disk, one NIC (every field the controller writes back).
fn discovered() -> Value {
    json!({
        "name": "web-vm", "moref": "vm-42", "cpus": 2, "coresPerSocket": 1, "memoryMib": 2048, "snapshots": 0,
        "disks": [{"key": 2000, "file": "[ds1] web-vm/web-vm.vmdk", "capacityBytes": 1073741824,
            "backing": "VirtualDiskFlatVer2BackingInfo", "thin": false, "snapshotChain": 0}],
        "nics": [{"mac": "00:50:56:00:00:01", "network": "VM Network"}],
    })
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no condition {type_} in {status:#}"))
}

#[tokio::test]
async fn a_hold_is_one_status_write_and_no_event() {
    let mut object = migration(
        json!({
            "phase": "Validating", "observedGeneration": 1, "reason": "SourceFound",
            "message": "found web-vm", "targetVM": "web", "source": discovered(),
        }),
        json!({}),
    );
    object["metadata"]["annotations"] = json!({HOLD_ANNOTATION: "Validating"});
    let vmm = vmm(object);
    let server = ApiServer::new();
    let ctx = server.ctx.clone();
    let script = vec![Exchange::status_write(&vmm, "101", |status| {
        assert_eq!(status["phase"], "Validating", "{status:#}");
        assert_eq!(status["reason"], "Held", "{status:#}");
        assert_eq!(
            status["message"],
            "held before Validating by the annotation migration.platform.example/hold-before; \
             remove it to go on"
        );
        // Everything else is what was read.
        assert_eq!(status["source"], discovered());
        assert_eq!(status["targetVM"], "web");
    })];
    let action = server.reconcile(vmm, script).await.expect("reconciled");
    assert_eq!(action, Action::await_change());
    // The write's resourceVersion is remembered: the copy read before it is now stale.
    assert!(ctx.is_stale(KEY, Some("100")));
    assert!(!ctx.is_stale(KEY, Some("101")));
}

#[tokio::test]
async fn a_hold_already_recorded_makes_no_request() {
    let mut object = migration(
        json!({
            "phase": "Validating", "observedGeneration": 1, "reason": "Held",
            "message": "held before Validating by the annotation migration.platform.example/hold-before; \
                        remove it to go on",
            "source": discovered(),
        }),
        json!({}),
    );
    object["metadata"]["annotations"] = json!({HOLD_ANNOTATION: "Validating"});
    let action = ApiServer::new()
        .reconcile(vmm(object), vec![])
        .await
        .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_new_migration_held_before_discovering_publishes_its_start_then_writes_held() {
    let mut object = migration(Value::Null, json!({}));
    object["metadata"]["annotations"] = json!({HOLD_ANNOTATION: "Discovering"});
    let vmm = vmm(object);
    let script = vec![
        Exchange::event(&vmm, "Normal", "Discovering", |note| {
            assert_eq!(note, "migration started")
        }),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "Discovering", "{status:#}");
            assert_eq!(status["reason"], "Held", "{status:#}");
            assert_eq!(status["targetVM"], "web");
            assert_eq!(status["observedGeneration"], 1);
            assert!(status["startTime"].is_string(), "{status:#}");
            assert_eq!(status["checkpoints"][0]["phase"], "Discovering");
            let discovered = condition(status, "SourceDiscovered");
            assert_eq!(
                (&discovered["status"], &discovered["reason"]),
                (&json!("False"), &json!("InProgress"))
            );
            let ready = condition(status, "Ready");
            assert_eq!(
                (&ready["status"], &ready["reason"]),
                (&json!("False"), &json!("MigrationInProgress"))
            );
        }),
    ];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_copy_older_than_our_last_write_makes_no_request() {
    let mut object = migration(json!({"phase": "Converting"}), json!({}));
    object["metadata"]["resourceVersion"] = json!("99");
    let server = ApiServer::new();
    server.ctx.wrote(KEY, Some("100".into()));
    let action = server
        .reconcile(vmm(object), vec![])
        .await
        .expect("skipped");
    assert_eq!(action, Action::requeue(Duration::from_secs(2)));
}

#[tokio::test]
async fn a_finished_migration_releases_only_its_finalizer() {
    let mut object = migration(
        json!({"phase": "Succeeded", "observedGeneration": 1, "reason": "HandedOver"}),
        json!({}),
    );
    object["metadata"]["finalizers"] = json!(["example.com/keep", FINALIZER]);
    let vmm = vmm(object);
    let server = ApiServer::new();
    let ctx = server.ctx.clone();
    ctx.wrote(KEY, Some("90".into()));
    let script = vec![Exchange::merge_patch(&vmm, "101", |patch| {
        assert_eq!(
            *patch,
            json!({"metadata": {"finalizers": ["example.com/keep"], "resourceVersion": "100"}})
        );
    })];
    let action = server.reconcile(vmm, script).await.expect("released");
    assert_eq!(action, Action::await_change());
    // The migration is over: its last write is forgotten, so no copy of it is ever skipped again.
    assert!(!ctx.is_stale(KEY, Some("1")));
}

#[tokio::test]
async fn a_new_migration_first_gets_the_finalizer() {
    let mut object = migration(Value::Null, json!({}));
    object["metadata"]["finalizers"] = json!([]);
    let vmm = vmm(object);
    let server = ApiServer::new();
    let ctx = server.ctx.clone();
    let script = vec![Exchange::merge_patch(&vmm, "101", |patch| {
        assert_eq!(
            *patch,
            json!({"metadata": {"finalizers": [FINALIZER], "resourceVersion": "100"}})
        );
    })];
    let action = server.reconcile(vmm, script).await.expect("added");
    assert_eq!(action, Action::requeue(Duration::ZERO));
    assert!(ctx.is_stale(KEY, Some("100")));
}

#[tokio::test]
async fn cancel_writes_cancelling_then_publishes_it() {
    let vmm = vmm(migration(
        json!({
            "phase": "Converting", "observedGeneration": 1, "reason": "Converting",
            "message": "Job web-convert-1 (attempt 1) converts the disks", "source": discovered(),
        }),
        json!({"cancel": true}),
    ));
    let script = vec![
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "Cancelling", "{status:#}");
            assert_eq!(status["reason"], "CancelRequested");
            assert_eq!(status["message"], "removing what the migration created");
            let ready = condition(status, "Ready");
            assert_eq!(
                (&ready["status"], &ready["reason"], &ready["message"]),
                (
                    &json!("False"),
                    &json!("Cancelling"),
                    &json!("spec.cancel is true")
                )
            );
            assert_eq!(status.get("cleanedUp"), None);
        }),
        Exchange::event(&vmm, "Normal", "Cancelling", |note| {
            assert_eq!(note, "spec.cancel is true: cleaning up")
        }),
    ];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("cancelling");
    assert_eq!(action, Action::requeue(Duration::ZERO));
}

#[tokio::test]
async fn a_failed_conversion_with_its_budget_spent_fails_the_migration() {
    let earlier_error = "Job web-convert-1: reading [ds1] web-vm/web-vm.vmdk: connection reset";
    let vmm = vmm(migration(
        json!({
            "phase": "Converting", "observedGeneration": 1, "reason": "Converting",
            "message": "Job web-convert-2 (attempt 2) converts the disks", "source": discovered(),
            "disks": [{"index": 0, "sourceFile": "[ds1] web-vm/web-vm.vmdk", "capacityBytes": 1073741824}],
            "progress": "0% (0 MiB of 1024 MiB)",
            "retry": {
                "attempts": 0, "budgetUsed": [{"phase": "Converting", "used": 1}], "charged": ["job-uid-1"],
                "lastError": {"class": "BoundedRetryable", "reason": "ShortRead",
                    "message": earlier_error, "phase": "Converting", "time": EARLIER},
            },
        }),
        json!({"retry": {"budget": 1}}),
    ));
    let error = r#"{"error": {"class": "BoundedRetryable", "reason": "ShortRead", "message": "reading [ds1] web-vm/web-vm.vmdk: connection reset"}}"#;
    let message = "Job web-convert-2: reading [ds1] web-vm/web-vm.vmdk: connection reset \
                   (retry budget of 1 spent)";
    let script = vec![
        Exchange::get("/apis/batch/v1/namespaces/apps/jobs/web-convert-2").reply(failed_job(
            "web-convert-2",
            "job-uid-2",
            json!({}),
        )),
        pods_of_failed_job("web-convert-2", "job-uid-2", "convert", error),
        Exchange::event(&vmm, "Warning", "ShortRead", move |note| {
            assert_eq!(note, message)
        }),
        Exchange::status_write(&vmm, "101", move |status| {
            assert_eq!(status["phase"], "Failed", "{status:#}");
            assert_eq!(status["reason"], "ShortRead");
            assert_eq!(status["message"], message);
            assert!(status["completionTime"].is_string(), "{status:#}");
            let retry = &status["retry"];
            assert_eq!(retry["lastError"]["reason"], "ShortRead");
            assert_eq!(retry["lastError"]["message"], message);
            assert_eq!(retry["lastError"]["phase"], "Converting");
            // An exhausted budget charges nothing more.
            assert_eq!(
                retry["budgetUsed"],
                json!([{"phase": "Converting", "used": 1}])
            );
            assert_eq!(retry["charged"], json!(["job-uid-1"]));
            let converted = condition(status, "DiskConverted");
            assert_eq!(
                (
                    &converted["status"],
                    &converted["reason"],
                    &converted["message"]
                ),
                (&json!("False"), &json!("ShortRead"), &json!(message))
            );
            let ready = condition(status, "Ready");
            assert_eq!(ready["status"], "False");
            assert_eq!(ready["message"], format!("failed at Converting: {message}"));
            // Ready comes last, whatever order the conditions were set in.
            assert_eq!(
                status["conditions"].as_array().and_then(|c| c.last()),
                Some(ready)
            );
        }),
    ];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("failed, as a status");
    assert_eq!(action, Action::requeue(Duration::ZERO));
}

/// Waiting for a person who has not acted yet: the checkpoint that stopped it runs again, fails the same way,
/// and that is neither a new Event nor a write.
#[tokio::test]
async fn manual_intervention_still_unresolved_reads_and_writes_nothing() {
    let message = "Secret apps/vc-creds named by Provider vc does not exist; \
                   create it with keys user and password";
    let vmm = vmm(migration(
        json!({
            "phase": "ManualInterventionRequired", "observedGeneration": 1,
            "reason": "ProviderSecretNotFound", "message": message, "targetVM": "web",
            "startTime": EARLIER,
            "checkpoints": [{"phase": "Discovering", "entered": "2026-01-01T00:00:00.000000Z"}],
            "conditions": [
                {"type": "SourceDiscovered", "status": "False", "reason": "InProgress",
                    "message": "Discovering in progress", "observedGeneration": 1, "lastTransitionTime": EARLIER},
                {"type": "Ready", "status": "False", "reason": "ProviderSecretNotFound",
                    "message": format!("{message} (at Discovering)"), "observedGeneration": 1,
                    "lastTransitionTime": EARLIER},
            ],
            "retry": {"attempts": 0, "lastError": {"class": "Permanent", "reason": "ProviderSecretNotFound",
                "message": message, "phase": "Discovering", "time": EARLIER}},
        }),
        json!({}),
    ));
    let script = vec![
        provider_vc(),
        Exchange::get("/api/v1/namespaces/apps/secrets/vc-creds").not_found("secrets", "vc-creds"),
    ];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("still waiting");
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
}

/// The same checkpoint failing the first time: the error is recorded, published once, and the migration waits.
#[tokio::test]
async fn a_missing_provider_secret_stops_for_a_person_with_one_event_and_one_write() {
    let message = "Secret apps/vc-creds named by Provider vc does not exist; \
                   create it with keys user and password";
    let vmm = vmm(migration(
        json!({
            "phase": "Discovering", "observedGeneration": 1, "reason": "Started",
            "message": "discovering the source VM", "targetVM": "web", "startTime": EARLIER,
        }),
        json!({}),
    ));
    let script = vec![
        provider_vc(),
        Exchange::get("/api/v1/namespaces/apps/secrets/vc-creds").not_found("secrets", "vc-creds"),
        Exchange::event(&vmm, "Warning", "ProviderSecretNotFound", move |note| {
            assert_eq!(note, message)
        }),
        Exchange::status_write(&vmm, "101", move |status| {
            assert_eq!(status["phase"], "ManualInterventionRequired", "{status:#}");
            assert_eq!(status["reason"], "ProviderSecretNotFound");
            assert_eq!(status["message"], message);
            let error = &status["retry"]["lastError"];
            assert_eq!(
                (&error["class"], &error["reason"], &error["phase"]),
                (
                    &json!("Permanent"),
                    &json!("ProviderSecretNotFound"),
                    &json!("Discovering")
                )
            );
            // A person's fix is awaited, not retried on a clock.
            assert_eq!(status["retry"]["attempts"], 0);
            assert_eq!(status["retry"].get("nextAttemptTime"), None);
            let ready = condition(status, "Ready");
            assert_eq!(
                (&ready["status"], &ready["reason"], &ready["message"]),
                (
                    &json!("False"),
                    &json!("ProviderSecretNotFound"),
                    &json!(format!("{message} (at Discovering)"))
                )
            );
        }),
    ];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("waiting for a person");
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
}

/// A Job under the name the conversion needs that is not this migration's (no UID label, no controller owner):
/// its result is never read and it is never deleted; a person is asked to move it.
#[tokio::test]
async fn a_job_in_the_way_is_refused_not_adopted() {
    let vmm = vmm(migration(
        json!({
            "phase": "Converting", "observedGeneration": 1, "reason": "Converting",
            "message": "Job web-convert-1 (attempt 1) converts the disks", "source": discovered(),
            "disks": [{"index": 0, "sourceFile": "[ds1] web-vm/web-vm.vmdk", "capacityBytes": 1073741824}],
        }),
        json!({}),
    ));
    let script = vec![
        Exchange::get("/apis/batch/v1/namespaces/apps/jobs/web-convert-1").reply(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "web-convert-1", "namespace": "apps", "uid": "someone-elses"},
            "spec": {"template": {"spec": {"containers": []}}},
            "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
        })),
        Exchange::event(&vmm, "Warning", "JobExists", |note| {
            assert!(
                note.contains("Job apps/web-convert-1 exists and is not this migration's"),
                "{note}"
            )
        }),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "ManualInterventionRequired", "{status:#}");
            assert_eq!(status["reason"], "JobExists");
        }),
    ];
    ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("waiting for a person");
}

#[tokio::test]
async fn a_retry_not_due_yet_makes_no_request() {
    let due =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(3600);
    let vmm = vmm(migration(
        json!({
            "phase": "Converting", "observedGeneration": 1, "reason": "APIServerBusy",
            "retry": {"attempts": 3, "nextAttemptTime": due.to_string()},
        }),
        json!({}),
    ));
    let action = ApiServer::new()
        .reconcile(vmm, vec![])
        .await
        .expect("waiting");
    // `Action { requeue_after: Some(3599.99…s) }`: the time left until the attempt is due.
    let debug = format!("{action:?}");
    let seconds: f64 = debug
        .split_once("Some(")
        .and_then(|(_, rest)| rest.split_once("s)"))
        .and_then(|(s, _)| s.parse().ok())
        .unwrap_or_else(|| panic!("a requeue: {debug}"));
    assert!((3590.0..=3600.0).contains(&seconds), "{debug}");
}

#[tokio::test]
async fn deleting_a_finished_migration_only_releases_the_finalizer() {
    let mut object = migration(
        json!({"phase": "Cancelled", "observedGeneration": 1, "cleanedUp": true}),
        json!({}),
    );
    object["metadata"]["deletionTimestamp"] = json!(EARLIER);
    let vmm = vmm(object);
    let script = vec![Exchange::merge_patch(&vmm, "101", |patch| {
        assert_eq!(
            *patch,
            json!({"metadata": {"finalizers": [], "resourceVersion": "100"}})
        );
    })];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("released");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn deleting_a_migration_without_our_finalizer_makes_no_request() {
    let mut object = migration(json!({"phase": "Converting"}), json!({}));
    object["metadata"]["deletionTimestamp"] = json!(EARLIER);
    object["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let action = ApiServer::new()
        .reconcile(vmm(object), vec![])
        .await
        .expect("nothing to do");
    assert_eq!(action, Action::await_change());
}

/// The fixture itself: a request beyond the script, or one the script has and the reconcile never made, fails.
mod the_script {
    use super::*;

    #[tokio::test]
    #[should_panic(
        expected = "unexpected request after the 0 of the script: PATCH /apis/migration.platform.example/v1alpha1/namespaces/apps/virtualmachinemigrations/web?"
    )]
    async fn refuses_a_request_beyond_it() {
        let mut object = migration(Value::Null, json!({}));
        object["metadata"]["finalizers"] = json!([]);
        let _ = ApiServer::new().reconcile(vmm(object), vec![]).await;
    }

    #[tokio::test]
    #[should_panic(expected = "request 1 of 1 never came: the reconcile returned without PATCH")]
    async fn fails_when_a_request_never_comes() {
        let mut object = migration(json!({"phase": "Converting"}), json!({}));
        object["metadata"]["resourceVersion"] = json!("99");
        let vmm = vmm(object);
        let server = ApiServer::new();
        server.ctx.wrote(KEY, Some("100".into()));
        let script = vec![Exchange::status_write(&vmm, "101", |_| {})];
        let _ = server.reconcile(vmm, script).await;
    }

    #[tokio::test]
    #[should_panic(expected = "request 1 of 1")]
    async fn fails_on_another_request_than_the_next_one() {
        let mut object = migration(Value::Null, json!({}));
        object["metadata"]["finalizers"] = json!([]);
        let vmm = vmm(object);
        let script = vec![Exchange::status_write(&vmm, "101", |_| {})];
        let _ = ApiServer::new().reconcile(vmm, script).await;
    }
}

/// `apps/web` at CreatingVM with its disk imported, and the VirtualMachine it builds, as stored with `memory`.
fn creating_vm(memory: &str) -> (VirtualMachineMigration, Value) {
    let vmm = vmm(migration(
        json!({
            "phase": "CreatingVM", "observedGeneration": 1, "reason": "DisksImportedAndVerified",
            "message": "1 disk(s) in their volumes", "targetVM": "web", "source": discovered(),
            "disks": [{"index": 0, "sourceFile": "[ds1] web-vm/web-vm.vmdk", "capacityBytes": 1073741824,
                "dataVolume": "web-disk-0", "verified": true}],
        }),
        json!({}),
    ));
    let source = serde_json::from_value(discovered()).expect("a source");
    let mut vm = serde_json::to_value(crate::build::vm::virtual_machine(&vmm, &source)).unwrap();
    vm["metadata"]["uid"] = json!("vm-uid");
    let domain = &mut vm["spec"]["template"]["spec"]["domain"];
    domain["memory"]["guest"] = json!(memory);
    domain["resources"]["requests"]["memory"] = json!(memory);
    (vmm, vm)
}

const VM_PATH: &str = "/apis/kubevirt.io/v1/namespaces/apps/virtualmachines/web";

#[tokio::test]
async fn a_vm_someone_changed_is_brought_back_to_the_source_shape() {
    let (vmm, edited) = creating_vm("8Gi");
    let script = vec![
        Exchange::get(VM_PATH).reply(edited.clone()),
        Exchange::new(http::Method::PATCH, format!("{VM_PATH}?"))
            .content_type("application/merge-patch+json")
            .check(|patch| {
                assert_eq!(
                    patch["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
                    "2Gi"
                )
            })
            .reply_with(move |patch| {
                let mut stored = edited;
                stored["spec"]["template"] = patch["spec"]["template"].clone();
                stored
            }),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "CreatingVM", "{status:#}");
            assert_eq!(status["reason"], "VMUpdated", "{status:#}");
        }),
    ];
    ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("the VM patched");
}

#[tokio::test]
async fn a_vm_admission_rewrites_is_kept_as_admitted_not_patched_forever() {
    // A mutating webhook (here: a policy that sets every VM's memory) undoes the patch as it is written.
    let (vmm, rewritten) = creating_vm("8Gi");
    let script = vec![
        Exchange::get(VM_PATH).reply(rewritten.clone()),
        Exchange::new(http::Method::PATCH, format!("{VM_PATH}?"))
            .content_type("application/merge-patch+json")
            .reply(rewritten.clone()),
        // On to Starting in the same reconcile: the VM as admitted, no VMI yet.
        Exchange::get(VM_PATH).reply(rewritten),
        Exchange::get("/apis/kubevirt.io/v1/namespaces/apps/virtualmachineinstances/web")
            .not_found("virtualmachineinstances.kubevirt.io", "web"),
        Exchange::event(&vmm, "Normal", "VMCreated", |note| {
            assert!(note.contains("kept as the cluster admitted it"), "{note}")
        }),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "Starting", "{status:#}");
            let created = condition(status, "VMCreated");
            assert_eq!(created["status"], "True");
            assert!(
                created["message"]
                    .as_str()
                    .unwrap()
                    .contains("admission rewrites spec.template.spec.domain.memory.guest"),
                "{created:#}"
            );
        }),
    ];
    ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("advanced");
}

/// `apps/web` allocating its one blank volume on the direct path, on a WaitForFirstConsumer class.
fn allocating() -> VirtualMachineMigration {
    vmm(migration(
        json!({
            "phase": "Allocating", "observedGeneration": 1, "reason": "Allocating",
            "message": "web-disk-0 created", "targetVM": "web", "source": discovered(),
            "disks": [{"index": 0, "sourceFile": "[ds1] web-vm/web-vm.vmdk", "capacityBytes": 1073741824,
                "dataVolume": "web-disk-0"}],
        }),
        json!({"staging": null, "target": {"networks": [{"source": "VM Network", "pod": {}}],
            "storage": {"storageClassName": "local-wffc"}}}),
    ))
}

const DV_PATH: &str = "/apis/cdi.kubevirt.io/v1beta1/namespaces/apps/datavolumes/web-disk-0";
const BIND_JOB_PATH: &str = "/apis/batch/v1/namespaces/apps/jobs/web-bind";

/// Blank DataVolume `web-disk-0` of `apps/web` with `status` as CDI writes it.
fn blank_data_volume(status: Value) -> Value {
    json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "web-disk-0", "namespace": "apps", "uid": "dv-uid-0",
            "creationTimestamp": k8s_openapi::jiff::Timestamp::now().to_string(),
            "labels": {ferry_api::keys::UID_LABEL: "6f1c2a9e-0000-4000-8000-000000000001"},
            "ownerReferences": [{"apiVersion": "migration.platform.example/v1alpha1",
                "kind": "VirtualMachineMigration", "name": "web",
                "uid": "6f1c2a9e-0000-4000-8000-000000000001", "controller": true}]},
        "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "local-wffc"}},
        "status": status,
    })
}

/// CDI v1.65.0 on a WaitForFirstConsumer class without a CSIDriver (no volume populators) leaves a blank volume
/// in `WaitForFirstConsumer`, and runs its importer (which makes `disk.img` anew) only once the claim's first
/// consumer ended: so that consumer is a Job of its own, never the conversion pod. The status is CDI's own.
#[tokio::test]
async fn a_volume_cdi_keeps_for_its_first_consumer_gets_one_that_writes_nothing() {
    let vmm = allocating();
    let waiting = blank_data_volume(json!({
        "phase": "WaitForFirstConsumer", "progress": "N/A", "claimName": "web-disk-0",
        "conditions": [
            {"type": "Bound", "status": "False", "reason": "Pending",
                "message": "target PVC web-disk-0 Pending and waiting for first consumer to be created before binding"},
            {"type": "Ready", "status": "False"},
            {"type": "Running", "status": "False"},
        ],
    }));
    let script = vec![
        Exchange::get(DV_PATH).reply(waiting),
        Exchange::get(BIND_JOB_PATH).not_found("jobs.batch", "web-bind"),
        Exchange::new(http::Method::POST, "/apis/batch/v1/namespaces/apps/jobs?")
            .content_type("application/json")
            .check(|job| {
                assert_eq!(job["metadata"]["name"], "web-bind", "{job:#}");
                assert_eq!(
                    job["metadata"]["labels"][ferry_api::keys::UID_LABEL],
                    "6f1c2a9e-0000-4000-8000-000000000001"
                );
                let pod = &job["spec"]["template"]["spec"];
                // It binds every disk's claim, read-only, and runs nothing that writes.
                assert_eq!(
                    pod["volumes"],
                    json!([{"name": "disk-0", "persistentVolumeClaim":
                        {"claimName": "web-disk-0", "readOnly": true}}]),
                    "{pod:#}"
                );
                let container = &pod["containers"][0];
                assert_eq!(container["args"], json!(["--version"]), "{container:#}");
                assert_eq!(container["volumeMounts"][0]["readOnly"], true);
                assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
            })
            .reply_with(|job| job.clone()),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "Allocating", "{status:#}");
            assert_eq!(status["reason"], "Allocating", "{status:#}");
            assert_eq!(
                status["message"],
                "web-disk-0 WaitForFirstConsumer; Job web-bind created to be the volumes' first consumer"
            );
        }),
    ];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("waiting for the volume");
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}

/// Bound by the first consumer, CDI's blank importer still has to run (`PVCBound`, then `ImportScheduled`...):
/// nothing is written into the volume until CDI says `Succeeded`, and the first consumer is left to end.
#[tokio::test]
async fn a_volume_bound_but_not_yet_imported_by_cdi_is_not_written() {
    let vmm = allocating();
    let bound = blank_data_volume(json!({
        "phase": "PVCBound", "progress": "N/A", "claimName": "web-disk-0",
        "conditions": [
            {"type": "Bound", "status": "True", "reason": "Bound", "message": "PVC web-disk-0 Bound"},
            {"type": "Ready", "status": "False"},
            {"type": "Running", "status": "False"},
        ],
    }));
    let script = vec![
        Exchange::get(DV_PATH).reply(bound),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "Allocating", "{status:#}");
            assert_eq!(status["message"], "web-disk-0 PVCBound");
        }),
    ];
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("waiting for CDI's import");
    assert_eq!(action, Action::requeue(Duration::from_secs(60)));
}

/// KubeVirt v1.9.0's VirtualMachine between two tries of a crash loop (virt-controller's `setPrintableStatus`
/// and `syncStartFailureStatus`): no instance, and nothing else says why.
fn crash_looping_vm(mut vm: Value) -> Value {
    vm["spec"]["runStrategy"] = json!("Always");
    vm["status"] = json!({
        "printableStatus": "CrashLoopBackOff", "runStrategy": "Always",
        "startFailure": {"consecutiveFailCount": 2, "lastFailedVMIUID": "3f1c0d52-vmi",
            "retryAfterTimestamp": "2026-12-06T10:00:52Z"},
        "conditions": [{"type": "Ready", "status": "False", "reason": "VMINotExists",
            "message": "VMI does not exist", "lastProbeTime": null,
            "lastTransitionTime": "2026-12-06T10:00:01Z"}],
    });
    vm
}

#[tokio::test]
async fn a_vm_kubevirt_keeps_failing_to_start_goes_to_the_guest_check_with_kubevirts_words() {
    let (creating, vm) = creating_vm("2Gi");
    let mut object = serde_json::to_value(&creating).unwrap();
    object["status"]["phase"] = json!("Starting");
    object["status"]["reason"] = json!("VMCreated");
    let vmm = vmm(object);
    let looping = crash_looping_vm(vm);
    let vmi_path = "/apis/kubevirt.io/v1/namespaces/apps/virtualmachineinstances/web";
    let script = vec![
        Exchange::get(VM_PATH).reply(looping.clone()),
        Exchange::get(vmi_path).not_found("virtualmachineinstances.kubevirt.io", "web"),
        // The guest check, in the same reconcile.
        Exchange::get(VM_PATH).reply(looping.clone()),
        Exchange::get(vmi_path).not_found("virtualmachineinstances.kubevirt.io", "web"),
        // Judged failed: the VM is stopped, its volumes kept, and a person is asked.
        Exchange::get(VM_PATH).reply(looping.clone()),
        Exchange::new(http::Method::PATCH, format!("{VM_PATH}?"))
            .content_type("application/merge-patch+json")
            .check(|patch| assert_eq!(patch["spec"]["runStrategy"], "Halted"))
            .reply(looping),
        Exchange::event(&vmm, "Normal", "VMIFailed", |note| {
            assert_eq!(
                note,
                "VirtualMachine web is in CrashLoopBackOff: 2 instance(s) in a row failed before they ran; \
                 KubeVirt tries again after 2026-12-06T10:00:52Z; the guest check follows up"
            )
        }),
        Exchange::event(&vmm, "Warning", "GuestNotReady", |note| {
            assert!(note.contains("CrashLoopBackOff"), "{note}")
        }),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "ManualInterventionRequired", "{status:#}");
            let message = status["message"].as_str().unwrap();
            assert!(message.contains("CrashLoopBackOff"), "{message}");
            assert!(
                message.contains("kept with its 1 DataVolume(s)"),
                "{message}"
            );
        }),
    ];
    ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("stopped for a person");
}

/// KubeVirt v1.9.0's VMI in a namespace that enforces Pod Security's `restricted` level, when the KubeVirt CR gives
/// launcher pods no seccomp profile (its default): virt-controller's words, as the lab's real node recorded them.
fn vmi_whose_pod_is_refused() -> Value {
    let refused = "failed to create pod for vmi apps/web, it needs a privileged namespace to run: pods \
                   \"virt-launcher-web-87987\" is forbidden: violates PodSecurity \"restricted:latest\": \
                   seccompProfile (pod or containers \"guest-console-log\", \"compute\" must set \
                   securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")";
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "web", "namespace": "apps", "uid": "vmi-uid",
            "creationTimestamp": "2026-12-06T09:47:22Z"},
        "status": {
            "phase": "Pending",
            "guestOSInfo": {},
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodNotExists",
                    "message": "virt-launcher pod has not yet been scheduled", "lastProbeTime": "2026-12-06T09:47:22Z",
                    "lastTransitionTime": "2026-12-06T09:47:22Z"},
                {"type": "Synchronized", "status": "False", "reason": "FailedCreate", "message": refused,
                    "lastProbeTime": null, "lastTransitionTime": "2026-12-06T09:47:22Z"},
            ],
        },
    })
}

#[tokio::test]
async fn a_vm_whose_launcher_pod_is_refused_says_kubevirts_words_and_waits_in_the_guest_check() {
    let (creating, mut vm) = creating_vm("2Gi");
    vm["spec"]["runStrategy"] = json!("Always");
    let mut object = serde_json::to_value(&creating).unwrap();
    object["status"]["phase"] = json!("Starting");
    object["status"]["reason"] = json!("VMCreated");
    let vmm = vmm(object);
    let vmi_path = "/apis/kubevirt.io/v1/namespaces/apps/virtualmachineinstances/web";
    let vmi = vmi_whose_pod_is_refused();
    let script = vec![
        Exchange::get(VM_PATH).reply(vm.clone()),
        Exchange::get(vmi_path).reply(vmi.clone()),
        // The guest check, in the same reconcile: KubeVirt retries, so it waits, saying why.
        Exchange::get(VM_PATH).reply(vm),
        Exchange::get(vmi_path).reply(vmi),
        Exchange::event(&vmm, "Normal", "VMIPodRefused", |note| {
            assert!(
                note.starts_with(
                    "KubeVirt cannot create the launcher pod of VirtualMachineInstance web: failed to create pod"
                ),
                "{note}"
            );
            assert!(note.contains("violates PodSecurity"), "{note}");
        }),
        Exchange::status_write(&vmm, "101", |status| {
            assert_eq!(status["phase"], "ValidatingGuest", "{status:#}");
            assert_eq!(status["reason"], "LauncherPodRefused", "{status:#}");
            let message = status["message"].as_str().unwrap();
            assert!(
                message
                    .starts_with("KubeVirt cannot create the VM's launcher pod and keeps trying"),
                "{message}"
            );
            assert!(message.contains("seccompProfile"), "{message}");
        }),
    ];
    ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("waiting for KubeVirt");
}

/// Job `name` (`uid`) of migration `apps/web`, failed, with `annotations`.
fn failed_job(name: &str, uid: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "apps", "uid": uid, "annotations": annotations,
            "labels": {ferry_api::keys::UID_LABEL: "6f1c2a9e-0000-4000-8000-000000000001"},
            "ownerReferences": [{"apiVersion": "migration.platform.example/v1alpha1",
                "kind": "VirtualMachineMigration", "name": "web",
                "uid": "6f1c2a9e-0000-4000-8000-000000000001", "controller": true}]},
        "spec": {"template": {"spec": {"containers": []}}},
        "status": {"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]},
    })
}

/// The list of Job `job`'s (`uid`) pods: one, whose container `container` ended with termination message `error`.
fn pods_of_failed_job(job: &str, uid: &str, container: &str, error: &str) -> Exchange {
    Exchange::get(format!(
        "/api/v1/namespaces/apps/pods?&labelSelector=batch.kubernetes.io%2Fjob-name%3D{job}"
    ))
    .reply(json!({
        "apiVersion": "v1", "kind": "PodList", "metadata": {},
        "items": [{
            "metadata": {"name": format!("{job}-x7k2p"), "namespace": "apps",
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                    "uid": uid, "controller": true}]},
            "status": {"containerStatuses": [{
                "name": container, "image": "ferry", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "message": error}},
            }]},
        }],
    }))
}

/// Job `web-adapt-1`, made from the migration's generation 1, failed.
fn refused_job() -> Value {
    failed_job(
        "web-adapt-1",
        "job-uid-1",
        json!({ferry_api::keys::SPEC_GENERATION_ANNOTATION: "1"}),
    )
}

/// A migration whose adaptation Job `web-adapt-1` (made from generation 1) refused for want of drivers after the
/// copy, waiting for a person, at `generation`.
fn refused_adaptation(generation: i64) -> (VirtualMachineMigration, Vec<Exchange>) {
    let message = "Job web-adapt-1: there are no virtio drivers available for this version of Windows (10.0 \
                   x86_64 Server win2k22). virt-v2v looks for drivers in /run/ferry/virtio-win/virtio-win.iso";
    let mut object = migration(
        json!({
            "phase": "ManualInterventionRequired", "observedGeneration": 1,
            "reason": "GuestDriversMissing", "message": message, "targetVM": "web", "startTime": EARLIER,
            "source": discovered(),
            "disks": [{"index": 0, "sourceFile": "[ds1] web-vm/web-vm.vmdk", "capacityBytes": 1073741824,
                "dataVolume": "web-disk-0", "sha256": "ab", "verified": true, "bytesMoved": 0}],
            "progress": "100% (1024 MiB of 1024 MiB)",
            "conditions": [{"type": "Ready", "status": "False", "reason": "GuestDriversMissing",
                "message": format!("{message} (at Adapting)"), "observedGeneration": 1,
                "lastTransitionTime": EARLIER}],
            "retry": {"attempts": 0, "budgetUsed": [], "lastError": {"class": "Permanent",
                "reason": "GuestDriversMissing", "message": message, "phase": "Adapting", "time": EARLIER}},
        }),
        json!({"conversion": {"guestAdaptation": "VirtV2v",
            "virtioWin": {"persistentVolumeClaim": "virtio-win-2k19"}, "firstBootTool": {"persistentVolumeClaim": "virt-tools"}}}),
    );
    object["metadata"]["generation"] = json!(generation);
    let vmm = vmm(object);
    let error = json!({"error": {"class": "Permanent", "reason": "GuestDriversMissing",
        "message": message.trim_start_matches("Job web-adapt-1: ")}})
    .to_string();
    let script = vec![
        Exchange::get("/apis/batch/v1/namespaces/apps/jobs/web-adapt-1").reply(refused_job()),
        pods_of_failed_job("web-adapt-1", "job-uid-1", "adapt", &error),
    ];
    (vmm, script)
}

/// Nobody changed the migration since the adaptation Job refused: it is neither run again nor charged, and that
/// is neither a new Event nor a write.
#[tokio::test]
async fn a_refused_adaptation_nobody_fixed_runs_nothing_again() {
    let (vmm, script) = refused_adaptation(1);
    let action = ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("still waiting");
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
}

/// The person named other drivers (generation 2): the refused Job goes, so that the same attempt starts again on
/// the volumes kept, uncharged.
#[tokio::test]
async fn a_refused_adaptation_is_removed_once_the_migration_changed() {
    let (vmm, mut script) = refused_adaptation(2);
    // The deletion reads the Job it removes.
    script.push(
        Exchange::get("/apis/batch/v1/namespaces/apps/jobs/web-adapt-1").reply(refused_job()),
    );
    script.push(
        Exchange::new(
            http::Method::DELETE,
            "/apis/batch/v1/namespaces/apps/jobs/web-adapt-1?",
        )
        .check(|body| {
            assert_eq!(body["preconditions"]["uid"], "job-uid-1", "{body:#}");
        }),
    );
    script.push(Exchange::status_write(&vmm, "101", |status| {
        assert_eq!(status["phase"], "Adapting", "{status:#}");
        assert_eq!(status["reason"], "AdaptationRestarting", "{status:#}");
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains("the migration changed since Job web-adapt-1 refused")),
            "{status:#}"
        );
        assert!(
            status["retry"]["charged"]
                .as_array()
                .is_none_or(|c| c.is_empty()),
            "uncharged: {status:#}"
        );
    }));
    ApiServer::new()
        .reconcile(vmm, script)
        .await
        .expect("restarting");
}
