//! The install for chosen namespaces (`ferry rbac --namespace`, `ferry controller --namespace`): under the lab's
//! real authorizer the controller holds rights in those namespaces only, serves them, and leaves every other
//! namespace alone. Its own ServiceAccount, so the default install's cluster-wide binding plays no part.

mod support;

use std::io::Write;
use std::time::Duration;

use ferry_api::Phase;
use ferry_lab::disks::raw_to_flat_vmdk;
use ferry_testkit::migration::{self, ControllerProcess};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use support::*;

const ACCOUNT: &str = "mover";

async fn allowed(
    admin: &Client,
    user: &str,
    verb: &str,
    (group, resource): (&str, &str),
    ns: &str,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                namespace: Some(ns.into()),
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

fn apply_rbac(lab: &ferry_testkit::TestLab, served: &str, account: &str) {
    let out = std::process::Command::new(ferry())
        .args(["rbac", "--namespace", served, "--service-account", account])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut kubectl = lab
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    kubectl
        .stdin
        .take()
        .unwrap()
        .write_all(&out.stdout)
        .unwrap();
    let applied = kubectl.wait_with_output().unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
}

#[tokio::test]
async fn a_controller_for_chosen_namespaces_serves_them_and_holds_no_right_elsewhere() {
    let lab = lab().await;
    let admin = lab.client().await;
    let ops = lab.namespace("ops").await;
    let served = lab.namespace("served").await;
    let also_served = lab.namespace("also-served").await;
    let outside = lab.namespace("outside").await;
    let namespaces = format!("{},{}", served.name(), also_served.name());
    apply_rbac(lab, &namespaces, &format!("{}/{ACCOUNT}", ops.name()));

    let user = format!("system:serviceaccount:{}:{ACCOUNT}", ops.name());
    let mut wrong = Vec::new();
    for (verb, resource, ns, expected) in [
        ("create", ("batch", "jobs"), served.name(), true),
        ("create", ("batch", "jobs"), also_served.name(), true),
        ("get", ("", "secrets"), served.name(), true),
        (
            "watch",
            ("migration.platform.example", "virtualmachinemigrations"),
            served.name(),
            true,
        ),
        (
            "update",
            ("coordination.k8s.io", "leases"),
            ops.name(),
            true,
        ),
        ("list", ("storage.k8s.io", "storageclasses"), "", true),
        ("create", ("batch", "jobs"), outside.name(), false),
        ("get", ("", "secrets"), outside.name(), false),
        ("list", ("", "pods"), outside.name(), false),
        (
            "watch",
            ("migration.platform.example", "virtualmachinemigrations"),
            outside.name(),
            false,
        ),
        ("create", ("batch", "jobs"), "", false),
        ("get", ("", "secrets"), "", false),
        ("list", ("", "pods"), "", false),
        (
            "update",
            ("coordination.k8s.io", "leases"),
            served.name(),
            false,
        ),
    ] {
        if allowed(&admin, &user, verb, resource, ns).await != expected {
            wrong.push(format!(
                "{verb} {resource:?} in {ns:?}: expected allowed={expected}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    let controller = ControllerProcess::start_as(
        lab,
        ferry(),
        (ops.name(), ACCOUNT),
        &[
            &format!("--namespace={namespaces}"),
            "--lease-name=ferry-namespaced-test",
        ],
    )
    .await
    .unwrap();

    let vm = "ferry-namespaced";
    let _source = source_lock(vm).await;
    let dir = lab.dir().join(vm);
    std::fs::create_dir_all(&dir).unwrap();
    let boot = dir.join(format!("{}.raw", disk_stem(vm, 0)));
    let sha = ferry_lab::vsphere::bootdisk::make_boot_disk(
        &boot,
        4 << 20,
        &ferry_lab::vsphere::demo::marker(vm),
    )
    .unwrap();
    provision_seeded(
        vm,
        &[raw_to_flat_vmdk(&boot, &disk_stem(vm, 0), sha, 4 << 20).unwrap()],
    )
    .await;

    // The same migration in a namespace it serves and in one it does not.
    for ns in [also_served.name(), outside.name()] {
        migration::create_provider(&admin, lab, ns).await.unwrap();
        let mut manifest = migration::migration(lab, ns, "moved", vm);
        manifest["spec"].as_object_mut().unwrap().remove("staging");
        manifest["spec"]["target"]["devices"] = "Source".into();
        if ns == outside.name() {
            // Another VM: were it served, it would not wait for the first.
            manifest["spec"]["source"]["vm"] = serde_json::json!({"name": "DC0_H0_VM0"});
        }
        migration::apply(&admin, ns, manifest).await.unwrap();
    }
    wait_for_phase(
        &admin,
        also_served.name(),
        "moved",
        Phase::Succeeded,
        Duration::from_secs(600),
    )
    .await;
    // Other test binaries' controllers serve every namespace, so what this one did is read from the audit log:
    // it did the work where it serves, never asked for anything elsewhere, and was never refused.
    let requests = lab.audit_requests_by(&user);
    let mine = [served.name(), also_served.name(), ops.name()];
    let elsewhere: Vec<_> = requests
        .iter()
        .filter(|r| {
            let cluster_scoped =
                r.namespace.is_empty() && matches!(r.resource.as_str(), "storageclasses" | "");
            !(mine.contains(&r.namespace.as_str()) || cluster_scoped) || r.code == 403
        })
        .map(|r| format!("{} {} -> {}", r.verb, r.uri, r.code))
        .collect();
    assert!(elsewhere.is_empty(), "{}", elsewhere.join("\n"));
    let did = |verb: &str, resource: &str| {
        requests.iter().any(|r| {
            r.namespace == also_served.name()
                && r.verb == verb
                && r.resource == resource
                && r.code < 300
        })
    };
    assert!(did("create", "jobs"), "it created the conversion Job");
    assert!(
        did("patch", "virtualmachinemigrations"),
        "it wrote the migration's status"
    );
    let logs = controller.logs();
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "the controller met a refusal: {}",
        logs.lines()
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
