//! The lab's real components, driven through the test-support crate.

use std::time::{Duration, Instant};

use ferry_testkit::TestLab;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

fn config_map(name: &str, owner: Option<&ConfigMap>) -> ConfigMap {
    let mut value = serde_json::json!({"metadata": {"name": name}, "data": {"k": "v"}});
    if let Some(owner) = owner {
        value["metadata"]["ownerReferences"] = serde_json::json!([{
            "apiVersion": "v1", "kind": "ConfigMap",
            "name": owner.metadata.name, "uid": owner.metadata.uid,
        }]);
    }
    serde_json::from_value(value).unwrap()
}

#[tokio::test]
async fn api_server_is_ready_and_the_garbage_collector_is_real() {
    let lab = TestLab::shared().await;
    let out = lab
        .kubectl()
        .args(["get", "--raw", "/readyz"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok");

    let ns = lab.namespace("gc").await;
    let api: Api<ConfigMap> = Api::namespaced(lab.client().await, ns.name());
    let parent = api
        .create(&PostParams::default(), &config_map("parent", None))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("child", Some(&parent)))
        .await
        .unwrap();
    api.delete("parent", &DeleteParams::default())
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(90);
    while api.get_opt("child").await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the garbage collector left the child for 90 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn vcsim_answers_retrieve_service_content() {
    let lab = TestLab::shared().await;
    let vcsim = lab.state().vcsim.clone().expect("vcsim endpoint");
    let _ = rustls::crypto::ring::default_provider().install_default();
    // vcsim serves a self-signed certificate made at start; TLS pinning is the vSphere client's job.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let body = r#"<?xml version="1.0"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><RetrieveServiceContent xmlns="urn:vim25"><_this type="ServiceInstance">ServiceInstance</_this></RetrieveServiceContent></soapenv:Body></soapenv:Envelope>"#;
    let response = http
        .post(&vcsim.url)
        .header("Content-Type", "text/xml")
        .header("SOAPAction", "urn:vim25/8.0")
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let text = response.text().await.unwrap();
    assert!(text.contains("RetrieveServiceContentResponse"), "{text}");
    assert!(text.contains("<apiType>VirtualCenter</apiType>"), "{text}");
}

#[tokio::test]
async fn up_twice_starts_no_second_copy_and_down_leaves_nothing() {
    let lab = TestLab::start().await.unwrap();
    let dir = lab.dir().to_path_buf();
    let state = lab.state().clone();

    let again = ferry_lab::up(&ferry_lab::LabOptions {
        dir: dir.clone(),
        tools: state.tools.clone(),
        lifetime: ferry_lab::Lifetime::TiedToThisProcess,
        standins: None,
        demo_vms: false,
        controller: false,
        vcsim_vms: ferry_lab::lab::DEFAULT_VCSIM_VMS,
        boot_guests: true,
        vcsim_realism: Default::default(),
        compress_staging: false,
        real_node: None,
        real_kubevirt: false,
    })
    .await
    .unwrap();
    assert!(matches!(again, ferry_lab::UpOutcome::AlreadyRunning(_)));
    assert_eq!(
        again.state().processes,
        state.processes,
        "the same processes, no second copy"
    );

    let report = ferry_lab::down(&dir).unwrap();
    assert_eq!(
        report.stopped,
        [
            "minio",
            "vcsim",
            "cdi-admission",
            "kubevirt-admission",
            "kube-controller-manager",
            "kube-apiserver",
            "etcd"
        ],
        "every component, newest first"
    );
    assert!(ferry_testkit::processes_mentioning(&dir).is_empty());
    for port in &state.ports {
        assert!(
            ferry_lab::control_plane::process::port_is_closed(*port),
            "port {port} still open"
        );
    }
}

const PANIC_CHILD: &str = "FERRY_TESTKIT_PANIC_CHILD";

/// Runs only inside `a_failing_test_leaves_no_lab_behind`: starts a shared and an owned lab, then fails.
#[tokio::test]
#[ignore = "run by a_failing_test_leaves_no_lab_behind"]
async fn failing_child() {
    if std::env::var_os(PANIC_CHILD).is_none() {
        return;
    }
    let shared = TestLab::shared().await;
    let owned = TestLab::start().await.unwrap();
    println!("LAB_DIR={}", shared.dir().display());
    println!("LAB_DIR={}", owned.dir().display());
    assert_eq!(1 + 1, 3, "a deliberate failure");
}

#[test]
fn a_failing_test_leaves_no_lab_behind() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "failing_child", "--ignored", "--nocapture"])
        .env(PANIC_CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "the child test should fail:\n{stdout}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("a deliberate failure"));
    let dirs: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("LAB_DIR="))
        .collect();
    assert_eq!(dirs.len(), 2, "{stdout}");
    for dir in dirs {
        let dir = std::path::Path::new(dir);
        assert!(!dir.exists(), "{} was left behind", dir.display());
        assert!(
            ferry_testkit::processes_mentioning(dir).is_empty(),
            "processes left in {}",
            dir.display()
        );
    }
}

#[tokio::test]
async fn kubevirt_and_cdi_resources_are_served_with_their_real_schemas() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::core::{ApiResource, GroupVersionKind};
    let lab = TestLab::shared().await;
    let ns = lab.namespace("schemas").await;
    let client = lab.client().await;
    let vm_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubevirt.io",
        "v1",
        "VirtualMachine",
    ));
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns.name(), &vm_resource);
    let vm = |spec: serde_json::Value| serde_json::json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "t"}, "spec": spec});
    let strict = PatchParams::apply("lab-test").validation_strict();
    let good = vm(
        serde_json::json!({"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}),
    );
    vms.patch("t", &strict, &Patch::Apply(&good)).await.unwrap();
    // A typo that a real cluster rejects (or silently prunes) is rejected here too.
    let typo = vm(
        serde_json::json!({"runstrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}),
    );
    let e = vms
        .patch("t", &strict, &Patch::Apply(&typo))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("runstrategy"), "{e}");

    let dv_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cdi.kubevirt.io",
        "v1beta1",
        "DataVolume",
    ));
    let dvs: Api<DynamicObject> = Api::namespaced_with(client, ns.name(), &dv_resource);
    let dv = serde_json::json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "d"},
        "spec": {"source": {"http": {"url": "http://127.0.0.1/disk.img"}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}});
    dvs.patch("d", &strict, &Patch::Apply(&dv)).await.unwrap();
}
