//! What the dashboard shows, kept current by watches (reflectors: one listing, then each change) on the
//! migrations, plans, Providers and Ferry's Events; and each plan's progress, sampled every few seconds for its
//! throughput over time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ferry_api::{MigrationPlan, Provider, VirtualMachineMigration};
use ferry_ui::{Samples, World};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use tokio::sync::watch;

/// How often each plan's bytes done are sampled: the throughput chart's resolution.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

pub struct Cache {
    migrations: Store<VirtualMachineMigration>,
    plans: Store<MigrationPlan>,
    providers: Store<Provider>,
    events: Store<Event>,
    samples: Mutex<HashMap<String, Samples>>,
    signals: Arc<Signals>,
    namespace: Option<String>,
}

/// What the watches tell the rest: that something changed, and what they could not read.
struct Signals {
    changed: watch::Sender<u64>,
    /// By kind: why its watch failed last, until it works again.
    problems: Mutex<BTreeMap<&'static str, String>>,
}

impl Cache {
    /// Starts the watches in `namespace` (every namespace when none) and the sampler.
    pub fn start(client: Client, namespace: Option<String>) -> Arc<Cache> {
        let signals = Arc::new(Signals {
            changed: watch::Sender::new(0),
            problems: Mutex::new(BTreeMap::new()),
        });
        let all = watcher::Config::default();
        // Only Events about Ferry's kinds: a busy cluster has many more.
        let ferrys = watcher::Config::default().fields(&format!(
            "involvedObject.apiVersion={}",
            ferry_api::API_VERSION
        ));
        let cache = Arc::new(Cache {
            migrations: reflect(
                api(&client, &namespace),
                all.clone(),
                "migrations",
                &signals,
            ),
            plans: reflect(api(&client, &namespace), all.clone(), "plans", &signals),
            providers: reflect(api(&client, &namespace), all, "Providers", &signals),
            events: reflect(api(&client, &namespace), ferrys, "Events", &signals),
            samples: Mutex::new(HashMap::new()),
            signals,
            namespace,
        });
        tokio::spawn(sample(Arc::clone(&cache)));
        cache
    }

    /// Everything as it is now.
    pub fn world(&self) -> World {
        let mut world = World::empty(self.namespace.clone(), k8s_openapi::jiff::Timestamp::now());
        world.migrations = self.migrations.state();
        world.plans = self.plans.state();
        world.providers = self.providers.state();
        world.events = self.events.state();
        world.samples = self
            .samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        world.problems = self
            .signals
            .problems
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(kind, problem)| format!("watching {kind}: {problem}"))
            .collect();
        world
    }

    /// Ticks on every change any watch saw.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.signals.changed.subscribe()
    }
}

fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A store kept by a watch of `api`; its failures (a watch the user's rights do not allow) are shown on every
/// page until it works.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    signals: &Arc<Signals>,
) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        // Nothing shows managed fields; they are most of an object's bytes.
        .modify(|o| o.meta_mut().managed_fields = None)
        .reflect(writer);
    let signals = Arc::clone(signals);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let mut problems = signals
                .problems
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match event {
                Ok(_) => {
                    problems.remove(kind);
                }
                Err(e) => {
                    problems.insert(kind, e.to_string());
                }
            }
            drop(problems);
            signals.changed.send_modify(|n| *n += 1);
        }
    });
    reader
}

/// Records each plan's bytes done every [`SAMPLE_EVERY`], once the plans and migrations are listed (a partial
/// listing would read as a burst of progress).
async fn sample(cache: Arc<Cache>) {
    let (plans, migrations) = (cache.plans.clone(), cache.migrations.clone());
    if plans.wait_until_ready().await.is_err() || migrations.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        let now = k8s_openapi::jiff::Timestamp::now().as_microsecond() as f64 / 1e6;
        let (plans, migrations) = (plans.state(), migrations.state());
        let mut samples = cache.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.retain(|uid, _| plans.iter().any(|p| p.metadata.uid.as_deref() == Some(uid)));
        for plan in &plans {
            let Some(uid) = plan.metadata.uid.as_deref() else {
                continue;
            };
            let done = ferry_ui::plans::bytes_done(uid, &migrations);
            samples
                .entry(uid.to_string())
                .or_default()
                .record(now, done);
        }
    }
}
