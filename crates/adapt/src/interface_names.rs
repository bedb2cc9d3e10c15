//! Which name each NIC must keep inside a Linux guest, and the systemd `.link` files that keep it.
//!
//! A VMware Linux guest names its NIC after VMware's PCI slot (`ens192`), and its own network configuration
//! names that interface. On KubeVirt the NIC sits elsewhere and would come up as `enp1s0`, so a static address
//! configured for `ens192` no longer applies. The MAC is kept, so a `.link` file that matches the MAC and names
//! the interface keeps the old name (systemd-udev on Debian and RHEL; see `docs/research/linux-interface-names.md`).
//!
//! The names come from the guest's configuration ([`configured_interfaces`]: ifupdown, NetworkManager keyfiles,
//! ifcfg); each is tied to a NIC ([`pins`]) by the MAC the configuration names, else by an address VMware Tools
//! reported on that NIC, else, when the VM has one NIC and the guest configures one, by being the only one. A NIC
//! claimed by two names, or a name by two NICs, is left alone and reported. Pure.

use std::collections::BTreeMap;

/// Where a guest keeps the configuration this module reads, as shell globs from its root.
pub const CONFIG_FILES: &[&str] = &[
    "/etc/network/interfaces",
    "/etc/network/interfaces.d/*",
    "/etc/NetworkManager/system-connections/*",
    "/etc/sysconfig/network-scripts/ifcfg-*",
];

/// The longest interface name Linux takes (`IFNAMSIZ` less the terminating zero).
const MAX_NAME: usize = 15;

/// A NIC as vSphere describes it: its MAC, and the addresses VMware Tools reported on it (without prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceNic {
    pub mac: String,
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

/// The physical interfaces `files` (path, text) configure, in file order; virtual ones (bonds, bridges, VLANs,
/// aliases' parents aside) and the loopback are left out.
pub fn configured_interfaces(files: &[(String, String)]) -> Vec<ConfiguredInterface> {
    let mut found: Vec<ConfiguredInterface> = Vec::new();
    for (path, text) in files {
        let file_name = path.rsplit('/').next().unwrap_or(path);
        let parsed = if path.starts_with("/etc/network/interfaces") {
            ifupdown(path, text)
        } else if path.starts_with("/etc/NetworkManager/system-connections/") {
            keyfile(path, text).into_iter().collect()
        } else if file_name.starts_with("ifcfg-") {
            ifcfg(path, text).into_iter().collect()
        } else {
            vec![]
        };
        for interface in parsed {
            merge(&mut found, interface);
        }
    }
    found
}

/// One entry per name: a name configured in two files keeps every address and the first MAC named.
fn merge(found: &mut Vec<ConfiguredInterface>, interface: ConfiguredInterface) {
    match found.iter_mut().find(|f| f.name == interface.name) {
        Some(existing) => {
            existing.mac = existing.mac.take().or(interface.mac);
            for address in interface.addresses {
                if !existing.addresses.contains(&address) {
                    existing.addresses.push(address);
                }
            }
        }
        None => found.push(interface),
    }
}

/// ifupdown's `iface NAME inet|inet6 static` stanzas with their `address` lines (an alias `NAME:1` counts for
/// `NAME`); interfaces with bond, bridge or VLAN options are virtual.
fn ifupdown(path: &str, text: &str) -> Vec<ConfiguredInterface> {
    let mut found = Vec::new();
    let mut current: Option<(ConfiguredInterface, bool)> = None;
    let mut finish = |current: &mut Option<(ConfiguredInterface, bool)>| {
        if let Some((interface, virtual_)) = current.take()
            && !virtual_
        {
            found.push(interface);
        }
    };
    for line in text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
    {
        let mut words = line.split_whitespace();
        let Some(keyword) = words.next() else {
            continue;
        };
        match keyword {
            "iface" => {
                finish(&mut current);
                let name = words.next().unwrap_or_default();
                let base = name.split(':').next().unwrap_or_default();
                if is_physical_name(base) {
                    current = Some((
                        ConfiguredInterface {
                            name: base.into(),
                            file: path.into(),
                            ..Default::default()
                        },
                        false,
                    ));
                }
            }
            "auto" | "allow-hotplug" | "allow-auto" | "mapping" | "source" | "source-directory" => {
                finish(&mut current)
            }
            "address" => {
                if let (Some((interface, _)), Some(address)) = (current.as_mut(), words.next()) {
                    interface.addresses.push(without_prefix(address));
                }
            }
            "hwaddress" => {
                let mac = words.find(|w| w.contains(':'));
                if let (Some((interface, _)), Some(mac)) = (current.as_mut(), mac) {
                    interface.mac = Some(mac.to_ascii_lowercase());
                }
            }
            option
                if ["bond-", "bond_", "bridge-", "bridge_", "vlan-", "vlan_"]
                    .iter()
                    .any(|p| option.starts_with(p)) =>
            {
                if let Some((_, virtual_)) = current.as_mut() {
                    *virtual_ = true;
                }
            }
            _ => {}
        }
    }
    finish(&mut current);
    found
}

/// A NetworkManager keyfile of an Ethernet connection: `interface-name`, `[ethernet] mac-address`, and the
/// `addressN` (or older `addressesN`) of `[ipv4]` and `[ipv6]`. A profile bound to a MAC and no name needs no
/// name kept: NetworkManager finds its NIC by the MAC.
fn keyfile(path: &str, text: &str) -> Option<ConfiguredInterface> {
    let sections = ini(text);
    let value = |section: &str, key: &str| {
        sections
            .get(section)
            .and_then(|s| s.get(key))
            .map(String::as_str)
    };
    let kind = value("connection", "type").unwrap_or("ethernet");
    if !matches!(kind, "ethernet" | "802-3-ethernet") {
        return None;
    }
    let name = value("connection", "interface-name").filter(|n| is_physical_name(n))?;
    let mac = value("ethernet", "mac-address")
        .or(value("802-3-ethernet", "mac-address"))
        .filter(|m| m.contains(':'))
        .map(str::to_ascii_lowercase);
    let mut addresses = Vec::new();
    for family in ["ipv4", "ipv6"] {
        let Some(section) = sections.get(family) else {
            continue;
        };
        for (key, value) in section {
            if key.starts_with("address") {
                // `192.0.2.10/24,192.0.2.1`: the address, then its gateway.
                for entry in value.split(';').filter(|e| !e.is_empty()) {
                    let address = entry.split(',').next().unwrap_or_default();
                    addresses.push(without_prefix(address));
                }
            }
        }
    }
    Some(ConfiguredInterface {
        name: name.into(),
        mac,
        addresses,
        file: path.into(),
    })
}

/// An `ifcfg-NAME` file of an Ethernet device (a bond's slave too): `DEVICE` (else the file's name), `HWADDR`,
/// and `IPADDR`, `IPADDR0`, `IPADDR1`, ….
fn ifcfg(path: &str, text: &str) -> Option<ConfiguredInterface> {
    let mut values = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if let Some((key, value)) = line.split_once('=') {
            values.insert(key.trim(), value.trim().trim_matches(['"', '\'']));
        }
    }
    let kind = values.get("TYPE").copied().unwrap_or("Ethernet");
    if !kind.eq_ignore_ascii_case("ethernet") || values.contains_key("VLAN") {
        return None;
    }
    let file_name = path.rsplit('/').next().unwrap_or(path);
    let name = values
        .get("DEVICE")
        .copied()
        .unwrap_or_else(|| file_name.trim_start_matches("ifcfg-"));
    if !is_physical_name(name) {
        return None;
    }
    let addresses = values
        .iter()
        .filter(|(key, _)| key.starts_with("IPADDR"))
        .map(|(_, value)| without_prefix(value))
        .collect();
    Some(ConfiguredInterface {
        name: name.into(),
        mac: values
            .get("HWADDR")
            .map(|m| m.to_ascii_lowercase())
            .filter(|m| !m.is_empty()),
        addresses,
        file: path.into(),
    })
}

/// Sections of an INI text, keys in order of their names.
fn ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = section.trim().to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            sections
                .entry(current.clone())
                .or_default()
                .insert(key.trim().into(), value.trim().into());
        }
    }
    sections
}

fn without_prefix(address: &str) -> String {
    address.split('/').next().unwrap_or(address).to_string()
}

/// A name the guest gives a NIC of its own: not the loopback, a VLAN (`ens192.100`), a bond or a bridge by its
/// usual name, and one Linux can give (at most 15 bytes, not all digits, not `all` or `default`, no `/`, `:` or
/// blanks).
fn is_physical_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.bytes().all(|b| b.is_ascii_digit())
        && !["lo", "all", "default"].contains(&name)
        && !name.contains(['.', '/', ':', ' ', '\t'])
        && !["bond", "br", "virbr", "docker", "team"]
            .iter()
            .any(|p| name.starts_with(p))
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
    fn ifcfg_files_name_their_device_and_mac() {
        let files = [
            file(
                "/etc/sysconfig/network-scripts/ifcfg-ens192",
                "TYPE=Ethernet\nBOOTPROTO=none\nDEVICE=ens192\nHWADDR=\"00:50:56:AA:00:21\"\nIPADDR=192.0.2.30\n",
            ),
            file(
                "/etc/sysconfig/network-scripts/ifcfg-bond0",
                "TYPE=Bond\nDEVICE=bond0\n",
            ),
            file("/etc/sysconfig/network-scripts/ifcfg-lo", "DEVICE=lo\n"),
        ];
        let configured = configured_interfaces(&files);
        assert_eq!(configured.len(), 1, "{configured:?}");
        assert_eq!(configured[0].mac.as_deref(), Some("00:50:56:aa:00:21"));
        let plan = pins(&[nic("00:50:56:aa:00:21", &[])], &configured);
        assert_eq!(plan.pins[0].name, "ens192");
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

    #[test]
    fn names_linux_cannot_give_or_virtual_interfaces_are_not_configured_names() {
        for name in [
            "lo",
            "all",
            "42",
            "ens192.100",
            "bond0",
            "br0",
            "a-name-too-long-0",
            "",
        ] {
            assert!(!is_physical_name(name), "{name}");
        }
        let bridged = [file(
            "/etc/network/interfaces",
            "iface br0 inet static\n address 192.0.2.60/24\n bridge_ports ens192\n\
             iface vlan7 inet static\n address 192.0.2.61/24\n vlan-raw-device ens192\n",
        )];
        assert!(configured_interfaces(&bridged).is_empty());
    }
}
