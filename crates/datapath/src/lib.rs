//! Ferry's data path, run by the conversion Job (`ferry convert`): each disk is read once from the datastore,
//! hashed in the same pass, converted to raw or qcow2, and staged with a manifest that proves it complete.
//! A rerun skips disks already staged from the same source, and goes on with a raw upload an earlier run left
//! unfinished.

pub mod adapt;
pub mod convert;
pub mod delta;
pub mod direct;
pub mod error;
mod hash;
mod interface_names;
mod local_parts;
pub mod memory;
pub mod progress;
pub mod qcow2;
mod qcow2_upload;
mod read_back;
pub mod report;
pub mod round;
pub mod source_check;
pub mod spec;
pub mod staging;
mod upload;
pub mod verify;
mod volume_writer;
mod windows_volume;
mod zero_runs;

pub use convert::{DiskResult, convert_all};
pub use error::{Error, Result};
pub use spec::ConvertSpec;

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lowercase or uppercase hex; `None` for anything else.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
