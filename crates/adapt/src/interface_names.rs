//! Which name each NIC must keep inside a Linux guest, and the systemd `.link` files that keep it.
//!
//! A VMware Linux guest names its NIC after VMware's PCI slot (`ens192`), and its own network configuration
//! names that interface. On KubeVirt the NIC sits elsewhere and would come up as `enp1s0`, so a static address
//! configured for `ens192` no longer applies. The MAC is kept, so a `.link` file that matches the MAC and names
//! the interface keeps the old name (systemd-udev on Debian and RHEL; see `docs/research/linux-interface-names.md`).
//!
//! The names come from the guest's configuration ([`configured_interfaces`]: ifupdown, NetworkManager keyfiles,
//! ifcfg, systemd-networkd, netplan); each is tied to a NIC ([`pins`]) by the MAC the configuration names, else by an address VMware Tools
//! reported on that NIC, else, when the VM has one NIC and the guest configures one, by being the only one. A NIC
//! claimed by two names, or a name by two NICs, is left alone and reported. Pure.

use serde::{Deserialize, Serialize};

mod configured;

pub use configured::configured_interfaces;

/// Where a guest keeps the configuration this module reads, as shell globs from its root.
pub const CONFIG_FILES: &[&str] = &[
    "/etc/network/interfaces",
    "/etc/network/interfaces.d/*",
    "/etc/NetworkManager/system-connections/*",
    "/etc/sysconfig/network-scripts/ifcfg-*",
    "/etc/systemd/network/*.network",
    "/etc/netplan/*.yaml",
];

/// A NIC as vSphere describes it: its MAC, and the addresses VMware Tools reported on it (without prefix).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceNic {
    pub mac: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

/// An interface the guest's configuration names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfiguredInterface {
    pub name: String,
    /// The MAC the configuration ties it to, if it names one (NetworkManager's `mac-address`, ifcfg's `HWADDR`).
    pub mac: Option<String>,
    /// Its static addresses, without prefix.
    pub addresses: Vec<String>,
    /// The file that names it.
    pub file: String,
}

/// The name a NIC keeps, and why Ferry tied the two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamePin {
    pub mac: String,
    pub name: String,
    pub evidence: String,
}

/// What the guest's configuration says about the VM's NICs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamePlan {
    pub pins: Vec<NamePin>,
    /// Names found and not kept, each with the reason.
    pub left_alone: Vec<String>,
}

/// Ties each configured name to a NIC of `nics`: by the MAC the configuration names, else by an address VMware
/// Tools reported on the NIC, else as the only name on the only NIC. Kernel names (`eth0`) are kept only on a VM
/// with one NIC: with several, the kernel may hand the same names out first.
pub fn pins(nics: &[SourceNic], configured: &[ConfiguredInterface]) -> NamePlan {
    let mut plan = NamePlan::default();
    let mut candidates: Vec<NamePin> = Vec::new();
    for interface in configured {
        let by_mac = interface.mac.as_ref().and_then(|mac| {
            nics.iter()
                .find(|n| n.mac.eq_ignore_ascii_case(mac))
                .map(|n| (n, format!("{} names its MAC", interface.file)))
        });
        let by_address = || {
            nics.iter().find_map(|n| {
                let address = interface
                    .addresses
                    .iter()
                    .find(|a| n.addresses.contains(a))?;
                Some((
                    n,
                    format!(
                        "{} gives it {address}, which VMware Tools reported on this NIC",
                        interface.file
                    ),
                ))
            })
        };
        let only_one = || {
            (nics.len() == 1 && configured.len() == 1).then(|| {
                (
                    &nics[0],
                    format!(
                        "{} configures the only interface of the VM's only NIC",
                        interface.file
                    ),
                )
            })
        };
        match by_mac.or_else(by_address).or_else(only_one) {
            Some((nic, evidence)) => candidates.push(NamePin {
                mac: nic.mac.to_ascii_lowercase(),
                name: interface.name.clone(),
                evidence,
            }),
            None => plan.left_alone.push(format!(
                "{} ({}): no NIC of the VM has its MAC or its addresses",
                interface.name, interface.file
            )),
        }
    }
    for pin in &candidates {
        let names = candidates.iter().filter(|p| p.mac == pin.mac).count();
        let nics_named = candidates.iter().filter(|p| p.name == pin.name).count();
        if names > 1 {
            plan.left_alone.push(format!(
                "{}: the NIC {} is also given another name",
                pin.name, pin.mac
            ));
        } else if nics_named > 1 {
            plan.left_alone.push(format!(
                "{}: more than one NIC is given this name",
                pin.name
            ));
        } else if is_kernel_name(&pin.name) && nics.len() > 1 {
            plan.left_alone.push(format!(
                "{}: a kernel name, which the kernel may give another of the VM's {} NICs first",
                pin.name,
                nics.len()
            ));
        } else {
            plan.pins.push(pin.clone());
        }
    }
    plan
}

fn is_kernel_name(name: &str) -> bool {
    name.strip_prefix("eth")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What keeping the names came to, as the worker reports it: the names kept with their NIC, the names found and
/// left alone with the reason, or why the guest's configuration could not be read (then nothing was written).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamesOutcome {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<KeptName>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_alone: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptName {
    pub name: String,
    pub mac: String,
}

/// The most bytes of reasons an outcome carries (it travels in a termination message with every disk's hash).
const MAX_REASON_BYTES: usize = 200;

impl NamesOutcome {
    /// The outcome of `plan` once its files were written; reasons past [`MAX_REASON_BYTES`] are counted, not kept.
    pub fn written(plan: &NamePlan) -> Self {
        let mut left_alone = Vec::new();
        let mut bytes = 0;
        for (i, reason) in plan.left_alone.iter().enumerate() {
            if bytes + reason.len() > MAX_REASON_BYTES {
                left_alone.push(format!("and {} more", plan.left_alone.len() - i));
                break;
            }
            bytes += reason.len();
            left_alone.push(reason.clone());
        }
        Self {
            kept: plan
                .pins
                .iter()
                .map(|p| KeptName {
                    name: p.name.clone(),
                    mac: p.mac.clone(),
                })
                .collect(),
            left_alone,
            error: String::new(),
        }
    }

    /// Nothing written, because `error`.
    pub fn failed(error: &str) -> Self {
        let mut error = error.trim().to_string();
        if error.len() > MAX_REASON_BYTES {
            let mut end = MAX_REASON_BYTES;
            while !error.is_char_boundary(end) {
                end -= 1;
            }
            error.truncate(end);
            error.push('…');
        }
        Self {
            error,
            ..Self::default()
        }
    }

    /// One line for people: `ens192 kept on 00:50:56:aa:bb:cc; left alone: …`.
    pub fn describe(&self) -> String {
        if !self.error.is_empty() {
            return format!("interface names not kept: {}", self.error);
        }
        let mut parts = Vec::new();
        if self.kept.is_empty() {
            parts.push("no interface name to keep in the guest's configuration".to_string());
        } else {
            let kept: Vec<String> = self
                .kept
                .iter()
                .map(|k| format!("{} on {}", k.name, k.mac))
                .collect();
            parts.push(format!("interface names kept: {}", kept.join(", ")));
        }
        if !self.left_alone.is_empty() {
            parts.push(format!("left alone: {}", self.left_alone.join("; ")));
        }
        parts.join("; ")
    }
}

/// The `.link` file that keeps `pin`'s name, and where it goes. It sorts before systemd's `99-default.link`;
/// `Path=pci-*` keeps it off virtual interfaces that share the MAC (a VLAN on the NIC).
pub fn link_file(pin: &NamePin) -> (String, String) {
    (
        format!("/etc/systemd/network/10-ferry-{}.link", pin.name),
        format!(
            "# Written by Ferry when it moved this VM from VMware: the NIC keeps the name its configuration\n\
             # uses ({}).\n\
             [Match]\n\
             MACAddress={}\n\
             Path=pci-*\n\
             \n\
             [Link]\n\
             Name={}\n",
            pin.evidence, pin.mac, pin.name
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> (String, String) {
        (path.into(), text.into())
    }

    fn nic(mac: &str, addresses: &[&str]) -> SourceNic {
        SourceNic {
            mac: mac.into(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn ifupdown_static_on_ens192_is_tied_by_the_address_vmware_tools_reported() {
        let files = [
            file(
                "/etc/network/interfaces",
                "source /etc/network/interfaces.d/*\nauto lo\niface lo inet loopback\n",
            ),
            file(
                "/etc/network/interfaces.d/ens192",
                "allow-hotplug ens192\niface ens192 inet static\n  address 192.0.2.10/24\n  gateway 192.0.2.1\n\
                 iface ens192:1 inet static\n  address 192.0.2.11/24 # an alias\n",
            ),
        ];
        let configured = configured_interfaces(&files);
        assert_eq!(
            configured,
            [ConfiguredInterface {
                name: "ens192".into(),
                mac: None,
                addresses: vec!["192.0.2.10".into(), "192.0.2.11".into()],
                file: "/etc/network/interfaces.d/ens192".into(),
            }]
        );
        let plan = pins(
            &[
                nic("00:50:56:AA:00:01", &["192.0.2.10", "fe80::1"]),
                nic("00:50:56:aa:00:02", &[]),
            ],
            &configured,
        );
        assert_eq!(plan.pins.len(), 1, "{plan:?}");
        assert_eq!(
            (plan.pins[0].mac.as_str(), plan.pins[0].name.as_str()),
            ("00:50:56:aa:00:01", "ens192")
        );
        assert!(plan.pins[0].evidence.contains("192.0.2.10"));
        let (path, text) = link_file(&plan.pins[0]);
        assert_eq!(path, "/etc/systemd/network/10-ferry-ens192.link");
        assert!(
            text.contains(
                "[Match]\nMACAddress=00:50:56:aa:00:01\nPath=pci-*\n\n[Link]\nName=ens192\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn networkmanager_keyfiles_give_names_by_mac_or_address_and_skip_virtual_profiles() {
        let files = [
            file(
                "/etc/NetworkManager/system-connections/ens192.nmconnection",
                "[connection]\nid=ens192\ntype=ethernet\ninterface-name=ens192\n\n[ipv4]\nmethod=manual\n\
                 address1=192.0.2.20/24,192.0.2.1\n",
            ),
            file(
                "/etc/NetworkManager/system-connections/backup.nmconnection",
                "[connection]\nid=backup\ntype=ethernet\ninterface-name=ens224\n\n[ethernet]\n\
                 mac-address=00:50:56:AA:00:12\n\n[ipv4]\nmethod=auto\n",
            ),
            file(
                "/etc/NetworkManager/system-connections/vlan.nmconnection",
                "[connection]\ntype=vlan\ninterface-name=ens192.100\n",
            ),
            file(
                "/etc/NetworkManager/system-connections/bond.nmconnection",
                "[connection]\ntype=bond\ninterface-name=bond0\n",
            ),
        ];
        let configured = configured_interfaces(&files);
        assert_eq!(
            configured
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["ens192", "ens224"]
        );
        let plan = pins(
            &[
                nic("00:50:56:aa:00:11", &["192.0.2.20"]),
                nic("00:50:56:aa:00:12", &["10.0.0.7"]),
            ],
            &configured,
        );
        let kept: Vec<_> = plan
            .pins
            .iter()
            .map(|p| (p.name.as_str(), p.mac.as_str()))
            .collect();
        assert_eq!(
            kept,
            [
                ("ens192", "00:50:56:aa:00:11"),
                ("ens224", "00:50:56:aa:00:12")
            ]
        );
        assert!(plan.pins[1].evidence.contains("names its MAC"));
        assert!(plan.left_alone.is_empty(), "{plan:?}");
    }

    #[test]
    fn the_only_name_on_the_only_nic_is_kept_and_anything_unsure_is_left_alone() {
        let dhcp = [file(
            "/etc/network/interfaces",
            "allow-hotplug ens192\niface ens192 inet dhcp\n",
        )];
        let only = pins(
            &[nic("00:50:56:aa:00:31", &[])],
            &configured_interfaces(&dhcp),
        );
        assert_eq!(only.pins[0].name, "ens192");
        assert!(only.pins[0].evidence.contains("only NIC"));

        // Two NICs and nothing that ties the name to either.
        let two = [nic("00:50:56:aa:00:31", &[]), nic("00:50:56:aa:00:32", &[])];
        let unsure = pins(&two, &configured_interfaces(&dhcp));
        assert!(unsure.pins.is_empty());
        assert!(
            unsure.left_alone[0].contains("no NIC of the VM"),
            "{unsure:?}"
        );

        // One NIC claimed by two names.
        let twice = [
            ConfiguredInterface {
                name: "ens192".into(),
                addresses: vec!["192.0.2.40".into()],
                ..Default::default()
            },
            ConfiguredInterface {
                name: "ens224".into(),
                mac: Some("00:50:56:aa:00:31".into()),
                ..Default::default()
            },
        ];
        let clash = pins(&[nic("00:50:56:aa:00:31", &["192.0.2.40"])], &twice);
        assert!(clash.pins.is_empty(), "{clash:?}");
        assert_eq!(clash.left_alone.len(), 2);

        // Kernel names on a VM with two NICs.
        let eth = [ConfiguredInterface {
            name: "eth0".into(),
            addresses: vec!["192.0.2.50".into()],
            ..Default::default()
        }];
        let racy = pins(
            &[
                nic("00:50:56:aa:00:41", &["192.0.2.50"]),
                nic("00:50:56:aa:00:42", &[]),
            ],
            &eth,
        );
        assert!(racy.pins.is_empty());
        assert!(racy.left_alone[0].contains("a kernel name"), "{racy:?}");
        assert_eq!(
            pins(&[nic("00:50:56:aa:00:41", &["192.0.2.50"])], &eth).pins[0].name,
            "eth0"
        );
    }
}
