//! One watch per kind for the floor's straight-line migrations: each waits on the shared cache for its child to
//! reach a state, instead of polling the API server N times.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

pub struct Watched<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    changed: watch::Receiver<u64>,
    dyntype: K::DynamicType,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    pub fn new(api: Api<K>) -> Self {
        Self::with(api, K::DynamicType::default())
    }
}

impl<K> Watched<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    pub fn with(api: Api<K>, dyntype: K::DynamicType) -> Self {
        let writer = reflector::store::Writer::new(dyntype.clone());
        let store = writer.as_reader();
        let (tx, changed) = watch::channel(0u64);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while stream.next().await.is_some() {
                tx.send_modify(|n| *n += 1);
            }
        });
        Self {
            store,
            changed,
            dyntype,
            task,
        }
    }

    /// Every object the watch holds now.
    pub fn objects(&self) -> Vec<std::sync::Arc<K>> {
        self.store.state()
    }

    /// Waits until `ns/name` exists and `ready` says it is done, then returns its answer.
    pub async fn until<T>(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
        ready: impl Fn(&K) -> Option<T>,
    ) -> Result<T> {
        let key = ObjectRef::<K>::new_with(name, self.dyntype.clone()).within(ns);
        let mut changed = self.changed.clone();
        let deadline = Instant::now() + timeout;
        loop {
            changed.borrow_and_update();
            if let Some(answer) = self.store.get(&key).and_then(|k| ready(&k)) {
                return Ok(answer);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "{ns}/{name} did not get there within {}s",
                    timeout.as_secs()
                );
            }
            let _ = tokio::time::timeout(left, changed.changed()).await;
        }
    }
}

impl<K: Resource + 'static> Drop for Watched<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}
