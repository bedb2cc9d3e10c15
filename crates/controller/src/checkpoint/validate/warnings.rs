//! Preflight's warnings: what the migration will not carry or protect, said in a condition that stays True while
//! it holds (the reconcile publishes each as an Event when it turns True), or refused when the spec asks.

use ferry_api::{
    ConditionType, NetworkMapping, Reason, SourceVmStatus, StaticAddressPolicy,
    VirtualMachineMigration,
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
        .filter_map(|nic| {
            let addresses: Vec<String> = nic
                .ip_addresses
                .iter()
                .filter(|a| a.is_static())
                .map(|a| format!("{}/{}", a.address, a.prefix_length))
                .collect();
            (!addresses.is_empty()).then(|| {
                format!(
                    "NIC {} on {} ({})",
                    nic.mac,
                    nic.network,
                    addresses.join(", ")
                )
            })
        })
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
