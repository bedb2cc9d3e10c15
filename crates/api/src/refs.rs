//! References to other objects: in the referrer's namespace, save a Provider lent from another.

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

/// Names the Provider that holds the source VM: in the referrer's namespace, or lent from another one.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ProviderReference {
    #[schemars(length(min = 1, max = 253), pattern(crate::DNS_SUBDOMAIN))]
    pub name: String,
    /// A Provider an administrator lends from another namespace. The API server admits the reference only
    /// when its creator may `use` that Provider (RBAC verb `use` on `providers`; the ValidatingAdmissionPolicy
    /// in `deploy/rbac/ferry-providers.yaml`). The conversion Job reads the Provider's credentials from a copy
    /// Ferry makes in the migration's namespace for the length of the conversion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), pattern(crate::DNS_LABEL))]
    pub namespace: Option<String>,
}

/// `name`, or `namespace/name` for a lent Provider.
impl std::fmt::Display for ProviderReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl ProviderReference {
    /// The Provider's namespace, for a reference made in `own`.
    pub fn namespace_or<'a>(&'a self, own: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(own)
    }

    /// Whether the Provider is lent from a namespace other than `own`.
    pub fn is_lent(&self, own: &str) -> bool {
        self.namespace_or(own) != own
    }
}
