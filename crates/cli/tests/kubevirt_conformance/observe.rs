//! The conformance scenarios and what is observed of them. Each VM is the one Ferry builds for its source
//! (`ferry_controller::surface::build::virtual_machine`), over blank DataVolumes whose `disk.img` the test fills
//! with the guest's image, so only KubeVirt differs between two runs. Observed: the VMI's phases, the VM's
//! printable statuses, both objects' conditions, `guestOSInfo`, `interfaces`, landmarks on the serial console,
//! and what `runStrategy: Halted` and deleting the VM leave. Timestamps, uids, addresses and the namespace's name
//! are left out, so two KubeVirts can be compared.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_api::foreign::{dv_resource, vm_resource, vmi_resource};
use ferry_controller::surface;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::host::Host;
use crate::scenario::{Content, Images, Scenario};

const TIMEOUT: Duration = Duration::from_secs(1500);
/// KubeVirt's default grace period (180 s) for a guest that ignores ACPI's power button, and some.
const STOP_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a stopped VM's status must hold to count as settled.
const SETTLE: Duration = Duration::from_secs(5);

/// Whether the VM's status has caught up with its VMI: virt-controller copies the VMI's conditions (each one's
/// status and reason; `Ready` too) a moment later, and says Running once the VMI runs.
fn caught_up(vm: &Value, vmi: &Value) -> bool {
    let said = |object: &Value| -> BTreeMap<String, (Value, Value)> {
        object["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["type"] != "Failure" && c["type"] != "RestartRequired")
            .map(|c| {
                let reason = c.get("reason").cloned().unwrap_or(Value::Null);
                let reason = if reason == "" { Value::Null } else { reason };
                (
                    c["type"].as_str().unwrap_or_default().to_string(),
                    (c["status"].clone(), reason),
                )
            })
            .collect()
    };
    let running = vmi["status"]["phase"] == "Running";
    said(vm) == said(vmi) && (!running || printable_status(vm) == "Running")
}

/// One condition, without its times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Where the scenario arrived.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub vmi_phase: String,
    pub vmi_conditions: BTreeMap<String, Condition>,
    pub guest_os_info: BTreeMap<String, String>,
    pub interfaces: Vec<BTreeMap<String, String>>,
    pub vm_printable_status: String,
    pub vm_ready: bool,
    pub vm_conditions: BTreeMap<String, Condition>,
    /// The landmarks the serial console showed, in `LANDMARKS`' order.
    pub console: Vec<String>,
}

/// How `runStrategy: Halted` stops the VM: once it is Stopped, its VMI and launcher pods are gone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Halted {
    /// The VM's printable statuses from Halted on.
    pub vm_walk: Vec<String>,
    pub vm_printable_status: String,
    pub vm_conditions: BTreeMap<String, Condition>,
}

/// What one scenario showed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// The VMI's phases, from its `phaseTransitionTimestamps`.
    pub vmi_walk: Vec<String>,
    /// The VM's printable statuses, in the order polling saw them, repeats folded.
    pub vm_walk: Vec<String>,
    pub end: Snapshot,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<Halted>,
    /// What is left once the deleted VM is gone: its VMI, launcher pods, and on the host any path or mount named
    /// by their uids.
    pub left_after_deletion: Vec<String>,
}

fn conditions(object: &Value, ns: &str) -> BTreeMap<String, Condition> {
    let text = |v: &Value| v.as_str().unwrap_or_default().replace(ns, "NS");
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                text(&c["type"]),
                Condition {
                    status: text(&c["status"]),
                    reason: text(&c["reason"]),
                    message: text(&c["message"]),
                },
            )
        })
        .collect()
}

fn strings(object: &Value) -> BTreeMap<String, String> {
    object
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// `status.interfaces`, addresses as how many there are: real KubeVirt shows a masquerade NIC's pod address,
/// the stand-in (no pod) the guest's own.
fn interfaces(vmi: &Value) -> Vec<BTreeMap<String, String>> {
    vmi["status"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            let mut fields = strings(i);
            if fields.contains_key("ipAddress") {
                fields.insert("ipAddress".into(), "(an address)".into());
            }
            if let Some(list) = i["ipAddresses"].as_array() {
                fields.insert("ipAddresses".into(), format!("({} addresses)", list.len()));
            }
            fields
        })
        .collect()
}

fn printable_status(vm: &Value) -> String {
    vm["status"]["printableStatus"]
        .as_str()
        .unwrap_or("(none)")
        .to_string()
}

fn push_folded(walk: &mut Vec<String>, seen: String) {
    if walk.last() != Some(&seen) {
        walk.push(seen);
    }
}

/// `disk.img` of the claim `claim`'s hostPath volume, as CDI left it.
async fn disk_image(client: &Client, ns: &str, claim: &str) -> anyhow::Result<PathBuf> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get(claim)
        .await?;
    let pv_name = pvc
        .spec
        .and_then(|s| s.volume_name)
        .ok_or_else(|| anyhow::anyhow!("{claim} is not bound"))?;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name)
        .await?;
    let path = pv
        .spec
        .and_then(|s| s.host_path)
        .map(|h| PathBuf::from(h.path))
        .ok_or_else(|| anyhow::anyhow!("{pv_name} is not a hostPath volume"))?;
    Ok(path.join("disk.img"))
}

/// Replaces `image`'s bytes by `source`'s, sparsely, keeping the file CDI made (its owner and mode).
fn fill(image: &Path, source: &Path) -> anyhow::Result<()> {
    let out = std::process::Command::new("cp")
        .args(["--sparse=always", "--no-preserve=all"])
        .arg(source)
        .arg(image)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "cp {} {}: {}",
        source.display(),
        image.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Gives up on `what` at `at`.
struct Deadline {
    what: String,
    timeout: Duration,
    at: Instant,
}

impl Deadline {
    fn new(what: String, timeout: Duration) -> Self {
        Self {
            what,
            timeout,
            at: Instant::now() + timeout,
        }
    }

    /// Waits before the next look, or fails once the time is up.
    async fn wait(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            Instant::now() < self.at,
            "{}: not within {:?}",
            self.what,
            self.timeout
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }
}

/// The VMI `name` and the launcher pods `selector` finds, if any are left.
async fn left_of(
    vmis: &Api<DynamicObject>,
    pods: &Api<Pod>,
    name: &str,
    selector: &str,
) -> kube::Result<Vec<String>> {
    let mut left = vec![];
    if vmis.get_opt(name).await?.is_some() {
        left.push(format!("VirtualMachineInstance {name}"));
    }
    let launchers = pods.list(&ListParams::default().labels(selector)).await?;
    left.extend(
        launchers
            .items
            .iter()
            .map(|p| format!("Pod {}", p.name_any())),
    );
    Ok(left)
}

/// Runs `scenario` in `ns`: its DataVolumes, their images, Ferry's VM; then halts it and deletes it.
pub async fn run(
    client: &Client,
    ns: &str,
    scenario: Scenario,
    images: &Images,
    host: &Host,
) -> anyhow::Result<Observed> {
    let contents = scenario.disks(images);
    let (vmm, source) = scenario.migration(ns, contents.len());
    let dvs = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &dv_resource());
    for (i, content) in contents.iter().enumerate() {
        // What CDI makes of it (less its file system's overhead) holds the image.
        let size = match content {
            Content::Image(image) if std::fs::metadata(image)?.len() > 64 << 20 => "1200Mi",
            _ => "64Mi",
        };
        let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": surface::children::data_volume(&vmm, i as i32)},
            "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "lab-hostpath",
                "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": size}}}}});
        dvs.create(&PostParams::default(), &serde_json::from_value(dv)?)
            .await?;
    }
    for (i, content) in contents.iter().enumerate() {
        let name = surface::children::data_volume(&vmm, i as i32);
        let filling = Deadline::new(format!("DataVolume {name} Succeeded"), TIMEOUT);
        while dvs.get(&name).await?.data["status"]["phase"] != "Succeeded" {
            filling.wait().await?;
        }
        if let Content::Image(source) = content {
            fill(&disk_image(client, ns, &name).await?, source)?;
        }
    }

    // Ferry's VM, without its owner (no migration exists to own it).
    let mut vm = surface::build::virtual_machine(&vmm, &source);
    vm.metadata.owner_references = None;
    let vms = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &vm_resource());
    let vmis = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &vmi_resource());
    let name = vm.name_any();
    vms.create(&PostParams::default(), &vm).await?;
    let mut vm_walk = vec![];
    let mut running_since = None;
    let arriving = Deadline::new(format!("{name} arriving"), TIMEOUT);
    let end = loop {
        let vm = vms.get(&name).await?;
        // Before virt-controller's first sync a VM has no status, or says Stopped for a moment: when either is
        // seen is chance, so the walk starts after them.
        let status = printable_status(&vm.data);
        if !(vm_walk.is_empty() && matches!(status.as_str(), "(none)" | "Stopped")) {
            push_folded(&mut vm_walk, status);
        }
        if let Some(vmi) = vmis.get_opt(&name).await? {
            let console = host.landmarks(client, &vmi).await;
            if vmi.data["status"]["phase"] == "Running" {
                running_since.get_or_insert_with(Instant::now);
            }
            let running_for = running_since.map(|t: Instant| t.elapsed());
            if scenario.arrived(&vmi.data, &console, running_for) && caught_up(&vm.data, &vmi.data)
            {
                break Snapshot {
                    vmi_phase: vmi.data["status"]["phase"]
                        .as_str()
                        .unwrap_or_default()
                        .into(),
                    vmi_conditions: conditions(&vmi.data, ns),
                    guest_os_info: strings(&vmi.data["status"]["guestOSInfo"]),
                    interfaces: interfaces(&vmi.data),
                    vm_printable_status: printable_status(&vm.data),
                    vm_ready: vm.data["status"]["ready"] == true,
                    vm_conditions: conditions(&vm.data, ns),
                    console,
                };
            }
        }
        arriving.wait().await?;
    };
    let vmi = vmis.get(&name).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let selector = format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={name}");
    let mut uids: Vec<String> = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    uids.extend(vmi.uid());
    let vmi_walk = vmi.data["status"]["phaseTransitionTimestamps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["phase"].as_str().map(String::from))
        .collect();

    let left = || left_of(&vmis, &pods, &name, &selector);

    // Halted: the VMI and its launcher pod go, the VM stays.
    let halted = if scenario.halts_before_deletion() {
        vms.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runStrategy": "Halted"}})),
        )
        .await?;
        let mut vm_walk = vec![];
        let halting = Deadline::new(format!("{name} halted"), STOP_TIMEOUT);
        // The VM's status settles a moment after the VMI is gone: taken once it held for a few seconds.
        let mut settled: Option<(Value, Instant)> = None;
        let vm = loop {
            let vm = vms.get(&name).await?;
            push_folded(&mut vm_walk, printable_status(&vm.data));
            if printable_status(&vm.data) == "Stopped" && left().await?.is_empty() {
                match &settled {
                    Some((status, since)) if *status == vm.data["status"] => {
                        if since.elapsed() >= SETTLE {
                            break vm;
                        }
                    }
                    _ => settled = Some((vm.data["status"].clone(), Instant::now())),
                }
            } else {
                settled = None;
            }
            halting.wait().await?;
        };
        Some(Halted {
            vm_walk,
            vm_printable_status: printable_status(&vm.data),
            vm_conditions: conditions(&vm.data, ns),
        })
    } else {
        None
    };

    // Deleted as a user would (in the background, the default): nothing of it is left.
    vms.delete(&name, &DeleteParams::default()).await?;
    let deleted = Instant::now();
    let left_after_deletion = loop {
        let gone = vms.get_opt(&name).await?.is_none();
        let mut left = left().await?;
        left.extend(host.leftovers(&uids));
        if gone && left.is_empty() || deleted.elapsed() > STOP_TIMEOUT {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    Ok(Observed {
        vmi_walk,
        vm_walk,
        end,
        halted,
        left_after_deletion,
    })
}
