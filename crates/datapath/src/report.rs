//! A Job's result, as it leaves it in its pod's termination message for the controller: a summary of what
//! `ferry convert` staged, the proof of `ferry verify`, or the classed error either Job ended with. The Jobs write
//! it and the controller reads it through this one type, so the two sides cannot drift apart.
//!
//! Kubernetes keeps at most 4 KiB of a termination message, so every report written fits in that: the staged
//! disks themselves are read from their manifests in the staging folder, and an error's message is shortened.

use std::path::Path;

use ferry_types::{DiskFormat, ErrorClass};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::convert::DiskResult;
use crate::direct::{ReadBack, WrittenDisk};
use crate::error::{Error, Result};
use crate::round::RoundDisk;
use crate::staging::StagedObject;
use crate::verify::Verified;

/// What Kubernetes keeps of a termination message (the kubelet cuts the rest, and a cut JSON does not parse).
pub const TERMINATION_MESSAGE_BYTES: usize = 4096;

/// On the wire, one key names the kind: `{"staged": {"bytesRead", "disks", "format", "run"}}`,
/// `{"verified": {"bytes", "sha256"}}` or `{"error": {"class", "message", "reason"}}`. A controller still reads
/// `{"disks": [...]}`, the whole list that Jobs of earlier releases wrote.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum JobReport {
    /// `ferry convert` of an earlier release: every disk staged, in index order (over 4 KiB from about 7 disks,
    /// so cut short by Kubernetes).
    Disks(Vec<DiskResult>),
    /// `ferry convert`: every disk staged; each one's result is in its manifest.
    Staged(StagedSummary),
    /// `ferry convert` without staging: every disk written into its volume, synced and read back equal.
    Written(WrittenSummary),
    /// `ferry convert` of a warm round: each disk copied whole or by its changed areas, synced and read back
    /// equal to what was read.
    Round(RoundSummary),
    /// `ferry verify`: the imported image hashes to the source's sha256.
    Verified(Verified),
    /// `ferry adapt`: virt-v2v adapted the guest; each volume's new sha256 and what it found.
    Adapted(Box<crate::adapt::AdaptedSummary>),
    /// Either Job failed: its error's class, reason and message.
    Error(JobError),
}

/// A Job's error, as the controller turns it into a failure.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(from = "serde_json::Value")]
pub struct JobError {
    pub class: ErrorClass,
    pub reason: String,
    pub message: String,
}

/// Read leniently, as the controller always has: a missing or malformed field takes its default (a bounded
/// retry, `JobFailed`, "failed") instead of making the whole report unreadable.
impl From<serde_json::Value> for JobError {
    fn from(value: serde_json::Value) -> Self {
        Self {
            class: serde_json::from_value(value["class"].clone())
                .unwrap_or(ErrorClass::BoundedRetryable),
            reason: value["reason"].as_str().unwrap_or("JobFailed").to_string(),
            message: value["message"].as_str().unwrap_or("failed").to_string(),
        }
    }
}

impl From<&Error> for JobError {
    fn from(e: &Error) -> Self {
        Self {
            class: e.class(),
            reason: e.reason().to_string(),
            message: e.to_string(),
        }
    }
}

/// `ferry convert`'s summary: disks `0..disks` are staged as `disk-<index>.<format>`, each with its manifest, and
/// the manifests this run wrote carry `run`. Its size does not grow with the number of disks.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StagedSummary {
    pub disks: u32,
    pub format: DiskFormat,
    /// Bytes read from the source in this run, over all disks.
    pub bytes_read: u64,
    pub run: String,
    /// See [`crate::memory::peak_rss_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
}

impl StagedSummary {
    pub fn of(disks: &[DiskResult], format: DiskFormat, run: &str) -> Self {
        Self {
            disks: disks.len() as u32,
            format,
            bytes_read: disks.iter().map(|d| d.bytes_read).sum(),
            run: run.to_string(),
            peak_rss_bytes: crate::memory::peak_rss_bytes(),
        }
    }

    /// Disk `index`'s result, from its manifest: copied in this run if the run marked it, else found staged.
    pub fn disk(&self, index: u32, manifest: StagedObject) -> DiskResult {
        let copied = manifest.run.as_deref() == Some(self.run.as_str());
        let read = manifest.bytes_read.unwrap_or(manifest.source_bytes);
        DiskResult {
            index,
            bytes_read: if copied { read } else { 0 },
            skipped: !copied,
            staged: manifest,
        }
    }
}

/// `ferry convert`'s summary on the direct path: each disk's sha256 (the source's, which its volume was read back
/// to match) in index order, in hex. About 67 bytes a disk, so up to [`MAX_WRITTEN_DISKS`] fit in a termination
/// message.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WrittenSummary {
    pub run: String,
    pub read_back: ReadBack,
    pub bytes_read: u64,
    /// Data written to the volumes; zeros were punched instead of written.
    pub bytes_written: u64,
    pub sha256: Vec<String>,
    /// See [`crate::memory::peak_rss_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
}

/// A warm round, disk by disk (at most about 440 bytes each, so a round of [`MAX_ROUND_DISKS`] fits in a termination
/// message).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RoundSummary {
    pub run: String,
    pub disks: Vec<RoundDisk>,
}

/// The most disks whose [`RoundSummary`] fits in a termination message.
pub const MAX_ROUND_DISKS: usize = 9;

/// The most disks whose [`WrittenSummary`] fits in a termination message.
pub const MAX_WRITTEN_DISKS: usize = 56;

impl WrittenSummary {
    pub fn of(disks: &[WrittenDisk], run: &str) -> Self {
        let buffered = disks.iter().any(|d| d.read_back == ReadBack::Buffered);
        Self {
            run: run.to_string(),
            read_back: if buffered {
                ReadBack::Buffered
            } else {
                ReadBack::Direct
            },
            bytes_read: disks.iter().map(|d| d.bytes_read).sum(),
            bytes_written: disks.iter().map(|d| d.bytes_written).sum(),
            sha256: disks.iter().map(|d| d.sha256.clone()).collect(),
            peak_rss_bytes: crate::memory::peak_rss_bytes(),
        }
    }
}

/// A name for one conversion run, unique enough to tell it from any other run of the same migration: the pod's
/// host name (the pod's own name in Kubernetes), the process, the time and a count within the process.
pub fn run_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    let seed = format!("{host}/{}/{nanos}/{count}", std::process::id());
    crate::hex(&Sha256::digest(seed.as_bytes()))[..16].to_string()
}

impl JobReport {
    /// What a Job reports for `outcome`: `ok` of its result, or its error.
    pub fn of<T>(outcome: &Result<T>, ok: impl FnOnce(&T) -> JobReport) -> Self {
        match outcome {
            Ok(value) => ok(value),
            Err(e) => JobReport::Error(e.into()),
        }
    }

    /// The report as a Job writes it. Through a `serde_json::Value`, as the Jobs' `json!` did before this type
    /// existed: object keys come out sorted, so the bytes are the same as earlier releases wrote.
    pub fn to_json(&self) -> String {
        serde_json::to_value(self)
            .expect("a report has only string keys")
            .to_string()
    }

    /// A report as the controller reads it back; `None` if the text is not one (no JSON, or another shape).
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// The report as it fits in a termination message: an error's message is shortened (ending in `…`) until
    /// the JSON is at most [`TERMINATION_MESSAGE_BYTES`]; any other report over it (only the old disk list can
    /// be) becomes an error saying so.
    pub fn to_message(&self) -> String {
        let text = self.to_json();
        if text.len() <= TERMINATION_MESSAGE_BYTES {
            return text;
        }
        let error = match self {
            JobReport::Error(e) => e.clone(),
            _ => JobError {
                class: ErrorClass::BoundedRetryable,
                reason: ferry_types::Reason::JobResultUnreadable.to_string(),
                message: format!(
                    "the report is {} bytes, over what a termination message keeps",
                    text.len()
                ),
            },
        };
        shortened(error)
    }

    /// Writes the report where the controller reads it (`path`: in a pod, its termination message) and returns
    /// the text written.
    pub fn write(&self, path: &Path) -> std::io::Result<String> {
        let text = self.to_message();
        std::fs::write(path, &text)?;
        Ok(text)
    }
}

/// The error's JSON within [`TERMINATION_MESSAGE_BYTES`], its message cut at the last character that fits (found
/// by bisection: escapes make the JSON's length per character of the message vary).
fn shortened(mut error: JobError) -> String {
    let message = std::mem::take(&mut error.message);
    let text_with = |cut: usize| {
        let mut error = error.clone();
        error.message = format!("{}…", &message[..floor_char_boundary(&message, cut)]);
        JobReport::Error(error).to_json()
    };
    let (mut fits, mut over) = (0, message.len());
    while fits < over {
        let mid = (fits + over).div_ceil(2);
        if text_with(mid).len() <= TERMINATION_MESSAGE_BYTES {
            fits = mid;
        } else {
            over = mid - 1;
        }
    }
    let text = text_with(fits);
    if text.len() <= TERMINATION_MESSAGE_BYTES {
        return text;
    }
    // Only an absurd reason can be left too long: the class alone still reads as an error.
    error.reason = "JobFailed".into();
    error.message = "…".into();
    JobReport::Error(error).to_json()
}

/// The largest index at most `index` that starts a character.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    (0..=index.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::staging::{SourceIdentity, StagedObject};

    fn disk() -> DiskResult {
        DiskResult {
            index: 0,
            staged: StagedObject {
                url: "s3://b/p/disk-0.raw".into(),
                format: "raw".into(),
                object_sha256: Some("ab".into()),
                object_bytes: 4,
                source_sha256: "ab".into(),
                source_bytes: 4,
                source: SourceIdentity {
                    vm_uuid: "u".into(),
                    disk_file: "[ds] vm/vm.vmdk".into(),
                    capacity_bytes: 4,
                },
                e_tag: None,
                run: None,
                bytes_read: None,
            },
            bytes_read: 4,
            skipped: false,
        }
    }

    #[test]
    fn every_report_reads_back_as_written() {
        let reports = [
            JobReport::Disks(vec![disk()]),
            JobReport::Verified(Verified {
                sha256: "ab".into(),
                bytes: 4,
            }),
            JobReport::Error(JobError {
                class: ErrorClass::Permanent,
                reason: "LoginFailed".into(),
                message: "login failed".into(),
            }),
        ];
        for report in reports {
            assert_eq!(JobReport::parse(&report.to_json()), Some(report));
        }
    }

    #[test]
    fn the_wire_is_what_the_jobs_wrote_before_the_type() {
        let verified = JobReport::Verified(Verified {
            sha256: "ab".into(),
            bytes: 4,
        });
        assert_eq!(
            verified.to_json(),
            serde_json::json!({"verified": {"sha256": "ab", "bytes": 4}}).to_string()
        );
        assert_eq!(
            verified.to_json(),
            r#"{"verified":{"bytes":4,"sha256":"ab"}}"#
        );
        let disks = JobReport::Disks(vec![disk()]);
        assert_eq!(
            disks.to_json(),
            serde_json::json!({"disks": [disk()]}).to_string()
        );
        let e = Error::ShortRead {
            index: 0,
            got: 1,
            expected: 2,
        };
        assert_eq!(
            JobReport::of(&Err::<(), _>(e), |_| unreachable!()).to_json(),
            r#"{"error":{"class":"BoundedRetryable","message":"disk 0: read 1 bytes from the source, expected 2","reason":"ShortRead"}}"#
        );
    }

    fn summary() -> StagedSummary {
        StagedSummary {
            disks: 12,
            format: DiskFormat::Raw,
            bytes_read: 48 << 20,
            run: "0123456789abcdef".into(),
            peak_rss_bytes: None,
        }
    }

    #[test]
    fn the_most_disks_written_directly_still_fit_a_termination_message() {
        let disk = |index| WrittenDisk {
            index,
            sha256: "f".repeat(64),
            bytes_read: u64::MAX / 64,
            bytes_written: u64::MAX / 64,
            read_back: ReadBack::Buffered,
        };
        let disks: Vec<_> = (0..MAX_WRITTEN_DISKS as u32).map(disk).collect();
        let mut summary = WrittenSummary::of(&disks, &"r".repeat(16));
        summary.peak_rss_bytes = Some(u64::MAX);
        let report = JobReport::Written(summary);
        let text = report.to_message();
        assert!(text.len() <= TERMINATION_MESSAGE_BYTES, "{}", text.len());
        assert_eq!(JobReport::parse(&text), Some(report));
        let more: Vec<_> = (0..MAX_WRITTEN_DISKS as u32 + 4).map(disk).collect();
        let over = JobReport::Written(WrittenSummary::of(&more, "r")).to_message();
        assert!(over.contains("JobResultUnreadable"), "{over}");
    }

    #[test]
    fn a_round_of_the_most_disks_fits_in_a_termination_message() {
        use crate::round::{REASON_CHARS, RoundKind};
        let disk = |index| RoundDisk {
            index,
            kind: RoundKind::FullAfterReset,
            reason: Some("r".repeat(REASON_CHARS)),
            change_id: Some("52 de c0 d9 b9 43 9d 10-61 d5 4c 1b e9 7b 65 63/4294967295".into()),
            areas: u64::MAX,
            bytes_read: u64::MAX,
            bytes_written: u64::MAX,
            sha256: "a".repeat(64),
            read_back: ReadBack::Buffered,
        };
        let round = |n: usize| {
            JobReport::Round(RoundSummary {
                run: "r".repeat(16),
                disks: (0..n as u32).map(disk).collect(),
            })
        };
        let report = round(MAX_ROUND_DISKS);
        let text = report.to_message();
        assert!(text.len() <= TERMINATION_MESSAGE_BYTES, "{}", text.len());
        assert_eq!(JobReport::parse(&text), Some(report));
        let over = round(MAX_ROUND_DISKS + 1).to_message();
        assert!(over.contains("JobResultUnreadable"), "{over}");
    }

    #[test]
    fn the_summary_stays_small_whatever_the_disk_count() {
        let report = JobReport::Staged(summary());
        assert_eq!(
            report.to_message(),
            r#"{"staged":{"bytesRead":50331648,"disks":12,"format":"raw","run":"0123456789abcdef"}}"#
        );
        assert_eq!(JobReport::parse(&report.to_message()), Some(report));
        let many = JobReport::Staged(StagedSummary {
            disks: u32::MAX,
            bytes_read: u64::MAX,
            peak_rss_bytes: Some(u64::MAX),
            ..summary()
        });
        assert!(many.to_message().len() < 200);
        // What earlier releases wrote: 12 disks are well over what Kubernetes keeps, and still read back.
        let sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let real = |index: u32| {
            let mut d = disk();
            d.index = index;
            d.staged.url = format!(
                "s3://ferry-staging/migrations/default/web-vm-0c6a2d1e-8f3b-4a5c-9d7e-1f2a3b4c5d6e/disk-{index}.raw"
            );
            (d.staged.object_sha256, d.staged.source_sha256) = (Some(sha.into()), sha.into());
            d.staged.source.vm_uuid = "42301f5e-8a6b-4c2d-9e7f-0a1b2c3d4e5f".into();
            d.staged.source.disk_file = format!("[datastore1] web-vm/web-vm_{index}.vmdk");
            d
        };
        let old = JobReport::Disks((0..12).map(real).collect());
        assert!(old.to_json().len() > TERMINATION_MESSAGE_BYTES);
        assert_eq!(JobReport::parse(&old.to_json()), Some(old.clone()));
        let Some(JobReport::Error(e)) = JobReport::parse(&old.to_message()) else {
            panic!()
        };
        assert_eq!(e.reason, "JobResultUnreadable");
    }

    #[test]
    fn a_disk_is_copied_in_this_run_only_if_the_run_marked_its_manifest() {
        let mut staged = disk().staged;
        staged.source_bytes = 1 << 20;
        staged.run = Some("0123456789abcdef".into());
        let copied = summary().disk(3, staged.clone());
        assert_eq!(
            (copied.index, copied.bytes_read, copied.skipped),
            (3, 1 << 20, false)
        );
        // It resumed an upload an earlier attempt left: it read only the rest.
        let resumed = StagedObject {
            bytes_read: Some(1 << 19),
            ..staged.clone()
        };
        assert_eq!(summary().disk(3, resumed).bytes_read, 1 << 19);
        for run in [None, Some("an earlier run".to_string())] {
            let found = summary().disk(
                3,
                StagedObject {
                    run,
                    ..staged.clone()
                },
            );
            assert_eq!((found.bytes_read, found.skipped), (0, true));
        }
        assert_eq!(run_id().len(), 16);
        assert_ne!(run_id(), run_id());
    }

    #[test]
    fn a_long_error_is_cut_to_a_valid_message_within_the_limit() {
        // Quotes and control characters double or sextuple when escaped; multibyte characters must not split.
        for unit in ["x", "\"é\"", "\u{1}", "ü€𝄞"] {
            let message = unit.repeat(20_000);
            let report = JobReport::Error(JobError {
                class: ErrorClass::Permanent,
                reason: "StagingUnavailable".into(),
                message: message.clone(),
            });
            let text = report.to_message();
            assert!(
                text.len() <= TERMINATION_MESSAGE_BYTES,
                "{unit}: {}",
                text.len()
            );
            assert!(
                text.len() > TERMINATION_MESSAGE_BYTES - 64,
                "{unit}: {}",
                text.len()
            );
            let Some(JobReport::Error(e)) = JobReport::parse(&text) else {
                panic!("{unit}: {text}")
            };
            assert_eq!(
                (e.class, e.reason.as_str()),
                (ErrorClass::Permanent, "StagingUnavailable")
            );
            let kept = e.message.strip_suffix('…').unwrap();
            assert!(!kept.is_empty() && message.starts_with(kept), "{unit}");
        }
        let short = JobReport::Error(JobError {
            class: ErrorClass::Transient,
            reason: "StagingUnavailable".into(),
            message: "down".into(),
        });
        assert_eq!(short.to_message(), short.to_json());
    }

    #[test]
    fn an_error_with_missing_fields_still_reads_as_an_error() {
        let Some(JobReport::Error(e)) = JobReport::parse(r#"{"error": {"reason": "Oom"}}"#) else {
            panic!()
        };
        assert_eq!(
            (e.class, e.reason.as_str(), e.message.as_str()),
            (ErrorClass::BoundedRetryable, "Oom", "failed")
        );
        assert_eq!(JobReport::parse("oom"), None);
        assert_eq!(JobReport::parse(r#"{"other": 1}"#), None);
    }
}
