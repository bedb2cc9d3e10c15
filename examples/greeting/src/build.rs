//! Desired state, computed purely from the Greeting: the ConfigMap and Deployment it should own.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use serde_json::json;

use crate::crd::Greeting;

/// The web server that serves the message; any image with a document root works.
pub const WEB_IMAGE: &str = "nginx:1.27";
const DOC_ROOT: &str = "/usr/share/nginx/html";

fn labels(greeting: &Greeting) -> BTreeMap<String, String> {
    BTreeMap::from([(
        "demo.example/greeting".to_string(),
        name(greeting).to_string(),
    )])
}

fn name(greeting: &Greeting) -> &str {
    greeting.metadata.name.as_deref().unwrap_or_default()
}

/// The ConfigMap `<name>` holding the page.
pub fn config_map(greeting: &Greeting) -> ConfigMap {
    let owner = greeting
        .controller_owner_ref(&())
        .expect("a stored Greeting has a name and uid");
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name(greeting),
            "namespace": greeting.metadata.namespace,
            "labels": labels(greeting),
            "ownerReferences": [owner],
        },
        "data": {"index.html": format!("{}\n", greeting.spec.message)},
    }))
    .expect("a valid ConfigMap")
}

/// The Deployment `<name>` serving the ConfigMap. A hash of the message in the pod template rolls the pods
/// when the message changes, since a mounted ConfigMap alone does not restart anything.
pub fn deployment(greeting: &Greeting) -> Deployment {
    let owner = greeting
        .controller_owner_ref(&())
        .expect("a stored Greeting has a name and uid");
    let name = name(greeting);
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": greeting.metadata.namespace,
            "labels": labels(greeting),
            "ownerReferences": [owner],
        },
        "spec": {
            "replicas": greeting.spec.replicas,
            "selector": {"matchLabels": labels(greeting)},
            "template": {
                "metadata": {
                    "labels": labels(greeting),
                    "annotations": {"demo.example/message-hash": message_hash(&greeting.spec.message)},
                },
                "spec": {
                    "containers": [{
                        "name": "web",
                        "image": WEB_IMAGE,
                        "ports": [{"containerPort": 80, "name": "http"}],
                        "volumeMounts": [{"name": "page", "mountPath": DOC_ROOT, "readOnly": true}],
                    }],
                    "volumes": [{"name": "page", "configMap": {"name": name}}],
                },
            },
        },
    }))
    .expect("a valid Deployment")
}

/// FNV-1a: stable across runs and Rust versions, unlike `DefaultHasher`.
fn message_hash(message: &str) -> String {
    let hash = message.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::GreetingSpec;

    fn hello(message: &str, replicas: i32) -> Greeting {
        let mut g = Greeting::new(
            "hello",
            GreetingSpec {
                message: message.into(),
                replicas,
            },
        );
        g.metadata.namespace = Some("demo".into());
        g.metadata.uid = Some("uid-1".into());
        g
    }

    #[test]
    fn children_are_owned_named_and_wired_together() {
        let g = hello("Hello from the lab", 2);
        let (cm, dep) = (config_map(&g), deployment(&g));
        for meta in [&cm.metadata, &dep.metadata] {
            assert_eq!(meta.name.as_deref(), Some("hello"));
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
                ("Greeting", "uid-1", Some(true))
            );
        }
        assert_eq!(cm.data.unwrap()["index.html"], "Hello from the lab\n");
        let spec = dep.spec;
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.unwrap();
        assert_eq!(
            pod.volumes.unwrap()[0].config_map.as_ref().unwrap().name,
            "hello"
        );
    }

    #[test]
    fn a_new_message_changes_the_pod_template() {
        let annotation = |m| {
            deployment(&hello(m, 1))
                .spec
                .template
                .metadata
                .unwrap()
                .annotations
                .unwrap()["demo.example/message-hash"]
                .clone()
        };
        assert_eq!(annotation("a"), annotation("a"));
        assert_ne!(annotation("a"), annotation("b"));
    }
}
