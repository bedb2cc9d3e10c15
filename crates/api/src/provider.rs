//! `Provider`: a vSphere endpoint (vCenter or standalone ESXi) that migrations read from.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::SecretReference;

/// A vSphere endpoint. Credentials stay in the Secret named by `secretRef` (keys `user` and `password`).
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "migration.platform.example",
    version = "v1alpha1",
    kind = "Provider",
    doc = "A vSphere endpoint (vCenter or standalone ESXi) that migrations read from.",
    namespaced,
    status = "ProviderStatus",
    category = "migrations",
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    #[serde(rename = "type")]
    pub type_: ProviderType,
    /// The SDK endpoint, for example `https://vcenter.example.com/sdk`. Immutable.
    #[x_kube(
        validation = Rule::new("self.startsWith('https://')").message("url must use https:// (TLS is never skipped silently)"),
        validation = Rule::new("isURL(self)").message("url is not a valid URL"),
        validation = Rule::new("!self.matches('^[a-z]+://[^/]*@')")
            .message("url must not carry credentials: put them in the Secret named by secretRef"),
        validation = Rule::new("self == oldSelf").message(
            "url is immutable: migrations found their VMs on the vCenter it reaches; create a new Provider for another endpoint"
        )
    )]
    #[schemars(length(min = 9, max = 2048))]
    pub url: String,
    /// A Secret in the same namespace with keys `user` and `password`.
    pub secret_ref: SecretReference,
    /// How to trust the endpoint's certificate: exactly one way.
    pub tls: ProviderTls,
    #[serde(default)]
    pub limits: ProviderLimits,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderType {
    Vsphere,
}

/// Exactly one of `caBundle`, `thumbprint` or `insecureSkipVerify: true`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("[has(self.caBundle), has(self.thumbprint), has(self.insecureSkipVerify)].exists_one(x, x)")
        .message("tls needs exactly one of caBundle, thumbprint or insecureSkipVerify")
)]
pub struct ProviderTls {
    /// PEM certificates of the CAs that sign the endpoint's certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.contains('-----BEGIN CERTIFICATE-----')")
        .message("caBundle must hold PEM certificates (-----BEGIN CERTIFICATE-----)"))]
    #[schemars(length(max = 65536))]
    pub ca_bundle: Option<String>,
    /// The SHA-256 fingerprint of the endpoint's certificate: 32 colon-separated hex pairs. Not the SHA-1
    /// thumbprint vSphere shows; `status.observedThumbprint` shows the SHA-256 the endpoint presents.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("!self.matches('^([0-9A-Fa-f]{2}:?){19}[0-9A-Fa-f]{2}$')").message(
            "thumbprint is a SHA-1 thumbprint (20 hex pairs, as vSphere shows it), but Ferry pins SHA-256: \
             use the certificate's SHA-256 fingerprint (openssl x509 -noout -fingerprint -sha256), which \
             `ferry inventory --insecure` and a Provider's status.observedThumbprint also show"
        ),
        validation = Rule::new(
            "self.matches('^([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}$') || self.matches('^([0-9A-Fa-f]{2}:?){19}[0-9A-Fa-f]{2}$')"
        )
        .message("thumbprint must be a SHA-256 fingerprint: 32 colon-separated hex pairs")
    )]
    #[schemars(length(max = 95))]
    pub thumbprint: Option<String>,
    /// Accept any certificate. Allowed, but the Provider then carries a warning condition.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self").message("insecureSkipVerify may only be set to true; to verify, set caBundle or thumbprint instead"))]
    pub insecure_skip_verify: Option<bool>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderLimits {
    /// Disk transfers in flight at once per ESXi host, to protect the host.
    #[serde(default = "default_disks_per_host")]
    #[schemars(range(min = 1, max = 100))]
    pub max_concurrent_disks_per_host: i32,
}

impl Default for ProviderLimits {
    fn default() -> Self {
        Self {
            max_concurrent_disks_per_host: default_disks_per_host(),
        }
    }
}

fn default_disks_per_host() -> i32 {
    10
}

/// What the controller found when it connected.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `VirtualCenter` or `HostAgent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The SHA-256 thumbprint the endpoint presented, to help pin it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_thumbprint: Option<String>,
    /// `Ready`, and `InsecureTLS` when verification is skipped.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}
