//! CRDs the lab serves from its start: Ferry's own, the real KubeVirt and CDI schemas of the resources the
//! stand-ins implement, and Multus' NetworkAttachmentDefinition, which KubeVirt reads for each Multus network. They go in before kube-controller-manager starts, whose garbage collector would
//! otherwise learn about them only at its next discovery resync (up to 30 s).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};

const MANAGER: &str = "ferry-lab";

/// KubeVirt VirtualMachine/VirtualMachineInstance, CDI DataVolume and Multus NetworkAttachmentDefinition, from
/// `hack/gen_test_crds.py`.
const STAND_IN_CRDS: [(&str, &str); 4] = [
    (
        "kubevirt-vm.yaml",
        include_str!("../../../../deploy/test-crds/kubevirt-vm.yaml"),
    ),
    (
        "kubevirt-vmi.yaml",
        include_str!("../../../../deploy/test-crds/kubevirt-vmi.yaml"),
    ),
    (
        "cdi-datavolume.yaml",
        include_str!("../../../../deploy/test-crds/cdi-datavolume.yaml"),
    ),
    (
        "multus-network-attachment-definition.yaml",
        include_str!("../../../../deploy/test-crds/multus-network-attachment-definition.yaml"),
    ),
];

pub fn all() -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = ferry_api::crds::all();
    for (file, yaml) in STAND_IN_CRDS {
        crds.push(
            serde_saphyr::from_str(yaml)
                .with_context(|| format!("parsing deploy/test-crds/{file}"))?,
        );
    }
    Ok(crds)
}

/// The lab's StorageClasses, served by the CDI stand-in's hostPath volumes: the default binds at once, the others
/// wait for the first consumer (as local storage does), one of them with a `CSIDriver` for its provisioner, so
/// that CDI fills its volumes with populators rather than on its legacy path.
async fn install_storage_class(client: &Client) -> Result<()> {
    use crate::standins::cdi::{
        CSI_PROVISIONER, POPULATED_WFFC_STORAGE_CLASS, PROVISIONER, STORAGE_CLASS,
        WFFC_STORAGE_CLASS,
    };
    let driver = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": CSI_PROVISIONER},
        "spec": {"attachRequired": false, "podInfoOnMount": false, "volumeLifecycleModes": ["Persistent"]},
    });
    Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(client.clone())
        .patch(
            CSI_PROVISIONER,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&driver),
        )
        .await
        .with_context(|| format!("creating the lab's CSIDriver {CSI_PROVISIONER}"))?;
    for (name, provisioner, mode, default) in [
        (STORAGE_CLASS, PROVISIONER, "Immediate", "true"),
        (
            WFFC_STORAGE_CLASS,
            PROVISIONER,
            "WaitForFirstConsumer",
            "false",
        ),
        (
            POPULATED_WFFC_STORAGE_CLASS,
            CSI_PROVISIONER,
            "WaitForFirstConsumer",
            "false",
        ),
    ] {
        let class = serde_json::json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": {"storageclass.kubernetes.io/is-default-class": default}},
            "provisioner": provisioner, "reclaimPolicy": "Delete", "volumeBindingMode": mode,
        });
        Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone())
            .patch(
                name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&class),
            )
            .await
            .with_context(|| format!("creating the lab's StorageClass {name}"))?;
    }
    Ok(())
}

/// Applies every CRD (server-side, idempotent) and waits until each is established; adds the StorageClass.
pub async fn install(client: &Client) -> Result<()> {
    install_storage_class(client).await?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crds = all()?;
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .with_context(|| format!("installing CRD {name}"))?;
    }
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not established within 60 s"))??;
    }
    Ok(())
}
