//! The machine the KubeVirt under test runs guests on.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, LogParams};
use kube::{Api, Client, ResourceExt};

use crate::scenario::LANDMARKS;

/// The machine the KubeVirt under test runs guests on: where a guest's serial console is (the stand-in's log
/// file, else the launcher pod's `guest-console-log` container, as real KubeVirt keeps it), and where a VMI leaves
/// sockets, directories and mounts (the stand-in's state directory, else virt-handler's and the kubelet's).
pub struct Host {
    pub standin_dir: Option<PathBuf>,
}

/// Where real KubeVirt and the kubelet keep a VMI's and a pod's things, named by their uids.
const REAL_NODE_DIRS: [&str; 5] = [
    "/var/run/kubevirt-private",
    "/var/run/kubevirt",
    "/var/run/kubevirt/container-disks",
    "/var/run/kubevirt/hotplug-disks",
    "/var/lib/kubelet/pods",
];

impl Host {
    /// Paths and mounts named by any of `uids` (a VMI's, its launcher pods').
    pub fn leftovers(&self, uids: &[String]) -> Vec<String> {
        let named = |text: &str| {
            uids.iter()
                .any(|u| !u.is_empty() && text.contains(u.as_str()))
        };
        let dirs: Vec<PathBuf> = match &self.standin_dir {
            Some(dir) => vec![dir.clone()],
            None => REAL_NODE_DIRS.iter().map(PathBuf::from).collect(),
        };
        let mut left: Vec<String> = dirs
            .iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten()
            .flatten()
            .filter(|entry| named(&entry.file_name().to_string_lossy()))
            // Kept on purpose, and named here: the stand-in keeps a stopped guest's serial console for people to
            // read (real KubeVirt's goes with the launcher pod).
            .filter(|entry| {
                self.standin_dir.is_none()
                    || !entry.file_name().to_string_lossy().ends_with(".serial")
            })
            .map(|entry| entry.path().display().to_string())
            .collect();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        left.extend(
            mounts
                .lines()
                .filter(|line| named(line))
                .filter_map(|line| line.split(' ').nth(4))
                .map(|point| format!("mount {point}")),
        );
        left
    }

    pub async fn landmarks(&self, client: &Client, vmi: &DynamicObject) -> Vec<String> {
        let text = match &self.standin_dir {
            Some(dir) => {
                let key = format!(
                    "{}_{}_{}",
                    vmi.namespace().unwrap_or_default(),
                    vmi.name_any(),
                    vmi.uid().unwrap_or_default()
                );
                std::fs::read(dir.join(format!("{key}.serial")))
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            }
            None => launcher_console(client, vmi).await,
        };
        LANDMARKS
            .iter()
            .filter(|l| text.contains(*l))
            .map(|l| l.to_string())
            .collect()
    }
}

async fn launcher_console(client: &Client, vmi: &DynamicObject) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    let selector = format!("kubevirt.io/created-by={}", vmi.uid().unwrap_or_default());
    let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else {
        return String::new();
    };
    let mut text = String::new();
    for pod in list.items {
        let params = LogParams {
            container: Some("guest-console-log".into()),
            ..Default::default()
        };
        text += &pods
            .logs(&pod.name_any(), &params)
            .await
            .unwrap_or_default();
    }
    text
}
