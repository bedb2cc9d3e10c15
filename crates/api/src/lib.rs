//! Ferry's API, group `migration.platform.example`, version `v1alpha1`.
//!
//! - [`Provider`]: a vSphere endpoint, its credentials (by Secret name) and how to trust its certificate.
//! - [`VirtualMachineMigration`] (`vmm`): one VM to move, and everything the controller observed doing it.
//! - [`foreign`]: the CDI and KubeVirt kinds it creates and reads.
//! - [`keys`]: every label, annotation, finalizer and field manager, built from [`GROUP`].
//!
//! The schema and its CEL rules reject bad input when it is applied, before the controller sees it.

// Printer columns repeat `type_ = "string"`, which clippy mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod crds;
pub mod foreign;
pub mod keys;
pub mod maps;
pub mod migration;
pub mod names;
pub mod plan;
pub mod provider;
mod refs;

/// Plain domain types shared with the vSphere client and the data path, which do not depend on this crate.
pub use ferry_types::{DiskFormat, ErrorClass, Firmware, PowerState, Reason};
pub use maps::*;
pub use migration::*;
pub use plan::*;
pub use provider::*;
pub use refs::{LocalObjectReference, ProviderReference, SecretReference};

pub const GROUP: &str = keys::group!();
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = concat!(keys::group!(), "/v1alpha1");
/// Holds a migration until the controller has cleaned up what it created (defined in [`keys`]).
pub use keys::FINALIZER;

/// DNS-1123 label: the names of VMs, DataVolumes and Jobs.
pub(crate) const DNS_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// DNS-1123 subdomain: the names of most Kubernetes objects, Secrets included.
pub(crate) const DNS_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
