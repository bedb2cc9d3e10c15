//! Providers lent across namespaces (deploy/rbac/ferry-providers.yaml): a migration or plan that names a
//! Provider in another namespace is admitted only when its creator may `use` that Provider, decided by the lab's
//! real authorizer for real users and ServiceAccounts.

use std::time::Duration;

use ferry_testkit::TestLab;
use kube::api::{DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

const GROUP: &str = "migration.platform.example";

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1alpha1", kind))
}

fn migration(provider: Value) -> Value {
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "VirtualMachineMigration",
        "metadata": {"name": "web"},
        "spec": {"source": {"providerRef": provider, "vm": {"name": "web-01"}}},
    })
}

fn plan(provider: Value) -> Value {
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "MigrationPlan",
        "metadata": {"name": "wave-1"},
        "spec": {"providerRef": provider, "vms": [{"name": "web-01"}]},
    })
}

/// `doc` created (dry run) in `ns` by `client`: None when admitted, else the API server's answer.
async fn refusal(client: &Client, ns: &str, doc: Value) -> Option<(u16, String)> {
    let kind = doc["kind"].as_str().unwrap();
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource(kind));
    let object: DynamicObject = serde_json::from_value(doc).unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match api.create(&dry_run, &object).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some((status.code, status.message)),
        Err(other) => panic!("{other}"),
    }
}

fn apply(lab: &TestLab, doc: &Value) {
    let mut kubectl = lab
        .kubectl()
        .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    kubectl
        .stdin
        .take()
        .unwrap()
        .write_all(doc.to_string().as_bytes())
        .unwrap();
    let out = kubectl.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn apply_file(lab: &TestLab, file: &str) {
    let path = format!("{}/../../deploy/rbac/{file}", env!("CARGO_MANIFEST_DIR"));
    let out = lab.kubectl().args(["apply", "-f", &path]).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply -f {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn binding(ns: &str, name: &str, role: (&str, &str), subjects: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role.0, "name": role.1},
        "subjects": subjects,
    })
}

fn user(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name})
}

fn service_account(ns: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": ns})
}

#[tokio::test]
async fn a_lent_provider_is_named_only_by_those_who_may_use_it() {
    let lab = TestLab::shared().await;
    let admin = lab.client().await;
    ferry_lab::crds::install(&admin).await.unwrap();
    apply_file(lab, "ferry-providers.yaml");
    let lender = lab.namespace("lender").await;
    let elsewhere = lab.namespace("elsewhere").await;
    let tenant = lab.namespace("tenant").await;
    let (lender, elsewhere, t) = (lender.name(), elsewhere.name(), tenant.name());

    // Everyone here may create migrations and plans in the tenant's namespace; the use of Providers is granted
    // in the lender's: to alice and the migrator ServiceAccount for every Provider there, to carol for one.
    apply(
        lab,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "migrate", "namespace": t},
            "rules": [{"apiGroups": [GROUP], "resources": ["virtualmachinemigrations", "migrationplans"],
                       "verbs": ["create"]}]}),
    );
    let everyone = json!([
        user("alice"),
        user("bob"),
        user("carol"),
        service_account(t, "migrator"),
        service_account(t, "other")
    ]);
    apply(lab, &binding(t, "migrate", ("Role", "migrate"), everyone));
    apply(
        lab,
        &binding(
            lender,
            "use-providers",
            ("ClusterRole", "ferry-provider-user"),
            json!([user("alice"), service_account(t, "migrator")]),
        ),
    );
    apply(
        lab,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "use-vcenter-b", "namespace": lender},
            "rules": [{"apiGroups": [GROUP], "resources": ["providers"], "resourceNames": ["vcenter-b"],
                       "verbs": ["use"]}]}),
    );
    apply(
        lab,
        &binding(
            lender,
            "carol-uses-vcenter-b",
            ("Role", "use-vcenter-b"),
            json!([user("carol")]),
        ),
    );

    let as_user = |name: &'static str| lab.client_as(name, &["system:authenticated"]);
    let (alice, bob, carol) = (
        as_user("alice").await.unwrap(),
        as_user("bob").await.unwrap(),
        as_user("carol").await.unwrap(),
    );
    let migrator = lab.client_as_service_account(t, "migrator").await.unwrap();
    let other = lab.client_as_service_account(t, "other").await.unwrap();

    let lent = json!({"name": "vcenter", "namespace": lender});
    // The policy is in force once the API server has loaded it.
    ferry_testkit::eventually(
        "the lent-Provider policy to be in force",
        Duration::from_secs(60),
        || refusal(&bob, t, migration(lent.clone())),
    )
    .await;

    let own = json!({"name": "vcenter"});
    let same_namespace = json!({"name": "vcenter", "namespace": t});
    let cases: Vec<(&str, &Client, Value, bool)> = vec![
        (
            "alice, a lent Provider",
            &alice,
            migration(lent.clone()),
            true,
        ),
        (
            "alice, a plan on a lent Provider",
            &alice,
            plan(lent.clone()),
            true,
        ),
        (
            "the migrator ServiceAccount",
            &migrator,
            migration(lent.clone()),
            true,
        ),
        ("bob, a lent Provider", &bob, migration(lent.clone()), false),
        (
            "bob, a plan on a lent Provider",
            &bob,
            plan(lent.clone()),
            false,
        ),
        (
            "another ServiceAccount",
            &other,
            migration(lent.clone()),
            false,
        ),
        (
            "bob, his namespace's own Provider",
            &bob,
            migration(own.clone()),
            true,
        ),
        (
            "bob, his own namespace named",
            &bob,
            plan(same_namespace),
            true,
        ),
        (
            "alice, a Provider of a namespace that lends her nothing",
            &alice,
            migration(json!({"name": "vcenter", "namespace": elsewhere})),
            false,
        ),
        (
            "carol, the one Provider lent to her",
            &carol,
            migration(json!({"name": "vcenter-b", "namespace": lender})),
            true,
        ),
        (
            "carol, another Provider there",
            &carol,
            migration(lent.clone()),
            false,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, client, doc, admitted) in cases {
        match (refusal(client, t, doc).await, admitted) {
            (None, true) => {}
            (Some((403, message)), false) if message.contains("may not use it") => {}
            (answer, _) => wrong.push(format!(
                "{what}: admitted={admitted} expected, got {answer:?}"
            )),
        }
    }
    // The controller creates a plan's migrations: it may use every Provider (deploy/rbac/ferry-rbac.yaml).
    apply_file(lab, "ferry-rbac.yaml");
    let controller = lab
        .client_as_service_account("ferry-system", "ferry")
        .await
        .unwrap();
    if let Some(answer) = refusal(&controller, t, migration(lent.clone())).await {
        wrong.push(format!("the controller, a plan's migration: {answer:?}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
