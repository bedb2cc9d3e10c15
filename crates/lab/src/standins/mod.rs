//! Stand-ins for what a real cluster provides and the lab's control plane lacks. Each is a small controller
//! that does the real work where the machine allows it.

pub mod accel;
pub mod agent;
pub mod cdi;
pub mod domain;
pub mod faults;
mod handler;
pub mod kubevirt;
pub mod node;
pub mod qemu;
