//! Ferry's lab: the real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager), vcsim, MinIO,
//! the stand-ins for what a cluster provides, and Ferry's controller, as supervised local processes.

pub mod control_plane;
pub use ferry_lab_disks as disks;
pub mod lab;
pub mod minio;
pub mod real_node;
pub mod standins;
pub mod volumes;
pub mod vsphere;
pub mod windows;

pub use control_plane::process::Lifetime;
pub use lab::{DownReport, LabOptions, LabState, UpOutcome, VcsimEndpoint, down, up};
// ferry-api's tests install the CRDs through this path.
pub use control_plane::crds;

/// The address the lab's servers listen on unless a real node's pods must reach them.
pub const LOOPBACK: &str = "127.0.0.1";
