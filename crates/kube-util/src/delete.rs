//! Deleting children: idempotent, because a restarted controller deletes again what it may already have deleted.

use std::fmt::Debug;

use kube::Api;
use kube::api::{DeleteParams, PropagationPolicy};
use serde::de::DeserializeOwned;

/// Deletes `name` with background propagation (its own children go after it, through garbage collection).
/// An object that is already gone counts as deleted.
pub async fn delete_if_present<K>(api: &Api<K>, name: &str) -> kube::Result<()>
where
    K: Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
