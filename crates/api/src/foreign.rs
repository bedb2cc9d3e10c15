//! The kinds of other projects that Ferry creates and reads: CDI's DataVolume, KubeVirt's VirtualMachine and
//! VirtualMachineInstance, and the NetworkAttachmentDefinitions of Multus networks. The controller and the lab's stand-ins name them from here, and read the fields they
//! share through the small serde views below (the objects themselves stay dynamic: Ferry owns none of their
//! schemas).

use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

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

/// Multus' NetworkAttachmentDefinition, which KubeVirt reads for each Multus network before it makes a VM's
/// launcher pod. Its plural has dashes, so it is not the one `from_gvk` would guess.
pub fn nad_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    )
}

/// The NetworkAttachmentDefinition (namespace, name) a Multus `networkName` means in `namespace`, as KubeVirt
/// reads it: `ns/name`, or a bare name in the VM's own namespace.
pub fn nad_namespaced_name(namespace: &str, network_name: &str) -> (String, String) {
    match network_name.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => (namespace.to_string(), network_name.to_string()),
    }
}

/// A condition as KubeVirt and CDI write them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForeignCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339, as Kubernetes writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// When the condition was last seen to hold. KubeVirt's `AgentConnected` has only this (its transition time is
    /// null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<String>,
}

fn is_true(conditions: &[ForeignCondition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The part of an object's `data` under `key`, as `T`; what does not parse reads as `T`'s default.
fn part<T: DeserializeOwned + Default>(object: &DynamicObject, key: &str) -> T {
    serde_json::from_value(object.data[key].clone()).unwrap_or_default()
}

/// What Ferry and the lab read of a VirtualMachine's spec.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<String>,
}

impl VmSpec {
    pub fn of(vm: &DynamicObject) -> Self {
        part(vm, "spec")
    }
}

/// What Ferry and the lab read of a VirtualMachine's status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmStatus {
    /// For example `Running`, `Stopped`, `CrashLoopBackOff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printable_status: Option<String>,
    /// virt-controller's `Failure` (a VMI it could not create, `FailedCreate`) among them.
    #[serde(default)]
    pub conditions: Vec<ForeignCondition>,
    /// virt-controller's count of instances that failed before they ran, and when it tries again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<StartFailure>,
}

/// KubeVirt's `status.startFailure` (`VirtualMachineStartFailure`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StartFailure {
    #[serde(default)]
    pub consecutive_fail_count: i64,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_timestamp: Option<String>,
}

impl VmStatus {
    pub fn of(vm: &DynamicObject) -> Self {
        part(vm, "status")
    }

    /// What KubeVirt says of a VM whose instances keep failing before they run (`CrashLoopBackOff`); None
    /// otherwise. virt-controller deletes each failed instance at once and backs off up to 5 minutes between
    /// tries, for as long as the VM should run: between tries the VM has no instance at all.
    pub fn crash_looping(&self) -> Option<String> {
        if self.printable_status.as_deref() != Some("CrashLoopBackOff") {
            return None;
        }
        let failure = self.start_failure.clone().unwrap_or_default();
        let next = failure
            .retry_after_timestamp
            .map(|t| format!("; KubeVirt tries again after {t}"))
            .unwrap_or_default();
        Some(format!(
            "CrashLoopBackOff: {} instance(s) in a row failed before they ran{next}",
            failure.consecutive_fail_count
        ))
    }

    /// Why virt-controller cannot create the VM's instance, as it says it; None when nothing stops it.
    pub fn start_refused(&self) -> Option<&str> {
        self.conditions
            .iter()
            .find(|c| c.type_ == "Failure" && c.status == "True")
            .map(|c| c.message.as_deref().unwrap_or("no message"))
    }
}

/// What Ferry and the lab read of a VirtualMachineInstance's status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmiStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default)]
    pub conditions: Vec<ForeignCondition>,
    /// Filled from the guest agent while it is connected.
    #[serde(
        default,
        rename = "guestOSInfo",
        skip_serializing_if = "Option::is_none"
    )]
    pub guest_os_info: Option<GuestOsInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<VmiInterface>,
}

impl VmiStatus {
    /// Why KubeVirt cannot create the instance's launcher pod, as virt-controller says it (its `Synchronized`
    /// condition False with `FailedCreate`: Pod Security refusing the pod, a quota); it keeps trying. None when
    /// nothing stops it.
    pub fn pod_refused(&self) -> Option<&str> {
        self.conditions
            .iter()
            .find(|c| {
                c.type_ == "Synchronized"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("FailedCreate")
            })
            .map(|c| c.message.as_deref().unwrap_or("no message"))
    }

    /// Why KubeVirt cannot bring the instance's domain in line with its spec, when that is not the pod's refusal:
    /// virt-handler's `Synchronized` False, for example a NIC whose pod link nothing attached (a Multus network
    /// without its NetworkAttachmentDefinition). It keeps trying. As `reason: message`.
    pub fn not_synchronized(&self) -> Option<String> {
        self.conditions
            .iter()
            .find(|c| {
                c.type_ == "Synchronized"
                    && c.status == "False"
                    && c.reason.as_deref() != Some("FailedCreate")
            })
            .map(|c| {
                let reason = c
                    .reason
                    .as_deref()
                    .unwrap_or_default()
                    .trim_end_matches('.');
                let message = c.message.as_deref().unwrap_or("no message");
                match reason {
                    "" => message.to_string(),
                    reason => format!("{reason}: {message}"),
                }
            })
    }

    pub fn of(vmi: &DynamicObject) -> Self {
        part(vmi, "status")
    }

    pub fn is_true(&self, type_: &str) -> bool {
        is_true(&self.conditions, type_)
    }

    pub fn condition(&self, type_: &str) -> Option<&ForeignCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// KubeVirt's `VirtualMachineInstanceGuestOSInfo`, from the agent's `guest-get-osinfo`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestOsInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretty_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// KubeVirt's `VirtualMachineInstanceNetworkInterface`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmiInterface {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// Who reported it, for example `domain, guest-agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info_source: Option<String>,
}

/// What Ferry and the lab read of a DataVolume's status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `12.5%`, or `N/A` before CDI knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    #[serde(default)]
    pub conditions: Vec<ForeignCondition>,
    /// How many times CDI restarted the volume's importer pod (it restarts a failing one without end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<i64>,
}

impl DataVolumeStatus {
    pub fn of(dv: &DynamicObject) -> Self {
        part(dv, "status")
    }

    /// CDI's condition `type_` (`Bound`, `Ready`, `Running`).
    pub fn condition(&self, type_: &str) -> Option<&ForeignCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// The message of the first condition of `types` that has one.
    pub fn message_of(&self, types: &[&str]) -> Option<&str> {
        self.conditions
            .iter()
            .find(|c| types.contains(&c.type_.as_str()))
            .and_then(|c| c.message.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multus_network_name_is_read_as_kubevirt_reads_it() {
        let nad = |ns, name| nad_namespaced_name(ns, name);
        assert_eq!(nad("apps", "lan"), ("apps".into(), "lan".into()));
        assert_eq!(nad("apps", "default/lan"), ("default".into(), "lan".into()));
        assert_eq!(nad_resource().plural, "network-attachment-definitions");
        assert_eq!(nad_resource().api_version, "k8s.cni.cncf.io/v1");
    }

    #[test]
    fn a_vm_says_why_its_instance_cannot_be_created() {
        let vm = |conditions: serde_json::Value| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "v"},
                "status": {"printableStatus": "Stopped", "conditions": conditions},
            }))
            .unwrap()
        };
        let refused = vm(
            serde_json::json!([{"type": "Failure", "status": "True", "reason": "FailedCreate",
            "message": "Failure while starting VMI: admission webhook denied the request"}]),
        );
        assert_eq!(
            VmStatus::of(&refused).start_refused(),
            Some("Failure while starting VMI: admission webhook denied the request")
        );
        let ready = vm(serde_json::json!([{"type": "Ready", "status": "True"}]));
        assert_eq!(VmStatus::of(&ready).start_refused(), None);
    }

    #[test]
    fn statuses_read_what_kubevirt_and_cdi_write() {
        let vmi: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v"},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": null},
                {"type": "AgentConnected", "status": "False"}]}}))
        .unwrap();
        let status = VmiStatus::of(&vmi);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert!(status.is_true("Ready") && !status.is_true("AgentConnected"));
        let empty: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "d"}}))
        .unwrap();
        assert_eq!(DataVolumeStatus::of(&empty), DataVolumeStatus::default());
        assert_eq!(VmSpec::of(&empty).run_strategy, None);
    }
}
