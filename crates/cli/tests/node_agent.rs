//! The lab's node agent runs Job pods for the real job controller: a `ferry convert` Job with a Secret volume
//! completes and its result is in the pod's termination message; a failing one ends Failed after backoffLimit.

use std::time::{Duration, Instant};

use ferry_lab::standins::node::{self, NodeAgentConfig};
use ferry_testkit::disks::make_flat_vmdk;
use ferry_testkit::{Background, TestLab, TestVcsim};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{Session, provision};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The node agent, in this test process, running the `ferry` binary cargo built for these tests.
fn start_agent(client: &Client, namespace: &str, state_dir: std::path::PathBuf) -> Background {
    let (client, namespace) = (client.clone(), namespace.to_string());
    let config = NodeAgentConfig {
        ferry_binary: env!("CARGO_BIN_EXE_ferry").into(),
        state_dir,
    };
    Background::spawn(move |shutdown| async move {
        node::run(client, Some(&namespace), config, shutdown).await
    })
}

fn job(name: &str, secret: &str, backoff_limit: i32, staging: &std::path::Path) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"backoffLimit": backoff_limit, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "convert", "image": "ferry:dev",
                "args": ["convert", "--spec", "/ferry/spec/spec.json", "--quiet"],
                "volumeMounts": [
                    {"name": "creds", "mountPath": "/ferry/creds", "readOnly": true},
                    {"name": "spec", "mountPath": "/ferry/spec", "readOnly": true},
                    {"name": "staging", "mountPath": "/ferry/staging"}]}],
            "volumes": [
                {"name": "creds", "secret": {"secretName": secret}},
                {"name": "spec", "configMap": {"name": "convert-spec"}},
                {"name": "staging", "hostPath": {"path": staging.display().to_string()}}]}}},
    }))
    .unwrap()
}

async fn wait_job(jobs: &Api<Job>, name: &str, condition: &str) -> Job {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let job = jobs.get(name).await.unwrap();
        let conditions = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == condition && c.status == "True")
        {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "Job {name} not {condition}: {:?}",
            job.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn pods_of(client: &Client, ns: &str, job: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .unwrap()
        .items
}

fn termination_message(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs[0].state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.message.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_conversion_job_runs_to_completion_and_a_failing_one_is_retried_then_failed() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("node").await;
    let client = lab.client().await;
    let vcsim = TestVcsim::start(false).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let ca = std::fs::read_to_string(&endpoint.ca_file).unwrap();
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(60)).unwrap())
        .await
        .unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into()))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let disk = make_flat_vmdk(work.path(), "jobdisk", 16 << 20, 5);
    let attached = provision::attach_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
        .await
        .unwrap();
    let info = inventory::describe_vm(&session, &vm).await.unwrap();

    let secret = |name: &str, password: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": name},
            "stringData": {"user": endpoint.username, "password": password, "ca.crt": ca}}))
        .unwrap()
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
    secrets
        .create(
            &PostParams::default(),
            &secret("creds", &endpoint.password().unwrap()),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &secret("creds-wrong", "not-the-password"),
        )
        .await
        .unwrap();
    let spec = json!({
        "source": {"url": endpoint.url, "credentialsDir": "/ferry/creds", "caFile": "/ferry/creds/ca.crt",
                   "datacenter": info.datacenter, "vmUuid": info.instance_uuid},
        "disks": [{"index": 0, "file": attached.to_string(), "capacityBytes": 16 << 20}],
        "format": "raw", "staging": {"url": "file:///ferry/staging/job"}, "scratchDir": "/tmp",
    });
    let config_map: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "convert-spec"},
        "data": {"spec.json": spec.to_string()}}))
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();

    let agent_state = work.path().join("node");
    let agent = start_agent(&client, ns.name(), agent_state.clone());

    let staging = work.path().join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns.name());
    jobs.create(
        &PostParams::default(),
        &job("convert", "creds", 0, &staging),
    )
    .await
    .unwrap();
    wait_job(&jobs, "convert", "Complete").await;
    let pods = pods_of(&client, ns.name(), "convert").await;
    assert_eq!(pods.len(), 1);
    let message = termination_message(&pods[0]);
    let result: serde_json::Value =
        serde_json::from_str(&message).unwrap_or_else(|e| panic!("{e}: {message:?}"));
    // The message is the summary; the disk's result is its manifest beside the staged object.
    assert_eq!(result["staged"]["disks"], 1, "{message}");
    assert!(staging.join("job/disk-0.raw").exists());
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(staging.join("job/disk-0.raw.manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["sourceSha256"], disk.sha256, "{manifest}");
    assert_eq!(manifest["run"], result["staged"]["run"], "{manifest}");

    jobs.create(
        &PostParams::default(),
        &job("wrong-password", "creds-wrong", 1, &staging),
    )
    .await
    .unwrap();
    let failed = wait_job(&jobs, "wrong-password", "Failed").await;
    let reason = failed
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Failed")
        .unwrap()
        .reason;
    assert_eq!(reason.as_deref(), Some("BackoffLimitExceeded"));
    let pods = pods_of(&client, ns.name(), "wrong-password").await;
    assert_eq!(
        pods.len(),
        2,
        "backoffLimit 1: the real job controller tried twice"
    );
    for pod in &pods {
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Failed")
        );
        assert!(
            termination_message(pod).contains("LoginFailed"),
            "{}",
            termination_message(pod)
        );
    }

    agent.stop().await;
}

#[tokio::test]
async fn a_pod_with_an_image_the_lab_cannot_run_fails_with_a_clear_reason() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("node-image").await;
    let client = lab.client().await;
    let work = tempfile::tempdir().unwrap();
    let agent = start_agent(&client, ns.name(), work.path().join("node"));
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "web", "image": "nginx:1.27"}]}})).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let pod = pods.get("web").await.unwrap();
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") {
            break pod;
        }
        assert!(
            Instant::now() < deadline,
            "the pod did not fail: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        failed.spec.unwrap().node_name.as_deref(),
        Some("lab-node"),
        "the agent bound it"
    );
    let terminated = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        terminated.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert!(
        terminated
            .message
            .unwrap_or_default()
            .contains("not known to the lab node")
    );
    agent.stop().await;
}
