//! Pure builders of the children a migration creates, from its spec and what discovery recorded.

pub mod datavolume;
pub mod job;
pub mod vm;

use kube::core::{ApiResource, GroupVersionKind};

pub fn dv_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cdi.kubevirt.io",
        "v1beta1",
        "DataVolume",
    ))
}

pub fn vm_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubevirt.io",
        "v1",
        "VirtualMachine",
    ))
}

pub fn vmi_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubevirt.io",
        "v1",
        "VirtualMachineInstance",
    ))
}
