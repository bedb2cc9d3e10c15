//! Pure builders of the children a migration creates, from its spec and what discovery recorded.

pub mod adapt_job;
pub mod datavolume;
pub mod job;
pub mod vm;

pub use ferry_api::foreign::{dv_resource, vm_resource, vmi_resource};
