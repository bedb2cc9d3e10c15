//! What the checkpoints share: driving a Job attempt and reading its result, observing and removing DataVolumes,
//! a first consumer for the volumes that wait for one, the source and the credentials lent to Jobs, the
//! one-migration-per-VM guard, the source's disk files, following a recorded vSphere task, a warm round's report
//! tallied, what a warm migration undoes on its source, and the cleanup of a migration that ends or is deleted.

pub(crate) mod cleanup;
pub(crate) mod conversion;
pub(crate) mod credentials;
pub(crate) mod disk_files;
pub(crate) mod first_consumer;
pub(crate) mod host_slot;
pub(crate) mod jobs;
pub(crate) mod one_per_vm;
pub(crate) mod retry;
pub(crate) mod source;
pub(crate) mod volumes;
pub(crate) mod vsphere_task;
pub(crate) mod warm_round;
pub(crate) mod warm_source;
