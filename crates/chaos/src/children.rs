//! The migration's children in a run's namespace, as the chaos harness observes them.

use std::collections::BTreeMap;
use std::fmt::Debug;

use anyhow::Result;
use ferry_api::VirtualMachineMigration;
use ferry_api::keys::{MIGRATED_BY_ANNOTATION, UID_LABEL, uid_selector};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::oracles::Record;

/// The migration's children in the run's namespace.
pub struct Children {
    jobs: Api<Job>,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
    data_volumes: Api<DynamicObject>,
    vms: Api<DynamicObject>,
    vmis: Api<DynamicObject>,
    events: Api<Event>,
    migrations: Api<VirtualMachineMigration>,
}

fn disk_count(m: &VirtualMachineMigration) -> usize {
    m.status.as_ref().map_or(0, |s| s.disks.len())
}

impl Children {
    pub fn new(client: &Client, ns: &str) -> Self {
        let dynamic = |r| Api::<DynamicObject>::namespaced_with(client.clone(), ns, &r);
        Self {
            jobs: Api::namespaced(client.clone(), ns),
            pods: Api::namespaced(client.clone(), ns),
            claims: Api::namespaced(client.clone(), ns),
            data_volumes: dynamic(ferry_api::foreign::dv_resource()),
            vms: dynamic(ferry_api::foreign::vm_resource()),
            vmis: dynamic(ferry_api::foreign::vmi_resource()),
            events: Api::namespaced(client.clone(), ns),
            migrations: Api::namespaced(client.clone(), ns),
        }
    }

    /// Notes the Jobs and DataVolumes seen; at most one DataVolume per disk of the migration `m` may exist at any
    /// time.
    pub async fn observe(&self, record: &mut Record, m: &VirtualMachineMigration) -> Result<()> {
        let uid = m.uid().unwrap_or_default();
        let uid = uid.as_str();
        let lp = ListParams::default();
        for job in self.jobs.list(&lp).await? {
            if !record.jobs_seen.contains(&job.name_any()) {
                record.jobs_seen.push(job.name_any());
            }
        }
        let dvs = self
            .data_volumes
            .list(&ListParams::default().labels(&uid_selector(uid)))
            .await?;
        let disks = if dvs.items.len() > disk_count(m).max(1) {
            // `m` was read before the list: disks recorded since, and their volumes, were not in it yet. A volume
            // is created only for a disk on record, so the count that bounds the list is one read after it.
            match self.migrations.get_opt(&m.name_any()).await? {
                Some(now) => disk_count(&now),
                None => disk_count(m),
            }
        } else {
            disk_count(m)
        };
        if dvs.items.len() > disks.max(1) {
            let names: Vec<String> = dvs.items.iter().map(|d| d.name_any()).collect();
            record.violations.push(format!(
                "{} DataVolumes for {disks} disk(s): {names:?}",
                names.len()
            ));
        }
        for dv in dvs {
            if !record.data_volumes_seen.contains(&dv.name_any()) {
                record.data_volumes_seen.push(dv.name_any());
            }
        }
        Ok(())
    }

    /// Whether a VMI of the migration (its VM's instance, named as the VM) is Running. Its VM carries its UID, or
    /// once handed over, `migrated-by` naming it; its name is recorded in `status.targetVM`.
    pub async fn target_running(&self, m: &VirtualMachineMigration) -> Result<bool> {
        let from = format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any());
        let uid = m.uid().unwrap_or_default();
        // Its recorded target name too: a VM deleted first leaves its VMI running a while.
        let mut names: Vec<String> = self
            .vms
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|vm| {
                vm.labels().get(UID_LABEL) == Some(&uid)
                    || vm.annotations().get(MIGRATED_BY_ANNOTATION) == Some(&from)
            })
            .map(|vm| vm.name_any())
            .collect();
        names.extend(m.status.as_ref().and_then(|s| s.target_vm.clone()));
        Ok(self
            .vmis
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|vmi| vmi.data["status"]["phase"] == "Running" && names.contains(&vmi.name_any())))
    }

    pub async fn count(&self) -> Result<BTreeMap<String, usize>> {
        let lp = ListParams::default();
        Ok(BTreeMap::from([
            ("VirtualMachine".to_string(), len(&self.vms, &lp).await?),
            (
                "DataVolume".to_string(),
                len(&self.data_volumes, &lp).await?,
            ),
            ("Job".to_string(), len(&self.jobs, &lp).await?),
        ]))
    }

    /// Objects still labelled with the migration's UID.
    pub async fn labelled(&self, uid: &str) -> Result<usize> {
        if uid.is_empty() {
            return Ok(0);
        }
        let lp = ListParams::default().labels(&uid_selector(uid));
        Ok(len(&self.jobs, &lp).await?
            + len(&self.pods, &lp).await?
            + len(&self.claims, &lp).await?
            + len(&self.data_volumes, &lp).await?
            + len(&self.vms, &lp).await?
            + len(&self.vmis, &lp).await?)
    }

    /// VMs and DataVolumes a succeeded migration handed over to its user (they carry `migrated-by`).
    pub async fn released(&self) -> Result<usize> {
        let lp = ListParams::default();
        let mut n = 0;
        for api in [&self.vms, &self.data_volumes] {
            n += api
                .list(&lp)
                .await?
                .items
                .iter()
                .filter(|o| o.annotations().contains_key(MIGRATED_BY_ANNOTATION))
                .count();
        }
        Ok(n)
    }

    /// Every Event in the namespace, oldest first, one line each.
    pub async fn story(&self) -> Result<String> {
        let mut events = self.events.list(&ListParams::default()).await?.items;
        events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
        Ok(events
            .iter()
            .map(|e| {
                format!(
                    "{} {} {}: {}",
                    e.type_.clone().unwrap_or_default(),
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n"))
    }

    pub async fn warnings(&self) -> Result<Vec<String>> {
        let lp = ListParams::default().fields("type=Warning");
        Ok(self
            .events
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect())
    }

    /// Every resourceVersion in the namespace that the controller would see change.
    pub async fn fingerprint(&self) -> Result<Vec<String>> {
        let lp = ListParams::default();
        let mut versions = versions_of(&self.jobs, &lp).await?;
        versions.extend(versions_of(&self.pods, &lp).await?);
        for api in [&self.data_volumes, &self.vms, &self.vmis] {
            versions.extend(versions_of(api, &lp).await?);
        }
        versions.extend(versions_of(&self.migrations, &lp).await?);
        Ok(versions)
    }
}

async fn len<K>(api: &Api<K>, lp: &ListParams) -> Result<usize>
where
    K: Clone + DeserializeOwned + Debug,
{
    Ok(api.list(lp).await?.items.len())
}

async fn versions_of<K>(api: &Api<K>, lp: &ListParams) -> Result<Vec<String>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    Ok(api
        .list(lp)
        .await?
        .items
        .iter()
        .map(|o| o.resource_version().unwrap_or_default())
        .collect())
}
