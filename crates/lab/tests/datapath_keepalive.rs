//! The conversion keeps its vSphere session alive while disks stream, and stops doing so when it ends.
//! (Here, not in `ferry-datapath`, so that crate needs no kube even for tests.)

use std::time::Duration;

use ferry_api::DiskFormat;
use ferry_datapath::progress::Progress;
use ferry_datapath::spec::{DiskSpec, SourceSpec, SourceTrust, StagingSpec, TransferSpec};
use ferry_datapath::{ConvertSpec, convert_all};
use ferry_testkit::TestVcsim;
use ferry_testkit::disks::make_flat_vmdk;
use ferry_testkit::proxy::{Fault, FaultProxy};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{Session, provision};

const DISK_BYTES: u64 = 8 << 20;

#[tokio::test]
async fn the_session_is_kept_alive_while_a_disk_streams_and_no_longer_after() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into()))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let disk = make_flat_vmdk(work.path(), "kept", DISK_BYTES, 5);
    let attached = provision::link_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
        .await
        .unwrap();
    let info = inventory::describe_vm(&session, &vm).await.unwrap();
    std::fs::write(work.path().join("user"), &endpoint.username).unwrap();
    std::fs::write(work.path().join("password"), endpoint.password().unwrap()).unwrap();

    let proxy = FaultProxy::start(&vcsim).await;
    // The disk's first request is answered only once a keepalive went by: the copy cannot finish without one.
    proxy.push(Fault::AfterSoapCall("CurrentTime".into()));
    let interval = Duration::from_millis(100);
    let spec = ConvertSpec {
        source: SourceSpec {
            url: proxy.url(),
            credentials_dir: work.path().to_path_buf(),
            trust: SourceTrust::CaFile(endpoint.ca_file.clone()),
            datacenter: info.datacenter.clone(),
            vm_uuid: info.instance_uuid.clone().unwrap(),
            instance_uuid: None,
        },
        disks: vec![DiskSpec {
            index: 0,
            file: attached.to_string(),
            capacity_bytes: DISK_BYTES,
        }],
        format: DiskFormat::Raw,
        staging: Some(StagingSpec {
            url: format!("file://{}", work.path().join("staging").display()),
            credentials_dir: None,
            endpoint: None,
            region: None,
            ca_bundle: None,
        }),
        volumes: vec![],
        parallel: 1,
        transfer: TransferSpec {
            keepalive_millis: interval.as_millis() as u64,
            ..TransferSpec::default()
        },
        round: None,
    };
    let result = &convert_all(&spec, &Progress::new(true)).await.unwrap()[0];
    assert_eq!(result.staged.source_sha256, disk.sha256);
    let keepalives = |proxy: &FaultProxy| {
        proxy
            .soap_calls()
            .iter()
            .filter(|m| *m == "CurrentTime")
            .count()
    };
    assert!(keepalives(&proxy) >= 1, "{:?}", proxy.soap_calls());
    assert_eq!(
        proxy.downloads().len(),
        2,
        "the descriptor, then the extent in one request"
    );

    // Ended with the conversion: ten intervals later, no keepalive came.
    let after = keepalives(&proxy);
    tokio::time::sleep(interval * 10).await;
    assert_eq!(keepalives(&proxy), after, "{:?}", proxy.soap_calls());
    assert_eq!(
        proxy.soap_calls().last().map(String::as_str),
        Some("Logout")
    );
}
