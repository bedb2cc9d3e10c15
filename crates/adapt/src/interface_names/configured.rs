//! What a Linux guest's network configuration names: one reader per format, each returning the physical
//! interfaces a file configures by name, with the MAC and static addresses it gives them. Pure.

use std::collections::BTreeMap;

use super::ConfiguredInterface;

/// The longest interface name Linux takes (`IFNAMSIZ` less the terminating zero).
const MAX_NAME: usize = 15;

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
        } else if path.starts_with("/etc/systemd/network/") && file_name.ends_with(".network") {
            networkd(path, text).into_iter().collect()
        } else if path.starts_with("/etc/netplan/") && file_name.ends_with(".yaml") {
            netplan(path, text)
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

/// A systemd-networkd `.network` file that matches one interface by its exact name (`[Match] Name=ens192`): its
/// `MACAddress` there, and every `Address=` of `[Network]` and `[Address]` sections. A file matching by MAC,
/// type or a pattern applies whatever the NIC is called, and needs no name kept.
fn networkd(path: &str, text: &str) -> Option<ConfiguredInterface> {
    let mut section = String::new();
    let mut names: Vec<&str> = Vec::new();
    let mut mac = None;
    let mut addresses = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with(['#', ';']) || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match (section.as_str(), key.trim()) {
            ("Match", "Name") => names.extend(value.split_whitespace()),
            ("Match", "MACAddress") => {
                mac = value.split_whitespace().next().map(str::to_ascii_lowercase)
            }
            ("Network" | "Address", "Address") => addresses.push(without_prefix(value.trim())),
            _ => {}
        }
    }
    let [name] = names.as_slice() else {
        return None;
    };
    if name.contains(['*', '?', '[', '!']) || !is_physical_name(name) {
        return None;
    }
    Some(ConfiguredInterface {
        name: name.to_string(),
        mac,
        addresses,
        file: path.into(),
    })
}

/// netplan's `network.ethernets` (Ubuntu): an entry without `match` names its interface by its id; one with
/// `match` names it by `set-name`, or by an exact `match.name`, and a MAC it matches is kept with it. Entries
/// matching by MAC alone, or by a pattern, apply whatever the NIC is called. `addresses` are strings, or
/// mappings keyed by the address (with a lifetime or label).
fn netplan(path: &str, text: &str) -> Vec<ConfiguredInterface> {
    let Ok(documents) = yaml_rust2::YamlLoader::load_from_str(text) else {
        return vec![];
    };
    let mut found = Vec::new();
    for document in &documents {
        let Some(ethernets) = document["network"]["ethernets"].as_hash() else {
            continue;
        };
        for (id, config) in ethernets {
            let matching = &config["match"];
            let name = if matching.is_badvalue() {
                id.as_str()
            } else {
                config["set-name"].as_str().or(matching["name"].as_str())
            };
            let Some(name) = name.filter(|n| !n.contains(['*', '?', '[']) && is_physical_name(n))
            else {
                continue;
            };
            let addresses = config["addresses"]
                .as_vec()
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|a| a.as_str().or_else(|| a.as_hash()?.keys().next()?.as_str()))
                        .map(without_prefix)
                        .collect()
                })
                .unwrap_or_default();
            found.push(ConfiguredInterface {
                name: name.into(),
                mac: matching["macaddress"].as_str().map(str::to_ascii_lowercase),
                addresses,
                file: path.into(),
            });
        }
    }
    found
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> (String, String) {
        (path.into(), text.into())
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
        let nic = crate::interface_names::SourceNic {
            mac: "00:50:56:aa:00:21".into(),
            addresses: vec![],
        };
        let plan = crate::interface_names::pins(&[nic], &configured);
        assert_eq!(plan.pins[0].name, "ens192");
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

    #[test]
    fn a_networkd_file_naming_one_interface_is_read_and_one_matching_any_is_not() {
        let files = [
            file(
                "/etc/systemd/network/10-lan.network",
                "[Match]\nName=ens192\n\n[Network]\nAddress=192.168.50.10/24\nGateway=192.168.50.1\n\n\
                 [Address]\nAddress=192.168.50.11/24\n",
            ),
            file(
                "/etc/systemd/network/80-ferry-ethernet.network",
                "[Match]\nType=ether\n\n[Network]\nDHCP=yes\n",
            ),
            file(
                "/etc/systemd/network/20-any.network",
                "[Match]\nName=en*\n\n[Network]\nDHCP=yes\n",
            ),
        ];
        assert_eq!(
            configured_interfaces(&files),
            [ConfiguredInterface {
                name: "ens192".into(),
                mac: None,
                addresses: vec!["192.168.50.10".into(), "192.168.50.11".into()],
                file: "/etc/systemd/network/10-lan.network".into(),
            }]
        );
    }

    #[test]
    fn netplan_names_its_interfaces_by_id_set_name_or_exact_match() {
        let files = [
            file(
                "/etc/netplan/00-installer-config.yaml",
                "# This is the network config written by 'subiquity'\n\
                 network:\n  ethernets:\n    ens192:\n      addresses:\n      - 192.168.50.10/24\n\
                 \x20     routes:\n      - to: default\n        via: 192.168.50.1\n\
                 \x20   ens224:\n      addresses:\n      - \"192.168.60.10/24\": {lifetime: 0}\n\
                 \x20 version: 2\n",
            ),
            file(
                "/etc/netplan/50-cloud-init.yaml",
                "network:\n  version: 2\n  ethernets:\n    eth0:\n      match:\n        macaddress: \
                 00:50:56:AA:BB:CC\n      set-name: eth0\n      dhcp4: true\n    any:\n      match:\n\
                 \x20       name: en*\n      dhcp4: true\n    bymac:\n      match:\n        macaddress: \
                 00:50:56:aa:bb:cd\n      dhcp4: true\n",
            ),
            file("/etc/netplan/99-broken.yaml", "network: [\n"),
        ];
        let found = configured_interfaces(&files);
        let summary: Vec<(&str, Option<&str>, Vec<&str>)> = found
            .iter()
            .map(|i| {
                (
                    i.name.as_str(),
                    i.mac.as_deref(),
                    i.addresses.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("ens192", None, vec!["192.168.50.10"]),
                ("ens224", None, vec!["192.168.60.10"]),
                ("eth0", Some("00:50:56:aa:bb:cc"), vec![]),
            ]
        );
    }
}
