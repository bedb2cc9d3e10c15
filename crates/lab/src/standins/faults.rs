//! The lab's fault switch: a ConfigMap `lab-faults` in a namespace asks the stand-ins to fail the next N imports
//! (`fail-imports`) or pods (`fail-pods`, only pods whose labels match `fail-pods-selector`, `key=value`). Each
//! fault is taken once, by compare-and-swap on the ConfigMap's resourceVersion.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};

pub const CONFIGMAP: &str = "lab-faults";
pub const FAIL_IMPORTS: &str = "fail-imports";
pub const FAIL_PODS: &str = "fail-pods";
pub const FAIL_PODS_SELECTOR: &str = "fail-pods-selector";

/// Takes one fault of `key` in `namespace` when one is left (and, for pods, `labels` match the selector).
pub async fn take(
    client: &Client,
    namespace: &str,
    key: &str,
    labels: &BTreeMap<String, String>,
) -> kube::Result<bool> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    loop {
        let Some(mut switch) = api.get_opt(CONFIGMAP).await? else {
            return Ok(false);
        };
        let data = switch.data.get_or_insert_default();
        let left: u32 = data
            .get(key)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let selected = match data.get(FAIL_PODS_SELECTOR).filter(|_| key == FAIL_PODS) {
            Some(selector) => selector
                .split_once('=')
                .is_some_and(|(k, v)| labels.get(k.trim()).map(String::as_str) == Some(v.trim())),
            None => true,
        };
        if left == 0 || !selected {
            return Ok(false);
        }
        data.insert(key.to_string(), (left - 1).to_string());
        match api
            .replace(CONFIGMAP, &PostParams::default(), &switch)
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
}
