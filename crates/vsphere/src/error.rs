//! Every error is classed, so the controller knows whether to requeue, spend a retry, or stop.

use ferry_types::{ErrorClass, Reason};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "login to {url} failed for user {user}: check the user and password in the Provider's Secret"
    )]
    LoginFailed { url: String, user: String },

    #[error(
        "the certificate of {url} has SHA-256 thumbprint {presented}, but the Provider pins {expected}; \
         if the endpoint's certificate was replaced on purpose, update spec.tls.thumbprint"
    )]
    ThumbprintMismatch {
        url: String,
        expected: String,
        presented: String,
    },

    #[error(
        "the thumbprint pinned for {url}, {given}, is a SHA-1 thumbprint (20 hex pairs, as vSphere shows \
         them), but Ferry pins SHA-256; {}",
        sha1_advice(.matches, .presented_sha256)
    )]
    Sha1Thumbprint {
        url: String,
        given: String,
        /// Whether `given` is the SHA-1 of the certificate the server presented.
        matches: bool,
        presented_sha256: String,
    },

    #[error(
        "TLS verification of {url} failed: {detail}; set spec.tls.caBundle to the CA that signed it, or pin its thumbprint"
    )]
    Tls { url: String, detail: String },

    #[error("invalid TLS settings: {0}")]
    TlsConfig(String),

    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },

    #[error("{url} did not answer within {seconds}s")]
    Timeout { url: String, seconds: u64 },

    #[error("{url} answered HTTP {status} to {what}")]
    Http {
        url: String,
        what: String,
        status: u16,
    },

    #[error(
        "{url} refused {what} with HTTP {status}, also right after logging in again: the user needs the \
         privileges for HTTP file access (Datastore.Browse and Datastore.FileManagement on the datacenter and \
         the datastore, System.View on the root folder)"
    )]
    DatastoreAccessDenied {
        url: String,
        what: String,
        status: u16,
    },

    #[error("vSphere fault {fault} in {method}: {message}")]
    Fault {
        method: String,
        fault: String,
        message: String,
    },

    #[error("task {task} failed with {fault}: {message}")]
    TaskFailed {
        task: String,
        fault: String,
        message: String,
    },

    #[error("task {task} did not finish within {seconds}s")]
    TaskTimeout { task: String, seconds: u64 },

    #[error("no VM matches {selector}; `ferry inventory` lists what the Provider can see")]
    VmNotFound { selector: String },

    #[error(
        "no VM folder at inventory path {path:?}; a folder's path reads /<datacenter>/vm/<folder>"
    )]
    FolderNotFound { path: String },

    #[error("{count} VMs are named {name}: select the VM by uuid or moref instead")]
    AmbiguousVmName { name: String, count: usize },

    #[error("disk {file} cannot be migrated: {reason}")]
    UnsupportedDisk { file: String, reason: String },

    #[error("reading {path}: got {got} bytes, expected {expected}")]
    ShortRead {
        path: String,
        got: u64,
        expected: u64,
    },

    #[error("unexpected response to {method}: {detail}")]
    InvalidResponse { method: String, detail: String },
}

impl Error {
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Unreachable { .. } | Error::Timeout { .. } => ErrorClass::Transient,
            Error::Http { status, .. } if *status >= 500 || *status == 429 => ErrorClass::Transient,
            Error::Http { .. } => ErrorClass::Permanent,
            Error::Fault { fault, .. } | Error::TaskFailed { fault, .. } => fault_class(fault),
            Error::TaskTimeout { .. } => ErrorClass::Transient,
            Error::ShortRead { .. } | Error::InvalidResponse { .. } => ErrorClass::BoundedRetryable,
            Error::LoginFailed { .. }
            | Error::ThumbprintMismatch { .. }
            | Error::Sha1Thumbprint { .. }
            | Error::DatastoreAccessDenied { .. }
            | Error::Tls { .. }
            | Error::TlsConfig(_)
            | Error::VmNotFound { .. }
            | Error::FolderNotFound { .. }
            | Error::AmbiguousVmName { .. }
            | Error::UnsupportedDisk { .. } => ErrorClass::Permanent,
        }
    }

    /// A short PascalCase reason for conditions, events and metrics.
    pub fn reason(&self) -> Reason {
        match self {
            Error::LoginFailed { .. } => Reason::LoginFailed,
            Error::ThumbprintMismatch { .. } | Error::Sha1Thumbprint { .. } => {
                Reason::ThumbprintMismatch
            }
            Error::DatastoreAccessDenied { .. } => Reason::VSpherePermissionDenied,
            Error::Tls { .. } | Error::TlsConfig(_) => Reason::TLSVerificationFailed,
            Error::Unreachable { .. } => Reason::EndpointUnreachable,
            Error::Timeout { .. } => Reason::EndpointTimeout,
            Error::Http { .. } => Reason::EndpointHTTPError,
            Error::Fault { fault, .. } => fault_reason(fault).unwrap_or(Reason::VSphereFault),
            Error::TaskFailed { fault, .. } => {
                fault_reason(fault).unwrap_or(Reason::VSphereTaskFailed)
            }
            Error::TaskTimeout { .. } => Reason::VSphereTaskTimeout,
            Error::VmNotFound { .. } => Reason::SourceVMNotFound,
            Error::FolderNotFound { .. } => Reason::SourceFolderNotFound,
            Error::AmbiguousVmName { .. } => Reason::SourceVMNameAmbiguous,
            Error::UnsupportedDisk { .. } => Reason::UnsupportedDisk,
            Error::ShortRead { .. } => Reason::ShortRead,
            Error::InvalidResponse { .. } => Reason::InvalidVSphereResponse,
        }
    }

    /// The vSphere fault type, when there is one.
    pub fn fault(&self) -> Option<&str> {
        match self {
            Error::Fault { fault, .. } | Error::TaskFailed { fault, .. } => Some(fault),
            _ => None,
        }
    }
}

/// What to pin instead of a SHA-1 thumbprint. The SHA-256 is trustworthy only when the SHA-1 matched.
fn sha1_advice(matches: &bool, presented_sha256: &str) -> String {
    if *matches {
        format!(
            "it matches the certificate the server presented, whose SHA-256 thumbprint is {presented_sha256}: \
             set spec.tls.thumbprint to that"
        )
    } else {
        format!(
            "it does not match the certificate the server presented either (SHA-256 {presented_sha256}); \
             check which host you are connecting to before pinning anything"
        )
    }
}

/// The faults common enough to name in a reason of their own.
fn fault_reason(fault: &str) -> Option<Reason> {
    Some(match fault {
        "ManagedObjectNotFound" => Reason::VSphereObjectNotFound,
        "NoPermission" => Reason::VSpherePermissionDenied,
        "InvalidPowerState" => Reason::VSphereInvalidPowerState,
        "TaskInProgress" | "ConcurrentAccess" => Reason::VSphereObjectBusy,
        "NotSupported" => Reason::VSphereNotSupported,
        _ => return None,
    })
}

/// Faults a person must act on are permanent; a busy or changing host is transient; the rest get a budget.
fn fault_class(fault: &str) -> ErrorClass {
    match fault {
        "NotAuthenticated" | "InvalidPowerState" | "InvalidState" | "TaskInProgress"
        | "HostCommunication" | "HostNotConnected" | "HostNotReachable" | "RequestCanceled"
        | "ConcurrentAccess" => ErrorClass::Transient,
        "InvalidLogin"
        | "NoPermission"
        | "NotSupported"
        | "ManagedObjectNotFound"
        | "InvalidArgument"
        | "InvalidRequest"
        | "FileNotFound"
        | "InvalidDatastorePath"
        | "RestrictedVersion" => ErrorClass::Permanent,
        _ => ErrorClass::BoundedRetryable,
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classed_as_the_controller_needs() {
        let http = |status| Error::Http {
            url: "u".into(),
            what: "w".into(),
            status,
        };
        assert_eq!(http(503).class(), ErrorClass::Transient);
        assert_eq!(http(404).class(), ErrorClass::Permanent);
        let login = Error::LoginFailed {
            url: "https://vc/sdk".into(),
            user: "bob".into(),
        };
        assert_eq!(login.class(), ErrorClass::Permanent);
        assert!(
            login
                .to_string()
                .starts_with("login to https://vc/sdk failed for user bob")
        );
        let task = |fault: &str| Error::TaskFailed {
            task: "t".into(),
            fault: fault.into(),
            message: "m".into(),
        };
        assert_eq!(task("InvalidPowerState").class(), ErrorClass::Transient);
        assert_eq!(task("FileNotFound").class(), ErrorClass::Permanent);
        assert_eq!(
            task("ManagedObjectNotFound").reason(),
            "VSphereObjectNotFound"
        );
        assert_eq!(task("FileNotFound").reason(), "VSphereTaskFailed");
        assert_eq!(
            task("GenericVmConfigFault").class(),
            ErrorClass::BoundedRetryable
        );
        let sha1 = |matches| Error::Sha1Thumbprint {
            url: "u".into(),
            given: "3F:3F".into(),
            matches,
            presented_sha256: "AB:AB".into(),
        };
        let (right, wrong) = (sha1(true).to_string(), sha1(false).to_string());
        assert!(
            right.contains("SHA-1") && right.contains("as vSphere shows"),
            "{right}"
        );
        assert!(
            right.contains("set spec.tls.thumbprint to that") && right.contains("AB:AB"),
            "{right}"
        );
        assert!(
            wrong.contains("does not match") && !wrong.contains("set spec.tls"),
            "{wrong}"
        );
        assert_eq!(sha1(true).class(), ErrorClass::Permanent);
        let denied = Error::DatastoreAccessDenied {
            url: "u".into(),
            what: "GET f".into(),
            status: 403,
        };
        assert_eq!(denied.class(), ErrorClass::Permanent);
        assert_eq!(denied.reason(), "VSpherePermissionDenied");
        let pin = Error::ThumbprintMismatch {
            url: "u".into(),
            expected: "AA".into(),
            presented: "BB".into(),
        };
        assert!(pin.to_string().contains("AA") && pin.to_string().contains("BB"));
    }
}
