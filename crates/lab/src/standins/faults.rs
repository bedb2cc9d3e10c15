//! The lab's fault switch: a ConfigMap `lab-faults` in a namespace asks the stand-ins to fail the next N imports
//! (`fail-imports`), to kill the importer of the next N imports midway (`kill-imports`: CDI starts the import
//! again), to flip a byte of the next N imported disks while reporting success (`corrupt-imports`), to have the
//! source refuse the next N importer runs (`refuse-imports`: the importer presents a wrong key, as after a Secret
//! was rotated; the S3 server's refusal is real, and CDI restarts the importer), to fail the
//! next N pods (`fail-pods`), or to start the next N pods and SIGKILL them midway
//! (`kill-pods`). `<key>-selector: key=value` limits a fault to objects with that label (`name=x`: that name).
//! Each fault is taken once, by compare-and-swap on the ConfigMap's resourceVersion.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};

pub const CONFIGMAP: &str = "lab-faults";
pub const FAIL_IMPORTS: &str = "fail-imports";
pub const KILL_IMPORTS: &str = "kill-imports";
pub const CORRUPT_IMPORTS: &str = "corrupt-imports";
pub const REFUSE_IMPORTS: &str = "refuse-imports";
pub const FAIL_PODS: &str = "fail-pods";
pub const KILL_PODS: &str = "kill-pods";

/// Takes one fault of `key` in `namespace` when one is left and the object (`name`, `labels`) matches the
/// fault's selector, if it has one.
pub async fn take(
    client: &Client,
    namespace: &str,
    key: &str,
    name: &str,
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
        let selected = match data.get(&format!("{key}-selector")) {
            Some(selector) => selector.split_once('=').is_some_and(|(k, v)| {
                let (k, v) = (k.trim(), v.trim());
                labels.get(k).map(String::as_str) == Some(v) || (k == "name" && name == v)
            }),
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
