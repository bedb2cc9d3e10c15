//! The CDI stand-in against the lab's real API server and PV binder: a DataVolume from an http URL of a qcow2
//! image ends Succeeded with a raw `disk.img` of the right content, reporting progress on the way; the fault
//! switch fails it.

use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use ferry_lab::standins::cdi::{self, FAULT_ANNOTATION};
use ferry_testkit::disks::{qemu_img, sha256_file, write_pattern};
use ferry_testkit::{Background, TestLab};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

fn data_volume(name: &str, url: &str, fault: Option<&str>) -> serde_json::Value {
    let mut dv = json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
        "spec": {"source": {"http": {"url": url}}, "storage": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}},
    });
    if let Some(fault) = fault {
        dv["metadata"]["annotations"] = json!({FAULT_ANNOTATION: fault});
    }
    dv
}

async fn wait_phase(
    dvs: &Api<DynamicObject>,
    name: &str,
    phase: &str,
    timeout: Duration,
) -> DynamicObject {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(dv) = dvs.get_opt(name).await.unwrap()
            && dv.data["status"]["phase"] == phase
        {
            return dv;
        }
        assert!(
            Instant::now() < deadline,
            "DataVolume {name} not {phase} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// As CDI's importer leaves it: the source's raw bytes, then zeros up to the volume's usable size (64 MiB for the
/// 64Mi these DataVolumes ask for).
fn holds_source_then_zeros(image: &Path, raw: &Path, sha: &str) {
    let bytes = std::fs::read(image).unwrap();
    assert_eq!(
        bytes.len(),
        64 << 20,
        "disk.img is the volume's usable size"
    );
    let source = std::fs::metadata(raw).unwrap().len() as usize;
    let head = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(head.path(), &bytes[..source]).unwrap();
    assert_eq!(
        sha256_file(head.path()),
        sha,
        "disk.img starts with the source's raw bytes"
    );
    assert!(
        bytes[source..].iter().all(|&b| b == 0),
        "and zeros after them"
    );
}

fn image_of(pv: &PersistentVolume) -> PathBuf {
    Path::new(&pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path).join("disk.img")
}

#[tokio::test]
async fn an_http_qcow2_source_imports_to_a_raw_disk_with_progress_and_the_fault_switch_fails() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("cdi").await;
    let client = lab.client().await;
    let work = tempfile::tempdir().unwrap();
    let raw = work.path().join("source.raw");
    let sha = write_pattern(&raw, 48 << 20, 3);
    let qcow2 = work.path().join("source.qcow2");
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2"], &[&raw, &qcow2]);
    let server = ferry_testkit::http::FileServer::start(qcow2, Some(24 << 20)).await;
    let url = server.url("source.qcow2");

    let state = work.path().join("cdi");
    let (standin_client, ns_name) = (client.clone(), ns.name().to_string());
    let standin = Background::spawn(move |shutdown| async move {
        cdi::run(standin_client, Some(&ns_name), &state, shutdown).await
    });

    let dvs = Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &cdi::dv_resource());
    // Record every progress value the DataVolume reports.
    let watched = dvs.clone();
    let progress = tokio::spawn(async move {
        let mut seen = Vec::new();
        let stream = watcher(watched, watcher::Config::default()).applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(dv)) = futures::StreamExt::next(&mut stream).await {
            if let Some(p) = dv.data["status"]["progress"].as_str()
                && seen.last().map(String::as_str) != Some(p)
            {
                seen.push(p.to_string());
            }
            if dv.data["status"]["phase"] == "Succeeded" {
                return seen;
            }
        }
        seen
    });
    dvs.patch(
        "disk-0",
        &PatchParams::apply("test"),
        &Patch::Apply(&data_volume("disk-0", &url, None)),
    )
    .await
    .unwrap();
    let done = wait_phase(&dvs, "disk-0", "Succeeded", Duration::from_secs(90)).await;
    assert_eq!(done.data["status"]["progress"], "100.0%");
    let seen = tokio::time::timeout(Duration::from_secs(10), progress)
        .await
        .unwrap()
        .unwrap();
    assert!(
        seen.iter()
            .any(|p| p.ends_with('%') && p != "0.00%" && p != "100.0%"),
        "no progress along the way: {seen:?}"
    );

    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns.name())
        .get("disk-0")
        .await
        .unwrap();
    assert!(
        claim
            .owner_references()
            .iter()
            .any(|o| o.kind == "DataVolume")
    );
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(claim.spec.unwrap().volume_name.as_deref().unwrap())
        .await
        .unwrap();
    let image = image_of(&pv);
    holds_source_then_zeros(&image, &raw, &sha);
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&info.stdout).contains("\"format\": \"raw\""));

    dvs.patch(
        "broken",
        &PatchParams::apply("test"),
        &Patch::Apply(&data_volume("broken", &url, Some("fail"))),
    )
    .await
    .unwrap();
    let failed = wait_phase(&dvs, "broken", "Failed", Duration::from_secs(30)).await;
    assert_eq!(
        failed.data["status"]["conditions"][1]["reason"],
        "LabFaultInjected"
    );

    standin.stop().await;
    drop(server);
    // The PVs are cluster-scoped: remove the ones this test made.
    let pvs = Api::<PersistentVolume>::all(client);
    for pv in pvs.list(&ListParams::default()).await.unwrap() {
        if pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|c| c.namespace.as_deref())
            == Some(ns.name())
        {
            let _ = pvs.delete(&pv.name_any(), &Default::default()).await;
        }
    }
}

#[tokio::test]
async fn an_s3_source_with_a_secret_imports_from_a_real_s3_server() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    let lab = TestLab::shared().await;
    let ns = lab.namespace("cdi-s3").await;
    let client = lab.client().await;
    let minio = ferry_testkit::TestMinio::start().await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let raw = work.path().join("source.raw");
    let sha = write_pattern(&raw, 16 << 20, 11);
    let qcow2 = work.path().join("source.qcow2");
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2"], &[&raw, &qcow2]);
    let staging = ferry_datapath::staging::Staging::open(&ferry_datapath::spec::StagingSpec {
        url: format!("{}/imports", minio.bucket_url()),
        credentials_dir: Some(minio.credentials_dir().to_path_buf()),
        endpoint: Some(minio.endpoint().to_string()),
        region: None,
        ca_bundle: None,
    })
    .unwrap();
    ferry_datapath::convert::upload_file(&staging, "source.qcow2", &qcow2)
        .await
        .unwrap();

    let key = |k: &str| std::fs::read_to_string(minio.credentials_dir().join(k)).unwrap();
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "s3-creds"},
        "stringData": {"accessKeyId": key("accessKeyId"), "secretKey": key("secretKey")}}))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let state = work.path().join("cdi");
    let (standin_client, ns_name) = (client.clone(), ns.name().to_string());
    let standin = Background::spawn(move |shutdown| async move {
        cdi::run(standin_client, Some(&ns_name), &state, shutdown).await
    });
    let dvs = Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &cdi::dv_resource());
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "from-s3"},
        "spec": {"source": {"s3": {"url": format!("{}/ferry-staging/imports/source.qcow2", minio.endpoint()), "secretRef": "s3-creds"}},
                 "storage": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}}});
    dvs.patch("from-s3", &PatchParams::apply("test"), &Patch::Apply(&dv))
        .await
        .unwrap();
    wait_phase(&dvs, "from-s3", "Succeeded", Duration::from_secs(60)).await;
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns.name())
        .get("from-s3")
        .await
        .unwrap();
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pv = pvs
        .get(claim.spec.unwrap().volume_name.as_deref().unwrap())
        .await
        .unwrap();
    holds_source_then_zeros(&image_of(&pv), &raw, &sha);

    standin.stop().await;
    let _ = pvs.delete(&pv.name_any(), &Default::default()).await;
}
