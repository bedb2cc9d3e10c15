//! Ferry's controller: turns each `VirtualMachineMigration` into a running KubeVirt VM, one idempotent step per
//! reconcile, resuming from what it observes after any crash.
//!
//! Its public API is small on purpose: [`run`] with [`RunOptions`] and [`Config`], the [`client`] it runs with,
//! [`surface`] (the builders, names and child states the benchmark, the views, the demo and the chaos harness
//! share with it) and, with the `chaos` feature, `chaos` (the fault plan). Inside:
//!
//! - `checkpoint`: the checkpoints, each as desired, observed, action and recorded.
//! - `build`: pure builders of the Jobs, DataVolumes and VM a migration creates.
//! - `status`: pure status edits (phases, conditions, retries, progress).
//! - `reconcile`: one reconcile: finalizer, cancel, dispatch, status write, Events.
//! - `runtime`: watches, leader election, metrics and health endpoints; `wake`: which changes of children, VMIs
//!   and Providers wake a migration; `watched`: the namespaces served, one watch each merged into one stream.

mod backoff;
pub(crate) mod build;
pub(crate) mod cache;
#[cfg(feature = "chaos")]
pub mod chaos;
pub(crate) mod checkpoint;
pub(crate) mod children;
pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod fair;
pub(crate) mod maps;
pub(crate) mod metrics;
mod owned;
pub(crate) mod plan;
pub(crate) mod provider;
pub(crate) mod reconcile;
pub(crate) mod runtime;
pub(crate) mod slots;
pub(crate) mod staging;
pub(crate) mod status;
pub mod surface;
pub(crate) mod wake;
pub mod watched;

pub use context::Config;
pub use runtime::{RunOptions, run};

/// The controller's Kubernetes client; with the `chaos` feature, wrapped in the fault plan of `FERRY_CHAOS_PLAN`.
pub fn client(config: kube::Config) -> kube::Result<kube::Client> {
    #[cfg(feature = "chaos")]
    return chaos::client(config);
    #[cfg(not(feature = "chaos"))]
    kube::Client::try_from(config)
}
