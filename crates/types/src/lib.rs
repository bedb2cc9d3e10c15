//! The words Ferry's crates share: error classes, power states, firmware and disk formats. Plain serde types with
//! no Kubernetes dependency, so the vSphere client and the data path build without kube; `ferry-api` re-exports
//! them and, through the `schemars` feature, puts them in the CRD schema.

use serde::{Deserialize, Serialize};

// No doc comments on these types: in the CRDs they would become schema descriptions, and the schema stays as it
// was when the types lived in `ferry-api`.

// How an error is retried: requeued, charged to a bounded budget, or not at all.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum ErrorClass {
    Transient,
    BoundedRetryable,
    Permanent,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum PowerState {
    PoweredOn,
    PoweredOff,
    Suspended,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum Firmware {
    Bios,
    Efi,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    #[default]
    Raw,
    Qcow2,
}

/// An enum whose variants are reasons, each spelled as its variant's name: `as_str` and `Display` give that name,
/// so renaming a variant renames the reason everywhere it is matched, and a typo does not compile.
macro_rules! reasons {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$doc:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$doc])* $variant,)*
        }

        impl $name {
            /// Every reason, in declaration order.
            pub const ALL: &'static [$name] = &[$(Self::$variant,)*];

            /// The reason as conditions, Events and metrics carry it: the variant's name.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant),)*
                }
            }

            /// The reason a status, an Event or a Job's report names, if it is one of these.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|r| r.as_str() == name)
            }
        }
    };
}

reasons! {
    /// Why something failed: short and PascalCase, for conditions, Events, metrics and the Jobs' reports.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Reason {
        // The vSphere client.
        LoginFailed,
        ThumbprintMismatch,
        TLSVerificationFailed,
        EndpointUnreachable,
        EndpointTimeout,
        EndpointHTTPError,
        VSphereObjectNotFound,
        VSpherePermissionDenied,
        VSphereInvalidPowerState,
        VSphereObjectBusy,
        VSphereNotSupported,
        VSphereFault,
        VSphereTaskFailed,
        VSphereTaskTimeout,
        SourceVMNotFound,
        SourceVMOutOfScope,
        SourceVMNameAmbiguous,
        SourceFolderNotFound,
        UnsupportedDisk,
        VsanDisk,
        VvolDisk,
        EncryptedDisk,
        SparseDisk,
        MultiExtentDisk,
        ShortRead,
        InvalidVSphereResponse,
        // The data path.
        InvalidConversionSpec,
        StagingUnavailable,
        EmptyDisk,
        DiskTooLargeToStage,
        ChecksumMismatch,
        ConversionFailed,
        ScratchIOFailed,
        VolumeTooSmall,
        DiskImageMissing,
        VolumeWriteFailed,
        // Guest adaptation (virt-v2v).
        AdaptationFailed,
        AdaptationApplianceFailed,
        GuestOSUnsupported,
        GuestDriversMissing,
        GuestFirstBootToolMissing,
        StaticIPsNotReported,
        StaticAddressOnPodNetwork,
        GuestDiskFull,
        GuestFilesystemUnwritable,
        VolumeNotAsConverted,
        // The Kubernetes API, as the controller sees it.
        APIRejected,
        APIServerBusy,
        APIServerUnreachable,
        Conflict,
        Forbidden,
        NotFound,
        // The controller's checkpoints: their own findings, and what a person must fix.
        ConfigMapExists,
        SecretExists,
        DataVolumeExists,
        DiskNotConverted,
        DiskNotStaged,
        GuestAdaptationUnsupported,
        GuestNotReady,
        ImportFailed,
        JobExists,
        JobDeadlineExceeded,
        JobFailed,
        JobResultUnreadable,
        DatastoreNotMapped,
        MultiplePodNetworkNICs,
        NetworkAttachmentDefinitionNotFound,
        NetworkMapNotFound,
        NetworkNamespaceNotAllowed,
        NetworkNotMapped,
        NoDefaultStorageClass,
        NoDisks,
        PersistentVolumeClaimExists,
        ProviderNotFound,
        ReconcileDeadlineExceeded,
        ProviderSecretNotFound,
        SecretKeyMissing,
        SecretNotFound,
        SnapshotsPresent,
        ChangeTrackingOff,
        TooManyDisksForWarm,
        SourceListingStale,
        SourceNotDiscovered,
        SourceIdentityChanged,
        SourceDiskLocked,
        SourceVMInUse,
        SourcePoweredOn,
        StagingSecretMissing,
        StagingUnsupported,
        StorageClassNotFound,
        StorageMapNotFound,
        TargetVMExists,
        TooManyVMsSelected,
        TooManyDisksForDirect,
        VolumeAllocationFailed,
        VolumeNotBound,
        VolumeReplaced,
        VMIFailed,
        VMMissing,
        VolumeModesDiffer,
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_spelled_as_its_variant() {
        assert_eq!(
            Reason::TLSVerificationFailed.as_str(),
            "TLSVerificationFailed"
        );
        assert_eq!(Reason::ScratchIOFailed.to_string(), "ScratchIOFailed");
        assert_eq!(Reason::ShortRead, "ShortRead");
        assert_eq!(
            Reason::from_name("GuestNotReady"),
            Some(Reason::GuestNotReady)
        );
        assert_eq!(Reason::from_name("NoSuchReason"), None);
        for reason in Reason::ALL {
            assert_eq!(Reason::from_name(reason.as_str()), Some(*reason));
        }
    }
}
