//! A real node beside the lab (`ferry lab up --node real`): containerd, the CNI bridge, the kubelet and
//! kube-scheduler, configured so that they work on a machine whose root lacks CAP_SYS_RESOURCE and still runs
//! cgroup v1. Here: the pure builders of its configuration and the pause image;
//! the machine's claim, host changes, components, images and install in the modules below.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use oci::ImageConfig;

pub mod cdi;
pub mod claim;
pub mod host;
pub mod image;
pub mod install;
pub mod kubevirt;
pub mod loops;
mod node;
pub mod oci;
pub use claim::{Holder, claim, holder, host_refusal, release_claim};
pub use node::{RealNode, prepare, release, start, stop_pods};

/// The bridge pods attach to: a private subnet with no gateway and no route, so nothing leaves the machine.
pub const BRIDGE: &str = "labbr0";
pub const BRIDGE_ADDRESS: &str = "10.88.0.1/24";
/// The machine's address on the bridge: where pods reach the lab's vcsim and MinIO.
pub const BRIDGE_IP: &str = "10.88.0.1";
pub const POD_SUBNET: &str = "10.88.0.0/24";
/// The `kubernetes` Service's cluster IP (the first of the lab's service range): with a real node the API server
/// listens there, on the bridge, as in-cluster clients expect; pods reach it by one route via the bridge.
pub const API_SERVICE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 0, 1);
pub const API_SERVICE_PORT: u16 = 443;
/// The cluster DNS address pods are given (a cluster's conventional one, in the service range; nothing serves it).
pub const CLUSTER_DNS_IP: &str = "10.0.0.10";
/// The sandbox image, built here and imported into containerd (there is no registry).
pub const PAUSE_IMAGE: &str = "localhost/pause:local";
/// The runc Debian installs; containerd runs it for every container.
pub const RUNC: &str = "/usr/sbin/runc";
/// One real node per machine: the kubelet's port, its fixed paths and `/kubepods` are the machine's.
pub const LOCK_FILE: &str = "/run/ferry-real-node.lock";

/// Why this machine cannot host a real node now, in words a user can act on; None when it can. `in_use`: what of a
/// node's fixed resources something else already holds (a bridge, `/kubepods`, the kubelet's port).
pub fn refusal(
    euid: u32,
    runc_present: bool,
    lock_holder: Option<&str>,
    in_use: &[String],
) -> Option<String> {
    if euid != 0 {
        return Some(
            "a real node needs root (it creates a bridge, cgroups and mounts); run as root or use the default node agent"
                .into(),
        );
    }
    if !runc_present {
        return Some(format!(
            "a real node needs runc at {RUNC}: apt-get install runc"
        ));
    }
    if let Some(holder) = lock_holder {
        return Some(claim::held_by(holder));
    }
    (!in_use.is_empty()).then(|| {
        format!(
            "this machine already has what a real node would create: {}; another kubelet, or a lab whose directory \
             is gone (then remove them by hand)",
            in_use.join(", ")
        )
    })
}

/// containerd's configuration (version 4, containerd 2.4's: a version 3 file is migrated with a warning, and its servers
/// are plugins), everything under `state` (root, state, sockets, imports; an empty `imports` means the host's
/// `/etc/containerd/conf.d`): the runc shim with
/// cgroupfs, the sandbox image pinned to the one imported here, and OOM scores clamped to containerd's own, since
/// without CAP_SYS_RESOURCE runc cannot lower a container's (every sandbox failed with "can't get final child's PID
/// from pipe"). A Block volume's device is given to the pod's user and group, as CDI's and KubeVirt's docs ask of
/// the runtime (`device_ownership_from_security_context`): their pods, and Ferry's, run as 107, not root.
pub fn containerd_config(state: &Path, cni_bin: &Path, cni_conf: &Path) -> String {
    let s = state.display();
    format!(
        r#"version = 4
root = "{s}/root"
state = "{s}/state"
imports = ["{s}/conf.d/*.toml"]

[plugins."io.containerd.server.v1.grpc"]
  address = "{s}/containerd.sock"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{s}/containerd.sock.ttrpc"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  device_ownership_from_security_context = true

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{}"]
  conf_dir = "{}"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  Root = "{s}/runc"
  SystemdCgroup = false
"#,
        cni_bin.display(),
        cni_conf.display()
    )
}

/// The CNI network: the bridge with host-local addresses, no gateway (the bridge plugin would turn on forwarding),
/// no masquerade, and one route: to the API server's address on the bridge (delivered locally, not forwarded).
/// Its address bookkeeping (host-local's `dataDir`) stays in `ipam_dir`, not in the machine's `/var/lib/cni`.
pub fn cni_conflist(ipam_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "ferry-lab",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": false, "ipMasq": false,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                      "dataDir": ipam_dir.display().to_string(),
                      "routes": [{"dst": format!("{API_SERVICE_IP}/32"), "gw": BRIDGE_IP}]}},
            {"type": "loopback"},
        ],
    })
}

/// The kubelet's configuration (JSON, which `--config` reads as YAML): cgroupfs from the CRI, cgroup v1 allowed,
/// OOM score 0 (see [`containerd_config`]), listeners on loopback only, the lab CA for client certificates, images
/// never collected (there is no registry to pull them back from), and the paths that can move under `dir`.
pub fn kubelet_config(dir: &Path, ca: &Path, runtime_socket: &Path) -> Value {
    let under = |p: &str| dir.join(p).display().to_string();
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": false,
        "failSwapOn": false,
        "oomScoreAdj": 0,
        "address": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "authentication": {
            "anonymous": {"enabled": true},
            "webhook": {"enabled": false},
            "x509": {"clientCAFile": ca.display().to_string()},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": format!("unix://{}", runtime_socket.display()),
        "resolvConf": "",
        // A cluster's DNS settings, so pods' resolv.conf is a cluster's (no server answers at that address: the
        // lab's pods reach everything by IP). Without them the kubelet writes `search .`, which virt-launcher's
        // DHCP server refuses (it hands the search domains to the guest) and so every VM fails.
        "clusterDomain": "cluster.local",
        "clusterDNS": [CLUSTER_DNS_IP],
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "podLogsDir": under("pod-logs"),
        "volumePluginDir": under("volume-plugins"),
    })
}

/// Runs `command` and returns its stdout; when it fails, an error `what: <its stderr>`. `install` says how to get
/// the program when it is missing.
fn run(command: &mut std::process::Command, what: &str, install: &str) -> Result<String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = command
        .output()
        .with_context(|| format!("running {program}{install}"))?;
    if !out.status.success() {
        anyhow::bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The sandbox process's source, kept with the tools (`tools/pause/pause.c`).
const PAUSE_SOURCE: &str = include_str!("../../../../tools/pause/pause.c");

/// Builds [`PAUSE_IMAGE`] under `dir`: the pause process compiled static with the machine's C compiler (682 KB),
/// alone in a one-layer image, run as nobody as Kubernetes' own pause image is. Returns the archive's path, for
/// `ctr image import`.
pub fn build_pause_image(dir: &Path) -> Result<std::path::PathBuf> {
    let rootfs = dir.join("pause-rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let source = dir.join("pause.c");
    std::fs::write(&source, PAUSE_SOURCE)?;
    run(
        std::process::Command::new("gcc")
            .args(["-static", "-Os", "-s", "-o"])
            .arg(rootfs.join("pause"))
            .arg(&source),
        "compiling the pause process",
        " (apt-get install gcc libc6-dev)",
    )?;
    let archive = dir.join("pause.oci.tar");
    let image = ImageConfig {
        name: PAUSE_IMAGE.into(),
        user: "65535:65535".into(),
        entrypoint: vec!["/pause".into()],
        env: vec![],
    };
    oci::write_archive(&rootfs, &image, &archive)?;
    Ok(archive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_refused_with_what_to_do() {
        assert!(
            refusal(1000, true, None, &[])
                .unwrap()
                .contains("needs root")
        );
        assert!(
            refusal(0, false, None, &[])
                .unwrap()
                .contains("apt-get install runc")
        );
        assert!(
            refusal(0, true, Some("/tmp/lab"), &[])
                .unwrap()
                .contains("ferry lab down --dir /tmp/lab")
        );
        let taken = refusal(0, true, None, &["bridge labbr0".into()]).unwrap();
        assert!(
            taken.contains("already has") && taken.contains("bridge labbr0"),
            "{taken}"
        );
        assert_eq!(refusal(0, true, None, &[]), None);
    }

    #[test]
    fn containerd_never_sets_an_oom_score_and_runs_runc_with_cgroupfs() {
        let config = containerd_config(
            Path::new("/lab/node"),
            Path::new("/tools/cni"),
            Path::new("/lab/node/cni"),
        );
        for line in [
            "version = 4",
            "imports = [\"/lab/node/conf.d/*.toml\"]",
            "restrict_oom_score_adj = true",
            "device_ownership_from_security_context = true",
            "sandbox = \"localhost/pause:local\"",
            "BinaryName = \"/usr/sbin/runc\"",
            "SystemdCgroup = false",
            "address = \"/lab/node/containerd.sock\"",
            "bin_dirs = [\"/tools/cni\"]",
        ] {
            assert!(config.contains(line), "{line} in {config}");
        }
    }

    #[test]
    fn pods_get_no_gateway_no_masquerade_and_a_route_to_the_api_server_only() {
        let bridge = &cni_conflist(Path::new("/lab/node/ipam"))["plugins"][0];
        assert!(BRIDGE_ADDRESS.starts_with(&format!("{BRIDGE_IP}/")));
        assert_eq!(bridge["ipam"]["dataDir"], "/lab/node/ipam");
        assert_eq!(bridge["isGateway"], false);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(
            bridge["ipam"]["routes"],
            json!([{"dst": "10.0.0.1/32", "gw": "10.88.0.1"}])
        );
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], POD_SUBNET);
    }

    #[test]
    fn the_kubelet_listens_on_loopback_and_leaves_oom_scores_alone() {
        let config = kubelet_config(
            Path::new("/lab/node"),
            Path::new("/lab/pki/ca.crt"),
            Path::new("/lab/node/containerd.sock"),
        );
        assert_eq!(config["oomScoreAdj"], 0);
        assert_eq!(config["address"], "127.0.0.1");
        assert_eq!(config["readOnlyPort"], 0);
        assert_eq!(config["failCgroupV1"], false);
        assert_eq!(
            config["containerRuntimeEndpoint"],
            "unix:///lab/node/containerd.sock"
        );
        assert_eq!(config["podLogsDir"], "/lab/node/pod-logs");
    }

    #[test]
    fn the_pause_image_holds_a_static_pause_that_exits_on_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let archive = build_pause_image(dir.path()).unwrap();
        assert!(archive.exists());
        let pause = dir.path().join("pause-rootfs/pause");
        let mut child = std::process::Command::new(&pause).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(child.try_wait().unwrap().is_none(), "it waits");
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        assert!(child.wait().unwrap().success(), "SIGTERM ends it with 0");
    }
}
