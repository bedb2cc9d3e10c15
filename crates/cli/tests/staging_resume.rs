//! A conversion Job's pod killed mid-upload: the next attempt resumes the staged upload where it stopped, reading
//! and uploading only the parts still missing (counted by MinIO), and the migration succeeds with the disk
//! verified. Before, every attempt started over from byte 0: hours lost on a 2 TB disk.

mod support;

use std::time::{Duration, Instant};

use ferry_api::Phase;
use ferry_api::keys::{step_selector, uid_selector};
use ferry_datapath::spec::StagingSpec;
use ferry_datapath::staging::{MIN_PART_BYTES, Staging, UploadJournal};
use ferry_lab::lab::VcsimRealism;
use ferry_lab::minio::StagingEndpoint;
use ferry_testkit::{TestLab, eventually, migration};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use support::*;

const VM: &str = "ferry-resume-vm";
/// Six parts of 16 MiB.
const DISK_BYTES: u64 = 96 << 20;
const PARTS: u64 = DISK_BYTES / MIN_PART_BYTES;
/// Each vCenter download's rate: the disk takes 24 s, time enough to kill the pod midway.
const THROTTLE: u64 = 4 << 20;
const OBJECT: &str = "disk-0.raw";

/// The lab as `ferry lab up` runs it, with vCenter's downloads throttled. The first call in this binary starts it.
async fn throttled_lab() -> &'static TestLab {
    let realism = VcsimRealism {
        folder_throttle: Some(THROTTLE),
        ..VcsimRealism::production_like()
    };
    TestLab::shared_with_standins_and(ferry(), realism).await
}

/// The migration's folder in the lab's MinIO: its key prefix, and the store as the conversion Job opens it.
async fn staging_folder(ns: &str, name: &str, uid: &str) -> (String, Staging) {
    let staging = lab_staging().await;
    let prefix = format!("migrations/{ns}/{name}-{uid}");
    let store = Staging::open(&StagingSpec {
        url: staging.url(&prefix),
        credentials_dir: Some(staging.credentials_dir.clone()),
        endpoint: Some(staging.endpoint.clone()),
        region: None,
        ca_bundle: staging.ca_bundle().unwrap(),
    })
    .unwrap();
    (prefix, store)
}

async fn lab_staging() -> StagingEndpoint {
    lab().await.state().staging.clone().unwrap()
}

/// Deletes the running conversion pod of migration `uid`; the lab's kubelet SIGKILLs its process.
async fn kill_conversion_pod(client: &kube::Client, ns: &str, uid: &str) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let selector = format!("{},{}", uid_selector(uid), step_selector("convert"));
    let running = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .expect("a running conversion pod");
    let name = running.name_any();
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    name
}

/// MinIO's count of UploadPart requests.
async fn part_requests() -> u64 {
    lab_staging()
        .await
        .s3_requests("PutObjectPart")
        .await
        .unwrap()
}

#[tokio::test]
async fn a_conversion_pod_killed_mid_upload_resumes_and_uploads_only_the_missing_parts() {
    throttled_lab().await;
    let started = Instant::now();
    let (client, ns) = setup("resume").await;
    let lab = lab().await;
    let sha = seed_vm(&lab.dir().join(VM), VM, &[DISK_BYTES >> 20]).await[0]
        .1
        .clone();
    let staging = lab_staging().await;
    let parts_before = part_requests().await;

    let name = "resume";
    migration::apply(
        &client,
        ns.name(),
        migration::staged_migration(lab, ns.name(), name, VM),
    )
    .await
    .unwrap();
    let api = migrations(&client, ns.name());
    let uid = api.get(name).await.unwrap().uid().unwrap();
    let (prefix, store) = staging_folder(ns.name(), name, &uid).await;

    // Past 40%: three of the six parts staged, as the upload's journal records them.
    let journal: UploadJournal = eventually(
        "the first attempt to stage three parts",
        Duration::from_secs(120),
        || async {
            store
                .journal(OBJECT)
                .await
                .unwrap()
                .filter(|j| j.parts.len() >= 3)
        },
    )
    .await;
    let killed = kill_conversion_pod(&client, ns.name(), &uid).await;
    let killed_at = started.elapsed();
    assert!(
        (journal.parts.len() as u64) < PARTS,
        "killed before the end: {journal:?}"
    );

    let done = wait_for_phase(
        &client,
        ns.name(),
        name,
        Phase::Succeeded,
        Duration::from_secs(240),
    )
    .await;
    let status = done.status.clone().unwrap();
    let disk = &status.disks[0];
    assert!(disk.verified, "{disk:?}");
    assert_eq!(disk.sha256.as_deref(), Some(sha.as_str()));
    // The second attempt read only what the first had not staged.
    let resumed_from = journal.parts.len() as u64 * MIN_PART_BYTES;
    assert!(
        disk.bytes_moved as u64 <= DISK_BYTES - resumed_from,
        "{} bytes read by the attempt that finished",
        disk.bytes_moved
    );
    let retries: Vec<_> = status
        .retry
        .iter()
        .flat_map(|r| &r.budget_used)
        .filter(|b| b.used > 0)
        .map(|b| (b.phase, b.used))
        .collect();
    assert_eq!(
        retries,
        [(Phase::Converting, 1)],
        "the killed pod cost one conversion retry"
    );

    // Nothing is left in the bucket: no object, no journal, no multipart upload.
    eventually(
        "the migration's staging folder to be empty",
        Duration::from_secs(30),
        || async {
            let objects = staging.objects(&prefix).await.unwrap();
            let uploads = staging.uploads_in_progress(&prefix).await.unwrap();
            (objects.is_empty() && uploads.is_empty()).then_some(())
        },
    )
    .await;

    let parts = part_requests().await - parts_before;
    println!(
        "killed {killed} after {killed_at:?} with {} of {PARTS} parts journaled; {parts} parts uploaded in all; \
         {} bytes read by the second attempt; {:?} in all",
        journal.parts.len(),
        disk.bytes_moved,
        started.elapsed()
    );
    assert!(
        (PARTS..2 * PARTS).contains(&parts),
        "{parts} UploadPart requests for {PARTS} parts"
    );
}
