//! A real-node lab for the tests that compare a stand-in with the real component (`--node real`): one already
//! running, named by an environment variable, or one the test starts and brings down on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_lab::LabState;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

pub struct RealNodeLab {
    pub state: LabState,
    /// The `ferry` binary that started the lab, when this test started it.
    started_by: Option<PathBuf>,
}

/// Set to run the tests that start a real node (they change the machine: runc, loop devices, mounts).
pub const ENABLE: &str = "FERRY_REAL_NODE";

impl RealNodeLab {
    /// Whether the real node may run here ([`ENABLE`] is set); if not, says on stderr that `real` (real CDI,
    /// real KubeVirt) was skipped and that its stand-in is still compared with the record.
    pub fn enabled(real: &str) -> bool {
        if std::env::var_os(ENABLE).is_some() {
            return true;
        }
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {real} runs on the real node, which changes the machine; run with {ENABLE}=1 (the stand-in \
             is compared with the record of {real} in any case)"
        );
        false
    }

    /// The lab in the directory `$running` names, else one started with `ferry lab up --node real` in `work`.
    pub fn running_or_started(running: &str, ferry: &Path, work: &Path) -> Self {
        let (dir, started_by) = match std::env::var_os(running) {
            Some(dir) => (PathBuf::from(dir), None),
            None => {
                let dir = work.join("lab");
                let up = Command::new(ferry)
                    .args(["lab", "up", "--node", "real", "--dir"])
                    .arg(&dir)
                    .output()
                    .expect("running ferry lab up");
                if !up.status.success() {
                    let _ = Command::new(ferry)
                        .args(["lab", "down", "--dir"])
                        .arg(&dir)
                        .output();
                    panic!(
                        "ferry lab up --node real: {}",
                        String::from_utf8_lossy(&up.stderr)
                    );
                }
                (dir, Some(ferry.to_path_buf()))
            }
        };
        let state = LabState::load(&dir)
            .expect("the lab's state")
            .unwrap_or_else(|| panic!("no lab in {}", dir.display()));
        let lab = RealNodeLab { state, started_by };
        assert!(
            lab.state.real_node.is_some(),
            "{} is not a real-node lab",
            dir.display()
        );
        lab
    }

    /// A namespace named `name` that enforces Pod Security's `restricted` level, as the demo's does; deleted
    /// with [`RealNodeLab::delete_namespace`].
    pub async fn restricted_namespace(&self, name: &str) -> Client {
        let client = self.state.client().await.expect("a client of the lab");
        let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
        .expect("a namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("creating the namespace");
        client
    }

    pub async fn delete_namespace(client: &Client, name: &str) {
        let _ = Api::<Namespace>::all(client.clone())
            .delete(name, &DeleteParams::background())
            .await;
    }
}

impl Drop for RealNodeLab {
    fn drop(&mut self) {
        if let Some(ferry) = &self.started_by {
            let _ = Command::new(ferry)
                .args(["lab", "down", "--dir"])
                .arg(&self.state.dir)
                .output();
        }
    }
}
