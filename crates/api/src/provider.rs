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
    /// Where in the inventory its migrations may take VMs from; unset, anywhere the account sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<ProviderScope>,
}

/// Inventory paths below the root folder, as vSphere shows them (`DC0/vm/team-a`, `DC0/host/cluster-1`,
/// `DC0/host/cluster-1/Resources/team-a`; a datacenter in a folder is `Europe/DC0/...`). A VM is in scope when
/// its folder lies in one of `folders`, or its resource pool in one of `clusters` or `resourcePools`; discovery
/// refuses any other with `SourceVMOutOfScope`, before anything touches it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("size(self.folders) + size(self.clusters) + size(self.resourcePools) > 0")
        .message("scope needs at least one folder, cluster or resource pool; leave scope out for the whole inventory")
)]
pub struct ProviderScope {
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 1024)))]
    #[x_kube(validation = Rule::new(PATHS_RULE).message(PATHS_MESSAGE))]
    pub folders: Vec<String>,
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 1024)))]
    #[x_kube(validation = Rule::new(PATHS_RULE).message(PATHS_MESSAGE))]
    pub clusters: Vec<String>,
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 1024)))]
    #[x_kube(validation = Rule::new(PATHS_RULE).message(PATHS_MESSAGE))]
    pub resource_pools: Vec<String>,
}

const PATHS_RULE: &str = "self.all(p, p.matches('^/?[^/]+(/[^/]+)*$'))";
const PATHS_MESSAGE: &str = "a scope path is an inventory path such as DC0/vm/team-a (a leading / allowed), with no empty segment";

impl ProviderScope {
    /// True when a VM in `folder` (its parent folder's path) and `pool` (its resource pool's path) is in scope.
    pub fn admits(&self, folder: &str, pool: Option<&str>) -> bool {
        let within = |path: &str, roots: &[String]| {
            roots.iter().any(|root| {
                let root = root.trim_matches('/');
                path == root
                    || path
                        .strip_prefix(root)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
        };
        within(folder.trim_matches('/'), &self.folders)
            || pool.is_some_and(|pool| {
                let pool = pool.trim_matches('/');
                within(pool, &self.clusters) || within(pool, &self.resource_pools)
            })
    }
}

#[cfg(test)]
mod scope_tests {
    use super::*;

    fn scope(folders: &[&str], clusters: &[&str], pools: &[&str]) -> ProviderScope {
        let paths = |p: &[&str]| p.iter().map(|s| s.to_string()).collect();
        ProviderScope {
            folders: paths(folders),
            clusters: paths(clusters),
            resource_pools: paths(pools),
        }
    }

    #[test]
    fn a_vm_is_in_scope_below_a_listed_folder_cluster_or_pool() {
        let team = scope(
            &["/DC0/vm/team-a"],
            &["DC0/host/C1"],
            &["DC0/host/C2/Resources/team-a"],
        );
        assert!(team.admits("DC0/vm/team-a", None));
        assert!(team.admits("DC0/vm/team-a/web", None));
        assert!(team.admits("DC0/vm", Some("DC0/host/C1/Resources")));
        assert!(team.admits("DC0/vm", Some("DC0/host/C2/Resources/team-a/inner")));
    }

    #[test]
    fn a_sibling_with_a_longer_name_or_another_branch_is_not() {
        let team = scope(&["DC0/vm/team-a"], &["DC0/host/C1"], &[]);
        assert!(!team.admits("DC0/vm/team-ab", None));
        assert!(!team.admits("DC0/vm", Some("DC0/host/C10/Resources")));
        assert!(!team.admits("DC0/vm", None));
        assert!(!team.admits("DC1/vm/team-a", Some("DC0/host/C2/Resources")));
    }
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
