//! Preflight's warnings: what the migration will not carry or protect, said in a condition that stays True while
//! it holds (the reconcile publishes each as an Event when it turns True), or refused when the spec asks.

use ferry_api::{
    ConditionType, GuestAdaptation, NetworkMapping, Reason, SourceNic, SourceVmStatus,
    StaticAddressPolicy, VirtualMachineMigration,
};

use crate::checkpoint::step::Step;
use crate::error::{Failure, Result};

/// The warning a plain-http staging endpoint (`insecure: true`) carries for as long as the migration lives.
pub(super) fn warn_if_plain_http(step: &mut Step<'_>) {
    let Some(message) = plain_http_staging(step.vmm) else {
        return;
    };
    let update = ferry_kube::conditions::ConditionUpdate {
        type_: ConditionType::InsecureStaging.as_str(),
        status: true,
        reason: "PlainHTTP",
        message,
        observed_generation: step.vmm.metadata.generation,
    };
    ferry_kube::conditions::set_condition(&mut step.status.conditions, update, &step.now);
}

/// The warning a source with a vTPM carries: what was sealed to it does not follow.
pub(super) fn warn_if_vtpm(step: &mut Step<'_>, source: &SourceVmStatus) {
    if let Some(message) = vtpm_not_carried(source) {
        warn(step, ConditionType::TpmNotCarried, "SourceHasVTPM", message);
    }
}

/// Sets warning condition `type_` True (the reconcile publishes it as an Event when it turns True).
pub(super) fn warn(step: &mut Step<'_>, type_: ConditionType, reason: &str, message: String) {
    let update = ferry_kube::conditions::ConditionUpdate {
        type_: type_.as_str(),
        status: true,
        reason,
        message,
        observed_generation: step.vmm.metadata.generation,
    };
    ferry_kube::conditions::set_condition(&mut step.status.conditions, update, &step.now);
}

/// The NICs whose address VMware Tools reported as configured by hand and whose network goes to the pod network
/// (masquerade: the guest must take the pod's DHCP address there): the warning, or the refusal the target asks
/// for. Pure.
pub(super) fn check_static_addresses(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    networks: &[NetworkMapping],
) -> Result<Option<String>> {
    let on_pod: Vec<String> = source
        .nics
        .iter()
        .filter(|nic| {
            networks
                .iter()
                .any(|n| n.source == nic.network && n.pod.is_some())
        })
        .filter_map(static_nic)
        .collect();
    if on_pod.is_empty() {
        return Ok(None);
    }
    let said = format!(
        "{} has an address configured by hand, and goes to the pod network, where the guest must take the pod's \
         address by DHCP: it will have no network until it does",
        on_pod.join("; ")
    );
    if vmm.spec.target.static_address_on_pod_network == StaticAddressPolicy::Warn {
        return Ok(Some(format!(
            "{said}; map its network to a multus network on its own subnet to keep the address"
        )));
    }
    let message = format!(
        "{said}; spec.target.staticAddressOnPodNetwork is Refuse: map its network to a multus network on its own \
         subnet"
    );
    Err(match &vmm.spec.target.network_map_ref {
        Some(map) => Failure::fixable(
            Reason::StaticAddressOnPodNetwork,
            format!(
                "{message} in NetworkMap {}, and the migration resumes",
                map.name
            ),
        ),
        None => Failure::permanent(
            Reason::StaticAddressOnPodNetwork,
            format!("{message}, in a new migration (the target is immutable)"),
        ),
    })
}

/// The NICs whose address VMware Tools reported as configured by hand and that go to a multus network (where the
/// address still means something), when nothing will put the address on the NIC the guest sees: the reason and
/// what it means. On KubeVirt each NIC is a new device at a new PCI address: Linux names it after that address
/// (`enp1s0` where it was `ens192`), so configuration naming the old interface does not apply; Windows sees a new
/// adapter without the old one's settings. Guest adaptation carries it: virt-v2v's `--mac` on Windows
/// (`preserveStaticIPs`), the old names kept by MAC on Linux. Pure.
pub(super) fn static_address_not_kept(
    vmm: &VirtualMachineMigration,
    source: &SourceVmStatus,
    networks: &[NetworkMapping],
) -> Option<(&'static str, String)> {
    let on_bridge: Vec<String> = source
        .nics
        .iter()
        .filter(|nic| {
            networks
                .iter()
                .any(|n| n.source == nic.network && n.multus.is_some())
        })
        .filter_map(static_nic)
        .collect();
    if on_bridge.is_empty() {
        return None;
    }
    let nics = on_bridge.join("; ");
    let conversion = &vmm.spec.conversion;
    let windows = crate::build::vm::is_windows(source);
    let (reason, why) = match (conversion.guest_adaptation, windows) {
        (GuestAdaptation::None, _) => (
            "NoGuestAdaptation",
            "without guest adaptation nothing in the guest changes, and on KubeVirt each NIC is a new device: \
             Linux names it after its new PCI slot (for example enp1s0 where it was ens192), so configuration \
             naming the old interface does not apply; Windows sees a new adapter without the old one's settings",
        ),
        (GuestAdaptation::VirtV2v, true) if !conversion.preserve_static_ips => (
            "PreserveStaticIPsOff",
            "Windows sees a new adapter without the old one's settings; conversion.preserveStaticIPs has \
             virt-v2v set the address on it at first boot",
        ),
        // virt-v2v's --mac sets it again (Windows); the guest's own configuration applies under the old names,
        // which the adaptation keeps by MAC (Linux; `status.adaptation.interfaceNames` says which it kept).
        (GuestAdaptation::VirtV2v, _) => return None,
    };
    Some((
        reason,
        format!(
            "{nics} has an address configured by hand that the migrated guest will not have: {why}; the guest has \
             no network there until it is configured again (a configuration that matches any interface name, or \
             DHCP, is not affected)"
        ),
    ))
}

/// `NIC <mac> on <network> (<address/prefix>, …)` for a NIC with an address configured by hand.
fn static_nic(nic: &SourceNic) -> Option<String> {
    let addresses = nic.static_addresses();
    (!addresses.is_empty()).then(|| {
        format!(
            "NIC {} on {} ({})",
            nic.mac,
            nic.network,
            addresses.join(", ")
        )
    })
}

/// What a source's vTPM means for its guest, if it has one. Pure.
fn vtpm_not_carried(source: &SourceVmStatus) -> Option<String> {
    if !source.vtpm {
        return None;
    }
    let windows = if crate::build::vm::is_windows(source) {
        ": BitLocker will ask for its recovery key at first boot, so have it ready, or suspend BitLocker in the \
         guest before it is powered off (Suspend-BitLocker -MountPoint C: -RebootCount 0) and resume it after"
    } else {
        ": a disk unlocked by the TPM will ask for its passphrase or recovery key"
    };
    Some(format!(
        "the source has a virtual TPM, whose contents vSphere keeps sealed by its key provider; the VM gets a new, \
         empty persistent vTPM, and nothing sealed to the old one follows{windows}"
    ))
}

/// Why the migration's staging is insecure, if it is. Pure.
fn plain_http_staging(vmm: &VirtualMachineMigration) -> Option<String> {
    let staging = vmm.spec.staging.as_ref().filter(|s| s.plain_http())?;
    let endpoint = staging.endpoint.as_deref().unwrap_or(&staging.url);
    Some(format!(
        "staging {endpoint} is plain http (insecure: true): the disks and the signed requests cross the network \
         unencrypted; use https"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::super::check_networks;

    fn vmm(networks: serde_json::Value) -> VirtualMachineMigration {
        super::super::tests::vmm(networks)
    }

    fn source() -> SourceVmStatus {
        super::super::tests::source()
    }

    #[test]
    fn a_static_address_on_a_bridge_is_a_warning_unless_something_carries_it() {
        let bridged = json!([{"source": "VM Network", "multus": {"networkName": "lan"}}]);
        let mut source = source();
        source.guest_os = Some("debian12_64Guest".into());
        source.nics[0].ip_addresses = vec![ferry_api::GuestIpAddress {
            address: "192.168.122.50".into(),
            prefix_length: 24,
            origin: "manual".into(),
        }];
        let warning = |vmm: &VirtualMachineMigration, source: &SourceVmStatus| {
            let networks = check_networks(vmm, None, source).unwrap();
            static_address_not_kept(vmm, source, &networks)
        };
        let reason = |vmm: &VirtualMachineMigration, source: &SourceVmStatus| {
            warning(vmm, source).map(|(reason, _)| reason)
        };
        let plain = vmm(bridged.clone());
        let (said, message) = warning(&plain, &source).unwrap();
        assert_eq!(said, "NoGuestAdaptation");
        assert!(
            message.starts_with(
                "NIC m on VM Network (192.168.122.50/24) has an address configured by hand"
            ) && message.contains("enp1s0 where it was ens192"),
            "{message}"
        );
        let mut adapted = vmm(bridged);
        adapted.spec.conversion.guest_adaptation = GuestAdaptation::VirtV2v;
        assert_eq!(
            reason(&adapted, &source),
            None,
            "Linux: the adaptation keeps the names by MAC"
        );
        source.guest_os = Some("windows2019srvNext_64Guest".into());
        assert_eq!(reason(&adapted, &source), Some("PreserveStaticIPsOff"));
        adapted.spec.conversion.preserve_static_ips = true;
        assert_eq!(
            reason(&adapted, &source),
            None,
            "virt-v2v's --mac carries it"
        );
        let pod = vmm(json!([{"source": "VM Network", "pod": {}}]));
        assert_eq!(
            reason(&pod, &source),
            None,
            "the pod network has a warning of its own"
        );
        source.nics[0].ip_addresses[0].origin = "dhcp".into();
        assert_eq!(reason(&plain, &source), None, "DHCP needs nothing");
    }

    #[test]
    fn a_static_address_on_the_pod_network_is_a_warning_or_the_refusal_asked_for() {
        let pod = json!([{"source": "VM Network", "pod": {}}]);
        let mut source = source();
        let networks = |vmm: &VirtualMachineMigration, source: &SourceVmStatus| {
            check_networks(vmm, None, source).unwrap()
        };
        let warned = vmm(pod.clone());
        assert_eq!(
            check_static_addresses(&warned, &source, &networks(&warned, &source)).unwrap(),
            None,
            "no address reported"
        );
        source.nics[0].ip_addresses = vec![ferry_api::GuestIpAddress {
            address: "192.168.122.50".into(),
            prefix_length: 24,
            origin: "manual".into(),
        }];
        let warning = check_static_addresses(&warned, &source, &networks(&warned, &source))
            .unwrap()
            .unwrap();
        assert!(
            warning.starts_with(
                "NIC m on VM Network (192.168.122.50/24) has an address configured by hand"
            ) && warning.contains("multus"),
            "{warning}"
        );
        let mut refusing = vmm(pod);
        refusing.spec.target.static_address_on_pod_network = StaticAddressPolicy::Refuse;
        let refused =
            check_static_addresses(&refusing, &source, &networks(&refusing, &source)).unwrap_err();
        assert_eq!(refused.reason, "StaticAddressOnPodNetwork");
        assert!(!refused.fixable, "the target is immutable");
        refusing.spec.target.network_map_ref = Some(ferry_api::LocalObjectReference {
            name: "site".into(),
        });
        let refused =
            check_static_addresses(&refusing, &source, &networks(&refusing, &source)).unwrap_err();
        assert!(refused.fixable && refused.message.contains("NetworkMap site"));
        let bridged = vmm(json!([{"source": "VM Network", "multus": {"networkName": "lan"}}]));
        assert_eq!(
            check_static_addresses(&bridged, &source, &networks(&bridged, &source)).unwrap(),
            None,
            "a bridge keeps the address meaningful"
        );
        source.nics[0].ip_addresses[0].origin = "dhcp".into();
        assert_eq!(
            check_static_addresses(&warned, &source, &networks(&warned, &source)).unwrap(),
            None
        );
    }

    #[test]
    fn a_vtpm_is_a_warning_that_names_bitlocker_for_windows() {
        let mut source = source();
        assert_eq!(vtpm_not_carried(&source), None);
        source.vtpm = true;
        let linux = vtpm_not_carried(&source).unwrap();
        assert!(linux.contains("new, empty persistent vTPM") && !linux.contains("BitLocker"));
        source.guest_os = Some("windows11_64Guest".into());
        let windows = vtpm_not_carried(&source).unwrap();
        assert!(
            windows.contains("BitLocker will ask for its recovery key")
                && windows.contains("Suspend-BitLocker"),
            "{windows}"
        );
    }

    #[test]
    fn plain_http_staging_is_named_and_https_is_not() {
        let with_staging = |staging: serde_json::Value| {
            VirtualMachineMigration::new(
                "m",
                serde_json::from_value(json!({
                    "source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}}, "staging": staging}))
                .unwrap(),
            )
        };
        let plain = with_staging(
            json!({"url": "s3://b/p", "endpoint": "http://minio:9000", "insecure": true}),
        );
        let said = plain_http_staging(&plain).unwrap();
        assert!(
            said.contains("staging http://minio:9000 is plain http"),
            "{said}"
        );
        let tls = with_staging(json!({"url": "s3://b/p", "endpoint": "https://minio:9000"}));
        assert_eq!(plain_http_staging(&tls), None);
        assert_eq!(
            plain_http_staging(&with_staging(json!({"url": "s3://b/p"}))),
            None
        );
    }
}
