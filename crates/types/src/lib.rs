//! The words Ferry's crates share: error classes, power states, firmware and disk formats. Plain serde types with
//! no Kubernetes dependency, so the vSphere client and the data path build without kube; `ferry-api` re-exports
//! them and, through the `schemars` feature, puts them in the CRD schema.

use serde::{Deserialize, Serialize};

// No doc comments on these types: in the CRDs they would become schema descriptions, and the schema stays as it
// was when the types lived in `ferry-api`.

// How an error is retried: requeued, charged to a bounded budget, or not at all.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum ErrorClass {
    Transient,
    BoundedRetryable,
    Permanent,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum PowerState {
    PoweredOn,
    PoweredOff,
    Suspended,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum Firmware {
    Bios,
    Efi,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    #[default]
    Raw,
    Qcow2,
}
