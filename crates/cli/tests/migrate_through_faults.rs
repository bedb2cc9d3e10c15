//! A vCenter at its worst while a disk streams: `/folder` throttled and behind sessions that idle out sooner than
//! the copy lasts, the connection cut halfway, `Range` ignored on the resume (a 200 with the whole file), and
//! "503 Out of HTTP sessions" on the first tries of each file. The migration succeeds and the disk hashes to its
//! source; vcsim's log proves each fault was met.
//!
//! In CI the disk is 48 MiB at 1.5 MiB/s (about 35 s) with a 10 s idle timeout. The full case, a 2 GiB
//! disk copied for over four minutes with a 60 s idle timeout, runs by hand:
//! `FERRY_LONG_TRANSFER=1 cargo test -p ferry --test migrate_through_faults -- --nocapture`.
//!
//! Before downloads were hardened, this failed three ways: the stream was cut at 120 s by a total timeout,
//! the 401 of the expired session was classed Permanent, and a 200 answering a resume was taken as the rest of
//! the disk.

mod support;

use std::time::{Duration, Instant};

use ferry_api::Phase;
use ferry_lab::lab::VcsimRealism;
use ferry_testkit::{TestLab, migration};
use support::*;

const MIB: u64 = 1 << 20;

struct Case {
    disk_mib: u64,
    throttle: u64,
    session_idle: Duration,
    timeout: Duration,
}

fn case() -> Case {
    if std::env::var_os("FERRY_LONG_TRANSFER").is_some() {
        Case {
            disk_mib: 2048,
            throttle: 8 * MIB,
            session_idle: Duration::from_secs(60),
            timeout: Duration::from_secs(1800),
        }
    } else {
        Case {
            disk_mib: 48,
            throttle: 3 * MIB / 2,
            session_idle: Duration::from_secs(10),
            timeout: Duration::from_secs(300),
        }
    }
}

/// The production-like lab of `ferry lab up`, with every transfer fault on.
async fn faulty_lab(case: &Case) -> &'static TestLab {
    let realism = VcsimRealism {
        session_idle: Some(case.session_idle),
        folder_throttle: Some(case.throttle),
        folder_cut_at: Some(case.disk_mib * MIB / 2),
        folder_ignore_range: true,
        folder_503: 2,
        ..VcsimRealism::production_like()
    };
    TestLab::shared_with_standins_and(ferry(), realism).await
}

#[tokio::test]
async fn a_disk_streams_through_throttling_expiry_a_cut_ignored_range_and_503s() {
    let case = case();
    let lab = faulty_lab(&case).await;
    let (client, ns) = setup("faults").await;
    const VM: &str = "ferry-faulty-transfer";
    let disks = seed_vm(&lab.dir().join(VM), VM, &[case.disk_mib]).await;

    let started = Instant::now();
    migration::apply(
        &client,
        ns.name(),
        migration::migration(lab, ns.name(), "faults", VM),
    )
    .await
    .unwrap();
    let done = wait_for_phase(&client, ns.name(), "faults", Phase::Succeeded, case.timeout).await;
    let took = started.elapsed();

    let status = done.status.unwrap();
    let disk = &status.disks[0];
    assert!(disk.verified, "{disk:?}");
    assert_eq!(disk.sha256.as_ref(), Some(&disks[0].1), "{disk:?}");
    let copy_floor = Duration::from_secs(case.disk_mib * MIB / case.throttle);
    assert!(
        took > copy_floor + case.session_idle,
        "the copy outlasted the session's idle timeout ({took:?})"
    );

    let log = std::fs::read_to_string(lab.dir().join("vcsim.log")).unwrap();
    let flat = format!("{VM}-flat.vmdk");
    let met = |fault: &str| {
        log.lines()
            .filter(|l| l.contains(fault) && l.contains(&flat))
            .count()
    };
    assert_eq!(met("fault: connection cut"), 1, "the stream was cut once");
    assert!(
        met("fault: Range") >= 1,
        "the resume asked for a Range, which was ignored"
    );
    assert!(met("fault: 503") >= 1, "503s were met");
    assert!(
        log.lines().any(|l| l.contains("fault: 401")),
        "an expired session was refused and logged in again"
    );
    println!(
        "{} MiB at {} KiB/s with a {:?} idle timeout: Succeeded in {took:?}",
        case.disk_mib,
        case.throttle / 1024,
        case.session_idle
    );
}
