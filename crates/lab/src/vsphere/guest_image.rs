//! Real Linux guests for the lab: Debian 12 disk images shaped like VMware VMs (PVSCSI or LSI Logic disks, a
//! vmxnet3 NIC, an initramfs with VMware's drivers and no virtio ones), one BIOS and one EFI (Secure Boot capable)
//! variant taking DHCP on any NIC, a BIOS variant with a static address on `ens192` (ifupdown, as Debian's installer
//! configures a server on VMware), an EFI variant with static addresses on two NICs (NetworkManager keyfiles, as
//! RHEL 9 configures them), plus a data disk holding a file of known sha256.
//!
//! The recipe is `guest/debian12.sh`, compiled in: its sha256 names the cache entry, so the images are rebuilt
//! exactly when the recipe changes. It builds from Debian's packages only (mmdebstrap), without loop devices or mounts
//! of its own: file systems are made from directories (`mkfs.ext4 -d`, mtools), GRUB's BIOS boot code is written with
//! dd, and the ESP gets Debian's signed shim and GRUB. It needs root, as mmdebstrap's root mode chroots into the tree.
//! A cold build takes minutes (downloading and installing ~200 packages); a warm call reads a manifest.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The recipe: a bash script, run as `bash debian12.sh build OUT`.
pub const RECIPE: &str = include_str!("../../guest/debian12.sh");

/// Overrides where the images are cached (default: a `guests` directory beside the Go tools' cache).
pub const GUESTS_DIR_ENV: &str = "FERRY_GUESTS_DIR";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    Bios,
    Efi,
}

/// One bootable root disk (raw, sparse). Boot it from a copy or an overlay: the cached file is shared.
#[derive(Debug, Clone)]
pub struct GuestImage {
    pub hostname: String,
    pub firmware: Firmware,
    pub root: PathBuf,
    pub root_uuid: String,
    pub size: u64,
    pub kernel: String,
    /// The addresses its own configuration gives the interfaces it names, in the VM's NIC order; none for a guest
    /// taking DHCP on any NIC.
    pub static_networks: Vec<StaticNetwork>,
}

/// A static address as the guest's configuration names it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StaticNetwork {
    /// The interface the configuration names (`ens192`).
    pub interface: String,
    pub address: String,
    pub prefix_length: u8,
    #[serde(default)]
    pub gateway: Option<String>,
}

/// The variants and the data disk they mount at `/data` (by its UUID, without `nofail`).
#[derive(Debug, Clone)]
pub struct GuestImages {
    pub dir: PathBuf,
    pub recipe_hash: String,
    pub bios: GuestImage,
    pub efi: GuestImage,
    /// BIOS, with a static address on `ens192` (ifupdown).
    pub static_ifupdown: GuestImage,
    /// EFI with Secure Boot, with static addresses on `ens192` and `ens224` (NetworkManager).
    pub static_nm: GuestImage,
    pub data: PathBuf,
    pub data_uuid: String,
    pub data_payload_sha256: String,
}

/// The first 16 hex digits of the recipe's sha256.
pub fn recipe_hash() -> String {
    crate::disks::hex(&Sha256::digest(RECIPE.as_bytes()))[..16].to_string()
}

/// `$FERRY_GUESTS_DIR`, else `guests` beside `$FERRY_TOOLS_DIR`, else `~/.cache/ferry/guests`.
pub fn default_cache_root() -> Result<PathBuf> {
    let env = |name| std::env::var_os(name).map(PathBuf::from);
    cache_root_from(env(GUESTS_DIR_ENV), env("FERRY_TOOLS_DIR"), env("HOME"))
        .context("no cache directory for guest images: set FERRY_GUESTS_DIR or HOME")
}

fn cache_root_from(
    guests: Option<PathBuf>,
    tools: Option<PathBuf>,
    home: Option<PathBuf>,
) -> Option<PathBuf> {
    guests
        .or_else(|| tools.map(|t| t.parent().unwrap_or(Path::new("/")).join("guests")))
        .or_else(|| home.map(|h| h.join(".cache/ferry/guests")))
}

/// The cached images for this recipe, if they were built; never builds.
pub fn cached_guest_images() -> Option<GuestImages> {
    let dir = default_cache_root().ok()?.join(recipe_hash());
    load(&dir, &recipe_hash()).ok().flatten()
}

/// Returns the cached images for this recipe, building them first if needed. Concurrent callers (parallel test
/// binaries) wait on a file lock for one builder; a build goes to a temporary directory renamed into place.
pub fn ensure_guest_images(cache_root: Option<&Path>) -> Result<GuestImages> {
    let root = match cache_root {
        Some(root) => root.to_path_buf(),
        None => default_cache_root()?,
    };
    let hash = recipe_hash();
    let dir = root.join(&hash);
    if let Some(images) = load(&dir, &hash)? {
        return Ok(images);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let lock = File::create(root.join(".lock"))?;
    lock.lock()
        .with_context(|| format!("locking {}/.lock", root.display()))?;
    if let Some(images) = load(&dir, &hash)? {
        return Ok(images);
    }
    build(&root, &dir, &hash)?;
    load(&dir, &hash)?.context("the recipe finished without a manifest")
}

fn build(root: &Path, dir: &Path, hash: &str) -> Result<()> {
    let tmp = TempDir::fresh(root.join(format!(".{hash}.tmp")))?;
    let script = tmp.0.join("debian12.sh");
    std::fs::write(&script, RECIPE)?;
    let missing = Command::new("bash")
        .arg(&script)
        .arg("check-tools")
        .output()
        .context("running bash")?;
    let missing = String::from_utf8_lossy(&missing.stdout);
    if !missing.trim().is_empty() {
        bail!(
            "the guest image recipe needs tools that are missing: {} (hack/setup.sh installs them)",
            missing.trim().replace('\n', ", ")
        );
    }
    eprintln!(
        "building the Debian 12 guest images into {} (minutes, once per recipe)",
        dir.display()
    );
    let status = Command::new("bash")
        .arg(&script)
        .arg("build")
        .arg(&tmp.0)
        .env("FERRY_GUEST_RECIPE_HASH", hash)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .context("running the guest image recipe")?;
    if !status.success() {
        bail!("the guest image recipe failed ({status}); its log is above");
    }
    std::fs::rename(&tmp.0, dir)
        .with_context(|| format!("moving the images to {}", dir.display()))?;
    Ok(()) // dropping `tmp` now removes nothing: it was renamed
}

/// A directory removed when dropped (a failed build leaves nothing behind).
struct TempDir(PathBuf);

impl TempDir {
    fn fresh(path: PathBuf) -> Result<Self> {
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("removing a stale {}", path.display()))?;
        }
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Deserialize)]
struct Manifest {
    recipe_hash: String,
    kernel: String,
    data: DataDisk,
    variants: Vec<Variant>,
}

#[derive(Deserialize)]
struct DataDisk {
    file: String,
    uuid: String,
    payload_sha256: String,
}

#[derive(Deserialize)]
struct Variant {
    name: String,
    hostname: String,
    firmware: Firmware,
    file: String,
    size: u64,
    root_uuid: String,
    #[serde(default)]
    networks: Vec<StaticNetwork>,
}

fn load(dir: &Path, hash: &str) -> Result<Option<GuestImages>> {
    let path = dir.join("manifest.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    parse_manifest(dir, hash, &text)
        .with_context(|| format!("reading {}", path.display()))
        .map(Some)
}

fn parse_manifest(dir: &Path, hash: &str, text: &str) -> Result<GuestImages> {
    let manifest: Manifest = serde_json::from_str(text)?;
    if manifest.recipe_hash != hash {
        bail!(
            "it was built by recipe {}, not {hash}",
            manifest.recipe_hash
        );
    }
    let variant = |name: &str| -> Result<GuestImage> {
        let v = manifest
            .variants
            .iter()
            .find(|v| v.name == name)
            .with_context(|| format!("no {name} variant"))?;
        Ok(GuestImage {
            hostname: v.hostname.clone(),
            firmware: v.firmware,
            root: dir.join(&v.file),
            root_uuid: v.root_uuid.clone(),
            size: v.size,
            kernel: manifest.kernel.clone(),
            static_networks: v.networks.clone(),
        })
    };
    Ok(GuestImages {
        dir: dir.to_path_buf(),
        recipe_hash: manifest.recipe_hash.clone(),
        bios: variant("bios")?,
        efi: variant("efi")?,
        static_ifupdown: variant("static")?,
        static_nm: variant("nm")?,
        data: dir.join(&manifest.data.file),
        data_uuid: manifest.data.uuid.clone(),
        data_payload_sha256: manifest.data.payload_sha256.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_sits_beside_the_tools_unless_told_otherwise() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(cache_root_from(p("/g"), p("/t/tools"), p("/root")), p("/g"));
        assert_eq!(
            cache_root_from(None, p("/c/ferry/tools"), p("/root")),
            p("/c/ferry/guests")
        );
        assert_eq!(
            cache_root_from(None, None, p("/root")),
            p("/root/.cache/ferry/guests")
        );
        assert_eq!(cache_root_from(None, None, None), None);
    }

    #[test]
    fn a_manifest_from_another_recipe_is_refused() {
        let text = r#"{"recipe_hash": "aaaa", "kernel": "6.1.0-1-amd64",
            "data": {"file": "data.raw", "uuid": "u", "payload_sha256": "s"},
            "variants": [
              {"name": "bios", "hostname": "b", "firmware": "bios", "file": "bios.raw", "size": 1, "root_uuid": "r1"},
              {"name": "efi", "hostname": "e", "firmware": "efi", "file": "efi.raw", "size": 1, "root_uuid": "r2"},
              {"name": "static", "hostname": "s", "firmware": "bios", "file": "static.raw", "size": 1, "root_uuid": "r3",
               "networks": [{"interface": "ens192", "address": "192.168.50.10", "prefix_length": 24, "gateway": "192.168.50.1"}]},
              {"name": "nm", "hostname": "n", "firmware": "efi", "file": "nm.raw", "size": 1, "root_uuid": "r4",
               "networks": [{"interface": "ens192", "address": "192.168.50.11", "prefix_length": 24, "gateway": "192.168.50.1"},
                            {"interface": "ens224", "address": "192.168.60.11", "prefix_length": 24}]}]}"#;
        let images = parse_manifest(Path::new("/c/aaaa"), "aaaa", text).unwrap();
        assert_eq!(images.efi.root, Path::new("/c/aaaa/efi.raw"));
        assert_eq!(images.bios.hostname, "b");
        assert_eq!(images.bios.static_networks, []);
        assert_eq!(images.static_ifupdown.firmware, Firmware::Bios);
        assert_eq!(
            images.static_ifupdown.static_networks[0].interface,
            "ens192"
        );
        let nm: Vec<_> = images
            .static_nm
            .static_networks
            .iter()
            .map(|n| n.gateway.as_deref())
            .collect();
        assert_eq!(nm, [Some("192.168.50.1"), None]);
        assert_eq!(images.data_payload_sha256, "s");
        let err = parse_manifest(Path::new("/c/aaaa"), "bbbb", text).unwrap_err();
        assert!(err.to_string().contains("recipe aaaa"), "{err}");
    }
}
