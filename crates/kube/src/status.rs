//! Status writes that never overwrite newer evidence with a stale copy.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Server-side applies `status` to `obj`'s status as `manager` (forced: the status is the controller's alone),
/// with the resourceVersion `obj` was read at as a precondition: the API server refuses the write (409) when
/// `obj` has changed since. Returns the object as written.
pub async fn apply_guarded<K, S>(
    api: &Api<K>,
    obj: &K,
    status: &S,
    manager: &str,
) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    S: Serialize,
{
    api.patch_status(
        &obj.name_any(),
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&guarded_status_patch(obj, status)),
    )
    .await
}

/// The body [`apply_guarded`] sends. Pure.
pub fn guarded_status_patch<K, S>(obj: &K, status: &S) -> Value
where
    K: Resource<DynamicType = ()>,
    S: Serialize,
{
    json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": obj.name_any(), "resourceVersion": obj.resource_version()},
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Pod, PodStatus};

    #[test]
    fn the_patch_names_the_object_and_the_version_it_was_read_at() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.resource_version = Some("7".into());
        let status = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        assert_eq!(
            guarded_status_patch(&pod, &status),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "resourceVersion": "7"},
                "status": {"phase": "Running"}})
        );
        pod.metadata.resource_version = None;
        assert_eq!(
            guarded_status_patch(&pod, &status)["metadata"]["resourceVersion"],
            Value::Null
        );
    }
}
