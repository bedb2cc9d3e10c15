//! `NetworkMap` and `StorageMap`: where source networks and datastores go, written once and named by many
//! migrations (`spec.target.networkMapRef`, `spec.target.storageMapRef`). A migration's own entries win over a
//! map's. Validating resolves them into the migration's status, so a map edited later changes only migrations
//! not yet validated.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{NetworkMapping, VolumeMode};

/// Where each source network goes.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "migration.platform.example",
    version = "v1alpha1",
    kind = "NetworkMap",
    doc = "Where each vSphere network goes: the pod network, a Multus network, or nowhere. Migrations name it in spec.target.networkMapRef.",
    namespaced,
    shortname = "netmap",
    category = "migrations",
    printcolumn(
        name = "Sources",
        type_ = "string",
        json_path = ".spec.networks[*].source"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkMapSpec {
    /// One entry per source network; a source appears once.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["source".into()]))]
    pub networks: Vec<NetworkMapping>,
}

/// Where each source datastore's disks go.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "migration.platform.example",
    version = "v1alpha1",
    kind = "StorageMap",
    doc = "Which StorageClass, volume mode and access mode the disks of each vSphere datastore get. Migrations name it in spec.target.storageMapRef.",
    namespaced,
    shortname = "stmap",
    category = "migrations",
    printcolumn(
        name = "Sources",
        type_ = "string",
        json_path = ".spec.datastores[*].source"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct StorageMapSpec {
    /// One entry per source datastore; a source appears once.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["source".into()]))]
    pub datastores: Vec<StorageMapping>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageMapping {
    /// The datastore's name, as in a disk's file `[datastore1] vm/vm.vmdk`.
    #[schemars(length(min = 1, max = 255))]
    pub source: String,
    #[schemars(length(min = 1, max = 253), pattern(crate::DNS_SUBDOMAIN))]
    pub storage_class_name: String,
    /// Unset: `Filesystem`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<VolumeMode>,
    /// Unset: `ReadWriteOnce`. `ReadWriteMany` lets KubeVirt live-migrate the VM between nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum AccessMode {
    #[default]
    ReadWriteOnce,
    ReadWriteMany,
}

impl AccessMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadWriteOnce => "ReadWriteOnce",
            AccessMode::ReadWriteMany => "ReadWriteMany",
        }
    }
}
