//! The lab's control plane and its supervision: the real components (etcd, kube-apiserver,
//! kube-controller-manager) with their PKI, processes and readiness probes, the CRDs they serve, the Go-built
//! tools, and Ferry's controller.

pub mod components;
pub mod controller_process;
pub mod crds;
pub mod pki;
pub mod probe;
pub mod process;
pub mod tools;
