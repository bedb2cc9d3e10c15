//! Real KubeVirt on the real node: KubeVirt v1.9.0's virt-controller, virt-handler and virt-launcher (`tools/kubevirt`,
//! built by `hack/tools.sh --node`), the handler and launcher in one image on a Debian trixie base with QEMU,
//! libvirt and OVMF, the controller alone in another, installed by
//! `kubevirt-install` from virt-operator's factories (without virt-operator), under software emulation. virt-api's
//! admission stays with `kubevirt-admission`, which also created the CRDs, RBAC and the KubeVirt CR.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};

use super::RealNode;
use super::image::{self, Base};
use super::oci::{self, ImageConfig};
use crate::lab::LabState;

pub const NAMESPACE: &str = "kubevirt";
pub const CONTROLLER: &str = "virt-controller";
pub const HANDLER: &str = "virt-handler";
/// The three names virt-operator would give its images; here one image answers to all of them.
pub const CONTROLLER_IMAGE: &str = "localhost/kubevirt/virt-controller:v1.9.0";
pub const HANDLER_IMAGE: &str = "localhost/kubevirt/virt-handler:v1.9.0";
pub const LAUNCHER_IMAGE: &str = "localhost/kubevirt/virt-launcher:v1.9.0";
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// What KubeVirt's launcher and handler images hold, from Debian trixie instead of CentOS Stream: QEMU, the
/// monolithic libvirtd (trixie has no modular `virtqemud`: see [`VIRTQEMUD_SHIM`]) with its log daemon and client,
/// OVMF and SeaBIOS, xorriso for cloud-init disks, and nftables, which virt-handler runs in each launcher's network
/// namespace for masquerade. KubeVirt's `qemu.conf` runs QEMU as user `qemu`, 107, as its images name it.
pub const KUBEVIRT_BASE: Base = Base {
    label: "kubevirt",
    suite: "trixie",
    packages: &[
        "qemu-system-x86",
        "qemu-utils",
        "libvirt-daemon",
        "libvirt-daemon-driver-qemu",
        "libvirt-daemon-log",
        "libvirt-clients",
        "ovmf",
        "seabios",
        "ipxe-qemu",
        "xorriso",
        "procps",
        "util-linux",
        "nftables",
        "iproute2",
    ],
    hook: r#"chroot "$1" groupadd -g 107 qemu && chroot "$1" useradd -M -u 107 -g 107 -d /home/qemu -s /bin/bash qemu && mkdir -p "$1/home/qemu" && chown 107:107 "$1/home/qemu""#,
    probe: "usr/sbin/libvirtd",
};

/// virt-launcher runs `/usr/sbin/virtqemud -f CONF`, and the node labeller `virtqemud -d`; trixie's libvirtd serves
/// the same QEMU driver and takes the same options and configuration keys. Its socket is `libvirt-sock` where
/// virtqemud's is `virtqemud-sock` (in `/run/libvirt` as root, `$XDG_RUNTIME_DIR/libvirt` otherwise, which
/// KubeVirt sets to `/var/run`), so KubeVirt's names are linked to it.
pub const VIRTQEMUD_SHIM: &str = r#"#!/bin/sh
# Ferry's lab: KubeVirt's virtqemud, served by Debian's monolithic libvirtd.
set -e
if [ "$(id -u)" = 0 ]; then run=/run/libvirt; else run="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/libvirt"; fi
mkdir -p "$run"
ln -sfn libvirt-sock "$run/virtqemud-sock"
ln -sfn libvirt-sock-ro "$run/virtqemud-sock-ro"
ln -sfn libvirt-admin-sock "$run/virtqemud-admin-sock"
exec /usr/sbin/libvirtd "$@"
"#;

/// KubeVirt looks for OVMF in `/usr/share/edk2/ovmf` under Fedora's names; Debian's 4 MiB builds, the Secure Boot
/// one with Microsoft's keys enrolled (as KubeVirt's `OVMF_VARS.secboot.fd` has them).
pub const OVMF_LINKS: [(&str, &str); 4] = [
    ("OVMF_CODE.fd", "/usr/share/OVMF/OVMF_CODE_4M.fd"),
    ("OVMF_VARS.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"),
    (
        "OVMF_CODE.secboot.fd",
        "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd",
    ),
    ("OVMF_VARS.secboot.fd", "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"),
];

/// The binaries `hack/tools.sh --node` builds into the node's tools, all in `/usr/bin` as KubeVirt's images have them.
const BINARIES: [&str; 9] = [
    "virt-handler",
    "virt-chroot",
    "virt-launcher",
    "virt-launcher-monitor",
    "virt-probe",
    "virt-tail",
    "virt-freezer",
    "libvirt-hook-client",
    "launcher-files/node-labeller.sh",
];

/// virt-launcher-monitor carries `cap_net_bind_service` as a file capability (KubeVirt's `setcaps`): the launcher
/// runs as 107 and passes it to virtqemud as an ambient capability.
const CAP_NET_BIND_SERVICE: u32 = 10;
/// KubeVirt's `qemu` user and group, which non-root launchers run as.
const QEMU_USER: u32 = 107;

/// Builds KubeVirt's image and imports it under the three names.
pub fn images(node: &RealNode) -> Result<()> {
    let started = Instant::now();
    let dir = node.dir.join("images");
    std::fs::create_dir_all(&dir)?;
    let top = dir.join("kubevirt-layer");
    let _ = std::fs::remove_dir_all(&top);
    top_layer(&node.tools, &top)?;
    let base = image::base_rootfs(&image::default_cache()?, &KUBEVIRT_BASE)?;
    // virt-handler's container names no user and must run as root; the launcher's names 107.
    let config = image_config(LAUNCHER_IMAGE, "0");
    let archive = dir.join("kubevirt.oci.tar");
    oci::write_layered_archive(&[&base, &top], &config, &archive)?;
    std::fs::remove_dir_all(&top)?;
    node.import_image(&archive)?;
    std::fs::remove_file(&archive)?;
    node.tag_image(LAUNCHER_IMAGE, HANDLER_IMAGE)?;

    // virt-controller (static, pure Go) alone, as KubeVirt's distroless image has it: its Deployment asks for a
    // non-root user and names none, so the image's is 1001, as upstream's.
    let controller = dir.join("virt-controller-root");
    let _ = std::fs::remove_dir_all(&controller);
    std::fs::create_dir_all(controller.join("usr/bin"))?;
    std::fs::create_dir_all(controller.join("tmp"))?;
    std::fs::set_permissions(
        controller.join("tmp"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )?;
    std::fs::copy(
        node.tools.join(CONTROLLER),
        controller.join("usr/bin").join(CONTROLLER),
    )?;
    let archive = dir.join("virt-controller.oci.tar");
    oci::write_archive(
        &controller,
        &image_config(CONTROLLER_IMAGE, "1001"),
        &archive,
    )?;
    std::fs::remove_dir_all(&controller)?;
    node.import_image(&archive)?;
    std::fs::remove_file(&archive)?;
    tracing::info!(
        "KubeVirt's image built and imported in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn image_config(name: &str, user: &str) -> ImageConfig {
    ImageConfig {
        name: name.into(),
        user: user.into(),
        entrypoint: vec![],
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
    }
}

/// What KubeVirt's build puts on its base: the binaries, libvirt's and QEMU's configuration from KubeVirt's
/// module, the libvirt hook, the virtqemud shim, the OVMF names, `/var/run` as a link and an empty
/// `/usr/lib64/qemu-kvm`.
fn top_layer(tools: &Path, top: &Path) -> Result<()> {
    let files = tools.join("launcher-files");
    let copy = |from: &Path, to: &str, mode: u32| -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if !from.exists() {
            bail!(
                "{} is missing: hack/setup.sh --node builds KubeVirt's components",
                from.display()
            );
        }
        let to = top.join(to);
        std::fs::create_dir_all(to.parent().context("a file in the image has a directory")?)?;
        std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    for binary in BINARIES {
        let name = Path::new(binary)
            .file_name()
            .context("a binary has a name")?;
        copy(
            &tools.join(binary),
            &format!("usr/bin/{}", name.to_string_lossy()),
            0o755,
        )?;
    }
    oci::set_file_capability(
        &top.join("usr/bin/virt-launcher-monitor"),
        &oci::file_capability(&[CAP_NET_BIND_SERVICE], true),
    )?;
    for conf in ["qemu.conf", "virtqemud.conf"] {
        copy(&files.join(conf), &format!("etc/libvirt/{conf}"), 0o644)?;
    }
    copy(&files.join("nsswitch.conf"), "etc/nsswitch.conf", 0o644)?;
    copy(&files.join("qemu"), "etc/libvirt/hooks/qemu", 0o755)?;
    // The launcher (107) replaces the hook with a link to libvirt-hook-client at start.
    for hook in ["etc/libvirt/hooks", "etc/libvirt/hooks/qemu"] {
        std::os::unix::fs::chown(top.join(hook), Some(QEMU_USER), Some(QEMU_USER))?;
    }
    let shim = top.join("usr/sbin/virtqemud");
    std::fs::create_dir_all(top.join("usr/sbin"))?;
    std::fs::write(&shim, VIRTQEMUD_SHIM)?;
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let ovmf = top.join("usr/share/edk2/ovmf");
    std::fs::create_dir_all(&ovmf)?;
    for (name, target) in OVMF_LINKS {
        std::os::unix::fs::symlink(target, ovmf.join(name))?;
    }
    std::fs::create_dir_all(top.join("usr/lib64/qemu-kvm"))?;
    Ok(())
}

/// Installs virt-controller and virt-handler with `kubevirt-install` and waits until both are ready: software
/// emulation, the node labeller told to probe `qemu` (this machine's `/dev/kvm` opens but its guests hang), and
/// launcher pods given the runtime's default seccomp profile, without which a namespace that enforces Pod
/// Security's `restricted` level refuses them (KubeVirt's default install sets none).
pub async fn install(state: &LabState, node: &RealNode, client: &kube::Client) -> Result<()> {
    let started = Instant::now();
    super::run(
        Command::new(node.tools.join("kubevirt-install"))
            .arg(format!("--kubeconfig={}", state.kubeconfig.display()))
            .arg(format!("--namespace={NAMESPACE}"))
            .arg(format!("--controller-image={CONTROLLER_IMAGE}"))
            .arg(format!("--handler-image={HANDLER_IMAGE}"))
            .arg(format!("--launcher-image={LAUNCHER_IMAGE}"))
            .args([
                "--emulation",
                "--virt-type=qemu",
                "--seccomp-runtime-default",
            ]),
        "kubevirt-install",
        "",
    )?;
    let deployments: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), NAMESPACE);
    let daemonsets: kube::Api<DaemonSet> = kube::Api::namespaced(client.clone(), NAMESPACE);
    loop {
        let controller = deployments
            .get(CONTROLLER)
            .await?
            .status
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        let handler = daemonsets
            .get(HANDLER)
            .await?
            .status
            .map_or(0, |s| s.number_ready);
        if controller > 0 && handler > 0 {
            tracing::info!(
                "KubeVirt v1.9.0's virt-controller and virt-handler ready in {:.1}s",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "KubeVirt was not ready within {READY_TIMEOUT:?} (virt-controller ready: {controller}, virt-handler \
                 ready: {handler}): {}",
                super::cdi::pods_said(client, NAMESPACE).await
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
