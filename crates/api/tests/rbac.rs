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
    apply(lab, "ferry-rbac.yaml");
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
        // The copies of lent Providers' credentials (ferry-admission.yaml admits no other Secret).
        ("create", "", "secrets", n),
        ("delete", "", "secrets", n),
        ("use", "migration.platform.example", "providers", n),
        ("get", "storage.k8s.io", "storageclasses", ""),
        (
            "get",
            "k8s.cni.cncf.io",
            "network-attachment-definitions",
            n,
        ),
        ("create", "events.k8s.io", "events", n),
        ("update", "coordination.k8s.io", "leases", "ferry-system"),
    ];
    let forbidden = [
        ("list", "", "secrets", n),
        ("watch", "", "secrets", n),
        ("update", "", "secrets", n),
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
        (
            "list",
            "k8s.cni.cncf.io",
            "network-attachment-definitions",
            n,
        ),
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

/// `kubectl apply` of a file of deploy/rbac. Two applies at once race to create the same objects (one gets
/// AlreadyExists), so the tests here take turns, and one that lost a race with another process applies again.
fn apply(lab: &TestLab, file: &str) {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let path = format!("{}/../../deploy/rbac/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut stderr = String::new();
    for _ in 0..3 {
        let out = lab.kubectl().args(["apply", "-f", &path]).output().unwrap();
        if out.status.success() {
            return;
        }
        stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !stderr.contains("AlreadyExists") {
            break;
        }
    }
    panic!("kubectl apply -f {path}: {stderr}");
}

/// The worker image deploy/ names, as the controller's default.
const WORKER_IMAGE: &str = concat!("ferry:", env!("CARGO_PKG_VERSION"));

/// A change to a Job's pod template.
type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

/// A Job as the controller builds them (deploy/rbac/ferry-admission.yaml admits it), changed by `edit`.
fn job(edit: impl FnOnce(&mut serde_json::Value)) -> k8s_openapi::api::batch::v1::Job {
    let mut job = serde_json::json!({
        "metadata": {"name": "m-convert-1"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": false, "enableServiceLinks": false,
            "containers": [{"name": "convert", "image": WORKER_IMAGE, "command": ["ferry"], "args": ["convert"],
                "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                                    "capabilities": {"drop": ["ALL"]}}}],
            "volumes": [{"name": "source-credentials", "secret": {"secretName": "vc"}}],
        }}},
    });
    edit(&mut job["spec"]["template"]["spec"]);
    serde_json::from_value(job).unwrap()
}

#[tokio::test]
async fn the_controller_may_create_only_jobs_as_ferry_builds_them() {
    let lab = TestLab::shared().await;
    apply(lab, "ferry-rbac.yaml");
    apply(lab, "ferry-admission.yaml");
    let deployment = include_str!("../../../deploy/controller.yaml");
    assert!(
        deployment.contains(&format!("value: {WORKER_IMAGE}")),
        "deploy/controller.yaml's FERRY_WORKER_IMAGE and ferry-admission.yaml's image differ"
    );
    let ns = lab.namespace("jobs-policy").await;
    let as_controller = lab
        .client_as_service_account("ferry-system", "ferry")
        .await
        .unwrap();
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(as_controller, ns.name());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let refused = |job: k8s_openapi::api::batch::v1::Job| {
        let (jobs, dry_run) = (jobs.clone(), dry_run.clone());
        async move {
            match jobs.create(&dry_run, &job).await {
                Ok(_) => None,
                Err(kube::Error::Api(status)) => Some(status.message),
                Err(other) => panic!("{other}"),
            }
        }
    };
    // The policy is in force once the API server has loaded it.
    let another_image = || job(|pod| pod["containers"][0]["image"] = "busybox".into());
    ferry_testkit::eventually(
        "the admission policy to be in force",
        std::time::Duration::from_secs(60),
        || refused(another_image()),
    )
    .await;

    let cases: [(&str, Edit, &str); 8] = [
        (
            "another image",
            Box::new(|pod| pod["containers"][0]["image"] = "busybox".into()),
            "worker image",
        ),
        (
            "an init container of another image",
            Box::new(|pod| {
                pod["initContainers"] = serde_json::json!([{"name": "i", "image": "busybox"}])
            }),
            "worker image",
        ),
        (
            "a ServiceAccount token",
            Box::new(|pod| pod["automountServiceAccountToken"] = true.into()),
            "mounts no ServiceAccount token",
        ),
        (
            "a token by default",
            Box::new(|pod| {
                pod.as_object_mut()
                    .unwrap()
                    .remove("automountServiceAccountToken");
            }),
            "mounts no ServiceAccount token",
        ),
        (
            "another ServiceAccount",
            Box::new(|pod| pod["serviceAccountName"] = "admin".into()),
            "default ServiceAccount",
        ),
        (
            "a hostPath volume",
            Box::new(|pod| {
                pod["volumes"] = serde_json::json!([{"name": "root", "hostPath": {"path": "/"}}])
            }),
            "no hostPath",
        ),
        (
            "the host's network",
            Box::new(|pod| pod["hostNetwork"] = true.into()),
            "no host namespace",
        ),
        (
            "a privileged container",
            Box::new(|pod| {
                let context = &mut pod["containers"][0]["securityContext"];
                context["privileged"] = true.into();
                context["allowPrivilegeEscalation"] = true.into();
            }),
            "no privileged container",
        ),
    ];
    let mut wrong = Vec::new();
    for (what, edit, expected) in cases {
        match refused(job(edit)).await {
            Some(message) if message.contains(expected) => {}
            Some(message) => wrong.push(format!(
                "{what}: refused, but not saying {expected:?}: {message}"
            )),
            None => wrong.push(format!("{what}: admitted")),
        }
    }
    if let Some(message) = refused(job(|_| {})).await {
        wrong.push(format!("the controller's own Job: refused: {message}"));
    }
    // Only the controller is held to it.
    let admin = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(lab.client().await, ns.name());
    if let Err(e) = admin.create(&dry_run, &another_image()).await {
        wrong.push(format!("a person's Job of another image: refused: {e}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A Secret as the controller copies a lent Provider's credentials (owned by migration `m`), changed by `edit`.
fn credentials_copy(edit: impl FnOnce(&mut serde_json::Value)) -> Secret {
    const UID: &str = "6f1c2a9e-0000-4000-8000-00000000000a";
    let mut secret = serde_json::json!({
        "metadata": {"name": "m-source-credentials",
            "labels": {"migration.platform.example/uid": UID, "app.kubernetes.io/managed-by": "ferry"},
            "ownerReferences": [{"apiVersion": "migration.platform.example/v1alpha1",
                "kind": "VirtualMachineMigration", "name": "m", "uid": UID, "controller": true}]},
        "stringData": {"user": "u", "password": "p"},
    });
    edit(&mut secret);
    serde_json::from_value(secret).unwrap()
}

#[tokio::test]
async fn the_controller_writes_only_its_copies_of_lent_credentials() {
    let lab = TestLab::shared().await;
    apply(lab, "ferry-rbac.yaml");
    apply(lab, "ferry-admission.yaml");
    let ns = lab.namespace("secrets-policy").await;
    let as_controller = lab
        .client_as_service_account("ferry-system", "ferry")
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(as_controller, ns.name());
    let admin: Api<Secret> = Api::namespaced(lab.client().await, ns.name());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let create = |secret: Secret| {
        let (secrets, dry_run) = (secrets.clone(), dry_run.clone());
        async move { secrets.create(&dry_run, &secret).await.err() }
    };
    ferry_testkit::eventually(
        "the admission policy to be in force",
        std::time::Duration::from_secs(60),
        || {
            create(credentials_copy(|s| {
                s["metadata"]["name"] = "vcenter".into()
            }))
        },
    )
    .await;

    let mut wrong = Vec::new();
    if let Some(e) = create(credentials_copy(|_| {})).await {
        wrong.push(format!("the controller's own copy: refused: {e}"));
    }
    let refused: [(&str, Edit); 4] = [
        (
            "another name",
            Box::new(|s| s["metadata"]["name"] = "vcenter".into()),
        ),
        (
            "no owner",
            Box::new(|s| s["metadata"]["ownerReferences"] = serde_json::json!([])),
        ),
        (
            "an owner other than its uid label names",
            Box::new(|s| {
                s["metadata"]["labels"]["migration.platform.example/uid"] = "another".into()
            }),
        ),
        (
            "no labels",
            Box::new(|s| {
                s["metadata"].as_object_mut().unwrap().remove("labels");
            }),
        ),
    ];
    for (what, edit) in refused {
        match create(credentials_copy(edit)).await {
            Some(kube::Error::Api(s)) if s.code == 403 && s.message.contains("lent Providers") => {}
            other => wrong.push(format!("{what}: {other:?}")),
        }
    }
    // A tenant's own Secret, even one under a copy's name, is neither changed nor deleted by the controller.
    let tenants = serde_json::json!({"metadata": {"name": "t-source-credentials"}, "stringData": {"password": "theirs"}});
    admin
        .create(
            &PostParams::default(),
            &serde_json::from_value(tenants).unwrap(),
        )
        .await
        .unwrap();
    let disguise = serde_json::json!({"metadata": {
        "labels": {"migration.platform.example/uid": "u"},
        "ownerReferences": [{"apiVersion": "migration.platform.example/v1alpha1",
            "kind": "VirtualMachineMigration", "name": "t", "uid": "u", "controller": true}]}});
    let patch_params = kube::api::PatchParams {
        dry_run: true,
        ..Default::default()
    };
    match secrets
        .patch(
            "t-source-credentials",
            &patch_params,
            &kube::api::Patch::Merge(&disguise),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => wrong.push(format!("a tenant's Secret, taken over: {other:?}")),
    }
    let delete = kube::api::DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    match secrets.delete("t-source-credentials", &delete).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => wrong.push(format!(
            "a tenant's Secret, deleted: {:?}",
            other.map(|_| ())
        )),
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
