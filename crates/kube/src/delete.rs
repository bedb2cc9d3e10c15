//! Deleting children: idempotent, because a restarted controller deletes again what it may already have deleted.

use std::fmt::Debug;

use kube::Api;
use kube::api::{DeleteParams, Preconditions, PropagationPolicy};
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

/// Deletes `name` only while it is still the object with `uid` (a precondition the API server checks), with
/// background propagation. Gone, or replaced by another object under the name since it was read, counts as
/// deleted: that other object is not the one we meant, and is left alone.
pub async fn delete_exactly<K>(api: &Api<K>, name: &str, uid: &str) -> kube::Result<()>
where
    K: Clone + DeserializeOwned + Debug + kube::Resource,
{
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        // A failed precondition is a 409, but so is any other conflict: only an object now under the name with
        // another uid (or none) means ours is gone.
        Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await? {
            Some(found) if found.meta().uid.as_deref() == Some(uid) => Err(kube::Error::Api(s)),
            _ => Ok(()),
        },
        Err(e) => Err(e),
    }
}
