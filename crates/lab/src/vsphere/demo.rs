//! Demo VMs in the lab's vcsim: their empty simulator disks are replaced by real, bootable VMDKs, so a migrated
//! VM really boots and prints its marker. `DC0_H0_VM0` gets one disk; `DC0_H0_VM1` three of different sizes; the
//! cluster's two VMs get one small disk each (tests use them side by side).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{Session, provision};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::LabState;

use crate::standins::kubevirt::READY_MARKER;
use crate::vsphere::vcsim::VcsimEndpoint;

/// (VM, disk sizes in MiB); the first disk boots.
pub const DEMO_VMS: [(&str, &[u64]); 4] = [
    ("DC0_H0_VM0", &[64]),
    ("DC0_H0_VM1", &[64, 32, 16]),
    ("DC0_C0_RP0_VM0", &[16]),
    ("DC0_C0_RP0_VM1", &[16]),
];

/// The marker a demo VM's boot disk prints.
pub fn marker(vm: &str) -> String {
    format!("{READY_MARKER} {vm}")
}

pub async fn seed_demo_vms(endpoint: &VcsimEndpoint, dir: &Path) -> Result<()> {
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(120))?).await?;
    let disks_dir = dir.join("demo-disks");
    std::fs::create_dir_all(&disks_dir)?;
    for (vm_name, sizes) in DEMO_VMS {
        let vm = inventory::find_vm(&session, &VmSelector::Name(vm_name.into())).await?;
        let original: Vec<i32> = inventory::describe_vm(&session, &vm)
            .await?
            .disks
            .iter()
            .map(|d| d.key)
            .collect();
        for (i, mib) in sizes.iter().enumerate() {
            let stem = format!("{vm_name}-demo-{i}");
            let (descriptor, extent) = (
                disks_dir.join(format!("{stem}.vmdk")),
                disks_dir.join(format!("{stem}-flat.vmdk")),
            );
            if !descriptor.exists() || !extent.exists() {
                let raw = disks_dir.join(format!("{stem}.raw"));
                let sha = if i == 0 {
                    crate::vsphere::bootdisk::make_boot_disk(&raw, mib << 20, &marker(vm_name))?
                } else {
                    crate::disks::write_pattern(&raw, mib << 20, i as u64)?
                };
                crate::disks::raw_to_flat_vmdk(&raw, &stem, sha, mib << 20)?;
            }
            provision::attach_flat_vmdk(&session, &vm, &descriptor, &extent)
                .await
                .with_context(|| format!("attaching {stem} to {vm_name}"))?;
        }
        provision::remove_disks(&session, &vm, &original).await?;
    }
    session.logout().await;
    Ok(())
}

pub const PROVIDER: &str = "vcsim";
pub const VSPHERE_SECRET: &str = "vcsim-credentials";
pub const STAGING_SECRET: &str = "staging-credentials";
/// vcsim's VMs sit on the distributed port group; its standalone-host model calls it "VM Network".
pub const SOURCE_NETWORKS: [&str; 2] = ["DC0_DVPG0", "VM Network"];

/// The Provider for the lab's vcsim, its credentials Secret, and the staging Secret, in `ns`.
pub async fn create_provider(client: &Client, state: &LabState, ns: &str) -> Result<()> {
    let vcsim = state.vcsim.as_ref().context("the lab has no vcsim")?;
    let staging = state
        .staging
        .as_ref()
        .context("the lab has no staging store")?;
    let password = std::fs::read_to_string(&vcsim.password_file)?;
    apply_secret(
        client,
        ns,
        VSPHERE_SECRET,
        json!({"user": vcsim.username, "password": password.trim()}),
    )
    .await?;
    apply_secret(client, ns, STAGING_SECRET, json!(staging.secret_data()?)).await?;
    let ca = std::fs::read_to_string(&vcsim.ca_file)?;
    apply(client, ns, json!({
        "apiVersion": ferry_api::API_VERSION, "kind": "Provider",
        "metadata": {"name": PROVIDER, "namespace": ns},
        "spec": {"type": "vsphere", "url": vcsim.url, "secretRef": {"name": VSPHERE_SECRET}, "tls": {"caBundle": ca}},
    }))
    .await
}

pub async fn apply_secret(client: &Client, ns: &str, name: &str, data: Value) -> Result<()> {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns}, "stringData": data,
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("ferry-test").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// Server-side applies any manifest with apiVersion, kind and metadata.name.
pub async fn apply(client: &Client, ns: &str, manifest: Value) -> Result<()> {
    let (group_version, kind) = (
        manifest["apiVersion"].as_str().unwrap_or_default(),
        manifest["kind"].as_str().unwrap_or_default(),
    );
    let (group, version) = group_version
        .rsplit_once('/')
        .unwrap_or(("", group_version));
    let resource =
        kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, kind));
    let api = Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), ns, &resource);
    let name = manifest["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply("ferry-test").force(),
        &Patch::Apply(&manifest),
    )
    .await
    .with_context(|| format!("applying {kind} {ns}/{name}"))?;
    Ok(())
}

/// The lab's Linux guests run qemu-guest-agent, so its answer is the proof asked for; the demo disks' boot
/// sectors have none, and one that runs this long has printed its line.
fn guest_check(vm: &str) -> Value {
    if [
        crate::vsphere::linux_vms::LINUX_BIOS_VM,
        crate::vsphere::linux_vms::LINUX_EFI_VM,
        crate::vsphere::linux_vms::LINUX_STATIC_VM,
    ]
    .contains(&vm)
    {
        json!({"agent": "Required"})
    } else {
        json!({"settleSeconds": LAB_SETTLE_SECONDS})
    }
}

/// How long a lab guest without an agent must run to pass the guest check.
pub const LAB_SETTLE_SECONDS: i32 = 2;

/// A migration of the lab VM `vm` with every vcsim network on the pod network, written straight into its
/// volumes (no staging).
pub fn migration(_state: &LabState, ns: &str, name: &str, vm: &str) -> Value {
    let networks: Vec<Value> = SOURCE_NETWORKS
        .iter()
        .map(|n| json!({"source": n, "pod": {}}))
        .collect();
    json!({
        "apiVersion": ferry_api::API_VERSION, "kind": "VirtualMachineMigration",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "source": {"providerRef": {"name": PROVIDER}, "vm": {"name": vm}, "restorePowerState": true},
            "target": {"networks": networks},
            "guestCheck": guest_check(vm),
        },
    })
}

/// [`migration`], staged in the lab's MinIO (`spec.staging`).
pub fn staged_migration(state: &LabState, ns: &str, name: &str, vm: &str) -> Value {
    let staging = state.staging.clone().expect("the lab has a staging store");
    let mut manifest = migration(state, ns, name, vm);
    manifest["spec"]["staging"] = json!({"url": staging.url("migrations"), "endpoint": staging.endpoint,
        "secretRef": {"name": STAGING_SECRET}});
    match staging.ca_bundle().expect("the lab's CA is readable") {
        Some(ca) => manifest["spec"]["staging"]["caBundle"] = json!(ca),
        None => manifest["spec"]["staging"]["insecure"] = json!(true),
    }
    manifest
}
