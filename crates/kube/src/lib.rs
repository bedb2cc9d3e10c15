//! Kubernetes helpers shared by Ferry's controllers (the migration controller and the Greeting example).
//!
//! - [`conditions`]: set a condition, keeping `lastTransitionTime` unless its status changes.
//! - [`apply`]: server-side apply that sends nothing when the object already holds what we want.
//! - [`create`]: create that counts an object already there as created.
//! - [`delete`]: delete that counts an object already gone as deleted.
//! - [`status`]: a status write guarded by the resourceVersion it was read at.

pub mod apply;
pub mod conditions;
pub mod create;
pub mod delete;
pub mod status;
