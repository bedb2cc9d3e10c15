//! Data path errors, classed like every Ferry error: a short or corrupt copy is bounded-retryable, never success.

use ferry_types::{ErrorClass, Reason};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid conversion spec: {0}")]
    Spec(String),
    #[error(transparent)]
    Source(#[from] ferry_vsphere::Error),
    #[error("staging {url}: {detail}")]
    Staging { url: String, detail: String },
    /// The store no longer knows the multipart upload (aborted, or expired by a lifecycle rule).
    #[error("staging {url}: the upload in progress is gone from the store")]
    UploadGone { url: String },
    #[error("disk {index}: read {got} bytes from the source, expected {expected}")]
    ShortRead { index: u32, got: u64, expected: u64 },
    #[error("disk {index} ({file}) is empty, but its capacity is {capacity} bytes")]
    EmptyDisk {
        index: u32,
        file: String,
        capacity: u64,
    },
    #[error("{}", too_large(.what, .bytes))]
    TooLargeToStage { what: String, bytes: u64 },
    #[error("{what}: sha256 {actual}, expected {expected}")]
    ChecksumMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("local I/O on {path}: {detail}")]
    Io { path: String, detail: String },
    #[error(
        "disk {index} needs {needed} bytes, but its volume {path} holds {size}: give the StorageClass more \
         filesystem overhead (CDIConfig spec.filesystemOverhead.storageClass) or more capacity"
    )]
    VolumeTooSmall {
        index: u32,
        path: String,
        size: u64,
        needed: u64,
    },
    #[error(
        "disk {index}: {path} is not there; the blank DataVolume was not allocated as CDI does"
    )]
    DiskImageMissing { index: u32, path: String },
    #[error("writing the volume {path}: {detail}")]
    Volume { path: String, detail: String },
    #[error(
        "disk {index}'s volume no longer holds the source's bytes (sha256 {actual}, the source's {expected}): it \
         was adapted already, torn by an interrupted commit, or changed, and is never adapted again: it is rewritten \
         from the source first"
    )]
    NotAsConverted {
        index: u32,
        expected: String,
        actual: String,
    },
    #[error("the source changed since discovery: {0}")]
    SourceChanged(String),
    #[error("{0}")]
    SourcePoweredOn(String),
    #[error(
        "vSphere refuses to read {file} while the VM runs, also under the round's snapshot (HTTP {status}: \
         {detail}): its host locks a running VM's disks, so this VM cannot be copied warm"
    )]
    SourceDiskLocked {
        file: String,
        status: u16,
        detail: String,
    },
    #[error("virt-v2v: {message}")]
    Adaptation {
        failure: ferry_adapt::failure::AdaptationFailure,
        message: String,
    },
}

impl Error {
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Spec(_) | Error::TooLargeToStage { .. } | Error::SourceChanged(_) => {
                ErrorClass::Permanent
            }
            Error::Source(e) => e.class(),
            Error::Staging { .. } | Error::UploadGone { .. } => ErrorClass::Transient,
            Error::ShortRead { .. } | Error::EmptyDisk { .. } | Error::ChecksumMismatch { .. } => {
                ErrorClass::BoundedRetryable
            }
            Error::Io { .. } => ErrorClass::BoundedRetryable,
            // CDI's size is the contract: another attempt gets the same volume.
            Error::VolumeTooSmall { .. } => ErrorClass::Permanent,
            Error::DiskImageMissing { .. } | Error::Volume { .. } => ErrorClass::BoundedRetryable,
            // The controller rewrites the volumes from the source, then adapts them again.
            Error::NotAsConverted { .. } => ErrorClass::BoundedRetryable,
            // Someone started the VM the cutover powered off: the controller waits for it to be off again.
            Error::SourcePoweredOn(_) => ErrorClass::BoundedRetryable,
            Error::SourceDiskLocked { .. } => ErrorClass::Permanent,
            Error::Adaptation { failure, .. } if failure.retryable() => {
                ErrorClass::BoundedRetryable
            }
            Error::Adaptation { .. } => ErrorClass::Permanent,
        }
    }

    pub fn reason(&self) -> Reason {
        match self {
            Error::Spec(_) => Reason::InvalidConversionSpec,
            Error::Source(e) => e.reason(),
            Error::Staging { .. } | Error::UploadGone { .. } => Reason::StagingUnavailable,
            Error::ShortRead { .. } => Reason::ShortRead,
            Error::EmptyDisk { .. } => Reason::EmptyDisk,
            Error::TooLargeToStage { .. } => Reason::DiskTooLargeToStage,
            Error::ChecksumMismatch { .. } => Reason::ChecksumMismatch,
            Error::Io { .. } => Reason::ScratchIOFailed,
            Error::VolumeTooSmall { .. } => Reason::VolumeTooSmall,
            Error::DiskImageMissing { .. } => Reason::DiskImageMissing,
            Error::Volume { .. } => Reason::VolumeWriteFailed,
            Error::NotAsConverted { .. } => Reason::VolumeNotAsConverted,
            Error::SourceChanged(_) => Reason::SourceIdentityChanged,
            Error::SourcePoweredOn(_) => Reason::SourcePoweredOn,
            Error::SourceDiskLocked { .. } => Reason::SourceDiskLocked,
            Error::Adaptation { failure, .. } => {
                use ferry_adapt::failure::AdaptationFailure as F;
                match failure {
                    F::UnsupportedGuest => Reason::GuestOSUnsupported,
                    F::NoSpace => Reason::GuestDiskFull,
                    F::MissingDrivers => Reason::GuestDriversMissing,
                    F::MissingFirstBootTool => Reason::GuestFirstBootToolMissing,
                    F::GuestFilesystemUnwritable => Reason::GuestFilesystemUnwritable,
                    F::ApplianceFailed => Reason::AdaptationApplianceFailed,
                    F::Other => Reason::AdaptationFailed,
                }
            }
        }
    }
}

fn too_large(what: &str, bytes: &u64) -> String {
    crate::staging::too_large_message(what, *bytes)
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
