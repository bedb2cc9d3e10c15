//! `ferry lab demo [--plan | --windows]`: the lab up, the controller running as in a cluster, one migration per
//! demo VM (or one plan of them all, through shared maps; or the phony Windows VMs, adapted) followed live, and a
//! summary of what happened to each.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferry_api::{Phase, VirtualMachineMigration};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::{Api, ResourceExt};

use crate::views::{bytes, phase_name};

pub const NAMESPACE: &str = "ferry-demo";
const DEFAULT_VMS: [&str; 3] = [
    "DC0_H0_VM0",
    "DC0_H0_VM1",
    ferry_lab::vsphere::linux_vms::LINUX_BIOS_VM,
];

pub async fn run(
    dir: PathBuf,
    vms: Vec<String>,
    as_plan: bool,
    windows: bool,
    node: crate::lab::NodeArg,
    install: crate::lab::InstallKind,
) -> Result<()> {
    let started = Instant::now();
    let vms = match (vms.is_empty(), windows) {
        (false, _) => vms,
        (true, false) => DEFAULT_VMS.map(String::from).to_vec(),
        (true, true) => WINDOWS_VMS.iter().map(|w| w.name.to_string()).collect(),
    };
    println!(
        "starting the lab in {} (the first run builds the Debian guest images: minutes) ...",
        dir.display()
    );
    let real = crate::lab::node_kind(&dir, node) == crate::lab::NodeKind::Real;
    let state = ferry_lab::up(&crate::lab::options_for(dir, node)?)
        .await?
        .into_state();
    if real {
        install_ferry(&state, install).await?;
    }
    println!(
        "lab ready after {:.1}s: kube-apiserver {}, vcsim {}, ferry controller {}",
        started.elapsed().as_secs_f64(),
        state.api_url,
        state.vcsim.as_ref().map_or("-", |v| v.url.as_str()),
        state.controller.as_deref().unwrap_or("-")
    );
    let client = state.client().await?;
    fresh_namespace(&client).await?;
    if windows {
        println!("seeding the phony Windows VMs (the first run builds them: a minute or two) ...");
        let vcsim = state.vcsim.as_ref().context("the lab has no vcsim")?;
        let fixtures = ferry_lab::windows::vms::seed_phony_windows_vms(vcsim, &state.dir).await?;
        ferry_lab::windows::claims::create_claims(&client, NAMESPACE, &fixtures).await?;
    }
    power_on_sources(&state, &vms).await?;
    ferry_lab::vsphere::demo::create_provider(&client, &state, NAMESPACE).await?;
    let name_of = |vm: &str| {
        if as_plan {
            ferry_api::names::plan_child(PLAN, vm)
        } else {
            migration_name(vm)
        }
    };
    let mut watched = crate::views::watch::Watched::All;
    let selector;
    let plans: Api<ferry_api::MigrationPlan> = Api::namespaced(client.clone(), NAMESPACE);
    if as_plan {
        let uid = create_plan(&client, &vms).await?;
        selector = format!("{}={uid}", ferry_api::keys::PLAN_UID_LABEL);
        watched = crate::views::watch::Watched::Plan {
            selector: &selector,
            plans: &plans,
            name: PLAN,
        };
    } else {
        for vm in &vms {
            let name = migration_name(vm);
            let mut manifest = ferry_lab::vsphere::demo::migration(&state, NAMESPACE, &name, vm);
            if windows {
                let adapted = ferry_lab::windows::claims::adapted_spec(
                    ferry_lab::windows::claims::DRIVERS_CLAIM,
                    true,
                );
                if let (Some(spec), serde_json::Value::Object(extra)) =
                    (manifest["spec"].as_object_mut(), adapted)
                {
                    spec.extend(extra);
                }
            }
            ferry_lab::vsphere::demo::apply(&client, NAMESPACE, manifest).await?;
            println!("created migration {NAMESPACE}/{name} for {vm}");
        }
    }
    // Hints name this binary as it was invoked (`./target/debug/ferry`, say), so they can be pasted.
    let ferry = std::env::args().next().unwrap_or_else(|| "ferry".into());
    println!(
        "following them (elsewhere: . {}/env && {ferry} watch -n {NAMESPACE})\n",
        state.dir.display()
    );
    let api: Api<VirtualMachineMigration> = Api::namespaced(client.clone(), NAMESPACE);
    let watch =
        crate::views::watch::follow(api.clone(), watched, true, std::io::stdout().is_terminal());
    tokio::time::timeout(Duration::from_secs(1800), watch)
        .await
        .context("the demo migrations did not end within 30 minutes")??;

    println!("\nSummary (total {:.1}s):", started.elapsed().as_secs_f64());
    let mut failed = vec![];
    for vm in &vms {
        let name = name_of(vm);
        let m = api.get(&name).await?;
        print!("{}", summary(&client, vm, &m).await);
        if windows {
            print!("{}", windows_summary(&client, vm, &m).await);
        }
        if m.status.as_ref().and_then(|s| s.phase) != Some(Phase::Succeeded) {
            failed.push(name);
        }
    }
    println!(
        "\nlook closer:  . {}/env && {ferry} get -n {NAMESPACE} && {ferry} describe -n {NAMESPACE} {}",
        state.dir.display(),
        name_of(&vms[0])
    );
    if as_plan {
        println!("the plan:     {ferry} describe -n {NAMESPACE} plan {PLAN}");
    }
    println!(
        "stop the lab: {ferry} lab down --dir {}",
        state.dir.display()
    );
    anyhow::ensure!(
        failed.is_empty(),
        "not every migration succeeded: {}; see `ferry describe -n {NAMESPACE} NAME`",
        failed.join(", ")
    );
    Ok(())
}

/// The phony Windows VMs `--windows` migrates by default.
const WINDOWS_VMS: [ferry_lab::windows::PhonyWindows; 2] =
    [ferry_lab::windows::WIN2K22, ferry_lab::windows::WIN11];

/// What was checked in a phony Windows VM's adapted volume, and what no lab can check.
async fn windows_summary(client: &kube::Client, vm: &str, m: &VirtualMachineMigration) -> String {
    let Some(guest) = ferry_lab::windows::ALL.into_iter().find(|w| w.name == vm) else {
        return String::new();
    };
    let status = m.status.clone().unwrap_or_default();
    let Some(claim) = status.disks.first().and_then(|d| d.data_volume.clone()) else {
        return "  adapted volume: none\n".into();
    };
    if status.phase != Some(Phase::Succeeded) {
        return String::new();
    }
    let static_mac = ferry_lab::windows::check::static_mac(m);
    let checked = match ferry_lab::volumes::volume_image(client, NAMESPACE, &claim).await {
        Ok(image) => tokio::task::spawn_blocking(move || {
            ferry_lab::windows::check::adapted_volume(&image, &guest, static_mac.as_deref())
        })
        .await
        .map_err(anyhow::Error::from)
        .and_then(|checked| checked),
        Err(e) => Err(e),
    };
    let mut out = String::new();
    match checked {
        Ok(found) => {
            out.push_str("  checked in the adapted volume (guestfish, hivexsh):\n");
            for line in found {
                out.push_str(&format!("    {line}\n"));
            }
        }
        Err(e) => out.push_str(&format!("  adapted volume: NOT as expected: {e:#}\n")),
    }
    out.push_str("  no lab can check:\n");
    for line in ferry_lab::windows::check::UNPROVEN {
        out.push_str(&format!("    {line}\n"));
    }
    out
}

/// The demo's plan, with every demo VM in flight at once.
const PLAN: &str = "demo";

/// The site's NetworkMap and StorageMap, and plan [`PLAN`] of `vms` through them; returns the plan's UID.
async fn create_plan(client: &kube::Client, vms: &[String]) -> Result<String> {
    use ferry_lab::vsphere::demo::{LAB_SETTLE_SECONDS, PROVIDER, SOURCE_NETWORKS, apply};
    use serde_json::json;
    let doc = |kind: &str, name: &str, spec: serde_json::Value| {
        json!({"apiVersion": ferry_api::API_VERSION, "kind": kind,
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})
    };
    let networks: Vec<_> = SOURCE_NETWORKS
        .iter()
        .map(|n| json!({"source": n, "pod": {}}))
        .collect();
    apply(
        client,
        NAMESPACE,
        doc("NetworkMap", "lab-networks", json!({"networks": networks})),
    )
    .await?;
    let datastores = json!({"datastores": [{"source": ferry_lab::vsphere::linux_vms::DATASTORE,
        "storageClassName": ferry_lab::standins::cdi::STORAGE_CLASS}]});
    apply(
        client,
        NAMESPACE,
        doc("StorageMap", "lab-datastores", datastores),
    )
    .await?;
    let listed: Vec<_> = vms.iter().map(|vm| json!({"name": vm})).collect();
    let plan = doc(
        "MigrationPlan",
        PLAN,
        json!({
        "providerRef": {"name": PROVIDER}, "vms": listed, "maxInFlight": vms.len().clamp(1, 500),
        "restorePowerState": true, "guestCheck": {"settleSeconds": LAB_SETTLE_SECONDS},
        "target": {"networkMapRef": {"name": "lab-networks"}, "storageMapRef": {"name": "lab-datastores"}}}),
    );
    apply(client, NAMESPACE, plan).await?;
    let created = Api::<ferry_api::MigrationPlan>::namespaced(client.clone(), NAMESPACE)
        .get(PLAN)
        .await?;
    println!(
        "created plan {NAMESPACE}/{PLAN} of {} VM(s), through NetworkMap lab-networks and StorageMap lab-datastores",
        vms.len()
    );
    Ok(created.metadata.uid.unwrap_or_default())
}

pub fn migration_name(vm: &str) -> String {
    vm.to_lowercase().replace('_', "-")
}

/// The demo starts over in an empty namespace: the previous demo's VMs and migrations go with the old one.
async fn fresh_namespace(client: &kube::Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(NAMESPACE).await?.is_some() {
        println!("removing the previous demo (namespace {NAMESPACE}) ...");
        let _ = namespaces
            .delete(NAMESPACE, &DeleteParams::background())
            .await;
        let deadline = Instant::now() + Duration::from_secs(180);
        while namespaces.get_opt(NAMESPACE).await?.is_some() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "namespace {NAMESPACE} is still being deleted after 3 minutes"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // Pod Security's `restricted` level, enforced: Ferry's Jobs are built for it (on a real node, they run under it).
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {
        "name": NAMESPACE,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
    }}))?;
    namespaces.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// A previous demo left its sources powered off; the demo shows them being shut down, so they start running.
async fn power_on_sources(state: &ferry_lab::LabState, vms: &[String]) -> Result<()> {
    let vcsim = state.vcsim.as_ref().context("the lab has no vcsim")?;
    let session =
        ferry_vsphere::Session::connect(vcsim.connect_config(Duration::from_secs(60))?).await?;
    for vm in vms {
        let moref = ferry_vsphere::inventory::find_vm(
            &session,
            &ferry_vsphere::VmSelector::Name(vm.clone()),
        )
        .await
        .with_context(|| {
            format!("{vm} is not in the lab's vcsim (`ferry inventory` lists its VMs)")
        })?;
        ferry_vsphere::power::power_on(&session, &moref, Duration::from_secs(60)).await?;
    }
    session.logout().await;
    Ok(())
}

async fn summary(client: &kube::Client, vm: &str, m: &VirtualMachineMigration) -> String {
    let status = m.status.clone().unwrap_or_default();
    let start = status.checkpoints.first().map(|c| c.entered.0);
    let end = status
        .checkpoints
        .iter()
        .find(|c| c.phase == Phase::Succeeded)
        .map(|c| c.entered.0)
        .or(status.completion_time.as_ref().map(|t| t.0));
    let took = match (start, end) {
        (Some(s), Some(e)) => e.duration_since(s).as_secs_f64(),
        _ => 0.0,
    };
    let mut out = format!(
        "{vm} -> {}/{}: {} in {took:.1}s{}\n",
        NAMESPACE,
        status.target_vm.clone().unwrap_or_else(|| m.name_any()),
        phase_name(status.phase),
        status
            .reason
            .as_ref()
            .filter(|_| status.phase != Some(Phase::Succeeded))
            .map(|r| format!(" ({r}: {})", status.message.clone().unwrap_or_default()))
            .unwrap_or_default()
    );
    if let Some(s) = start {
        let times: Vec<String> = status
            .checkpoints
            .iter()
            .map(|c| {
                format!(
                    "{} +{:.1}s",
                    phase_name(Some(c.phase)),
                    c.entered.0.duration_since(s).as_secs_f64()
                )
            })
            .collect();
        out.push_str(&format!("  checkpoints: {}\n", times.join(", ")));
    }
    let moved: i64 = status.disks.iter().map(|d| d.bytes_moved).sum();
    let rate = if took > 0.0 { moved as f64 / took } else { 0.0 };
    out.push_str(&format!(
        "  moved {} from {} disk(s), {}/s end to end\n",
        bytes(moved as f64),
        status.disks.len(),
        bytes(rate)
    ));
    let verified = status.disks.iter().filter(|d| d.verified).count();
    out.push_str(&format!(
        "  checksum: {verified} of {} disk(s) read back from their volumes with the source's sha256{}\n",
        status.disks.len(),
        if verified == status.disks.len() && verified > 0 { " (match)" } else { "" }
    ));
    let vmis = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ferry_api::foreign::vmi_resource(),
    );
    let target = status.target_vm.clone().unwrap_or_default();
    // A guest's agent may answer before the guest prints its line (which waits for the network and hashes the
    // data disk): under software emulation on a busy machine that takes minutes.
    // A phony Windows guest prints nothing: nothing to wait for.
    let phony_windows = ferry_lab::windows::ALL.iter().any(|w| w.name == vm);
    let deadline = Instant::now() + Duration::from_secs(if phony_windows { 0 } else { 240 });
    let marker = loop {
        let vmi = vmis.get_opt(&target).await.ok().flatten();
        let mut line = vmi.as_ref().and_then(|vmi| {
            vmi.annotations()
                .get(ferry_lab::standins::kubevirt::MARKER_ANNOTATION)
                .cloned()
        });
        if line.is_none() && vmi.is_some() {
            line = console_marker(client, &target).await;
        }
        if line.is_some() || vmi.is_none() || Instant::now() > deadline {
            break line;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    out.push_str(&match marker {
        Some(line) => format!("  guest: {line:?} on the migrated VM's serial console\n"),
        None => "  guest: no marker seen\n".to_string(),
    });
    if let Some(guest) = &status.guest {
        out.push_str(&format!(
            "  guest check: {:?}: {}\n",
            guest.evidence, guest.message
        ));
    }
    out
}

/// The guest's ready line as real KubeVirt records the serial console: in the `guest-console-log` container of
/// the VM's launcher pod. (The stand-in writes it as an annotation on the VMI instead.)
async fn console_marker(client: &kube::Client, vm: &str) -> Option<String> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = format!("vm.kubevirt.io/name={vm}");
    let launchers = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .ok()?;
    for pod in launchers.items {
        let params = kube::api::LogParams {
            container: Some("guest-console-log".into()),
            ..Default::default()
        };
        let Ok(log) = pods.logs(&pod.name_any(), &params).await else {
            continue;
        };
        if let Some(line) = log
            .lines()
            .find(|l| l.starts_with(ferry_lab::standins::kubevirt::READY_MARKER))
        {
            return Some(line.trim().to_string());
        }
    }
    None
}

/// Ferry on a real node, installed as a user installs it: the chart with Helm, or deploy/ applied unchanged; both
/// replicas Ready and one leading before any migration is created.
async fn install_ferry(state: &ferry_lab::LabState, how: crate::lab::InstallKind) -> Result<()> {
    use ferry_lab::real_node::install;
    let started = Instant::now();
    match how {
        crate::lab::InstallKind::Helm => {
            let chart = std::path::Path::new(install::CHART_DIR);
            println!("installing Ferry with Helm from {} ...", chart.display());
            install::helm_install(state, chart)?;
        }
        crate::lab::InstallKind::Manifests => {
            let deploy = std::path::Path::new(install::DEPLOY_DIR);
            println!("installing Ferry from {} ...", deploy.display());
            install::apply_deploy(state, deploy)?;
        }
    }
    let rollout = install::wait_rollout(&state.client().await?).await?;
    println!(
        "ferry installed in {:.1}s: {}/{} replicas available, {} leads",
        started.elapsed().as_secs_f64(),
        rollout.available,
        rollout.replicas,
        rollout.leader.as_deref().unwrap_or("-")
    );
    Ok(())
}
