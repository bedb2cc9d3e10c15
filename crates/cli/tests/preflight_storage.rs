//! Disks Ferry cannot copy are refused in Validating, each with its own reason, while the source is still
//! running and before anything is created: vcsim's storage fixtures (vSAN and vVol objects, VM Encryption, an
//! seSparse snapshot child, a disk split into extents), in the tests' production-like lab: `/folder` answers
//! only a live session and only the datacenter's full inventory path, as vCenter does. Before the preflight
//! read the descriptors, these passed Validating and failed in Converting, after Preparing powered the VM off.

mod support;

use std::time::Duration;

use ferry_api::{Phase, PowerState};
use ferry_testkit::migration;
use support::*;

#[tokio::test]
async fn disks_ferry_cannot_copy_are_refused_before_any_power_change() {
    let (client, ns) = setup("preflight-storage").await;
    let lab = lab().await;
    let cases = [
        ("ferry-vsan-vm", "VsanDisk", "vSAN object"),
        ("ferry-vvol-vm", "VvolDisk", "vVols object"),
        ("ferry-encrypted-vm", "EncryptedDisk", "ciphertext"),
        ("ferry-sesparse-vm", "SnapshotsPresent", "snapshot"),
        ("ferry-multiextent-vm", "MultiExtentDisk", "extent files"),
    ];
    for (vm, _, _) in cases {
        assert_eq!(source_power(vm).await, PowerState::PoweredOn, "{vm}");
        migration::apply(
            &client,
            ns.name(),
            migration::migration(lab, ns.name(), vm, vm),
        )
        .await
        .unwrap();
    }
    for (vm, reason, words) in cases {
        let failed = wait_for_phase(
            &client,
            ns.name(),
            vm,
            Phase::Failed,
            Duration::from_secs(120),
        )
        .await;
        let status = failed.status.clone().unwrap();
        let error = status.retry.as_ref().unwrap().last_error.clone().unwrap();
        assert_eq!(error.reason, reason, "{vm}: {error:?}");
        assert!(error.message.contains(words), "{vm}: {error:?}");
        let validated = status.conditions.iter().find(|c| c.type_ == "Validated");
        assert_eq!(
            validated.map(|c| (c.status.as_str(), c.reason.as_str())),
            Some(("False", reason)),
            "{vm}: refused in Validating: {:?}",
            status.conditions
        );
        assert_eq!(
            source_power(vm).await,
            PowerState::PoweredOn,
            "{vm}: the source was never powered off"
        );
    }
    let created: Vec<String> = lab
        .audit_requests_by(migration::SERVICE_ACCOUNT)
        .into_iter()
        .filter(|r| r.namespace == ns.name() && r.verb == "create")
        .map(|r| r.resource)
        .filter(|r| !matches!(r.as_str(), "events"))
        .collect();
    assert!(created.is_empty(), "nothing was created: {created:?}");
}
