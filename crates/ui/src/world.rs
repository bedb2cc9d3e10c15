//! Everything one page is drawn from: the watched objects as they are now, the progress samples, and the
//! troubles with watching, taken at one instant.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_api::{MigrationPlan, Provider, VirtualMachineMigration};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;

use crate::Samples;

#[derive(Clone, Debug)]
pub struct World {
    pub plans: Vec<Arc<MigrationPlan>>,
    pub migrations: Vec<Arc<VirtualMachineMigration>>,
    /// For the per-host limits; a Provider outside the watched namespace is not here (its limit shows unknown).
    pub providers: Vec<Arc<Provider>>,
    /// Events about Ferry's own objects.
    pub events: Vec<Arc<Event>>,
    /// Each plan's progress over time, by the plan's UID.
    pub samples: HashMap<String, Samples>,
    /// The namespace watched; none for every namespace.
    pub namespace: Option<String>,
    /// Why a kind could not be watched just now (for example `Forbidden`), for people to see.
    pub problems: Vec<String>,
    pub now: Timestamp,
}

impl World {
    /// Nothing watched yet, at `now`.
    pub fn empty(namespace: Option<String>, now: Timestamp) -> Self {
        Self {
            plans: Vec::new(),
            migrations: Vec::new(),
            providers: Vec::new(),
            events: Vec::new(),
            samples: HashMap::new(),
            namespace,
            problems: Vec::new(),
            now,
        }
    }

    /// `namespace apps`, or `all namespaces`.
    pub fn scope(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("namespace {ns}"),
            None => "all namespaces".into(),
        }
    }

    /// Whether names need their namespace beside them to be told apart.
    pub fn many_namespaces(&self) -> bool {
        self.namespace.is_none()
    }

    pub fn migration(&self, namespace: &str, name: &str) -> Option<&VirtualMachineMigration> {
        self.migrations.iter().map(AsRef::as_ref).find(|m| {
            m.metadata.namespace.as_deref() == Some(namespace)
                && m.metadata.name.as_deref() == Some(name)
        })
    }

    pub fn plan(&self, namespace: &str, name: &str) -> Option<&MigrationPlan> {
        self.plans.iter().map(AsRef::as_ref).find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }
}
