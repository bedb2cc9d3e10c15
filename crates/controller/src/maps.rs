//! Where a migration's networks and disks go: its own `spec.target` entries, then the `NetworkMap` and
//! `StorageMap` it names. Pure: Validating reads the maps, resolves, and records the result in status, which
//! the builders read from then on.

use std::collections::BTreeSet;

use ferry_api::{
    AccessMode, DiskStatus, DiskStorage, NetworkMapSpec, NetworkMapping, SourceDisk, SourceNic,
    StorageMapSpec, TargetSpec, VirtualMachineMigration, VolumeMode,
};

/// The datastore of a disk file `[datastore1] vm/vm.vmdk`.
pub fn datastore_of(file: &str) -> Option<&str> {
    let rest = file.strip_prefix('[')?;
    Some(&rest[..rest.find(']')?])
}

/// One mapping per source network the NICs use, in the order first used: the target's own entry for it, else
/// the map's. Err: the networks neither covers.
pub fn resolve_networks(
    target: &TargetSpec,
    map: Option<&NetworkMapSpec>,
    nics: &[SourceNic],
) -> Result<Vec<NetworkMapping>, Vec<String>> {
    let mut resolved: Vec<NetworkMapping> = Vec::new();
    let mut uncovered = BTreeSet::new();
    for nic in nics {
        if resolved.iter().any(|m| m.source == nic.network) {
            continue;
        }
        let from_map = map.and_then(|m| m.networks.iter().find(|e| e.source == nic.network));
        match target
            .networks
            .iter()
            .find(|e| e.source == nic.network)
            .or(from_map)
        {
            Some(mapping) => resolved.push(mapping.clone()),
            None => {
                uncovered.insert(nic.network.clone());
            }
        }
    }
    if uncovered.is_empty() {
        Ok(resolved)
    } else {
        Err(uncovered.into_iter().collect())
    }
}

/// Each disk's volume: the target's `storageClassName` and `volumeMode` where set, else its datastore's entry in
/// the map, else the cluster's default class on `Filesystem`. Err: the datastores a map is needed for and does
/// not cover.
pub fn resolve_storage(
    target: &TargetSpec,
    map: Option<&StorageMapSpec>,
    disks: &[SourceDisk],
) -> Result<Vec<DiskStorage>, Vec<String>> {
    let mut uncovered = BTreeSet::new();
    let mut resolved = Vec::new();
    for disk in disks {
        let datastore = datastore_of(&disk.file).unwrap_or_default();
        let entry = map.and_then(|m| m.datastores.iter().find(|e| e.source == datastore));
        if map.is_some() && entry.is_none() && target.storage_class_name.is_none() {
            uncovered.insert(datastore.to_string());
            continue;
        }
        resolved.push(DiskStorage {
            storage_class_name: target
                .storage_class_name
                .clone()
                .or_else(|| entry.map(|e| e.storage_class_name.clone())),
            volume_mode: target
                .volume_mode
                .or_else(|| entry.and_then(|e| e.volume_mode))
                .unwrap_or_default(),
            access_mode: entry.and_then(|e| e.access_mode).unwrap_or_default(),
        });
    }
    if uncovered.is_empty() {
        Ok(resolved)
    } else {
        Err(uncovered.into_iter().collect())
    }
}

/// Multus networks outside the migration's namespace and `default`: another tenant's networks are not its to
/// use.
pub fn foreign_networks<'a>(networks: &'a [NetworkMapping], namespace: &str) -> Vec<&'a str> {
    networks
        .iter()
        .filter_map(|m| m.multus.as_ref())
        .map(|m| m.network_name.as_str())
        .filter(|name| match name.split_once('/') {
            Some((ns, _)) => ns != namespace && ns != "default",
            None => false,
        })
        .collect()
}

/// The one volume mode of a migration's disks, or none when they differ (the conversion Job mounts every volume
/// one way).
pub fn one_volume_mode(disks: &[DiskStorage]) -> Option<VolumeMode> {
    let first = disks
        .first()
        .map_or(VolumeMode::Filesystem, |d| d.volume_mode);
    disks
        .iter()
        .all(|d| d.volume_mode == first)
        .then_some(first)
}

/// Disk `disk`'s volume as Validating recorded it; for a migration validated before storage was recorded, what
/// its target says.
pub fn disk_storage(vmm: &VirtualMachineMigration, disk: &DiskStatus) -> DiskStorage {
    disk.storage.clone().unwrap_or_else(|| DiskStorage {
        storage_class_name: vmm.spec.target.storage_class_name.clone(),
        volume_mode: vmm.spec.target.volume_mode.unwrap_or_default(),
        access_mode: AccessMode::ReadWriteOnce,
    })
}

/// The volume mode of the migration's disks, as recorded (one for all), else as its target says.
pub fn volume_mode(vmm: &VirtualMachineMigration) -> VolumeMode {
    let recorded = vmm
        .status
        .as_ref()
        .and_then(|s| s.disks.first()?.storage.as_ref());
    recorded.map_or(vmm.spec.target.volume_mode.unwrap_or_default(), |s| {
        s.volume_mode
    })
}

/// Where each source network goes, as recorded, else as the target says.
pub fn networks(vmm: &VirtualMachineMigration) -> &[NetworkMapping] {
    match vmm.status.as_ref().map(|s| &s.networks) {
        Some(resolved) if !resolved.is_empty() => resolved,
        _ => &vmm.spec.target.networks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(value: serde_json::Value) -> TargetSpec {
        serde_json::from_value(value).unwrap()
    }

    fn nic(network: &str) -> SourceNic {
        SourceNic {
            mac: "00:50:56:00:00:01".into(),
            network: network.into(),
            model: None,
            ip_addresses: vec![],
        }
    }

    fn disk(file: &str) -> SourceDisk {
        SourceDisk {
            file: file.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_migrations_own_network_entry_wins_over_the_maps_and_uncovered_ones_are_named() {
        let own = target(json!({"networks": [{"source": "prod", "ignored": {}}]}));
        let map: NetworkMapSpec = serde_json::from_value(json!({"networks": [
            {"source": "prod", "pod": {}}, {"source": "backup", "multus": {"networkName": "ns/backup"}}]}))
        .unwrap();
        let nics = [nic("prod"), nic("backup"), nic("prod")];
        let resolved = resolve_networks(&own, Some(&map), &nics).unwrap();
        assert_eq!(resolved.len(), 2);
        assert!(resolved[0].ignored.is_some(), "{resolved:?}");
        assert!(resolved[1].multus.is_some());
        let missing = resolve_networks(&own, None, &[nic("prod"), nic("dmz"), nic("lab")]);
        assert_eq!(missing, Err(vec!["dmz".to_string(), "lab".to_string()]));
        assert_eq!(foreign_networks(&resolved, "ns"), Vec::<&str>::new());
        assert_eq!(foreign_networks(&resolved, "other"), vec!["ns/backup"]);
    }

    #[test]
    fn disks_take_their_datastores_class_unless_the_migration_sets_one() {
        let map: StorageMapSpec = serde_json::from_value(json!({"datastores": [
            {"source": "fast", "storageClassName": "ssd", "volumeMode": "Block", "accessMode": "ReadWriteMany"},
            {"source": "slow", "storageClassName": "hdd"}]}))
        .unwrap();
        let disks = [disk("[fast] a/a.vmdk"), disk("[slow] a/a_1.vmdk")];
        let resolved = resolve_storage(&target(json!({})), Some(&map), &disks).unwrap();
        assert_eq!(resolved[0].storage_class_name.as_deref(), Some("ssd"));
        assert_eq!(
            (resolved[0].volume_mode, resolved[0].access_mode),
            (VolumeMode::Block, AccessMode::ReadWriteMany)
        );
        assert_eq!(
            (
                resolved[1].storage_class_name.as_deref(),
                resolved[1].volume_mode
            ),
            (Some("hdd"), VolumeMode::Filesystem)
        );
        assert_eq!(one_volume_mode(&resolved), None);
        let own = target(json!({"storageClassName": "gold", "volumeMode": "Filesystem"}));
        let resolved = resolve_storage(&own, Some(&map), &disks).unwrap();
        assert!(
            resolved
                .iter()
                .all(|d| d.storage_class_name.as_deref() == Some("gold"))
        );
        assert_eq!(one_volume_mode(&resolved), Some(VolumeMode::Filesystem));
        let uncovered = resolve_storage(&target(json!({})), Some(&map), &[disk("[nfs] b/b.vmdk")]);
        assert_eq!(uncovered, Err(vec!["nfs".to_string()]));
        let no_map = resolve_storage(&target(json!({})), None, &[disk("[nfs] b/b.vmdk")]).unwrap();
        assert_eq!(no_map, vec![DiskStorage::default()]);
        assert_eq!(datastore_of("[LocalDS_0] vm/vm.vmdk"), Some("LocalDS_0"));
        assert_eq!(datastore_of("vm.vmdk"), None);
    }
}
