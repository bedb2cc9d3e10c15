//! Real CDI on the real node: CDI v1.65.0's controller and importer (`tools/cdi`, built by `hack/tools.sh --node`)
//! as images on the cached base, the controller installed by `cdi-install` from CDI's operator factories and run
//! as a pod; it creates the importer pods that fill every DataVolume. The lab's provisioner
//! (`standins::provisioner`) answers their claims.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;

use super::RealNode;
use super::image::{self, USER};
use super::oci::ImageConfig;
use crate::lab::LabState;

pub const NAMESPACE: &str = "cdi";
pub const DEPLOYMENT: &str = "cdi-deployment";
pub const CONTROLLER_IMAGE: &str = "localhost/cdi-controller:v1.65.0";
pub const IMPORTER_IMAGE: &str = "localhost/cdi-importer:v1.65.0";
const AVAILABLE_TIMEOUT: Duration = Duration::from_secs(180);

/// CDI's images as its own build makes them (`cmd/*/BUILD.bazel`: the binary in `/usr/bin`, entrypoint with
/// `-alsologtostderr`), on the lab's Debian base (qemu-img and nbdkit with the curl plugin, which the importer runs)
/// instead of CDI's CentOS one, and as the ferry image's user rather than CDI's 1001: both run as whatever user
/// their pod gives (the importer as 107).
pub fn images(node: &RealNode) -> Result<()> {
    let started = Instant::now();
    let dir = node.dir.join("images");
    std::fs::create_dir_all(&dir)?;
    for (binary, name) in [
        ("cdi-controller", CONTROLLER_IMAGE),
        ("cdi-importer", IMPORTER_IMAGE),
    ] {
        let path = node.tools.join(binary);
        if !path.exists() {
            bail!(
                "{} is missing: hack/setup.sh --node builds CDI's controller and importer",
                path.display()
            );
        }
        let config = ImageConfig {
            name: name.into(),
            user: USER.into(),
            entrypoint: vec![format!("/usr/bin/{binary}"), "-alsologtostderr".into()],
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        };
        let target = format!("usr/bin/{binary}");
        let archive = image::build_on_base(
            &image::default_cache()?,
            &image::FERRY_BASE,
            &dir,
            &[(&path, target.as_str())],
            &config,
            binary,
        )?;
        node.import_image(&archive)?;
        std::fs::remove_file(&archive)?;
    }
    tracing::info!(
        "CDI's images built and imported in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Installs CDI's controller with `cdi-install` and waits until its Deployment is available.
pub async fn install(state: &LabState, node: &RealNode, client: &kube::Client) -> Result<()> {
    let started = Instant::now();
    super::run(
        Command::new(node.tools.join("cdi-install"))
            .arg(format!("--kubeconfig={}", state.kubeconfig.display()))
            .arg(format!("--namespace={NAMESPACE}"))
            .arg(format!("--controller-image={CONTROLLER_IMAGE}"))
            .arg(format!("--importer-image={IMPORTER_IMAGE}")),
        "cdi-install",
        "",
    )?;
    let deployments: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), NAMESPACE);
    loop {
        let deployment = deployments.get(DEPLOYMENT).await?;
        let available = deployment
            .status
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        if available > 0 {
            tracing::info!(
                "CDI v1.65.0's controller available in {:.1}s",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if started.elapsed() > AVAILABLE_TIMEOUT {
            bail!(
                "{NAMESPACE}/{DEPLOYMENT} was not available within {AVAILABLE_TIMEOUT:?}: {}",
                pods_said(client, NAMESPACE).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the pods of `namespace` say of themselves, for an error: each one's phase and its containers' waiting
/// reasons.
pub async fn pods_said(client: &kube::Client, namespace: &str) -> String {
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), namespace);
    let Ok(list) = pods.list(&Default::default()).await else {
        return "its pods could not be listed".into();
    };
    let said: Vec<String> = list
        .items
        .iter()
        .map(|pod| {
            let status = pod.status.clone().unwrap_or_default();
            let waiting: Vec<String> = status
                .container_statuses
                .iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
                .map(|w| {
                    format!(
                        "{} {}",
                        w.reason.clone().unwrap_or_default(),
                        w.message.clone().unwrap_or_default()
                    )
                })
                .collect();
            format!(
                "{} {} {}",
                pod.metadata.name.clone().unwrap_or_default(),
                status.phase.unwrap_or_default(),
                waiting.join("; ")
            )
        })
        .collect();
    if said.is_empty() {
        "no pod".into()
    } else {
        said.join(", ")
    }
}
