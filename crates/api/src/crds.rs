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
    fn deploy_and_chart_crds_match_the_code() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let generated = super::to_yaml().unwrap();
        for file in ["deploy/crds/ferry.yaml", "charts/ferry/crds/ferry.yaml"] {
            let committed = std::fs::read_to_string(format!("{root}/{file}")).unwrap_or_default();
            assert!(
                committed == generated,
                "{file} is out of date: run `cargo run -q --bin ferry -- crds | tee deploy/crds/ferry.yaml > charts/ferry/crds/ferry.yaml`"
            );
        }
    }
}
