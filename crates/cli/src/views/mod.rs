//! Human views of migrations and plans: `ferry get`, `ferry describe`, `ferry watch`. Rendering is pure (objects and a
//! time in, text out); the commands around it only read the API.

pub mod describe;
pub mod get;
pub mod plan;
mod warm;
pub mod watch;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::jiff::Timestamp;

/// Where to look: a kubeconfig and a namespace, as kubectl takes them.
#[derive(Args, Clone, Debug)]
pub struct Scope {
    /// A kubeconfig; without it, $KUBECONFIG or ~/.kube/config (`. .lab/env` sets it for the lab).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace; without it, the kubeconfig's, or `default`.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long, global = true)]
    pub all_namespaces: bool,
}

impl Scope {
    pub async fn client(&self) -> Result<(kube::Client, String)> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
            }
            None => kube::Config::infer().await.context(
                "no kubeconfig: set KUBECONFIG (for the lab: . .lab/env) or pass --kubeconfig",
            )?,
        };
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        Ok((kube::Client::try_from(config)?, namespace))
    }

    pub fn api<K>(&self, client: &kube::Client, namespace: &str) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        if self.all_namespaces {
            kube::Api::all(client.clone())
        } else {
            kube::Api::namespaced(client.clone(), namespace)
        }
    }
}

/// `45s`, `3m12s`, `2h5m`, `3d4h`: kubectl's way.
pub fn age(since: Timestamp, now: Timestamp) -> String {
    let s = now.duration_since(since).as_secs().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// `64.0 MiB`: as `ferry ui` shows sizes.
pub use ferry_ui::format::bytes;

/// A table with columns padded to their widest cell.
pub fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i + 1 == row.len() {
                    cell.clone()
                } else {
                    format!("{cell:<width$}", width = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// The maps a target names, as `NetworkMap NAME` and `StorageMap NAME`.
pub fn map_names(target: &ferry_api::TargetSpec) -> Vec<String> {
    let network = target.network_map_ref.as_ref();
    let storage = target.storage_map_ref.as_ref();
    [
        network.map(|r| format!("NetworkMap {}", r.name)),
        storage.map(|r| format!("StorageMap {}", r.name)),
    ]
    .into_iter()
    .flatten()
    .collect()
}

pub fn phase_name(phase: Option<ferry_api::Phase>) -> String {
    phase
        .and_then(|p| serde_json::to_value(p).ok())
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| "Pending".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_bytes_and_tables_read_like_kubectl() {
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        let later = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        assert_eq!(age(t, later(42)), "42s");
        assert_eq!(age(t, later(192)), "3m12s");
        assert_eq!(age(t, later(7500)), "2h5m");
        assert_eq!(bytes(64.0 * 1048576.0), "64.0 MiB");
        assert_eq!(bytes(12.0), "12 B");
        let text = table(&[
            vec!["NAME".into(), "PHASE".into()],
            vec!["a-long-name".into(), "Done".into()],
        ]);
        assert_eq!(text, "NAME          PHASE\na-long-name   Done\n");
    }
}
