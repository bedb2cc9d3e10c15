//! `VirtualMachineMigration`: one VM, from vSphere to KubeVirt.

pub(crate) mod spec;
mod status;
mod warm;

pub use spec::*;
pub use status::*;
pub use warm::*;
