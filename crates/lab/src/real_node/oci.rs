//! Images without a registry: an OCI image archive of one layer, written from a directory, that
//! `ctr -n k8s.io image import` takes: the real node's pause, CDI and KubeVirt images, which no Dockerfile here
//! describes. The `ferry` image is not written here: buildah builds it from the `Dockerfile` (`hack/image.sh`).

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// What the image runs, as a Dockerfile's `USER`, `ENTRYPOINT` and `ENV` say it.
#[derive(Clone, Debug)]
pub struct ImageConfig {
    /// As pods name it (`ferry:0.1.0`); stored under its full reference (`docker.io/library/ferry:0.1.0`).
    pub name: String,
    pub user: String,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
}

/// The full reference containerd stores `name` under, as the kubelet resolves it: Docker Hub's `library/` for a
/// bare name, `:latest` when no tag is given.
pub fn full_reference(name: &str) -> String {
    let (path, tag) = match name.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') => (path, tag),
        _ => (name, "latest"),
    };
    let first = path.split('/').next().unwrap_or_default();
    let has_registry =
        path.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let full = match (has_registry, path.contains('/')) {
        (true, _) => path.to_string(),
        (false, true) => format!("docker.io/{path}"),
        (false, false) => format!("docker.io/library/{path}"),
    };
    format!("{full}:{tag}")
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::disks::hex(&Sha256::digest(bytes)))
}

/// An uncompressed tar of `rootfs`'s contents, symlinks kept as links, paths relative to it.
fn layer(rootfs: &Path) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    // Owners, modes and times as they are: a Debian tree needs its setuid bits, /tmp's sticky bit and its owners.
    tar.mode(tar::HeaderMode::Complete);
    tar.append_dir_all(".", rootfs)
        .with_context(|| format!("packing {}", rootfs.display()))?;
    // The tar crate writes no extended attributes: files with a file capability are written again, after a PAX
    // record that carries it, as an image builder writes them; the later entry replaces the first on unpacking.
    for (path, capability) in capabilities_under(rootfs)? {
        let relative = path.strip_prefix(rootfs)?;
        let mut pax = tar::Header::new_ustar();
        let record = pax_record(CAPABILITY_XATTR_PAX, &capability);
        pax.set_entry_type(tar::EntryType::XHeader);
        pax.set_size(record.len() as u64);
        pax.set_mode(0o644);
        pax.set_cksum();
        tar.append(&pax, record.as_slice())?;
        tar.append_path_with_name(&path, Path::new(".").join(relative))?;
    }
    Ok(tar.into_inner()?)
}

/// The xattr that holds a file capability, and its name in a PAX record (GNU tar's and containerd's spelling).
const CAPABILITY_XATTR: &str = "security.capability";
const CAPABILITY_XATTR_PAX: &str = "SCHILY.xattr.security.capability";

/// One PAX record: `<length> <key>=<value>\n`, the length counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3;
    let mut length = rest + rest.to_string().len();
    if length.to_string().len() != rest.to_string().len() {
        length += 1;
    }
    let mut record = format!("{length} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}

/// Every regular file under `dir` that carries a file capability, with its raw value.
fn capabilities_under(dir: &Path) -> Result<Vec<(std::path::PathBuf, Vec<u8>)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            found.extend(capabilities_under(&entry.path())?);
        } else if kind.is_file() {
            let mut value = vec![0u8; 64];
            if let Ok(n) = rustix::fs::getxattr(entry.path(), CAPABILITY_XATTR, &mut value[..]) {
                value.truncate(n);
                found.push((entry.path(), value));
            }
        }
    }
    Ok(found)
}

/// A file capability's xattr value (VFS_CAP_REVISION_2) granting `capabilities` (bit numbers) as permitted and,
/// with `effective`, raised on exec: what `setcap cap_x+ep` writes.
pub fn file_capability(capabilities: &[u32], effective: bool) -> Vec<u8> {
    const REVISION_2: u32 = 0x0200_0000;
    let mut permitted = [0u32; 2];
    for &bit in capabilities {
        permitted[(bit / 32) as usize] |= 1 << (bit % 32);
    }
    let mut value = (REVISION_2 | u32::from(effective)).to_le_bytes().to_vec();
    for word in permitted {
        value.extend_from_slice(&word.to_le_bytes());
        value.extend_from_slice(&0u32.to_le_bytes());
    }
    value
}

/// Sets `capability` (see [`file_capability`]) on `path`, for [`layer`] to pack.
pub fn set_file_capability(path: &Path, capability: &[u8]) -> Result<()> {
    rustix::fs::setxattr(
        path,
        CAPABILITY_XATTR,
        capability,
        rustix::fs::XattrFlags::empty(),
    )
    .with_context(|| format!("setting a file capability on {}", path.display()))
}

fn config(image: &ImageConfig, diff_ids: &[String]) -> Value {
    json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"User": image.user, "Entrypoint": image.entrypoint, "Env": image.env},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    })
}

/// Writes the archive of `rootfs` as `image` to `out`; returns the manifest's digest.
pub fn write_archive(rootfs: &Path, image: &ImageConfig, out: &Path) -> Result<String> {
    write_layered_archive(&[rootfs], image, out)
}

/// [`write_archive`] with one layer per directory, the first at the bottom: a base tree and what is built on it.
pub fn write_layered_archive(layers: &[&Path], image: &ImageConfig, out: &Path) -> Result<String> {
    let layers = layers
        .iter()
        .map(|dir| layer(dir))
        .collect::<Result<Vec<_>>>()?;
    let diff_ids: Vec<String> = layers.iter().map(|l| digest(l)).collect();
    let config = serde_json::to_vec(&config(image, &diff_ids))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(&config), "size": config.len()},
        "layers": layers.iter().map(|l| json!({"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest(l), "size": l.len()})).collect::<Vec<_>>(),
    }))?;
    let manifest_digest = digest(&manifest);
    let reference = full_reference(&image.name);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": manifest_digest, "size": manifest.len(),
                       "annotations": {"io.containerd.image.name": reference,
                                       "org.opencontainers.image.ref.name": reference.rsplit_once(':').map_or("latest", |(_, t)| t)}}],
    }))?;
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut archive = tar::Builder::new(std::io::BufWriter::new(file));
    let mut add = |path: &str, bytes: &[u8]| -> Result<()> {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        archive.append_data(&mut header, path, bytes)?;
        Ok(())
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    for blob in layers.iter().chain([&config, &manifest]) {
        add(&format!("blobs/sha256/{}", &digest(blob)[7..]), blob)?;
    }
    archive.into_inner()?.flush()?;
    Ok(manifest_digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    #[test]
    fn names_resolve_as_the_kubelet_resolves_them() {
        assert_eq!(
            full_reference("ferry:0.1.0"),
            "docker.io/library/ferry:0.1.0"
        );
        assert_eq!(full_reference("pause"), "docker.io/library/pause:latest");
        assert_eq!(full_reference("team/ferry:1"), "docker.io/team/ferry:1");
        assert_eq!(
            full_reference("localhost/pause:local"),
            "localhost/pause:local"
        );
        assert_eq!(
            full_reference("registry.example:5000/ferry"),
            "registry.example:5000/ferry:latest"
        );
    }

    #[test]
    fn a_file_capability_is_what_setcap_writes_and_its_pax_record_counts_itself() {
        // `setcap cap_net_bind_service+ep` (bit 10): revision 2 with the effective flag, then permitted and
        // inheritable for each of the two 32-bit words.
        assert_eq!(
            file_capability(&[10], true),
            [1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let record = pax_record(CAPABILITY_XATTR_PAX, &file_capability(&[10], true));
        let text = String::from_utf8_lossy(&record);
        let (length, _) = text.split_once(' ').unwrap();
        assert_eq!(length.parse::<usize>().unwrap(), record.len());
        assert_eq!(pax_record("k", b"v"), b"6 k=v\n");
        // Where adding the length's own digits carries it to one more digit.
        let record = pax_record("k", &[b'v'; 94]);
        assert_eq!(record.len(), 101);
        assert!(record.starts_with(b"101 k="));
    }

    #[test]
    fn the_archive_holds_the_directory_and_every_digest_matches_its_blob() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(root.join("usr/bin/hello"), b"#!/bin/sh\necho hi\n").unwrap();
        std::os::unix::fs::symlink("hello", root.join("usr/bin/hi")).unwrap();
        let image = ImageConfig {
            name: "ferry:0.1.0".into(),
            user: "65532:65532".into(),
            entrypoint: vec!["ferry".into()],
            env: vec!["PATH=/usr/bin".into()],
        };
        let out = dir.path().join("image.tar");
        let manifest_digest = write_archive(&root, &image, &out).unwrap();

        let mut files = BTreeMap::new();
        let mut archive = tar::Archive::new(std::fs::File::open(&out).unwrap());
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut bytes = vec![];
            entry.read_to_end(&mut bytes).unwrap();
            files.insert(path, bytes);
        }
        for (path, bytes) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(format!("sha256:{hex}"), digest(bytes), "{path}");
            }
        }
        let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(entry["digest"], manifest_digest.as_str());
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"],
            "docker.io/library/ferry:0.1.0"
        );
        let manifest: Value =
            serde_json::from_slice(&files[&format!("blobs/sha256/{}", &manifest_digest[7..])])
                .unwrap();
        let config_digest = manifest["config"]["digest"].as_str().unwrap();
        let config: Value =
            serde_json::from_slice(&files[&format!("blobs/sha256/{}", &config_digest[7..])])
                .unwrap();
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );

        // The layer holds the file and the link as a link.
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        let layer = &files[&format!("blobs/sha256/{}", &layer_digest[7..])];
        let mut found = BTreeMap::new();
        for entry in tar::Archive::new(layer.as_slice()).entries().unwrap() {
            let entry = entry.unwrap();
            found.insert(
                entry.path().unwrap().display().to_string(),
                entry.header().entry_type(),
            );
        }
        assert_eq!(
            found.get("usr/bin/hello"),
            Some(&tar::EntryType::Regular),
            "{found:?}"
        );
        assert_eq!(
            found.get("usr/bin/hi"),
            Some(&tar::EntryType::Symlink),
            "{found:?}"
        );
    }
}
