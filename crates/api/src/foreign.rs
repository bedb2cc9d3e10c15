//! The kinds of other projects that Ferry creates and reads, untyped: CDI's DataVolume and KubeVirt's
//! VirtualMachine and VirtualMachineInstance. The controller and the lab's stand-ins name them from here.

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
