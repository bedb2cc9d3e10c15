//! Ferry's controller: turns each `VirtualMachineMigration` into a running KubeVirt VM, one idempotent step per
//! reconcile, resuming from what it observes after any crash.
//!
//! - [`checkpoint`]: the checkpoints, each as desired, observed, action and recorded.
//! - [`build`]: pure builders of the Jobs, DataVolumes and VM a migration creates.
//! - [`status`]: pure status edits (phases, conditions, retries, progress).
//! - [`reconcile`]: one reconcile: finalizer, cancel, dispatch, status write, Events.
//! - [`runtime`]: watches, leader election, metrics and health endpoints.

mod backoff;
pub mod build;
#[cfg(feature = "chaos")]
pub mod chaos;
pub mod checkpoint;
pub mod children;
pub mod context;
pub mod error;
#[cfg(test)]
mod fixtures;
pub mod metrics;
mod owned;
pub mod provider;
pub mod reconcile;
#[cfg(test)]
mod reconcile_tests;
pub mod runtime;
pub mod staging;
pub mod status;

pub use context::Config;
pub use runtime::{RunOptions, run};

/// The controller's Kubernetes client; with the `chaos` feature, wrapped in the fault plan of `FERRY_CHAOS_PLAN`.
pub fn client(config: kube::Config) -> kube::Result<kube::Client> {
    #[cfg(feature = "chaos")]
    return chaos::client(config);
    #[cfg(not(feature = "chaos"))]
    kube::Client::try_from(config)
}
