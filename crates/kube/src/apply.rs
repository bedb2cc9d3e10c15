//! Update-if-different: a controller that finds everything in place must send no write at all.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What [`apply_if_different`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
    Unchanged,
}

/// Server-side applies `desired` unless `observed` already holds every field of it.
/// `desired` must carry `apiVersion` and `kind` (k8s-openapi and kube-derive types do).
pub async fn apply_if_different<K>(
    api: &Api<K>,
    field_manager: &str,
    desired: &K,
    observed: Option<&K>,
) -> kube::Result<Applied>
where
    K: Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let desired_json = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    if let Some(observed) = observed {
        let observed_json = serde_json::to_value(observed).map_err(kube::Error::SerdeError)?;
        if is_subset(&desired_json, &observed_json) {
            return Ok(Applied::Unchanged);
        }
    }
    let name = desired.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&desired_json),
    )
    .await?;
    Ok(if observed.is_some() {
        Applied::Updated
    } else {
        Applied::Created
    })
}

/// True when every field set in `desired` has the same value in `observed`. Fields the server added (defaults,
/// status, managed fields) are ignored; lists must match element by element.
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    first_difference(desired, observed).is_none()
}

/// The path of the first field of `desired` that `observed` lacks or holds another value for (`.a.b[2].c`), as
/// [`is_subset`] judges it; None when there is none.
pub fn first_difference(desired: &Value, observed: &Value) -> Option<String> {
    match (desired, observed) {
        (Value::Object(want), Value::Object(have)) => want.iter().find_map(|(key, value)| {
            let found = match have.get(key) {
                Some(found) => first_difference(value, found),
                None => (!is_empty(value)).then(String::new),
            };
            found.map(|rest| format!(".{key}{rest}"))
        }),
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => want
            .iter()
            .zip(have)
            .enumerate()
            .find_map(|(i, (w, h))| first_difference(w, h).map(|rest| format!("[{i}]{rest}"))),
        (want, have) => (want != have).then(String::new),
    }
}

/// The server drops empty maps and lists, so wanting one is satisfied by its absence.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(list) => list.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_added_fields_do_not_count_as_differences() {
        let desired = json!({"metadata": {"name": "a", "labels": {}}, "spec": {"replicas": 2,
            "containers": [{"name": "c", "image": "i"}]}});
        let observed = json!({"metadata": {"name": "a", "uid": "u", "resourceVersion": "7"},
            "spec": {"replicas": 2, "containers": [{"name": "c", "image": "i", "imagePullPolicy": "Always"}]},
            "status": {"readyReplicas": 0}});
        assert!(is_subset(&desired, &observed));
    }

    #[test]
    fn a_changed_value_or_list_length_is_a_difference() {
        let observed = json!({"spec": {"replicas": 2, "items": [1, 2]}});
        assert!(!is_subset(&json!({"spec": {"replicas": 3}}), &observed));
        assert!(!is_subset(&json!({"spec": {"items": [1]}}), &observed));
        assert!(!is_subset(&json!({"spec": {"missing": "x"}}), &observed));
    }

    #[test]
    fn the_first_difference_is_named_by_its_path() {
        let observed = json!({"spec": {"items": [{"a": 1}, {"memory": "1Gi"}], "n": 2}});
        assert_eq!(
            first_difference(
                &json!({"spec": {"items": [{"a": 1}, {"memory": "1024Mi"}]}}),
                &observed
            ),
            Some(".spec.items[1].memory".into())
        );
        assert_eq!(
            first_difference(&json!({"spec": {"items": [{}]}}), &observed),
            Some(".spec.items".into())
        );
        assert_eq!(
            first_difference(&json!({"spec": {"n": 2, "x": {}}}), &observed),
            None
        );
    }
}
