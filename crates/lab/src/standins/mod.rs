//! Stand-ins for what a real cluster provides and the lab's control plane lacks. Each is a small controller
//! that does the real work where the machine allows it.

pub mod cdi;
pub mod faults;
pub mod kubevirt;
pub mod node;
