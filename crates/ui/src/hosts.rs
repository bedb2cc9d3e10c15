//! ESXi hosts' disk slots, as the migrations record them: a grant in `status.hostSlot` (disks counted against
//! the host's limit), a wait as reason `WaitingForHostSlot`. The limit is the Provider's
//! `spec.limits.maxConcurrentDisksPerHost`, counted per Provider and host, as the controller counts it.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_api::{Phase, Provider, VirtualMachineMigration};
use k8s_openapi::jiff::Timestamp;

/// The reason a migration waits for a slot (the controller's `slots::WAITING`).
pub const WAITING_FOR_HOST_SLOT: &str = "WaitingForHostSlot";

#[derive(Clone, Debug, PartialEq)]
pub struct HostView {
    /// The Provider, as `namespace/name`.
    pub provider: String,
    /// The host's name, else its moref.
    pub host: String,
    pub moref: Option<String>,
    /// Disk slots per host; none when the Provider is not visible here.
    pub limit: Option<i32>,
    pub in_use: i32,
    pub holders: Vec<Holder>,
    /// In the order they are served: created earlier first, then by name.
    pub waiters: Vec<Waiter>,
    /// Migrations of this host not holding or waiting (done, or not that far yet).
    pub others: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    pub namespace: String,
    pub migration: String,
    pub disks: i32,
    pub granted: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Waiter {
    pub namespace: String,
    pub migration: String,
    /// Disks it will ask for: those not copied yet.
    pub disks: usize,
    pub created: Option<Timestamp>,
}

/// Every host a watched migration was discovered on or holds a slot on, by Provider, then host.
pub fn hosts(
    migrations: &[Arc<VirtualMachineMigration>],
    providers: &[Arc<Provider>],
) -> Vec<HostView> {
    let mut hosts: BTreeMap<(String, String), HostView> = BTreeMap::new();
    for m in migrations {
        let Some(status) = m.status.as_ref() else {
            continue;
        };
        let source = status.source.as_ref();
        let (name, moref) = match (&status.host_slot, source) {
            (Some(slot), _) => (
                slot.host.clone(),
                Some(slot.host_moref.clone()).filter(|s| !s.is_empty()),
            ),
            (None, Some(s)) => (s.host.clone().unwrap_or_default(), s.host_moref.clone()),
            (None, None) => continue,
        };
        if name.is_empty() && moref.is_none() {
            continue;
        }
        let provider_ns = m.provider_namespace().to_string();
        let provider_name = m.spec.source.provider_ref.name.clone();
        let provider = format!("{provider_ns}/{provider_name}");
        // The controller counts a host by its moref when known, else its name.
        let key = (
            provider.clone(),
            moref.clone().unwrap_or_else(|| name.clone()),
        );
        let view = hosts.entry(key.clone()).or_insert_with(|| HostView {
            provider,
            host: if name.is_empty() {
                moref.clone().unwrap_or_default()
            } else {
                name.clone()
            },
            moref: moref.clone(),
            limit: limit(providers, &provider_ns, &provider_name),
            in_use: 0,
            holders: Vec::new(),
            waiters: Vec::new(),
            others: 0,
        });
        let namespace = m.metadata.namespace.clone().unwrap_or_default();
        let migration = m.metadata.name.clone().unwrap_or_default();
        let waits = status.reason.as_deref() == Some(WAITING_FOR_HOST_SLOT)
            && !status
                .phase
                .is_some_and(|p| p.is_terminal() || p == Phase::Cancelling);
        match &status.host_slot {
            Some(slot) => {
                view.in_use += slot.disks.max(0);
                view.holders.push(Holder {
                    namespace,
                    migration,
                    disks: slot.disks,
                    granted: slot.granted.0,
                });
            }
            None if waits => {
                let disks = status.disks.iter().filter(|d| d.sha256.is_none()).count();
                view.waiters.push(Waiter {
                    namespace,
                    migration,
                    disks: disks.max(1),
                    created: m.metadata.creation_timestamp.as_ref().map(|t| t.0),
                });
            }
            None => view.others += 1,
        }
    }
    // In the order the controller serves them: created earlier first (its whole seconds), then by name.
    for view in hosts.values_mut() {
        let order = |w: &Waiter| (w.created.map(|t| t.as_second()), w.migration.clone());
        view.waiters.sort_by_key(order);
    }
    hosts.into_values().collect()
}

fn limit(providers: &[Arc<Provider>], namespace: &str, name: &str) -> Option<i32> {
    providers
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
        .map(|p| p.spec.limits.max_concurrent_disks_per_host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrations::tests::vmm;
    use serde_json::json;

    fn provider(limit: i32) -> Arc<Provider> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "migration.platform.example/v1alpha1", "kind": "Provider",
                "metadata": {"name": "vc", "namespace": "apps"},
                "spec": {"type": "vsphere", "url": "https://vc/sdk", "secretRef": {"name": "s"},
                         "tls": {"insecureSkipVerify": true}, "limits": {"maxConcurrentDisksPerHost": limit}}}))
            .unwrap(),
        )
    }

    fn source(host: &str) -> serde_json::Value {
        json!({"name": "vm", "moref": "vm-1", "host": host, "hostMoref": format!("host-{host}"), "cpus": 1,
               "coresPerSocket": 1, "memoryMib": 512})
    }

    #[test]
    fn slots_in_use_are_the_grants_and_waiters_are_in_the_order_they_are_served() {
        let mut later = vmm(
            "later",
            json!({"phase": "Preparing", "reason": WAITING_FOR_HOST_SLOT,
            "source": source("h1"), "disks": [{"index": 0, "sourceFile": "f", "capacityBytes": 1},
                                              {"index": 1, "sourceFile": "g", "capacityBytes": 1}]}),
        );
        later.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-12-01T10:00:05Z".parse().unwrap(),
            ));
        let migrations: Vec<Arc<VirtualMachineMigration>> = vec![
            vmm("holder", json!({"phase": "Converting", "source": source("h1"),
                "hostSlot": {"host": "h1", "hostMoref": "host-h1", "disks": 2,
                             "granted": "2026-12-01T10:00:01.000000Z"}})),
            later,
            vmm("earlier", json!({"phase": "Preparing", "reason": WAITING_FOR_HOST_SLOT, "source": source("h1")})),
            vmm("done", json!({"phase": "Succeeded", "source": source("h1")})),
            vmm("elsewhere", json!({"phase": "Succeeded", "source": source("h2")})),
            vmm("undiscovered", json!({"phase": "Discovering"})),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let found = hosts(&migrations, &[provider(2)]);
        assert_eq!(found.len(), 2);
        let h1 = &found[0];
        assert_eq!((h1.provider.as_str(), h1.host.as_str()), ("apps/vc", "h1"));
        assert_eq!((h1.limit, h1.in_use, h1.others), (Some(2), 2, 1));
        assert_eq!(h1.holders[0].migration, "holder");
        let waiters: Vec<_> = h1
            .waiters
            .iter()
            .map(|w| (w.migration.as_str(), w.disks))
            .collect();
        assert_eq!(waiters, [("earlier", 1), ("later", 2)]);
        assert_eq!((found[1].host.as_str(), found[1].in_use), ("h2", 0));
        assert_eq!(
            hosts(&migrations, &[])[0].limit,
            None,
            "a Provider not watched: limit unknown"
        );
    }
}
