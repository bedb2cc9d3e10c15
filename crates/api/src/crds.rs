//! The CustomResourceDefinitions, as `ferry crds` prints them and `deploy/crds/` holds them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{MigrationPlan, NetworkMap, Provider, StorageMap, VirtualMachineMigration};

pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        Provider::crd(),
        VirtualMachineMigration::crd(),
        NetworkMap::crd(),
        StorageMap::crd(),
        MigrationPlan::crd(),
    ]
}

/// Every CRD as one multi-document YAML stream.
pub fn to_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn deploy_crds_match_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/crds/ferry.yaml");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == super::to_yaml().unwrap(),
            "deploy/crds/ferry.yaml is out of date: run `cargo run -q --bin ferry -- crds > deploy/crds/ferry.yaml`"
        );
    }
}
