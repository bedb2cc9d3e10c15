//! deploy/rbac gives the controller what it needs and no more, checked by the lab's real RBAC authorizer.

use ferry_testkit::TestLab;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

const SA_USER: &str = "system:serviceaccount:ferry-system:ferry";

async fn allowed(admin: &Client, verb: &str, group: &str, resource: &str, namespace: &str) -> bool {
    let (resource, subresource) = resource
        .split_once('/')
        .map_or((resource, None), |(r, s)| (r, Some(s)));
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(SA_USER.into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:ferry-system".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource: subresource.map(String::from),
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn the_controller_service_account_gets_what_it_needs_and_no_more() {
    let lab = TestLab::shared().await;
    let rbac = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/rbac/ferry-rbac.yaml"
    );
    let out = lab.kubectl().args(["apply", "-f", rbac]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let admin = lab.client().await;
    let ns = lab.namespace("rbac").await;
    let n = ns.name();

    let needed = [
        (
            "watch",
            "migration.platform.example",
            "virtualmachinemigrations",
            n,
        ),
        (
            "patch",
            "migration.platform.example",
            "virtualmachinemigrations/status",
            n,
        ),
        (
            "update",
            "migration.platform.example",
            "virtualmachinemigrations/finalizers",
            n,
        ),
        ("list", "migration.platform.example", "providers", n),
        ("get", "migration.platform.example", "networkmaps", n),
        (
            "create",
            "migration.platform.example",
            "virtualmachinemigrations",
            n,
        ),
        ("watch", "migration.platform.example", "migrationplans", n),
        (
            "patch",
            "migration.platform.example",
            "migrationplans/status",
            n,
        ),
        ("get", "migration.platform.example", "storagemaps", n),
        ("patch", "migration.platform.example", "providers/status", n),
        ("create", "batch", "jobs", n),
        ("delete", "batch", "jobs", n),
        ("create", "cdi.kubevirt.io", "datavolumes", n),
        ("delete", "cdi.kubevirt.io", "datavolumes", n),
        ("create", "kubevirt.io", "virtualmachines", n),
        ("patch", "kubevirt.io", "virtualmachines", n),
        ("watch", "kubevirt.io", "virtualmachineinstances", n),
        ("get", "", "pods", n),
        ("get", "", "secrets", n),
        ("get", "storage.k8s.io", "storageclasses", ""),
        ("create", "events.k8s.io", "events", n),
        ("update", "coordination.k8s.io", "leases", "ferry-system"),
    ];
    let forbidden = [
        ("list", "", "secrets", n),
        ("watch", "", "secrets", n),
        ("create", "", "secrets", n),
        ("create", "", "pods/exec", n),
        ("create", "", "pods", n),
        (
            "update",
            "migration.platform.example",
            "virtualmachinemigrations/scale",
            n,
        ),
        ("update", "migration.platform.example", "migrationplans", n),
        (
            "delete",
            "migration.platform.example",
            "virtualmachinemigrations",
            n,
        ),
        ("update", "migration.platform.example", "networkmaps", n),
        ("list", "migration.platform.example", "storagemaps", n),
        ("escalate", "rbac.authorization.k8s.io", "clusterroles", ""),
        ("bind", "rbac.authorization.k8s.io", "clusterroles", ""),
        ("create", "rbac.authorization.k8s.io", "rolebindings", n),
        ("delete", "", "namespaces", ""),
        ("update", "coordination.k8s.io", "leases", n),
    ];
    let mut wrong = Vec::new();
    for (verb, group, resource, namespace) in needed {
        if !allowed(&admin, verb, group, resource, namespace).await {
            wrong.push(format!(
                "denied but needed: {verb} {group}/{resource} in {namespace:?}"
            ));
        }
    }
    for (verb, group, resource, namespace) in forbidden {
        if allowed(&admin, verb, group, resource, namespace).await {
            wrong.push(format!(
                "allowed but not needed: {verb} {group}/{resource} in {namespace:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // The same, as real requests with the ServiceAccount's identity: a Secret by name, but no listing.
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vcenter-creds"}, "stringData": {"user": "u", "password": "canary"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), n)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let as_controller = lab
        .client_as_service_account("ferry-system", "ferry")
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(as_controller, n);
    assert!(secrets.get("vcenter-creds").await.is_ok());
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("listing Secrets must be forbidden, got {other:?}"),
    }
}
