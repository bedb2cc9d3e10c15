//! `VirtualMachineMigration`: one VM, from vSphere to KubeVirt.

pub(crate) mod spec;
mod status;

pub use spec::*;
pub use status::*;
