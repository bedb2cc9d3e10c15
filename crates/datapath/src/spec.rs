//! The conversion Job's input: which disks to move, from where, to where. Credentials are paths to mounted
//! files, never values, so the spec itself holds no secret.

use std::path::{Path, PathBuf};

use ferry_types::DiskFormat;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConvertSpec {
    pub source: SourceSpec,
    pub disks: Vec<DiskSpec>,
    pub format: DiskFormat,
    pub staging: StagingSpec,
    /// Where qcow2 conversion keeps its scratch copy.
    #[serde(default = "default_scratch")]
    pub scratch_dir: PathBuf,
    /// Disks converted at once.
    #[serde(default = "default_parallel")]
    pub parallel: usize,
}

fn default_scratch() -> PathBuf {
    std::env::temp_dir()
}

fn default_parallel() -> usize {
    2
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceSpec {
    pub url: String,
    /// A directory with the files `user` and `password` (a mounted Secret).
    pub credentials_dir: PathBuf,
    /// Exactly one of: a PEM file, PEM text (a Provider's public caBundle), a pinned thumbprint, or `insecure`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    #[serde(default)]
    pub thumbprint: Option<String>,
    #[serde(default)]
    pub insecure: bool,
    pub datacenter: String,
    /// The VM's identity, recorded with each staged disk.
    pub vm_uuid: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpec {
    pub index: u32,
    /// `[datastore] dir/disk.vmdk`
    pub file: String,
    pub capacity_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StagingSpec {
    /// `file:///dir/prefix` or `s3://bucket/prefix`.
    pub url: String,
    /// For s3: a directory with `accessKeyId` and `secretKey` files (a mounted Secret).
    #[serde(default)]
    pub credentials_dir: Option<PathBuf>,
    /// For s3 outside AWS, for example `http://minio.storage:9000`.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
}

impl ConvertSpec {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Spec(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| Error::Spec(format!("{}: {e}", path.display())))
    }

    pub fn parse(text: &str) -> Result<Self> {
        let spec: Self = serde_json::from_str(text).map_err(|e| Error::Spec(e.to_string()))?;
        if spec.disks.is_empty() {
            return Err(Error::Spec("the spec lists no disk".into()));
        }
        Ok(spec)
    }
}

/// Reads one value of a mounted Secret, without a trailing newline.
pub fn read_secret(dir: &Path, key: &str) -> Result<String> {
    let path = dir.join(key);
    std::fs::read_to_string(&path)
        .map(|s| s.trim_end_matches(['\r', '\n']).to_string())
        .map_err(|e| {
            Error::Spec(format!(
                "reading the credential file {}: {e}",
                path.display()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_without_disks_or_with_bad_json_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(ConvertSpec::load(&path), Err(Error::Spec(_))));
        let empty = serde_json::json!({
            "source": {"url": "https://vc/sdk", "credentialsDir": "/creds", "insecure": true, "datacenter": "DC0", "vmUuid": "u"},
            "disks": [], "format": "raw", "staging": {"url": "file:///tmp/s"}
        });
        std::fs::write(&path, empty.to_string()).unwrap();
        let e = ConvertSpec::load(&path).unwrap_err();
        assert!(e.to_string().contains("no disk"), "{e}");
        assert_eq!(e.class(), ferry_types::ErrorClass::Permanent);
    }

    #[test]
    fn secrets_are_read_without_their_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
        assert_eq!(read_secret(dir.path(), "password").unwrap(), "s3cret");
        assert!(read_secret(dir.path(), "user").is_err());
    }
}
