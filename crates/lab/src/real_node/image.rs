//! Images without a registry. The `ferry` image is the repository's `Dockerfile` built by buildah (`hack/image.sh`:
//! its bases made from Debian's archive, the `ferry` binary built as the Dockerfile builds it, without the lab,
//! given as the `binary` build context), an OCI archive cached by its inputs. CDI's and KubeVirt's images, which no
//! Dockerfile here describes, are trees of Debian packages built with mmdebstrap (cached, built once per package
//! list) with their binaries as a layer on top, written by the lab's own OCI writer ([`oci`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::real_node::oci::{self, ImageConfig};

/// A tree of Debian packages that images are built on: cached by its recipe, built once with mmdebstrap.
pub struct Base {
    /// Names the cached tree (`<label>-base-<hash of the recipe>`).
    pub label: &'static str,
    pub suite: &'static str,
    pub packages: &'static [&'static str],
    /// A shell command mmdebstrap runs on the finished tree (`$1` is its root).
    pub hook: &'static str,
    /// A file every complete tree has: a tree without it is rebuilt.
    pub probe: &'static str,
}

/// The Dockerfile's runtime stage as a tree (`FROM debian:trixie-slim` and its `apt-get install` line): the base of
/// CDI's images on the real node, which run `qemu-img` and `nbdkit` as the `ferry` image does. The kernel must be
/// readable by the Jobs' users (libguestfs's supermin builds its appliance from it).
pub const FERRY_BASE: Base = Base {
    label: "ferry",
    suite: "trixie",
    packages: &[
        "ca-certificates",
        "qemu-utils",
        "virt-v2v",
        "nbdkit",
        "guestfish",
        "linux-image-amd64",
    ],
    hook: r#"chmod a+r "$1"/boot/vmlinuz-*"#,
    probe: "usr/bin/qemu-img",
};
const MIRROR: &str = "http://deb.debian.org/debian";
/// The Dockerfile's `USER`: no passwd entry, as there.
pub const USER: &str = "65532:65532";

/// The image name deploy/controller.yaml runs (its `image` and `FERRY_WORKER_IMAGE`).
pub const FERRY_IMAGE: &str = "ferry:0.1.0";

impl Base {
    /// What names the cached tree: the suite, the packages and the hook that adjusts it.
    fn key(&self) -> String {
        let recipe = format!("{} {} {}", self.suite, self.packages.join(","), self.hook);
        crate::disks::hex(&Sha256::digest(recipe.as_bytes()))[..16].to_string()
    }
}

/// The tree of `base` in `cache`, built with mmdebstrap (root mode) if absent.
pub fn base_rootfs(cache: &Path, base: &Base) -> Result<PathBuf> {
    let name = format!("{}-base-{}", base.label, base.key());
    let tree = cache.join(&name);
    if tree.join(base.probe).exists() {
        return Ok(tree);
    }
    let staging = cache.join(format!("{name}.partial"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(cache)?;
    let packages = base.packages.join(",");
    tracing::info!(
        "building the {} image's base ({}: {packages}) with mmdebstrap into {}; a few minutes, once",
        base.label,
        base.suite,
        tree.display()
    );
    let out = Command::new("mmdebstrap")
        .args(["--mode=root", "--variant=apt", "--quiet"])
        // The Dockerfile's --no-install-recommends.
        .arg("--aptopt=APT::Install-Recommends \"false\"")
        .arg(format!("--include={packages}"))
        .arg(format!("--customize-hook={}", base.hook))
        .args([
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
        ])
        .arg(base.suite)
        .arg(&staging)
        .arg(MIRROR)
        .output()
        .context("running mmdebstrap (apt-get install mmdebstrap)")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        bail!(
            "mmdebstrap could not build the {} image's base:\n{}",
            base.label,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    std::fs::rename(&staging, &tree)?;
    Ok(tree)
}

/// The `ferry` binary the image ships, built as the Dockerfile builds it: without the `lab` feature, so without the
/// lab, the benchmarks and vSphere provisioning. It has a target directory of its own so that the lab's binary (with
/// them) is not replaced; `FERRY_SHIPPED_BIN` names one already built.
pub fn shipped_binary() -> Result<PathBuf> {
    if let Some(binary) = std::env::var_os("FERRY_SHIPPED_BIN") {
        return Ok(binary.into());
    }
    let workspace = workspace();
    let target = workspace.join("target/shipped");
    tracing::info!(
        "building the shipped ferry binary (--no-default-features) into {}",
        target.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--locked",
            "--no-default-features",
            "--bin",
            "ferry",
        ])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(&workspace)
        .status()
        .context("running cargo to build the shipped ferry binary")?;
    if !status.success() {
        bail!(
            "building the shipped ferry binary failed ({status}); set FERRY_SHIPPED_BIN to one built with --no-default-features"
        );
    }
    Ok(target.join("debug/ferry"))
}

/// The workspace this lab was built from: its `Dockerfile` and `hack/` scripts.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `ferry` image (`name`) as an OCI archive, for `ctr image import`: the `Dockerfile` built by buildah with
/// `ferry` (`hack/image.sh --binary`), the archive naming it as the kubelet resolves `name`. Cached in `cache` by
/// the Dockerfile, its base and the binary: a second call with the same binary builds nothing. The first makes the
/// Debian base (under a minute) and installs the runtime packages (a few minutes); after that a new binary takes
/// seconds.
pub fn build_ferry_image(cache: &Path, ferry: &Path, name: &str) -> Result<PathBuf> {
    let script = workspace().join("hack/image.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--binary")
        .arg(ferry)
        .args(["--name", name])
        .env("FERRY_IMAGE_CACHE", cache)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        bail!(
            "{} could not build the {name} image with buildah (apt-get install buildah, or hack/setup.sh --node):\n{}",
            script.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    if let Some(summary) = stderr.lines().last() {
        tracing::info!("{summary}");
    }
    let archive = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !archive.is_file() {
        bail!(
            "{} printed no archive: {:?}",
            script.display(),
            archive.display()
        );
    }
    Ok(archive)
}

/// Writes an image of the cached `base` with `files` (each a host file and its path in the image) on top to `dir`
/// as an OCI archive named after `label`. Returns the archive's path.
pub fn build_on_base(
    cache: &Path,
    base: &Base,
    dir: &Path,
    files: &[(&Path, &str)],
    image: &ImageConfig,
    label: &str,
) -> Result<PathBuf> {
    let base = base_rootfs(cache, base)?;
    let top = dir.join(format!("{label}-layer"));
    let _ = std::fs::remove_dir_all(&top);
    for (from, to) in files {
        let to = top.join(to);
        std::fs::create_dir_all(to.parent().context("a file in the image has a directory")?)?;
        std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    let archive = dir.join(format!("{label}.oci.tar"));
    oci::write_layered_archive(&[&base, &top], image, &archive)?;
    std::fs::remove_dir_all(&top)?;
    Ok(archive)
}

/// Where base trees and the `ferry` image's archive are cached: `images` beside the guest images' cache.
pub fn default_cache() -> Result<PathBuf> {
    let guests = crate::vsphere::guest_image::default_cache_root()?;
    Ok(guests
        .parent()
        .map_or_else(|| guests.join("images"), |p| p.join("images")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_the_dockerfiles_runtime_stage() {
        let dockerfile = include_str!("../../../../Dockerfile");
        let base = FERRY_BASE;
        assert!(dockerfile.contains(&format!("ARG BASE=debian:{}-slim", base.suite)));
        assert!(dockerfile.contains("FROM ${BASE}\n"));
        assert!(dockerfile.contains(&format!(
            "--no-install-recommends {}",
            base.packages.join(" ")
        )));
        assert!(dockerfile.contains(&format!("USER {USER}")));
        assert!(dockerfile.contains(r#"ENTRYPOINT ["ferry"]"#));
        assert!(dockerfile.contains("ENV LIBGUESTFS_BACKEND=direct"));
        assert!(dockerfile.contains("chmod a+r /boot/vmlinuz-*"));
    }

    #[test]
    fn the_dockerfile_takes_a_binary_built_elsewhere_as_the_lab_gives_it() {
        // hack/image.sh --binary passes a directory holding `ferry` as the build context `binary`, which replaces
        // the stage of that name; the runtime stage copies from it.
        let dockerfile = include_str!("../../../../Dockerfile");
        assert!(dockerfile.contains(
            "FROM scratch AS binary\nCOPY --from=build /src/target/release/ferry /ferry\n"
        ));
        assert!(dockerfile.contains("COPY --from=binary /ferry /usr/local/bin/ferry\n"));
        assert!(
            include_str!("../../../../hack/image.sh")
                .contains("--build-context \"binary=$tmp/binary\"")
        );
    }

    #[test]
    fn the_archive_names_the_image_as_containerd_stores_it() {
        for name in [
            FERRY_IMAGE,
            "ferry",
            "team/ferry:1",
            "localhost/ferry:dev",
            "registry.example:5000/ferry",
            "registry.example/team/ferry:2",
        ] {
            let out = Command::new("bash")
                .arg(workspace().join("hack/image.sh"))
                .args(["--reference", name])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                oci::full_reference(name),
                "{name}"
            );
        }
    }
}
