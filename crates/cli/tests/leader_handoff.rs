//! Two replicas of `ferry controller`, as deploy/controller.yaml runs them: a standby is ready and stops at once on
//! SIGTERM (a rolling update terminates it; it must not hold its pod for the whole grace period, nor take the Lease
//! while it stops), and a leader that stops releases its Lease rather than holding it until it expires.

use std::path::Path;
use std::time::{Duration, Instant};

use ferry_lab::control_plane::process::{self, Lifetime, ProcessRecord};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

const LEASE: &str = "ferry-handoff-test";
/// A standby looks again when the holder's term would end (kube-lease-manager sleeps until then), so a handover
/// takes up to this long even when the Lease was released.
const LEASE_SECONDS: u64 = 10;

struct Replica {
    record: ProcessRecord,
    port: u16,
    identity: String,
}

fn start(ferry: &Path, kubeconfig: &Path, dir: &Path, identity: &str) -> Replica {
    let port = process::free_port().unwrap();
    let mut spec =
        ferry_lab::control_plane::controller_process::component(ferry, kubeconfig, port, identity)
            .spec;
    spec.args.retain(|a| !a.starts_with("--lease-seconds="));
    spec.args.extend([
        format!("--lease-seconds={LEASE_SECONDS}"),
        format!("--lease-name={LEASE}"),
    ]);
    let log = dir.join(format!("{identity}.log"));
    let record = process::start(&spec, &log, Lifetime::TiedToThisProcess).unwrap();
    Replica {
        record,
        port,
        identity: identity.into(),
    }
}

fn status(replica: &Replica, path: &str) -> Option<u16> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{}{path}", replica.port))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).parse().ok()
}

async fn until(what: &str, timeout: Duration, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

fn sigterm(replica: &Replica) {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &replica.record.pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

fn log(replica: &Replica) -> String {
    std::fs::read_to_string(&replica.record.log).unwrap_or_default()
}

async fn holder(lab: &ferry_testkit::TestLab) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(lab.client().await, "ferry-system");
    leases.get_opt(LEASE).await.ok()??.spec?.holder_identity
}

#[tokio::test]
async fn a_standby_stops_at_once_on_sigterm_and_a_stopping_leader_hands_its_lease_over() {
    let lab = ferry_testkit::TestLab::shared().await;
    let state = lab.state();
    ferry_lab::control_plane::controller_process::apply_rbac(&state.tools, &state.kubeconfig)
        .unwrap();
    let kubeconfig =
        ferry_lab::control_plane::controller_process::kubeconfig(lab.dir(), &state.api_url)
            .unwrap();
    let ferry = Path::new(env!("CARGO_BIN_EXE_ferry"));
    let dir = lab.dir();
    let alive = |r: &Replica| r.record.is_alive(ferry);

    let leader = start(ferry, &kubeconfig, dir, "handoff-a");
    until("a leads", Duration::from_secs(60), || {
        status(&leader, "/readyz/leader") == Some(200)
    })
    .await;
    let standby = start(ferry, &kubeconfig, dir, "handoff-b");
    until("b stands by, ready", Duration::from_secs(60), || {
        status(&standby, "/readyz") == Some(200)
    })
    .await;
    assert_eq!(status(&standby, "/readyz/leader"), Some(503));

    // A standby goes at once: it holds nothing.
    sigterm(&standby);
    let gone = until(
        "the standby exits on SIGTERM",
        Duration::from_secs(20),
        || !alive(&standby),
    )
    .await;
    assert!(
        log(&standby).contains("stopping while standing by"),
        "{}",
        log(&standby)
    );
    assert_eq!(holder(lab).await.as_deref(), Some("handoff-a"));

    // A leader that stops releases its Lease (no one holds it once it is gone), and the standby takes it.
    let successor = start(ferry, &kubeconfig, dir, "handoff-c");
    until("c stands by", Duration::from_secs(60), || {
        status(&successor, "/readyz") == Some(200)
    })
    .await;
    sigterm(&leader);
    until(
        "the leader exits on SIGTERM",
        Duration::from_secs(20),
        || !alive(&leader),
    )
    .await;
    let after_exit = holder(lab).await;
    assert_ne!(
        after_exit.as_deref(),
        Some("handoff-a"),
        "the stopped leader still holds the Lease: {}",
        log(&leader)
    );
    let handed_over = until("c leads", Duration::from_secs(LEASE_SECONDS * 3), || {
        status(&successor, "/readyz/leader") == Some(200)
    })
    .await;
    assert_eq!(
        holder(lab).await.as_deref(),
        Some(successor.identity.as_str())
    );
    println!(
        "standby {} gone {gone:?} after SIGTERM; {} leads {handed_over:?} after the leader stopped (lease {LEASE_SECONDS} s)",
        standby.identity, successor.identity
    );
    let _ = process::stop(&successor.record, Duration::from_secs(10));
}
