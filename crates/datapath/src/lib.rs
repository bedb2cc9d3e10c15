//! Ferry's data path, run by the conversion Job (`ferry convert`): each disk is read once from the datastore,
//! hashed in the same pass, converted to raw or qcow2, and staged with a manifest that proves it complete.
//! A rerun skips disks already staged from the same source.

pub mod convert;
pub mod error;
pub mod progress;
pub mod report;
pub mod spec;
pub mod staging;
pub mod verify;

pub use convert::{DiskResult, convert_all};
pub use error::{Error, Result};
pub use spec::ConvertSpec;

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
