//! Whether the guest's network came up as it was on VMware: each NIC whose address VMware Tools reported as
//! configured by hand must carry that address again, on the NIC with the same MAC, under the name the adaptation
//! kept. Compared from the guest agent's report (the VMI's interfaces) with what discovery recorded. Pure.

use ferry_api::foreign::VmiInterface;
use ferry_api::{InterfaceNamesStatus, SourceVmStatus};

/// A NIC whose identity is checked: its MAC, its addresses configured by hand (`address/prefix`), and the name
/// the adaptation kept for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedNic {
    pub mac: String,
    pub addresses: Vec<String>,
    pub name: Option<String>,
}

/// A NIC of the running VM, as the VMI shows it: its name and addresses come from the guest agent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeenInterface {
    pub mac: String,
    /// The guest's name for it; `None` until the agent reported it.
    pub name: Option<String>,
    pub addresses: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// No NIC had an address configured by hand: nothing to compare.
    NotAsked,
    /// Every address is back; `changed` names the NICs whose name changed all the same.
    Kept { said: String, changed: bool },
    /// An address configured by hand is not on its NIC.
    Lost(String),
    /// The agent has not reported the NIC yet.
    Unknown(String),
}

/// The NICs to check: those with an address VMware Tools reported as configured by hand, with the name kept;
/// not those on the pod network (`on_pod_network`, by MAC), where masquerade gives the guest the pod's address
/// and preflight already said so (`StaticAddressOnPodNetwork`).
pub fn expected(
    source: &SourceVmStatus,
    names: Option<&InterfaceNamesStatus>,
    on_pod_network: &[String],
) -> Vec<ExpectedNic> {
    source
        .nics
        .iter()
        .filter(|nic| {
            !on_pod_network
                .iter()
                .any(|m| m.eq_ignore_ascii_case(&nic.mac))
        })
        .filter_map(|nic| {
            let addresses = nic.static_addresses();
            let mac = nic.mac.to_ascii_lowercase();
            let name = names
                .and_then(|n| n.kept.iter().find(|k| k.mac.eq_ignore_ascii_case(&mac)))
                .map(|k| k.name.clone());
            (!addresses.is_empty()).then_some(ExpectedNic {
                mac,
                addresses,
                name,
            })
        })
        .collect()
}

/// The MACs of the VM's NICs on the pod network, from its template (`interfaces[].macAddress` whose network is
/// `pod`).
pub fn pod_network_macs(vm: &serde_json::Value) -> Vec<String> {
    let spec = &vm["spec"]["template"]["spec"];
    let on_pod = |name: &serde_json::Value| {
        spec["networks"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| &n["name"] == name && n["pod"].is_object()))
    };
    spec["domain"]["devices"]["interfaces"]
        .as_array()
        .map(|interfaces| {
            interfaces
                .iter()
                .filter(|i| on_pod(&i["name"]))
                .filter_map(|i| i["macAddress"].as_str())
                .map(str::to_ascii_lowercase)
                .collect()
        })
        .unwrap_or_default()
}

/// The VMI's interfaces, each with what the agent said of it (KubeVirt marks those with `guest-agent`).
pub fn seen(interfaces: &[VmiInterface]) -> Vec<SeenInterface> {
    interfaces
        .iter()
        .filter_map(|i| {
            let mac = i.mac.as_ref()?.to_ascii_lowercase();
            let from_agent = i
                .info_source
                .as_deref()
                .is_some_and(|s| s.contains("guest-agent"));
            let mut addresses = i.ip_addresses.clone();
            if addresses.is_empty() {
                addresses.extend(i.ip_address.clone());
            }
            Some(SeenInterface {
                mac,
                name: i.interface_name.clone().filter(|_| from_agent),
                addresses: if from_agent { addresses } else { vec![] },
            })
        })
        .collect()
}

pub fn compare(expected: &[ExpectedNic], seen: &[SeenInterface]) -> Identity {
    let mut kept = Vec::new();
    let mut renamed = false;
    let mut lost = Vec::new();
    let mut unknown = Vec::new();
    for nic in expected {
        // A NIC the VM does not have (its network ignored) has nothing to carry.
        let Some(found) = seen.iter().find(|s| s.mac == nic.mac) else {
            continue;
        };
        let Some(name) = &found.name else {
            unknown.push(format!("NIC {}", nic.mac));
            continue;
        };
        let missing: Vec<&str> = nic
            .addresses
            .iter()
            .filter(|a| {
                let address = a.split('/').next().unwrap_or(a);
                !found.addresses.iter().any(|s| s == address)
            })
            .map(String::as_str)
            .collect();
        let renamed_from = nic.name.as_ref().filter(|old| *old != name);
        renamed |= renamed_from.is_some();
        let called = match renamed_from {
            Some(old) => format!("NIC {} is {name} in the guest where it was {old}", nic.mac),
            None => format!("NIC {} is {name} in the guest", nic.mac),
        };
        if missing.is_empty() {
            kept.push(format!("{called}, with {}", nic.addresses.join(", ")));
        } else {
            let has = if found.addresses.is_empty() {
                "no address".to_string()
            } else {
                found.addresses.join(", ")
            };
            lost.push(format!(
                "{called} and lacks {}, which VMware Tools reported as configured by hand (it has {has})",
                missing.join(", ")
            ));
        }
    }
    if !lost.is_empty() {
        return Identity::Lost(lost.join("; "));
    }
    if !unknown.is_empty() {
        return Identity::Unknown(format!(
            "{} not reported by the guest agent yet",
            unknown.join(", ")
        ));
    }
    if kept.is_empty() {
        return Identity::NotAsked;
    }
    let said = if renamed {
        format!("addresses kept, a name changed: {}", kept.join("; "))
    } else {
        format!("network identity kept: {}", kept.join("; "))
    };
    Identity::Kept {
        said,
        changed: renamed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect(mac: &str, address: &str, name: Option<&str>) -> ExpectedNic {
        ExpectedNic {
            mac: mac.into(),
            addresses: vec![address.into()],
            name: name.map(String::from),
        }
    }

    fn seen_as(mac: &str, name: Option<&str>, addresses: &[&str]) -> SeenInterface {
        SeenInterface {
            mac: mac.into(),
            name: name.map(String::from),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn the_agents_report_is_compared_with_what_vmware_tools_reported() {
        let nic = [expect(
            "00:50:56:aa:bb:cc",
            "192.168.50.10/24",
            Some("ens192"),
        )];
        let kept = compare(
            &nic,
            &[seen_as(
                "00:50:56:aa:bb:cc",
                Some("ens192"),
                &["192.168.50.10", "fe80::1"],
            )],
        );
        assert_eq!(
            kept,
            Identity::Kept {
                said: "network identity kept: NIC 00:50:56:aa:bb:cc is ens192 in the guest, with \
                       192.168.50.10/24"
                    .into(),
                changed: false
            }
        );
        let Identity::Lost(lost) = compare(
            &[expect("00:50:56:aa:bb:cc", "192.168.50.10/24", None)],
            &[seen_as("00:50:56:aa:bb:cc", Some("enp1s0"), &["fe80::2"])],
        ) else {
            panic!("an address not back is lost");
        };
        assert_eq!(
            lost,
            "NIC 00:50:56:aa:bb:cc is enp1s0 in the guest and lacks 192.168.50.10/24, which VMware Tools \
             reported as configured by hand (it has fe80::2)"
        );
        let Identity::Kept { said, changed } = compare(
            &nic,
            &[seen_as(
                "00:50:56:aa:bb:cc",
                Some("enp1s0"),
                &["192.168.50.10"],
            )],
        ) else {
            panic!("the address is back under another name");
        };
        assert!(
            changed && said.contains("is enp1s0 in the guest where it was ens192"),
            "{said}"
        );
    }

    #[test]
    fn nothing_to_compare_or_nothing_reported_yet_is_said_so() {
        assert_eq!(compare(&[], &[]), Identity::NotAsked);
        let nic = [expect("00:50:56:aa:bb:cc", "10.1.2.3/16", None)];
        assert_eq!(
            compare(&nic, &[]),
            Identity::NotAsked,
            "its network ignored"
        );
        assert_eq!(
            compare(&nic, &[seen_as("00:50:56:aa:bb:cc", None, &[])]),
            Identity::Unknown("NIC 00:50:56:aa:bb:cc not reported by the guest agent yet".into())
        );
    }

    #[test]
    fn only_the_agents_word_counts_and_only_addresses_set_by_hand_are_expected() {
        let interfaces: Vec<VmiInterface> = serde_json::from_value(serde_json::json!([
            {"name": "default", "mac": "00:50:56:AA:BB:CC", "ipAddress": "10.88.0.7", "infoSource": "domain"},
            {"name": "lan", "mac": "00:50:56:aa:bb:cd", "interfaceName": "ens224", "ipAddress": "192.168.50.11",
             "ipAddresses": ["192.168.50.11", "fe80::3"], "infoSource": "domain, guest-agent"},
        ]))
        .unwrap();
        assert_eq!(
            seen(&interfaces),
            [
                seen_as("00:50:56:aa:bb:cc", None, &[]),
                seen_as(
                    "00:50:56:aa:bb:cd",
                    Some("ens224"),
                    &["192.168.50.11", "fe80::3"]
                ),
            ]
        );
        let nic = |mac: &str, address: &str, origin: &str| ferry_api::SourceNic {
            mac: mac.into(),
            network: "VM Network".into(),
            ip_addresses: vec![ferry_api::GuestIpAddress {
                address: address.into(),
                prefix_length: 24,
                origin: origin.into(),
            }],
            ..Default::default()
        };
        let source = SourceVmStatus {
            nics: vec![
                nic("00:50:56:AA:BB:CC", "10.0.0.5", "dhcp"),
                nic("00:50:56:aa:bb:cd", "192.168.50.11", "manual"),
            ],
            ..Default::default()
        };
        let names = InterfaceNamesStatus {
            kept: vec![ferry_api::KeptInterfaceName {
                name: "ens224".into(),
                mac: "00:50:56:aa:bb:cd".into(),
            }],
            ..Default::default()
        };
        assert_eq!(
            expected(&source, Some(&names), &[]),
            [expect(
                "00:50:56:aa:bb:cd",
                "192.168.50.11/24",
                Some("ens224")
            )]
        );
        let vm = serde_json::json!({"spec": {"template": {"spec": {
            "domain": {"devices": {"interfaces": [
                {"name": "default", "masquerade": {}, "macAddress": "00:50:56:AA:BB:CC"},
                {"name": "lan", "bridge": {}, "macAddress": "00:50:56:aa:bb:cd"}]}},
            "networks": [{"name": "default", "pod": {}}, {"name": "lan", "multus": {"networkName": "lan"}}],
        }}}});
        assert_eq!(pod_network_macs(&vm), ["00:50:56:aa:bb:cc"]);
        assert_eq!(
            expected(&source, Some(&names), &["00:50:56:aa:bb:cd".into()]),
            [],
            "masquerade gives the guest the pod's address: preflight warned"
        );
    }
}
