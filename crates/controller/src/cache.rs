//! The controller's watch caches of the children it polls most: Jobs and DataVolumes. A cached copy answers only
//! where a stale one can only delay (a Job still running, a volume still importing or ready); anything that
//! leads to an action or a verdict is read from the API server.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::batch::v1::Job;
use kube::api::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};

use crate::build::dv_resource;
use crate::error::Result;

#[derive(Default)]
pub struct Caches {
    jobs: OnceLock<Store<Job>>,
    data_volumes: OnceLock<Store<DynamicObject>>,
}

impl Caches {
    pub fn attach(&self, jobs: Store<Job>, data_volumes: Store<DynamicObject>) {
        let _ = self.jobs.set(jobs);
        let _ = self.data_volumes.set(data_volumes);
    }

    pub fn job(&self, ns: &str, name: &str) -> Option<Arc<Job>> {
        self.jobs.get()?.get(&ObjectRef::new(name).within(ns))
    }

    pub fn data_volume(&self, ns: &str, name: &str) -> Option<Arc<DynamicObject>> {
        self.data_volumes
            .get()?
            .get(&ObjectRef::new_with(name, dv_resource()).within(ns))
    }
}

/// `cached` when `enough` says a stale copy of it can only delay us; otherwise `name` as the API server has it.
pub async fn read<K>(
    cached: Option<Arc<K>>,
    api: &Api<K>,
    name: &str,
    enough: impl Fn(&K) -> bool,
) -> Result<Option<K>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match cached {
        Some(object) if enough(&object) => Ok(Some((*object).clone())),
        _ => Ok(api.get_opt(name).await?),
    }
}
