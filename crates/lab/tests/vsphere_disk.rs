//! `ferry-vsphere` and a real disk in vcsim: a 256 MiB flat VMDK made with qemu-img is downloaded byte-exact, also
//! when the connection is cut halfway. (Here, not in `ferry-vsphere`, so that crate needs no kube even for tests.)

use std::time::Duration;

use ferry_testkit::TestVcsim;
use ferry_testkit::disks::{hex, make_flat_vmdk};
use ferry_testkit::proxy::CuttingProxy;
use ferry_vsphere::datastore::{Download, flat_disk};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{ConnectConfig, Session, provision};
use sha2::{Digest, Sha256};

const DISK_BYTES: u64 = 256 << 20;

async fn download_sha(session: &Session, datacenter: &str, disk_file: &str) -> (String, u64) {
    let flat = flat_disk(session, datacenter, disk_file).await.unwrap();
    assert_eq!(flat.size, DISK_BYTES);
    let mut download = Download::open(session, datacenter, &flat.extent, 0)
        .await
        .unwrap();
    let mut hash = Sha256::new();
    while let Some(chunk) = download.next_chunk().await.unwrap() {
        hash.update(&chunk);
    }
    (hex(&hash.finalize()), download.offset())
}

#[tokio::test]
async fn a_real_flat_vmdk_downloads_byte_exact_even_when_the_connection_is_cut() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let config = endpoint.connect_config(Duration::from_secs(120)).unwrap();
    let session = Session::connect(config.clone()).await.unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into()))
        .await
        .unwrap();

    let work = tempfile::tempdir().unwrap();
    let disk = make_flat_vmdk(work.path(), "migrate-me", DISK_BYTES, 1);
    let attached = provision::link_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
        .await
        .unwrap();

    let info = inventory::describe_vm(&session, &vm).await.unwrap();
    let described = info
        .disks
        .iter()
        .find(|d| d.file == attached.to_string())
        .expect("the attached disk is described");
    assert_eq!(described.capacity_bytes as u64, DISK_BYTES);

    let (sha, bytes) = download_sha(&session, &info.datacenter, &described.file).await;
    assert_eq!((sha.as_str(), bytes), (disk.sha256.as_str(), DISK_BYTES));

    // Again through a proxy that drops the connection after 96 MiB: the download resumes with Range.
    let proxy = CuttingProxy::start(endpoint.port().unwrap(), 96 << 20).await;
    let through_proxy = ConnectConfig {
        url: format!("https://127.0.0.1:{}/sdk", proxy.port),
        ..config
    };
    let session = Session::connect(through_proxy).await.unwrap();
    let (sha, bytes) = download_sha(&session, &info.datacenter, &described.file).await;
    assert!(proxy.has_cut(), "the proxy never cut the connection");
    assert!(proxy.connections() >= 2, "the download did not reconnect");
    assert_eq!((sha.as_str(), bytes), (disk.sha256.as_str(), DISK_BYTES));
}
