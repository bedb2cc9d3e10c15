//! `ferry-vsphere` downloads against vcsim behind a proxy that behaves like a real vCenter on a bad day: a slow
//! link, an expired cookie, "Out of HTTP sessions", dropped and stalled streams, `Range` ignored. Also the
//! datacenter's full path and SHA-1 thumbprints, which vcsim alone would let pass.
//! (Here, not in `ferry-vsphere`, so that crate needs no kube even for tests.)

use std::time::Duration;

use ferry_api::ErrorClass;
use ferry_testkit::TestVcsim;
use ferry_testkit::disks::{FlatVmdk, hex, make_flat_vmdk};
use ferry_testkit::proxy::{Fault, FaultProxy, Seen};
use ferry_vsphere::datastore::{Download, FlatDisk, flat_disk};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{
    Backoff, ConnectConfig, Error, MoRef, Session, TlsMode, TransferPolicy, power, props, provision,
};
use sha2::{Digest, Sha256};

const DISK_BYTES: u64 = 8 << 20;

struct Fixture {
    vcsim: TestVcsim,
    _work: tempfile::TempDir,
    disk: FlatVmdk,
    datacenter: String,
    flat: FlatDisk,
}

/// vcsim with an 8 MiB flat disk attached to DC0_H0_VM0; `before_describe` runs on the inventory first.
async fn fixture_with<F: AsyncFnOnce(&Session)>(before_describe: F) -> Fixture {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let session = Session::connect(config(&vcsim, vcsim.endpoint().url.clone(), 30))
        .await
        .unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into()))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let disk = make_flat_vmdk(work.path(), "transfer", DISK_BYTES, 3);
    let attached = provision::attach_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
        .await
        .unwrap();
    before_describe(&session).await;
    let info = inventory::describe_vm(&session, &vm).await.unwrap();
    let flat = flat_disk(&session, &info.datacenter, &attached.to_string())
        .await
        .unwrap();
    assert_eq!(flat.size, DISK_BYTES);
    Fixture {
        vcsim,
        _work: work,
        disk,
        datacenter: info.datacenter,
        flat,
    }
}

async fn fixture() -> Fixture {
    fixture_with(async |_: &Session| {}).await
}

fn config(vcsim: &TestVcsim, url: String, timeout_s: u64) -> ConnectConfig {
    ConnectConfig {
        url,
        ..vcsim
            .endpoint()
            .connect_config(Duration::from_secs(timeout_s))
            .unwrap()
    }
}

/// Short waits, so that a test spends milliseconds where a real vCenter gets minutes.
fn quick(attempts: u32) -> TransferPolicy {
    TransferPolicy {
        idle_timeout: Duration::from_secs(2),
        backoff: Backoff {
            first: Duration::from_millis(10),
            max: Duration::from_millis(40),
            attempts,
        },
    }
}

async fn through(
    f: &Fixture,
    proxy: &FaultProxy,
    timeout_s: u64,
    policy: TransferPolicy,
) -> Session {
    Session::connect_with(config(&f.vcsim, proxy.url(), timeout_s), policy)
        .await
        .unwrap()
}

async fn download(f: &Fixture, session: &Session) -> Result<(String, u64), Error> {
    let mut download = Download::open(session, &f.datacenter, &f.flat.extent, 0).await?;
    let mut hash = Sha256::new();
    while let Some(chunk) = download.next_chunk().await? {
        hash.update(&chunk);
    }
    Ok((hex(&hash.finalize()), download.offset()))
}

/// The proxy's record of requests for the flat extent (the descriptor was read before faults were queued).
fn extent_requests(proxy: &FaultProxy) -> Vec<Seen> {
    proxy
        .downloads()
        .into_iter()
        .filter(|s| s.target.contains("-flat.vmdk"))
        .collect()
}

fn assert_exact(f: &Fixture, got: (String, u64)) {
    assert_eq!(got, (f.disk.sha256.clone(), DISK_BYTES));
}

#[tokio::test]
async fn a_disk_stream_outlasts_the_soap_deadline_in_one_request() {
    let f = fixture().await;
    let proxy = FaultProxy::start(&f.vcsim).await;
    // SOAP calls get 2 s in all; the disk trickles in over about 4 s.
    let session = through(&f, &proxy, 2, quick(4)).await;
    proxy.push(Fault::Throttle(2 << 20));
    assert_exact(&f, download(&f, &session).await.unwrap());
    let requests = extent_requests(&proxy);
    assert_eq!(
        requests.len(),
        1,
        "the stream was cut and resumed: {requests:?}"
    );
}

#[tokio::test]
async fn a_refused_cookie_logs_in_again_once_and_twice_is_a_clear_permanent_error() {
    let f = fixture().await;
    let proxy = FaultProxy::start(&f.vcsim).await;
    let session = through(&f, &proxy, 30, quick(4)).await;
    let logins = |proxy: &FaultProxy| proxy.soap_calls().iter().filter(|m| *m == "Login").count();
    assert_eq!(logins(&proxy), 1);

    // An expired session: vCenter answers 401 to /folder.
    proxy.push(Fault::Status(401));
    assert_exact(&f, download(&f, &session).await.unwrap());
    let requests = extent_requests(&proxy);
    assert_eq!(
        requests.iter().map(|s| s.status).collect::<Vec<_>>(),
        [401, 200]
    );
    assert_ne!(
        requests[0].cookie, requests[1].cookie,
        "the retry must carry the new session's cookie"
    );
    assert_eq!(logins(&proxy), 2);

    // Refused again right after logging in: the user lacks the privileges, and says so.
    proxy.push(Fault::Status(403));
    proxy.push(Fault::Status(403));
    let e = download(&f, &session).await.unwrap_err();
    assert!(
        matches!(e, Error::DatastoreAccessDenied { status: 403, .. }),
        "{e}"
    );
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert!(e.to_string().contains("Datastore.Browse"), "{e}");
    assert_eq!(logins(&proxy), 3, "one login per refusal, not a loop");
}

#[tokio::test]
async fn busy_answers_drops_and_stalls_are_ridden_out_until_the_attempts_are_spent() {
    let f = fixture().await;
    let proxy = FaultProxy::start(&f.vcsim).await;
    let session = through(&f, &proxy, 30, quick(3)).await;
    // Two busy answers ("Out of HTTP sessions"), a cut stream, another busy one, a stream that stalls (the
    // idle timeout ends it), then a clean answer. Progress starts the count over, so 3 attempts are enough.
    for fault in [
        Fault::Status(503),
        Fault::Status(500),
        Fault::CutAfter(1 << 20),
        Fault::Status(503),
        Fault::StallAfter(3 << 20),
    ] {
        proxy.push(fault);
    }
    // Only a guard: without an idle timeout the stalled stream would hang forever.
    let got = tokio::time::timeout(Duration::from_secs(60), download(&f, &session))
        .await
        .expect("a stalled stream was never given up");
    assert_exact(&f, got.unwrap());
    let requests = extent_requests(&proxy);
    assert_eq!(
        requests.iter().map(|s| s.status).collect::<Vec<_>>(),
        [503, 500, 200, 503, 206, 206]
    );
    assert!(requests[4].range.is_some() && requests[5].range.is_some());

    // Busy for longer than the schedule: the last answer is the error, transient, after 1 + 3 requests.
    for _ in 0..4 {
        proxy.push(Fault::Status(503));
    }
    let e = download(&f, &session).await.unwrap_err();
    assert!(matches!(e, Error::Http { status: 503, .. }), "{e}");
    assert_eq!(e.class(), ErrorClass::Transient);
    assert_eq!(extent_requests(&proxy).len(), 6 + 4);
}

#[tokio::test]
async fn a_server_that_ignores_range_still_gives_the_exact_bytes() {
    let f = fixture().await;
    let proxy = FaultProxy::start(&f.vcsim).await;
    let session = through(&f, &proxy, 30, quick(3)).await;
    proxy.push(Fault::CutAfter(3 << 20));
    proxy.push(Fault::IgnoreRange);
    assert_exact(&f, download(&f, &session).await.unwrap());
    let requests = extent_requests(&proxy);
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert!(
        requests[1].range.is_some() && requests[1].status == 200,
        "the resume asked for a range and got the whole file: {requests:?}"
    );
}

#[tokio::test]
async fn a_datacenter_in_a_folder_is_named_by_its_inventory_path() {
    // DC0 moved into a folder whose name needs escaping in a query.
    let f = fixture_with(async |session: &Session| {
        let root = session.content().root_folder.clone();
        let folder = session
            .call("CreateFolder", &root, "<name>Lab A&amp;B</name>")
            .await
            .unwrap();
        let folder = MoRef::from_element(folder.child("returnval").unwrap()).unwrap();
        let dc = props::retrieve_all(session, "Datacenter", &["name"])
            .await
            .unwrap()
            .into_iter()
            .find(|o| o.text("name") == Some("DC0"))
            .unwrap()
            .obj;
        let task = session
            .call("MoveIntoFolder_Task", &folder, &dc.xml("list"))
            .await
            .unwrap();
        let task = MoRef::from_element(task.child("returnval").unwrap()).unwrap();
        power::wait_task(session, &task, Duration::from_secs(30))
            .await
            .unwrap();
    })
    .await;
    assert_eq!(f.datacenter, "Lab A&B/DC0");

    let proxy = FaultProxy::start(&f.vcsim).await;
    let session = through(&f, &proxy, 30, quick(3)).await;
    assert_exact(&f, download(&f, &session).await.unwrap());
    let target = &extent_requests(&proxy)[0].target;
    assert!(
        target.contains("dcPath=Lab+A%26B%2FDC0&dsName="),
        "{target}"
    );
}

#[tokio::test]
async fn a_sha1_thumbprint_as_vsphere_shows_it_names_the_sha256_to_pin() {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let vcsim = TestVcsim::start(false).await.unwrap();
    let pem = std::fs::read(vcsim.dir().join("pki/vcsim.crt")).unwrap();
    let der = CertificateDer::from_pem_slice(&pem).unwrap();
    let (sha256, sha1) = (
        ferry_vsphere::tls::thumbprint_of(der.as_ref()),
        ferry_vsphere::tls::sha1_thumbprint_of(der.as_ref()),
    );
    let pinned = |thumbprint: String| ConnectConfig {
        tls: TlsMode::Thumbprint(thumbprint),
        ..config(&vcsim, vcsim.endpoint().url.clone(), 10)
    };

    // As vSphere shows it (lower case here, to show case does not matter).
    let e = Session::connect(pinned(sha1.to_lowercase()))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Sha1Thumbprint { matches: true, presented_sha256, .. } if *presented_sha256 == sha256),
        "{e:?}"
    );
    let message = e.to_string();
    assert!(
        message.contains("SHA-1") && message.contains(&sha256),
        "{message}"
    );
    assert_eq!(e.class(), ErrorClass::Permanent);

    // Another certificate's SHA-1: no advice to pin what the server showed.
    let e = Session::connect(pinned(vec!["3F"; 20].join(":")))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Sha1Thumbprint { matches: false, .. }),
        "{e:?}"
    );
    assert!(!e.to_string().contains("set spec.tls.thumbprint"), "{e}");

    // The SHA-256 it named is accepted.
    Session::connect(pinned(sha256)).await.unwrap();
}
