//! The lab's vSphere: vcsim, and the VMs in it whose disks are real (demo VMs with a boot disk that prints a
//! marker, Linux VMs from Debian guest images).

pub mod bootdisk;
pub mod demo;
pub mod guest_image;
pub mod lab_hands;
pub mod linux_vms;
pub mod tools_network;
pub mod vcsim;
