//! References to other objects in the same namespace.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Names an object in the migration's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectReference {
    #[schemars(length(min = 1, max = 253), pattern(crate::DNS_SUBDOMAIN))]
    pub name: String,
}

/// Names a Secret in the same namespace. Ferry reads it by name when it needs it and never copies its data.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretReference {
    #[schemars(length(min = 1, max = 253), pattern(crate::DNS_SUBDOMAIN))]
    pub name: String,
}
