//! The controller: watch, queue, reconcile. Reconcile observes the world afresh, applies what differs, and
//! records what it saw in status. It never remembers anything between runs.

use std::sync::Arc;
use std::time::Duration;

use ferry_kube::apply::{Applied, apply_if_different};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::crd::Greeting;
use crate::{build, status};

/// One field manager for every write, so server-side apply knows which fields are ours.
pub const MANAGER: &str = "greeting-controller";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

struct Context {
    client: Client,
}

/// Runs the controller until `shutdown` resolves. `namespace: None` watches every namespace.
pub async fn run(
    client: Client,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (greetings, config_maps, deployments) = match namespace {
        Some(ns) => (
            Api::<Greeting>::namespaced(client.clone(), ns),
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            Api::<Deployment>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    Controller::new(greetings, watcher::Config::default())
        // Changes to the children map back to the owning Greeting through their ownerReferences.
        .owns(config_maps, watcher::Config::default())
        .owns(deployments, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!("reconcile: {e}");
            }
        })
        .await;
}

async fn reconcile(greeting: Arc<Greeting>, ctx: Arc<Context>) -> Result<Action, Error> {
    if greeting.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children through their owner references.
        return Ok(Action::await_change());
    }
    let ns = greeting.namespace().unwrap_or_default();
    let name = greeting.name_any();
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);

    // Observe.
    let observed_cm = config_maps.get_opt(&name).await?;
    let mut observed_deployment = deployments.get_opt(&name).await?;

    // Act: create or update only what differs from the desired state.
    let cm = apply_if_different(
        &config_maps,
        MANAGER,
        &build::config_map(&greeting),
        observed_cm.as_ref(),
    )
    .await?;
    let dep = apply_if_different(
        &deployments,
        MANAGER,
        &build::deployment(&greeting),
        observed_deployment.as_ref(),
    )
    .await?;
    for (kind, applied) in [("ConfigMap", cm), ("Deployment", dep)] {
        if applied != Applied::Unchanged {
            tracing::info!(greeting = %name, namespace = %ns, "{kind} {applied:?}");
        }
    }
    if dep != Applied::Unchanged {
        // Status is computed from the Deployment as stored now, not as it was before our write.
        observed_deployment = deployments.get_opt(&name).await?;
    }

    // Record: write status only when it says something new.
    let now = Time(Timestamp::now());
    let desired = status::desired_status(&greeting, observed_deployment.as_ref(), &now);
    if greeting.status.as_ref() != Some(&desired) {
        let greetings: Api<Greeting> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"apiVersion": "demo.example/v1", "kind": "Greeting", "status": desired});
        greetings
            .patch_status(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
    }
    // Level-triggered: watch events drive progress; the periodic requeue only guards against missed events.
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(greeting: Arc<Greeting>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(greeting = %greeting.name_any(), "reconcile failed, retrying in 5s: {error}");
    Action::requeue(Duration::from_secs(5))
}
