//! Stand-ins for what a real cluster provides and the lab's control plane lacks. Each is a small controller
//! that does the real work where the machine allows it.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::core::{ApiResource, NamespaceResourceScope};
use kube::runtime::controller::{Action, Controller};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

pub mod cdi;
pub mod faults;
pub mod kubevirt;
pub mod node;
pub mod provisioner;

/// How long a stand-in waits before it reconciles an object again after an error.
const RETRY: Duration = Duration::from_secs(2);

/// Work a stand-in's reconciles started and left running, by object uid.
type Tasks = Mutex<HashMap<String, JoinHandle<()>>>;

/// Runs a stand-in's controller until `shutdown` resolves: each error is logged under `name` and the object
/// reconciled again after [`RETRY`].
async fn run_controller<K, Ctx, Fut, E>(
    name: &'static str,
    controller: Controller<K>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    ctx: Arc<Ctx>,
) where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
{
    let error_policy = move |_: Arc<K>, error: &E, _: Arc<Ctx>| {
        tracing::warn!("{name}: {error}");
        Action::requeue(RETRY)
    };
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

/// Stops the work left running once a stand-in's controller stopped.
fn abort_all(tasks: &Tasks) {
    for (_, task) in tasks.lock().unwrap_or_else(|p| p.into_inner()).drain() {
        task.abort();
    }
}

/// `namespace`'s objects of kind `K`, or every namespace's when it is `None`.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// [`scoped`] for the kinds the lab serves without Rust types (KubeVirt's, CDI's).
fn scoped_dynamic(
    client: &Client,
    namespace: Option<&str>,
    resource: &ApiResource,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}
