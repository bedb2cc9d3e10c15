//! The `Greeting` custom resource (`demo.example/v1`): the desired state a user writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A greeting web page: `message` is served by `replicas` web servers.
// Printer columns repeat `type_ = "integer"`, which clippy mistakes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "demo.example",
    version = "v1",
    kind = "Greeting",
    namespaced,
    status = "GreetingStatus",
    printcolumn(name = "Message", type_ = "string", json_path = ".spec.message"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GreetingSpec {
    pub message: String,
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,
}

/// What the controller last observed. Written only by the controller, through the status subresource.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GreetingStatus {
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
