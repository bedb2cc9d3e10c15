//! `VirtualMachineMigration`: one VM, from vSphere to KubeVirt.

mod spec;
mod status;

pub use spec::*;
pub use status::*;
