//! `ferry plan create`: a MigrationPlan's YAML from what a Provider's vCenter holds (VMs chosen by folder, name
//! pattern and power state), with the maps it needs, and what no map covers said before anything is applied.
//! It reads the cluster and vCenter and writes only to standard output.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ferry_api::names::dns_label;
use ferry_api::{
    LocalObjectReference, MigrationPlan, MigrationPlanSpec, NetworkMap, NetworkMapSpec,
    NetworkMapping, PlanSelector, PlanVm, PodNetwork, PowerState, Provider, StorageMap,
    StorageMapSpec, StorageMapping,
};
use ferry_vsphere::{VmInfo, inventory};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};

use crate::views::Scope;

#[derive(Args)]
pub struct PlanArgs {
    #[command(subcommand)]
    command: PlanCommand,
}

#[derive(Subcommand)]
enum PlanCommand {
    /// Write a plan of the VMs a filter chooses, and the maps they need, as YAML for `kubectl apply -f -`.
    Create(CreateArgs),
}

#[derive(Args)]
struct CreateArgs {
    /// The plan's name.
    name: String,
    /// The Provider (in the namespace) whose vCenter holds the VMs.
    #[arg(long)]
    provider: String,
    /// A VM folder's inventory path, for example /DC0/vm/web: the VMs below it.
    #[arg(long)]
    folder: Option<String>,
    /// VM names to take, as a glob (`*` any run, `?` one character), for example 'web-*'.
    #[arg(long)]
    name_pattern: Option<String>,
    /// Only VMs in this power state.
    #[arg(long, value_parser = parse_power)]
    power_state: Option<PowerState>,
    /// Write the filter as the plan's spec.selector (chosen again when the plan starts) instead of the VMs
    /// chosen now.
    #[arg(long)]
    as_selector: bool,
    /// An existing NetworkMap to use; without it, a new one is written (the most used network on the pod
    /// network; the others for you to map).
    #[arg(long)]
    network_map: Option<String>,
    /// An existing StorageMap to use; without it, a new one is written (every datastore on --storage-class).
    #[arg(long)]
    storage_map: Option<String>,
    /// The StorageClass of a new StorageMap; without it, the cluster's default.
    #[arg(long)]
    storage_class: Option<String>,
    /// Migrations of the plan running at once.
    #[arg(long, default_value_t = 10)]
    max_in_flight: i32,
    #[command(flatten)]
    scope: Scope,
}

fn parse_power(text: &str) -> Result<PowerState, String> {
    match text.to_ascii_lowercase().as_str() {
        "poweredon" | "on" => Ok(PowerState::PoweredOn),
        "poweredoff" | "off" => Ok(PowerState::PoweredOff),
        "suspended" => Ok(PowerState::Suspended),
        _ => Err(format!(
            "{text:?} is no power state: PoweredOn, PoweredOff or Suspended"
        )),
    }
}

pub async fn run(args: PlanArgs) -> Result<()> {
    match args.command {
        PlanCommand::Create(args) => create(args).await,
    }
}

async fn create(args: CreateArgs) -> Result<()> {
    if args.folder.is_none() && args.name_pattern.is_none() {
        bail!(
            "say which VMs: --folder, --name-pattern, or both (a plan never takes a whole vCenter by accident)"
        );
    }
    let selector = PlanSelector {
        folder: args.folder.clone(),
        name_pattern: args.name_pattern.clone(),
        power_state: args.power_state,
    };
    let (client, ns) = args.scope.client().await?;
    let provider = Api::<Provider>::namespaced(client.clone(), &ns)
        .get_opt(&args.provider)
        .await?
        .with_context(|| format!("no Provider {ns}/{}", args.provider))?;
    let session = ferry_controller::surface::Actions::new(client.clone())
        .provider_session(&provider)
        .await
        .with_context(|| format!("logging in to {}", provider.spec.url))?;
    let listed = match &selector.folder {
        Some(folder) => inventory::list_vms_in_folder(&session, folder).await?,
        None => inventory::list_vms(&session).await?,
    };
    let mut chosen = Vec::new();
    for vm in listed
        .iter()
        .filter(|vm| selector.matches(&vm.name, vm.power_state))
    {
        let moref = ferry_vsphere::MoRef::new("VirtualMachine", vm.moref.as_str());
        chosen.push(inventory::describe_vm(&session, &moref).await?);
    }
    session.logout().await;
    if chosen.is_empty() {
        bail!("no VM of Provider {} matches {selector}", args.provider);
    }
    let network_map = match &args.network_map {
        Some(name) => Existing(
            Api::<NetworkMap>::namespaced(client.clone(), &ns)
                .get_opt(name)
                .await?
                .with_context(|| format!("no NetworkMap {ns}/{name}"))?,
        ),
        None => New(proposed_network_map(&args.name, &ns, &chosen)),
    };
    let storage_map = match &args.storage_map {
        Some(name) => Existing(
            Api::<StorageMap>::namespaced(client.clone(), &ns)
                .get_opt(name)
                .await?
                .with_context(|| format!("no StorageMap {ns}/{name}"))?,
        ),
        None => {
            let class = match &args.storage_class {
                Some(class) => class.clone(),
                None => default_storage_class(&client).await?,
            };
            New(proposed_storage_map(&args.name, &ns, &chosen, &class))
        }
    };
    let uncovered = uncovered(&chosen, network_map.get(), storage_map.get());
    for line in &uncovered {
        eprintln!("not covered: {line}");
    }
    let plan = plan(&args, &ns, &selector, &chosen, &network_map, &storage_map);
    let mut out = format!(
        "# {} VM(s) of Provider {} chosen by {selector}.\n",
        chosen.len(),
        args.provider
    );
    if uncovered.is_empty() {
        out.push_str("# Every NIC and disk is covered by a map.\n");
    } else {
        out.push_str("# Not covered by a map yet (preflight refuses these VMs until they are):\n");
        for line in &uncovered {
            out.push_str(&format!("#   {line}\n"));
        }
    }
    if let New(map) = &network_map {
        out.push_str(&document(map)?);
    }
    if let New(map) = &storage_map {
        out.push_str(&document(map)?);
    }
    out.push_str(&document(&plan)?);
    print!("{out}");
    Ok(())
}

/// A map named on the command line, or one this command writes.
enum MapChoice<M> {
    Existing(M),
    New(M),
}
use MapChoice::{Existing, New};

impl<M: kube::Resource> MapChoice<M> {
    fn get(&self) -> &M {
        match self {
            Existing(m) | New(m) => m,
        }
    }

    fn reference(&self) -> LocalObjectReference {
        LocalObjectReference {
            name: kube::ResourceExt::name_any(self.get()),
        }
    }
}

fn document<T: serde::Serialize>(object: &T) -> Result<String> {
    Ok(format!("---\n{}", serde_saphyr::to_string(object)?))
}

/// Networks by how many chosen VMs use them, most used first (then by name).
fn networks_by_use(chosen: &[VmInfo]) -> Vec<String> {
    let mut uses: BTreeMap<&str, usize> = BTreeMap::new();
    for vm in chosen {
        let networks: BTreeSet<&str> = vm.nics.iter().map(|n| n.network.as_str()).collect();
        for network in networks {
            *uses.entry(network).or_default() += 1;
        }
    }
    let mut ranked: Vec<(&str, usize)> = uses.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    ranked.into_iter().map(|(n, _)| n.to_string()).collect()
}

/// The most used network on the pod network; the others are the user's to map (Multus or ignored), since a VM
/// has one pod network NIC at most.
fn proposed_network_map(plan: &str, ns: &str, chosen: &[VmInfo]) -> NetworkMap {
    let networks = networks_by_use(chosen)
        .into_iter()
        .take(1)
        .map(|source| NetworkMapping {
            source,
            pod: Some(PodNetwork {}),
            multus: None,
            ignored: None,
        })
        .collect();
    let mut map = NetworkMap::new(&format!("{plan}-networks"), NetworkMapSpec { networks });
    map.metadata.namespace = Some(ns.to_string());
    map
}

fn proposed_storage_map(plan: &str, ns: &str, chosen: &[VmInfo], class: &str) -> StorageMap {
    let datastores: BTreeSet<&str> = chosen
        .iter()
        .flat_map(|vm| vm.disks.iter().map(|d| d.datastore.as_str()))
        .collect();
    let datastores = datastores
        .into_iter()
        .map(|source| StorageMapping {
            source: source.to_string(),
            storage_class_name: class.to_string(),
            volume_mode: None,
            access_mode: None,
        })
        .collect();
    let mut map = StorageMap::new(&format!("{plan}-datastores"), StorageMapSpec { datastores });
    map.metadata.namespace = Some(ns.to_string());
    map
}

/// Each network and datastore a chosen VM uses that the maps do not cover, with the VMs that use it.
fn uncovered(chosen: &[VmInfo], networks: &NetworkMap, storage: &StorageMap) -> Vec<String> {
    let mapped_networks: BTreeSet<&str> = networks
        .spec
        .networks
        .iter()
        .map(|n| n.source.as_str())
        .collect();
    let mapped_datastores: BTreeSet<&str> = storage
        .spec
        .datastores
        .iter()
        .map(|d| d.source.as_str())
        .collect();
    let mut missing: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for vm in chosen {
        for nic in vm
            .nics
            .iter()
            .filter(|n| !mapped_networks.contains(n.network.as_str()))
        {
            missing
                .entry(format!("network {:?}", nic.network))
                .or_default()
                .insert(&vm.name);
        }
        for disk in vm
            .disks
            .iter()
            .filter(|d| !mapped_datastores.contains(d.datastore.as_str()))
        {
            missing
                .entry(format!("datastore {:?}", disk.datastore))
                .or_default()
                .insert(&vm.name);
        }
    }
    missing
        .into_iter()
        .map(|(what, vms)| {
            let vms: Vec<&str> = vms.into_iter().collect();
            format!("{what} (used by {})", vms.join(", "))
        })
        .collect()
}

/// The plan: the chosen VMs by name (by moref where a name is not unique among them), or the filter itself.
fn plan(
    args: &CreateArgs,
    ns: &str,
    selector: &PlanSelector,
    chosen: &[VmInfo],
    networks: &MapChoice<NetworkMap>,
    storage: &MapChoice<StorageMap>,
) -> MigrationPlan {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for vm in chosen {
        *names.entry(&vm.name).or_default() += 1;
    }
    let vms = if args.as_selector {
        vec![]
    } else {
        chosen
            .iter()
            .map(|vm| match names[vm.name.as_str()] {
                1 => PlanVm {
                    name: Some(vm.name.clone()),
                    ..Default::default()
                },
                _ => PlanVm {
                    moref: Some(vm.moref.clone()),
                    target_name: Some(dns_label(&format!("{}-{}", vm.name, vm.moref))),
                    ..Default::default()
                },
            })
            .collect()
    };
    let spec: MigrationPlanSpec = serde_json::from_value(serde_json::json!({
        "providerRef": {"name": args.provider},
        "vms": vms,
        "maxInFlight": args.max_in_flight,
        "target": {"networkMapRef": networks.reference(), "storageMapRef": storage.reference()},
    }))
    .expect("a plan spec from typed parts");
    let mut plan = MigrationPlan::new(
        &args.name,
        MigrationPlanSpec {
            selector: args.as_selector.then(|| selector.clone()),
            ..spec
        },
    );
    plan.metadata.namespace = Some(ns.to_string());
    plan
}

/// The StorageClass annotated as the cluster's default.
async fn default_storage_class(client: &kube::Client) -> Result<String> {
    const DEFAULT: &str = "storageclass.kubernetes.io/is-default-class";
    Api::<StorageClass>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|sc| {
            sc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT))
                .is_some_and(|v| v == "true")
        })
        .and_then(|sc| sc.metadata.name)
        .context("the cluster has no default StorageClass: pass --storage-class or --storage-map")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(name: &str, moref: &str, networks: &[&str], datastores: &[&str]) -> VmInfo {
        let mut info = test_vm();
        info.name = name.into();
        info.moref = moref.into();
        info.nics = networks
            .iter()
            .map(|n| ferry_vsphere::NicInfo {
                key: 4000,
                label: "Network adapter 1".into(),
                mac: "00:50:56:00:00:01".into(),
                model: "vmxnet3".into(),
                network: n.to_string(),
            })
            .collect();
        info.disks = datastores
            .iter()
            .map(|d| ferry_vsphere::DiskInfo {
                key: 2000,
                label: "Hard disk 1".into(),
                bus: "scsi".into(),
                controller: "ParaVirtualSCSIController".into(),
                controller_model: "pvscsi".into(),
                controller_key: 1000,
                unit_number: 0,
                capacity_bytes: 1 << 30,
                file: format!("[{d}] {name}/{name}.vmdk"),
                datastore: d.to_string(),
                backing: "flat".into(),
                thin: true,
                disk_mode: "persistent".into(),
                uuid: None,
                change_id: None,
                parents: vec![],
            })
            .collect();
        info
    }

    fn test_vm() -> VmInfo {
        VmInfo {
            moref: String::new(),
            name: String::new(),
            uuid: None,
            instance_uuid: None,
            guest_id: None,
            firmware: ferry_api::Firmware::Bios,
            efi_secure_boot: None,
            boot_order: vec![],
            vtpm: false,
            cpus: 1,
            cores_per_socket: 1,
            memory_mib: 1024,
            power_state: PowerState::PoweredOn,
            tools_running_status: None,
            guest_network: Default::default(),
            change_tracking: false,
            snapshots: 0,
            datacenter: "DC0".into(),
            host: None,
            disks: vec![],
            nics: vec![],
        }
    }

    #[test]
    fn the_most_used_network_goes_to_the_pod_network_and_the_rest_is_listed_as_not_covered() {
        let chosen = [
            vm("web-1", "vm-1", &["app"], &["ds1"]),
            vm("web-2", "vm-2", &["app", "backup"], &["ds1", "ds2"]),
            vm("web-3", "vm-3", &["app"], &["ds2"]),
        ];
        let networks = proposed_network_map("wave", "apps", &chosen);
        assert_eq!(networks.spec.networks.len(), 1);
        assert_eq!(networks.spec.networks[0].source, "app");
        assert!(networks.spec.networks[0].pod.is_some());
        let storage = proposed_storage_map("wave", "apps", &chosen, "fast");
        let sources: Vec<_> = storage
            .spec
            .datastores
            .iter()
            .map(|d| d.source.as_str())
            .collect();
        assert_eq!(sources, ["ds1", "ds2"]);
        assert_eq!(
            uncovered(&chosen, &networks, &storage),
            [r#"network "backup" (used by web-2)"#]
        );
        let partial = proposed_storage_map("wave", "apps", &chosen[..1], "fast");
        assert_eq!(
            uncovered(&chosen, &networks, &partial),
            [
                r#"datastore "ds2" (used by web-2, web-3)"#,
                r#"network "backup" (used by web-2)"#
            ]
        );
    }
}
