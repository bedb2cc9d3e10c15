//! A small, typed vSphere SOAP client: everything Ferry reads from vCenter or ESXi, and the only things it
//! changes there: the power state, the snapshots it takes (and removes), and Changed Block Tracking when the
//! user allows it.
//!
//! - [`session`]: connect (TLS that fails closed), log in, call, re-login once on an expired session.
//! - [`inventory`]: find a VM by name, inventory path, UUID or moref; describe it; list VMs.
//! - [`power`] and [`snapshot`]: tasks whose morefs can be recorded and followed again after a restart.
//! - [`cbt`]: Changed Block Tracking: change IDs and the areas written between them, paged to the end.
//! - [`file_lock`]: whether a running VM holds a disk file `/folder` would serve.
//! - [`datastore`]: stream a disk's bytes over `/folder` with Range resume; [`transfer`]: its timeouts and backoff.
//! - [`error`]: every error is classed transient, bounded-retryable or permanent.

pub mod cbt;
#[cfg(feature = "chaos")]
pub mod chaos;
pub mod datastore;
pub mod error;
pub mod file_lock;
pub mod guest_network;
pub mod inventory;
pub mod power;
pub mod preflight;
pub mod props;
#[cfg(feature = "provision")]
pub mod provision;
pub mod session;
pub mod snapshot;
pub mod soap;
pub mod tls;
pub mod transfer;
pub mod vmdk;
pub mod xml;

pub use error::{Error, Result};
pub use inventory::{DiskInfo, NicInfo, VmInfo, VmSelector, VmSummary};
pub use session::{ConnectConfig, Session};
pub use soap::MoRef;
pub use tls::TlsMode;
pub use transfer::{Backoff, TransferPolicy};
