//! What VMware Tools in a running guest reports of its network (`guest.net`, `guest.ipStack`): per NIC its MAC and
//! addresses, each with its prefix and origin (`manual` for an address configured by hand, `dhcp`, `linklayer`,
//! ...), and the guest's default gateways and DNS servers. vSphere reports nothing while the tools do not run.

use serde::Serialize;

use crate::xml::Element;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestNetwork {
    /// In `guest.net`'s order; a default gateway's `nic` indexes this.
    pub nics: Vec<GuestNic>,
    pub default_gateways: Vec<DefaultGateway>,
    pub dns_servers: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestNic {
    /// As vSphere writes it: `00:50:56:aa:bb:cc`.
    pub mac: String,
    /// The virtual NIC's device key (`deviceConfigId`); absent for a guest interface with no virtual NIC.
    pub device_key: Option<i32>,
    pub addresses: Vec<GuestAddress>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestAddress {
    pub address: String,
    pub prefix_length: u8,
    /// `NetIpConfigInfoIpAddressOrigin`: `manual`, `dhcp`, `linklayer`, `random` or `other`.
    pub origin: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DefaultGateway {
    pub address: String,
    /// The NIC it is reached through (an index into [`GuestNetwork::nics`]), when the tools say.
    pub nic: Option<usize>,
}

impl GuestNetwork {
    /// From the `guest.net` and `guest.ipStack` properties (each an array element), either absent.
    pub fn parse(net: Option<&Element>, ip_stack: Option<&Element>) -> Self {
        let nics = net
            .map(|net| net.children.iter().map(parse_nic).collect())
            .unwrap_or_default();
        let stacks: Vec<&Element> = ip_stack
            .map(|s| s.children.iter().collect())
            .unwrap_or_default();
        let mut default_gateways = Vec::new();
        let mut dns_servers: Vec<String> = Vec::new();
        for stack in stacks {
            let routes = stack
                .child("ipRouteConfig")
                .into_iter()
                .flat_map(|c| c.children_named("ipRoute"));
            for route in routes {
                let default = route.text_at(&["prefixLength"]).map(str::trim) == Some("0");
                let gateway = route
                    .text_at(&["gateway", "ipAddress"])
                    .map(str::trim)
                    .filter(|g| !g.is_empty());
                if let (true, Some(gateway)) = (default, gateway) {
                    default_gateways.push(DefaultGateway {
                        address: gateway.to_string(),
                        nic: route
                            .text_at(&["gateway", "device"])
                            .and_then(|d| d.trim().parse().ok()),
                    });
                }
            }
            let servers = stack
                .child("dnsConfig")
                .into_iter()
                .flat_map(|c| c.children_named("ipAddress"));
            for server in servers {
                let server = server.text.trim().to_string();
                if !server.is_empty() && !dns_servers.contains(&server) {
                    dns_servers.push(server);
                }
            }
        }
        GuestNetwork {
            nics,
            default_gateways,
            dns_servers,
        }
    }

    /// Whether the tools reported any address at all.
    pub fn reported(&self) -> bool {
        self.nics.iter().any(|n| !n.addresses.is_empty())
    }
}

fn parse_nic(nic: &Element) -> GuestNic {
    let addresses = nic
        .child("ipConfig")
        .into_iter()
        .flat_map(|c| c.children_named("ipAddress"))
        .filter_map(|a| {
            Some(GuestAddress {
                address: a.text_at(&["ipAddress"])?.trim().to_string(),
                prefix_length: a.text_at(&["prefixLength"])?.trim().parse().ok()?,
                origin: a
                    .text_at(&["origin"])
                    .map(str::trim)
                    .unwrap_or("other")
                    .to_string(),
            })
        })
        .collect();
    GuestNic {
        mac: nic
            .text_at(&["macAddress"])
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase(),
        device_key: nic
            .text_at(&["deviceConfigId"])
            .and_then(|k| k.trim().parse().ok())
            .filter(|k: &i32| *k >= 0),
        addresses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two NICs as ESXi reports a Windows guest's: a static IPv4 address with a link-local IPv6 one on the first, a
    /// DHCP address on the second; one default route through the first; two DNS servers.
    const NET: &str = r#"<val xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="ArrayOfGuestNicInfo">
      <GuestNicInfo><network>VM Network</network><ipAddress>192.168.122.50</ipAddress>
        <macAddress>00:50:56:AA:BB:CC</macAddress><connected>true</connected><deviceConfigId>4000</deviceConfigId>
        <ipConfig>
          <ipAddress><ipAddress>192.168.122.50</ipAddress><prefixLength>24</prefixLength><origin>manual</origin><state>preferred</state></ipAddress>
          <ipAddress><ipAddress>fe80::250:56ff:feaa:bbcc</ipAddress><prefixLength>64</prefixLength><origin>linklayer</origin><state>unknown</state></ipAddress>
        </ipConfig></GuestNicInfo>
      <GuestNicInfo><macAddress>00:50:56:aa:bb:cd</macAddress><connected>true</connected><deviceConfigId>4001</deviceConfigId>
        <ipConfig><ipAddress><ipAddress>10.0.0.7</ipAddress><prefixLength>16</prefixLength><origin>dhcp</origin></ipAddress></ipConfig></GuestNicInfo>
    </val>"#;
    const STACK: &str = r#"<val xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="ArrayOfGuestStackInfo">
      <GuestStackInfo>
        <dnsConfig><dhcp>false</dhcp><hostName>w</hostName><domainName>lab</domainName><ipAddress>192.168.122.2</ipAddress><ipAddress>192.168.122.3</ipAddress></dnsConfig>
        <ipRouteConfig>
          <ipRoute><network>0.0.0.0</network><prefixLength>0</prefixLength><gateway><ipAddress>192.168.122.1</ipAddress><device>0</device></gateway></ipRoute>
          <ipRoute><network>192.168.122.0</network><prefixLength>24</prefixLength><gateway><device>0</device></gateway></ipRoute>
        </ipRouteConfig>
      </GuestStackInfo>
    </val>"#;

    #[test]
    fn addresses_origins_gateways_and_dns_are_read_as_the_tools_report_them() {
        let net = crate::xml::parse(NET).unwrap();
        let stack = crate::xml::parse(STACK).unwrap();
        let found = GuestNetwork::parse(Some(&net), Some(&stack));
        assert_eq!(found.nics.len(), 2);
        let first = &found.nics[0];
        assert_eq!(
            (first.mac.as_str(), first.device_key),
            ("00:50:56:aa:bb:cc", Some(4000))
        );
        assert_eq!(
            (
                first.addresses[0].origin.as_str(),
                first.addresses[1].origin.as_str()
            ),
            ("manual", "linklayer")
        );
        assert_eq!(first.addresses[0].prefix_length, 24);
        assert_eq!(found.nics[1].addresses[0].origin, "dhcp");
        assert_eq!(found.dns_servers, ["192.168.122.2", "192.168.122.3"]);
        assert_eq!(
            found.default_gateways,
            [DefaultGateway {
                address: "192.168.122.1".into(),
                nic: Some(0)
            }],
            "only the default route"
        );
        assert!(found.reported());
    }

    #[test]
    fn a_guest_whose_tools_do_not_run_reports_nothing() {
        let found = GuestNetwork::parse(None, None);
        assert!(!found.reported());
        let bare = crate::xml::parse(
            r#"<val><GuestNicInfo><macAddress>00:50:56:aa:bb:cc</macAddress><deviceConfigId>4000</deviceConfigId></GuestNicInfo></val>"#,
        )
        .unwrap();
        let found = GuestNetwork::parse(Some(&bare), None);
        assert_eq!(found.nics.len(), 1, "vcsim lists the NICs");
        assert!(!found.reported());
    }
}
