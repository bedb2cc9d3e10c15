//! Multus networks, as the stand-in attaches them. KubeVirt v1.9.0 no longer reads NetworkAttachmentDefinitions
//! itself (its `ExternalNetResourceInjection` gate is Beta, on by default): it asks Multus for the pod's link of each
//! Multus network, and when nothing attached one (the NAD is missing) virt-launcher fails its network setup and
//! tries again, the VMI Scheduled with `Synchronized` False, as the lab's real node recorded
//! (`kubevirt_conformance`). The lab has no CNI plugin for them: a NAD that names its segment with the lab's
//! annotations becomes a bridge on which the guest's gateway answers (QEMU's user network on that subnet, no route
//! out), as a bridge NAD on a VLAN with a router would; any other NAD is a segment of its own.

use std::net::Ipv4Addr;

use ferry_api::foreign::{nad_namespaced_name, nad_resource};
use kube::api::DynamicObject;
use kube::{Api, Client, ResourceExt};
use sha2::{Digest, Sha256};

use super::domain::{Bridge, Domain, Network};

/// The IPv4 subnet (`192.168.50.0/24`) of the segment a NAD attaches to, for the lab.
pub const SUBNET_ANNOTATION: &str = "lab.ferry.dev/subnet";
/// The router on that segment (`192.168.50.1`): it answers ARP and ping, nothing is routed beyond it.
pub const GATEWAY_ANNOTATION: &str = "lab.ferry.dev/gateway";

/// What the VMI's NICs attach to: each Multus network's NAD, read now. `Err` is virt-launcher's failure to find
/// the pod link of a NIC whose NAD is missing, in its words.
pub async fn attach(
    domain: &mut Domain,
    namespace: &str,
    client: &Client,
) -> Result<Result<(), String>, kube::Error> {
    for nic in &mut domain.nics {
        let Network::Multus {
            network_name,
            bridge,
        } = &mut nic.network
        else {
            continue;
        };
        let (ns, name) = nad_namespaced_name(namespace, network_name);
        let nads = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &nad_resource());
        let Some(nad) = nads.get_opt(&name).await? else {
            return Ok(Err(format!(
                "failed to configure vmi network: setup failed, err: pod link ({}) is missing",
                pod_link(&nic.name)
            )));
        };
        *bridge = match lab_segment(&nad) {
            Ok(segment) => segment,
            // A NAD the lab cannot read as a segment is still a network: its NIC just has no gateway.
            Err(why) => {
                tracing::warn!(
                    "NetworkAttachmentDefinition {ns}/{name}: {why}; its NICs sit alone"
                );
                None
            }
        };
    }
    Ok(Ok(()))
}

/// The launcher pod's link of a VMI network: KubeVirt's hashed name, `pod` and 11 hex digits of the name's sha256.
fn pod_link(network: &str) -> String {
    let digest = Sha256::digest(network.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("pod{}", &hex[..11])
}

/// The lab segment a NAD's annotations give, if any.
pub fn lab_segment(nad: &DynamicObject) -> Result<Option<Bridge>, String> {
    let annotations = nad.annotations();
    let (Some(subnet), Some(gateway)) = (
        annotations.get(SUBNET_ANNOTATION),
        annotations.get(GATEWAY_ANNOTATION),
    ) else {
        return Ok(None);
    };
    let (network, prefix) = subnet
        .split_once('/')
        .and_then(|(a, p)| Some((a.parse::<Ipv4Addr>().ok()?, p.parse::<u32>().ok()?)))
        .filter(|(_, p)| (8..=30).contains(p))
        .ok_or_else(|| {
            format!("{SUBNET_ANNOTATION} {subnet:?} is not an IPv4 subnet a.b.c.d/8..30")
        })?;
    let gateway: Ipv4Addr = gateway
        .parse()
        .map_err(|_| format!("{GATEWAY_ANNOTATION} {gateway:?} is not an IPv4 address"))?;
    let mask = u32::MAX << (32 - prefix);
    if u32::from(network) & mask != u32::from(gateway) & mask {
        return Err(format!("gateway {gateway} is not in {subnet}"));
    }
    Ok(Some(Bridge {
        cidr: format!("{}/{prefix}", Ipv4Addr::from(u32::from(network) & mask)),
        gateway: gateway.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nad(annotations: &[(&str, &str)]) -> DynamicObject {
        let mut nad = DynamicObject::new("lan", &nad_resource());
        nad.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        nad
    }

    #[test]
    fn a_pod_link_is_named_as_kubevirt_hashes_it() {
        // As real KubeVirt v1.9.0 named the link of the network `nic-0` (kubevirt_conformance).
        assert_eq!(pod_link("nic-0"), "pod0e6b58809dd");
    }

    #[test]
    fn a_nad_names_its_lab_segment_by_subnet_and_gateway() {
        let bridge = lab_segment(&nad(&[
            (SUBNET_ANNOTATION, "192.168.50.7/24"),
            (GATEWAY_ANNOTATION, "192.168.50.1"),
        ]));
        assert_eq!(
            bridge,
            Ok(Some(Bridge {
                cidr: "192.168.50.0/24".into(),
                gateway: "192.168.50.1".into()
            }))
        );
        assert_eq!(lab_segment(&nad(&[])), Ok(None));
        let outside = lab_segment(&nad(&[
            (SUBNET_ANNOTATION, "192.168.50.0/24"),
            (GATEWAY_ANNOTATION, "192.168.60.1"),
        ]));
        assert!(outside.unwrap_err().contains("not in 192.168.50.0/24"));
        for subnet in ["192.168.50.0", "fd00::/64", "10.0.0.0/31"] {
            let refused = lab_segment(&nad(&[
                (SUBNET_ANNOTATION, subnet),
                (GATEWAY_ANNOTATION, "10.0.0.1"),
            ]));
            assert!(refused.is_err(), "{subnet}");
        }
    }
}
