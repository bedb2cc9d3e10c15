//! One error type for every step: its class decides between requeue, a spent retry, and a stop.

use ferry_api::{ErrorClass, Reason};

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub class: ErrorClass,
    /// Short and specific: it lands in conditions, Events and metrics as the variant's name.
    pub reason: Reason,
    pub message: String,
    /// A person can fix the cause in place (create a Secret, a StorageClass); the migration then resumes.
    pub fixable: bool,
}

impl Failure {
    pub fn transient(reason: Reason, message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Transient, reason, message, false)
    }
    pub fn bounded(reason: Reason, message: impl Into<String>) -> Self {
        Self::new(ErrorClass::BoundedRetryable, reason, message, false)
    }
    pub fn permanent(reason: Reason, message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Permanent, reason, message, false)
    }
    /// Permanent until a person fixes it: `ManualInterventionRequired`, re-checked on every change.
    pub fn fixable(reason: Reason, message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Permanent, reason, message, true)
    }
    fn new(class: ErrorClass, reason: Reason, message: impl Into<String>, fixable: bool) -> Self {
        Self {
            class,
            reason,
            message: message.into(),
            fixable,
        }
    }
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(status) => match status.code {
                409 => Failure::transient(
                    Reason::Conflict,
                    format!("the object changed meanwhile: {}", status.message),
                ),
                429 | 500..=599 => {
                    Failure::transient(Reason::APIServerBusy, status.message.clone())
                }
                403 => Failure::fixable(
                    Reason::Forbidden,
                    format!(
                        "the controller's ServiceAccount may not do this; check deploy/rbac: {}",
                        status.message
                    ),
                ),
                404 => Failure::transient(Reason::NotFound, status.message.clone()),
                _ => Failure::permanent(Reason::APIRejected, status.message.clone()),
            },
            _ => Failure::transient(Reason::APIServerUnreachable, e.to_string()),
        }
    }
}

impl From<ferry_vsphere::Error> for Failure {
    fn from(e: ferry_vsphere::Error) -> Self {
        Self::new(e.class(), e.reason(), e.to_string(), false)
    }
}

impl From<ferry_datapath::Error> for Failure {
    fn from(e: ferry_datapath::Error) -> Self {
        Self::new(e.class(), e.reason(), e.to_string(), false)
    }
}

pub type Result<T, E = Failure> = std::result::Result<T, E>;
