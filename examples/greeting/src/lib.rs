//! `Greeting`, the smallest complete controller, built as Ferry's migration controller is. Read `README.md` beside this crate first.

pub mod build;
pub mod controller;
pub mod crd;
pub mod status;

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, CustomResourceExt};

/// Installs (or updates) the Greeting CRD and waits until the API server serves it.
pub async fn install_crd(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crd::Greeting::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.patch(
        &name,
        &PatchParams::apply(controller::MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await?;
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await??;
    Ok(())
}
