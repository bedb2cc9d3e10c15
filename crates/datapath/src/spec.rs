//! The conversion Job's input: which disks to move, from where, to where. Credentials are paths to mounted
//! files, never values, so the spec itself holds no secret.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_types::DiskFormat;
use ferry_vsphere::{Backoff, TlsMode, TransferPolicy};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConvertSpec {
    pub source: SourceSpec,
    pub disks: Vec<DiskSpec>,
    pub format: DiskFormat,
    /// Stage each disk in an object store; unset, each disk is written into its volume (`volumes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<StagingSpec>,
    /// Where each disk is written when nothing is staged: a blank DataVolume's `disk.img` or block device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeSpec>,
    /// Disks converted at once.
    #[serde(default = "default_parallel")]
    pub parallel: usize,
    /// Timeouts, resume backoff and keepalive of the vSphere side; the defaults suit a real vCenter.
    #[serde(default)]
    pub transfer: TransferSpec,
    /// A warm migration's round: each disk copied from a snapshot (or from the powered-off VM at cutover),
    /// whole or only what changed since its last round. Unset: every disk whole, the VM off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<RoundSpec>,
}

/// What a warm round copies from. The disks' `file`s are their base files, as discovery recorded them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RoundSpec {
    /// The VM's moref: Changed Block Tracking is asked of it.
    pub vm_moref: String,
    /// The round's snapshot, whose frozen base files are read. Unset at cutover, when the VM must be off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Per disk, in the order of `disks`: the change ID its last round copied up to; unset, the disk is copied
    /// whole.
    #[serde(default)]
    pub since: Vec<Option<String>>,
    /// At cutover: each disk copied by its changed areas is also read whole from the source, and its sha256
    /// compared with the volume's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hash_source: bool,
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
    /// How the endpoint's certificate is trusted. On the wire, the four fields it always had (`caFile`,
    /// `caBundle`, `thumbprint`, `insecure`), exactly one of them set.
    #[serde(flatten)]
    pub trust: SourceTrust,
    pub datacenter: String,
    /// The VM's identity, recorded with each staged disk.
    pub vm_uuid: String,
    /// The VM's instance UUID as discovery recorded it: the Job finds the VM by it and copies nothing from a VM
    /// that has another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_uuid: Option<String>,
}

/// How the conversion Job trusts the vSphere endpoint's certificate.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(try_from = "TrustFields", into = "TrustFields")]
pub enum SourceTrust {
    /// A PEM file (mounted).
    CaFile(PathBuf),
    /// PEM text: a Provider's public `caBundle`.
    CaBundle(String),
    /// A pinned SHA-256 thumbprint.
    Thumbprint(String),
    /// No verification.
    Insecure,
}

impl SourceTrust {
    /// The vSphere client's TLS mode. A CA file is read now; nothing else can fail.
    pub fn tls_mode(&self) -> Result<TlsMode> {
        Ok(match self {
            SourceTrust::CaFile(ca) => TlsMode::CaBundle(
                std::fs::read_to_string(ca)
                    .map_err(|e| Error::Spec(format!("reading {}: {e}", ca.display())))?,
            ),
            SourceTrust::CaBundle(pem) => TlsMode::CaBundle(pem.clone()),
            SourceTrust::Thumbprint(thumbprint) => TlsMode::Thumbprint(thumbprint.clone()),
            SourceTrust::Insecure => TlsMode::InsecureSkipVerify,
        })
    }
}

/// [`SourceTrust`] as the spec's JSON spells it, unchanged from when these were four fields of [`SourceSpec`]:
/// a spec written by an earlier controller (or by hand) still reads, and a Job of an earlier release reads ours.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TrustFields {
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_bundle: Option<String>,
    #[serde(default)]
    thumbprint: Option<String>,
    #[serde(default)]
    insecure: bool,
}

impl TryFrom<TrustFields> for SourceTrust {
    type Error = String;

    fn try_from(fields: TrustFields) -> std::result::Result<Self, String> {
        match fields {
            TrustFields {
                ca_file: Some(ca),
                ca_bundle: None,
                thumbprint: None,
                insecure: false,
            } => Ok(SourceTrust::CaFile(ca)),
            TrustFields {
                ca_file: None,
                ca_bundle: Some(pem),
                thumbprint: None,
                insecure: false,
            } => Ok(SourceTrust::CaBundle(pem)),
            TrustFields {
                ca_file: None,
                ca_bundle: None,
                thumbprint: Some(thumbprint),
                insecure: false,
            } => Ok(SourceTrust::Thumbprint(thumbprint)),
            TrustFields {
                ca_file: None,
                ca_bundle: None,
                thumbprint: None,
                insecure: true,
            } => Ok(SourceTrust::Insecure),
            _ => Err(
                "the source needs exactly one of caFile, caBundle, thumbprint or insecure".into(),
            ),
        }
    }
}

impl From<SourceTrust> for TrustFields {
    fn from(trust: SourceTrust) -> Self {
        let mut fields = TrustFields {
            ca_file: None,
            ca_bundle: None,
            thumbprint: None,
            insecure: false,
        };
        match trust {
            SourceTrust::CaFile(ca) => fields.ca_file = Some(ca),
            SourceTrust::CaBundle(pem) => fields.ca_bundle = Some(pem),
            SourceTrust::Thumbprint(thumbprint) => fields.thumbprint = Some(thumbprint),
            SourceTrust::Insecure => fields.insecure = true,
        }
        fields
    }
}

/// How the download rides out a slow or flaky vCenter, in milliseconds (tests shorten them).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct TransferSpec {
    /// A stream with no byte for this long is resumed.
    pub idle_timeout_millis: u64,
    /// The first wait before asking again; each next one doubles, up to `resumeMaxDelayMillis`.
    pub resume_first_delay_millis: u64,
    pub resume_max_delay_millis: u64,
    /// Attempts in a row without progress before a disk fails.
    pub resume_attempts: u32,
    /// How often the SOAP session is renewed while disks stream (vCenter ends idle sessions after about 30
    /// minutes; govmomi renews every 10). 0: never.
    pub keepalive_millis: u64,
}

impl Default for TransferSpec {
    fn default() -> Self {
        let policy = TransferPolicy::default();
        Self {
            idle_timeout_millis: millis(policy.idle_timeout),
            resume_first_delay_millis: millis(policy.backoff.first),
            resume_max_delay_millis: millis(policy.backoff.max),
            resume_attempts: policy.backoff.attempts,
            keepalive_millis: 10 * 60 * 1000,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl TransferSpec {
    pub fn policy(&self) -> TransferPolicy {
        TransferPolicy {
            // Zero would fail every read at once.
            idle_timeout: Duration::from_millis(self.idle_timeout_millis.max(1)),
            backoff: Backoff {
                first: Duration::from_millis(self.resume_first_delay_millis),
                max: Duration::from_millis(self.resume_max_delay_millis),
                attempts: self.resume_attempts,
            },
        }
    }

    pub fn keepalive(&self) -> Option<Duration> {
        (self.keepalive_millis > 0).then(|| Duration::from_millis(self.keepalive_millis))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpec {
    pub index: u32,
    /// `[datastore] dir/disk.vmdk`
    pub file: String,
    pub capacity_bytes: u64,
}

/// The volume disk `index` is written into: an existing file (`disk.img` on a Filesystem volume) or a block
/// device. It is never created, truncated or resized: its size is what CDI gave the volume.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    pub index: u32,
    pub path: PathBuf,
    #[serde(default)]
    pub block: bool,
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
    /// PEM certificates of the CAs the endpoint's certificate is checked against, beside the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
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
        match &spec.staging {
            Some(_) if !spec.volumes.is_empty() => {
                return Err(Error::Spec(
                    "the spec names both staging and volumes: a disk goes to one of them".into(),
                ));
            }
            Some(_) => {}
            None => {
                if spec.format != DiskFormat::Raw {
                    return Err(Error::Spec(
                        "only raw disks are written into volumes; qcow2 needs staging".into(),
                    ));
                }
                for disk in &spec.disks {
                    if spec.volume(disk.index).is_none() {
                        return Err(Error::Spec(format!(
                            "disk {} has neither staging nor a volume to go to",
                            disk.index
                        )));
                    }
                }
            }
        }
        Ok(spec)
    }

    /// The volume disk `index` is written into.
    pub fn volume(&self, index: u32) -> Option<&VolumeSpec> {
        self.volumes.iter().find(|v| v.index == index)
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
    fn each_disk_goes_to_staging_or_to_its_volume() {
        let spec = |rest: serde_json::Value| {
            let mut spec = serde_json::json!({
                "source": {"url": "https://vc/sdk", "credentialsDir": "/creds", "insecure": true, "datacenter": "DC0", "vmUuid": "u"},
                "disks": [{"index": 0, "file": "[ds] a.vmdk", "capacityBytes": 1}, {"index": 1, "file": "[ds] b.vmdk", "capacityBytes": 1}],
                "format": "raw"
            });
            spec.as_object_mut()
                .unwrap()
                .extend(rest.as_object().unwrap().clone());
            ConvertSpec::parse(&spec.to_string())
        };
        let volumes = serde_json::json!([{"index": 0, "path": "/disks/0/disk.img"}, {"index": 1, "path": "/dev/ferry-disk-1", "block": true}]);
        let direct = spec(serde_json::json!({"volumes": volumes})).unwrap();
        assert!(direct.staging.is_none());
        assert!(direct.volume(1).unwrap().block);
        let e = spec(serde_json::json!({"volumes": [volumes[0]]})).unwrap_err();
        assert!(e.to_string().contains("disk 1 has neither"), "{e}");
        let e = spec(serde_json::json!({"volumes": volumes, "staging": {"url": "file:///s"}}))
            .unwrap_err();
        assert!(e.to_string().contains("both staging and volumes"), "{e}");
        let e = spec(serde_json::json!({"volumes": volumes, "format": "qcow2"})).unwrap_err();
        assert!(e.to_string().contains("qcow2 needs staging"), "{e}");
        assert!(spec(serde_json::json!({"staging": {"url": "file:///s"}})).is_ok());
    }

    #[test]
    fn source_trust_keeps_the_four_fields_on_the_wire() {
        let source = |trust: serde_json::Value| {
            let mut source = serde_json::json!({
                "url": "https://vc/sdk", "credentialsDir": "/creds", "datacenter": "DC0", "vmUuid": "u"
            });
            source
                .as_object_mut()
                .unwrap()
                .extend(trust.as_object().unwrap().clone());
            serde_json::from_value::<SourceSpec>(source).map(|s| s.trust)
        };
        // What the controller wrote for each choice, before the enum.
        let written = [
            (
                serde_json::json!({"caFile": "/ca.pem", "thumbprint": null, "insecure": false}),
                SourceTrust::CaFile("/ca.pem".into()),
            ),
            (
                serde_json::json!({"caFile": null, "caBundle": "PEM", "thumbprint": null, "insecure": false}),
                SourceTrust::CaBundle("PEM".into()),
            ),
            (
                serde_json::json!({"caFile": null, "thumbprint": "AB:CD", "insecure": false}),
                SourceTrust::Thumbprint("AB:CD".into()),
            ),
            (
                serde_json::json!({"caFile": null, "thumbprint": null, "insecure": true}),
                SourceTrust::Insecure,
            ),
        ];
        for (json, trust) in written {
            assert_eq!(source(json.clone()).unwrap(), trust);
            let spec = SourceSpec {
                url: "https://vc/sdk".into(),
                credentials_dir: "/creds".into(),
                trust,
                datacenter: "DC0".into(),
                vm_uuid: "u".into(),
                instance_uuid: None,
            };
            let mut back = serde_json::to_value(&spec).unwrap();
            for key in ["url", "credentialsDir", "datacenter", "vmUuid"] {
                back.as_object_mut().unwrap().remove(key);
            }
            assert_eq!(back, json);
        }
        for wrong in [
            serde_json::json!({}),
            serde_json::json!({"thumbprint": "AB", "insecure": true}),
            serde_json::json!({"caFile": "/ca.pem", "caBundle": "PEM"}),
        ] {
            let e = source(wrong).unwrap_err().to_string();
            assert!(e.contains("exactly one of caFile"), "{e}");
        }
    }

    #[test]
    fn transfer_settings_default_to_a_real_vcenter_and_can_be_shortened() {
        let spec: ConvertSpec = serde_json::from_value(serde_json::json!({
            "source": {"url": "https://vc/sdk", "credentialsDir": "/creds", "insecure": true, "datacenter": "DC0", "vmUuid": "u"},
            "disks": [{"index": 0, "file": "[ds] a.vmdk", "capacityBytes": 1}], "format": "raw",
            "staging": {"url": "file:///tmp/s"}
        }))
        .unwrap();
        assert_eq!(spec.transfer.policy(), TransferPolicy::default());
        assert_eq!(spec.transfer.keepalive(), Some(Duration::from_secs(600)));
        let short: TransferSpec = serde_json::from_value(serde_json::json!({
            "resumeFirstDelayMillis": 10, "resumeAttempts": 3, "keepaliveMillis": 0
        }))
        .unwrap();
        assert_eq!(
            short.policy().backoff.delay(1),
            Some(Duration::from_millis(10))
        );
        assert_eq!(short.policy().backoff.delay(4), None);
        assert_eq!(short.policy().idle_timeout, Duration::from_secs(60));
        assert_eq!(short.keepalive(), None);
    }

    #[test]
    fn secrets_are_read_without_their_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("password"), "s3cret\n").unwrap();
        assert_eq!(read_secret(dir.path(), "password").unwrap(), "s3cret");
        assert!(read_secret(dir.path(), "user").is_err());
    }
}
