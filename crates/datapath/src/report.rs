//! A Job's result, as it leaves it in its pod's termination message for the controller: the staged disks of
//! `ferry convert`, the proof of `ferry verify`, or the classed error either Job ended with. The Jobs write it
//! and the controller reads it through this one type, so the two sides cannot drift apart.

use std::path::Path;

use ferry_types::ErrorClass;
use serde::{Deserialize, Serialize};

use crate::convert::DiskResult;
use crate::error::{Error, Result};
use crate::verify::Verified;

/// On the wire, one key names the kind: `{"disks": [...]}`, `{"verified": {"bytes", "sha256"}}` or
/// `{"error": {"class", "message", "reason"}}`. A controller reads the reports of Jobs from earlier releases,
/// which wrote the same JSON.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum JobReport {
    /// `ferry convert`: every disk staged, in index order.
    Disks(Vec<DiskResult>),
    /// `ferry verify`: the imported image hashes to the source's sha256.
    Verified(Verified),
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

    /// Writes the report where the controller reads it (`path`: in a pod, its termination message) and returns
    /// the text written.
    pub fn write(&self, path: &Path) -> std::io::Result<String> {
        let text = self.to_json();
        std::fs::write(path, &text)?;
        Ok(text)
    }
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
                object_sha256: "ab".into(),
                object_bytes: 4,
                source_sha256: "ab".into(),
                source_bytes: 4,
                source: SourceIdentity {
                    vm_uuid: "u".into(),
                    disk_file: "[ds] vm/vm.vmdk".into(),
                    capacity_bytes: 4,
                },
                e_tag: None,
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
