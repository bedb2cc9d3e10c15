//! Creating children: idempotent, because a restarted controller creates again what it may already have created.

use std::fmt::Debug;

use kube::Api;
use kube::api::PostParams;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// What [`create_if_absent`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    Now,
    /// An object of that name exists: with deterministic names, one an earlier reconcile created and whose
    /// answer was lost. The caller checks whose it is when that matters.
    AlreadyThere,
}

/// Creates `object`; one of the same name already there is not an error.
pub async fn create_if_absent<K>(api: &Api<K>, object: &K) -> kube::Result<Created>
where
    K: Clone + Serialize + DeserializeOwned + Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(Created::Now),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Created::AlreadyThere),
        Err(e) => Err(e),
    }
}
