//! Ferry's lab: the real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager), vcsim, MinIO,
//! the stand-ins for what a cluster provides, and Ferry's controller, as supervised local processes.

pub mod bootdisk;
pub mod components;
pub mod controller_process;
pub mod crds;
pub mod demo;
pub use ferry_lab_disks as disks;
pub mod guest_image;
pub mod lab;
pub mod linux_vms;
pub mod minio;
pub mod oci;
pub mod pki;
pub mod probe;
pub mod process;
pub mod real_node;
pub mod standins;
pub mod tools;
pub mod vcsim;

pub use lab::{DownReport, LabOptions, LabState, UpOutcome, VcsimEndpoint, down, up};
pub use process::Lifetime;

/// The address the lab's servers listen on unless a real node's pods must reach them.
pub const LOOPBACK: &str = "127.0.0.1";
