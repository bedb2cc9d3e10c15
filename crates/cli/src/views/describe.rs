//! `ferry describe NAME`: what was asked, where it stands, what happened, and what to do when it stopped.

use anyhow::{Context, Result};
use clap::Args;
use ferry_api::{
    ErrorClass, MigrationPlan, Phase, Reason, VirtualMachineMigration, VirtualMachineMigrationSpec,
    VirtualMachineMigrationStatus,
};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;

use super::{Scope, age, bytes, phase_name, table};

#[derive(Args)]
pub struct DescribeArgs {
    /// The migration; or `plan`, then the plan's name.
    name: String,
    /// With `plan`: the plan.
    plan: Option<String>,
    #[command(flatten)]
    scope: Scope,
}

pub async fn run(args: DescribeArgs) -> Result<()> {
    let (client, namespace) = args.scope.client().await?;
    if let Some(plan) = &args.plan {
        if !super::plan::names_plans(Some(&args.name)) {
            anyhow::bail!(
                "ferry describe takes NAME, or plan NAME; not {:?}",
                args.name
            );
        }
        let api: kube::Api<MigrationPlan> = kube::Api::namespaced(client, &namespace);
        let found = api
            .get_opt(plan)
            .await?
            .with_context(|| format!("no plan {plan} in namespace {namespace}"))?;
        print!("{}", super::plan::render(&found, Timestamp::now()));
        return Ok(());
    }
    let api: kube::Api<VirtualMachineMigration> = kube::Api::namespaced(client.clone(), &namespace);
    let vmm = api
        .get_opt(&args.name)
        .await?
        .with_context(|| format!("no migration {} in namespace {namespace}", args.name))?;
    let events: kube::Api<Event> = kube::Api::namespaced(client, &namespace);
    let selector = format!("involvedObject.uid={}", vmm.uid().unwrap_or_default());
    let mut events = events
        .list(&ListParams::default().fields(&selector))
        .await?
        .items;
    events.sort_by_key(event_time);
    print!("{}", render(&vmm, &events, Timestamp::now()));
    Ok(())
}

fn event_time(e: &Event) -> Timestamp {
    e.event_time
        .as_ref()
        .map(|t| t.0)
        .or(e.last_timestamp.as_ref().map(|t| t.0))
        .or(e.first_timestamp.as_ref().map(|t| t.0))
        .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

pub fn render(vmm: &VirtualMachineMigration, events: &[Event], now: Timestamp) -> String {
    let status = vmm.status.clone().unwrap_or_default();
    let mut out = String::new();
    asked(&mut out, vmm, &status);
    standing(&mut out, &status);
    checkpoints(&mut out, &status);
    conditions(&mut out, &status, now);
    disks(&mut out, &status);
    if let Some(warm) = &vmm.spec.warm {
        super::warm::render(&mut out, warm, status.warm.as_ref(), now);
    }
    retries(&mut out, &vmm.spec, &status);
    what_went_wrong(&mut out, vmm, &status);
    recent_events(&mut out, events, now);
    out
}

/// One line of the header: the key, padded, then its value.
fn line(out: &mut String, key: &str, value: String) {
    out.push_str(&format!("{key:<12}{value}\n"));
}

/// What was asked: the migration, its source, target, devices and staging.
fn asked(out: &mut String, vmm: &VirtualMachineMigration, status: &VirtualMachineMigrationStatus) {
    let spec = &vmm.spec;
    line(
        out,
        "Name:",
        format!("{}/{}", vmm.namespace().unwrap_or_default(), vmm.name_any()),
    );
    line(out, "Source:", source(spec, status));
    if let Some(network) = status.source.as_ref().and_then(guest_network) {
        line(out, "Guest network:", network);
    }
    line(out, "Target:", target(vmm, status));
    line(out, "Devices:", devices(spec));
    line(
        out,
        "Staging:",
        match &spec.staging {
            Some(staging) => format!("{} ({:?})", staging.url, spec.conversion.format),
            None => "none: each disk is written straight into its volume".to_string(),
        },
    );
}

fn source(spec: &VirtualMachineMigrationSpec, status: &VirtualMachineMigrationStatus) -> String {
    let vm = &spec.source.vm;
    let selector = vm
        .name
        .clone()
        .or(vm.inventory_path.clone())
        .or(vm.uuid.clone())
        .or(vm.moref.clone())
        .unwrap_or_default();
    format!(
        "{selector} via Provider {} (power off: {:?}{}){}",
        spec.source.provider_ref,
        spec.source.power_off.mode,
        if spec.source.restore_power_state {
            ", restored if cancelled or failed"
        } else {
            ""
        },
        status
            .source
            .as_ref()
            .map(|s| format!(", {} {} vCPU {} MiB", s.moref, s.cpus, s.memory_mib))
            .unwrap_or_default()
    )
}

/// What VMware Tools reported of the guest's network when it was discovered: each NIC's addresses and their
/// origin, the default gateways and DNS servers; `None` when they reported nothing.
fn guest_network(source: &ferry_api::SourceVmStatus) -> Option<String> {
    let mut parts: Vec<String> = source
        .nics
        .iter()
        .filter(|n| !n.ip_addresses.is_empty())
        .map(|n| {
            let addresses: Vec<String> = n
                .ip_addresses
                .iter()
                .map(|a| {
                    let origin = if a.is_static() { "static" } else { &a.origin };
                    format!("{}/{} {origin}", a.address, a.prefix_length)
                })
                .collect();
            format!("{} {}", n.mac, addresses.join(", "))
        })
        .collect();
    if parts.is_empty() {
        return None;
    }
    if let Some(reported) = &source.guest_network {
        if !reported.default_gateways.is_empty() {
            let gateways: Vec<&str> = reported
                .default_gateways
                .iter()
                .map(|g| g.address.as_str())
                .collect();
            parts.push(format!("gateway {}", gateways.join(", ")));
        }
        if !reported.dns_servers.is_empty() {
            parts.push(format!("DNS {}", reported.dns_servers.join(", ")));
        }
    }
    Some(format!(
        "{} (as VMware Tools reported it)",
        parts.join("; ")
    ))
}

fn target(vmm: &VirtualMachineMigration, status: &VirtualMachineMigrationStatus) -> String {
    let spec = &vmm.spec;
    let networks = networks(spec, status);
    let placed = status.disks.first().and_then(|d| d.storage.as_ref());
    let maps = super::map_names(&spec.target);
    format!(
        "VM {} ({:?}, {:?} volumes, StorageClass {}), networks: {}{}",
        spec.target.name.clone().unwrap_or_else(|| vmm.name_any()),
        spec.target.run_strategy,
        placed.map_or(spec.target.volume_mode.unwrap_or_default(), |p| p
            .volume_mode),
        storage_classes(spec, status),
        if networks.is_empty() {
            "none".into()
        } else {
            networks.join(", ")
        },
        if maps.is_empty() {
            String::new()
        } else {
            format!(" (from {})", maps.join(" and "))
        }
    )
}

/// Each source network and where it goes: what Validating resolved from the target and the maps, else what the
/// target says.
fn networks(
    spec: &VirtualMachineMigrationSpec,
    status: &VirtualMachineMigrationStatus,
) -> Vec<String> {
    let mapped = if status.networks.is_empty() {
        &spec.target.networks
    } else {
        &status.networks
    };
    mapped
        .iter()
        .map(|n| {
            let to = match (&n.pod, &n.multus) {
                (Some(_), _) => "pod".to_string(),
                (_, Some(m)) => format!("multus {}", m.network_name),
                _ => "ignored".to_string(),
            };
            format!("{} -> {to}", n.source)
        })
        .collect()
}

/// The StorageClasses the disks were placed on, else the one the target names.
fn storage_classes(
    spec: &VirtualMachineMigrationSpec,
    status: &VirtualMachineMigrationStatus,
) -> String {
    let classes: std::collections::BTreeSet<String> = status
        .disks
        .iter()
        .filter_map(|d| d.storage.as_ref())
        .map(|s| {
            s.storage_class_name
                .clone()
                .unwrap_or_else(|| "default".into())
        })
        .collect();
    if classes.is_empty() {
        spec.target
            .storage_class_name
            .clone()
            .unwrap_or_else(|| "default".into())
    } else {
        classes.into_iter().collect::<Vec<_>>().join(", ")
    }
}

fn devices(spec: &VirtualMachineMigrationSpec) -> String {
    let devices = match spec.target.devices {
        Some(d) => format!("{d:?}"),
        None if spec.conversion.guest_adaptation == ferry_api::GuestAdaptation::VirtV2v => {
            "Virtio (default with guest adaptation)".into()
        }
        None => "Compatibility (default: SATA disks, e1000e NICs)".into(),
    };
    let check = &spec.guest_check;
    format!(
        "{devices}; guest check: agent {}, settle {} s, timeout {} s",
        check
            .agent
            .map_or("Optional (default)".to_string(), |a| format!("{a:?}")),
        check.settle_seconds,
        check.timeout_seconds
    )
}

/// Where it stands: phase, message, progress, and what is known of the source's power, the adaptation and the
/// guest.
fn standing(out: &mut String, status: &VirtualMachineMigrationStatus) {
    line(
        out,
        "Phase:",
        format!(
            "{}  {}",
            phase_name(status.phase),
            status.reason.clone().unwrap_or_default()
        ),
    );
    if let Some(message) = &status.message {
        line(out, "Message:", message.clone());
    }
    line(
        out,
        "Progress:",
        status.progress.clone().unwrap_or_else(|| "-".into()),
    );
    if let Some(power) = &status.power {
        let state =
            |p: Option<ferry_api::PowerState>| p.map_or("unknown".into(), |p| format!("{p:?}"));
        line(
            out,
            "Power:",
            format!(
                "source VM {} now, {} before the migration{}",
                state(power.current),
                state(power.original),
                if power.restored {
                    "; restored by Ferry"
                } else {
                    ""
                }
            ),
        );
    }
    if let Some(adaptation) = &status.adaptation {
        line(
            out,
            "Adapted:",
            format!(
                "{} by virt-v2v in {} s (osinfo {})",
                adaptation.os,
                adaptation.seconds,
                if adaptation.osinfo.is_empty() {
                    "unknown"
                } else {
                    &adaptation.osinfo
                }
            ),
        );
        if let Some(names) = &adaptation.interface_names {
            line(
                out,
                "Interfaces:",
                ferry_controller::surface::describe_interface_names(names),
            );
        }
    }
    if let Some(copies) = copies_again(status) {
        line(out, "Copied:", copies);
    }
    if let Some(guest) = &status.guest {
        line(
            out,
            "Guest:",
            format!("{:?}: {}", guest.evidence, guest.message),
        );
    }
}

/// What is known of the copy beyond the first one: copied again for `spec.recopy`, or to be written again after
/// an adaptation attempt that may have changed the volumes.
fn copies_again(status: &VirtualMachineMigrationStatus) -> Option<String> {
    let recopied = (status.recopied > 0).then(|| {
        format!(
            "again from the source for spec.recopy {} (the source was changed on purpose)",
            status.recopied
        )
    });
    let rewrite = status.rewrite_volumes.then(|| {
        "the volumes are written from the source again before the next adaptation attempt (the last one may \
         have changed them)"
            .to_string()
    });
    match (recopied, rewrite) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    }
}

/// When each checkpoint was entered, and when the migration ended.
fn checkpoints(out: &mut String, status: &VirtualMachineMigrationStatus) {
    let Some(first) = status.checkpoints.first() else {
        return;
    };
    out.push_str("\nCheckpoints:\n");
    let start = first.entered.0;
    let mut rows = vec![vec![
        "  PHASE".to_string(),
        "ENTERED".into(),
        "AFTER START".into(),
    ]];
    for c in &status.checkpoints {
        rows.push(vec![
            format!("  {}", phase_name(Some(c.phase))),
            c.entered.0.strftime("%H:%M:%S%.3f").to_string(),
            format!("+{:.1}s", c.entered.0.duration_since(start).as_secs_f64()),
        ]);
    }
    if let Some(end) = &status.completion_time {
        rows.push(vec![
            "  (ended)".into(),
            end.0.strftime("%H:%M:%S").to_string(),
            // Whole seconds (metav1.Time) against microseconds: never before the start.
            format!(
                "+{:.1}s",
                end.0.duration_since(start).as_secs_f64().max(0.0)
            ),
        ]);
    }
    out.push_str(&table(&rows));
}

fn conditions(out: &mut String, status: &VirtualMachineMigrationStatus, now: Timestamp) {
    if status.conditions.is_empty() {
        return;
    }
    out.push_str("\nConditions:\n");
    let mut rows = vec![vec![
        "  TYPE".to_string(),
        "STATUS".into(),
        "REASON".into(),
        "AGE".into(),
        "MESSAGE".into(),
    ]];
    for c in &status.conditions {
        rows.push(vec![
            format!("  {}", c.type_),
            c.status.clone(),
            c.reason.clone(),
            age(c.last_transition_time.0, now),
            c.message.clone(),
        ]);
    }
    out.push_str(&table(&rows));
}

fn disks(out: &mut String, status: &VirtualMachineMigrationStatus) {
    if status.disks.is_empty() {
        return;
    }
    out.push_str("\nDisks:\n");
    let mut rows = vec![vec![
        "  #".to_string(),
        "SOURCE".into(),
        "CAPACITY".into(),
        "MOVED".into(),
        "DATAVOLUME".into(),
        "IMPORT".into(),
        "SHA256".into(),
        "VERIFIED".into(),
    ]];
    for d in &status.disks {
        rows.push(vec![
            format!("  {}", d.index),
            d.source_file.clone(),
            bytes(d.capacity_bytes as f64),
            bytes(d.bytes_moved as f64),
            d.data_volume.clone().unwrap_or_else(|| "-".into()),
            d.progress.clone().unwrap_or_else(|| "-".into()),
            d.sha256
                .as_ref()
                .map(|s| format!("{}…", &s[..s.len().min(12)]))
                .unwrap_or_else(|| "-".into()),
            if d.verified {
                "yes".into()
            } else {
                "no".into()
            },
        ]);
    }
    out.push_str(&table(&rows));
}

/// Attempts in this checkpoint and the retry budget each step used, once there is any.
fn retries(
    out: &mut String,
    spec: &VirtualMachineMigrationSpec,
    status: &VirtualMachineMigrationStatus,
) {
    let Some(retry) = status
        .retry
        .as_ref()
        .filter(|r| r.attempts > 0 || !r.budget_used.is_empty())
    else {
        return;
    };
    let used: Vec<String> = retry
        .budget_used
        .iter()
        .map(|b| format!("{} {}", phase_name(Some(b.phase)), b.used))
        .collect();
    out.push_str(&format!(
        "\nRetries:    {} attempt(s) in this checkpoint; budget used: {} (of {} per step){}\n",
        retry.attempts,
        if used.is_empty() {
            "none".into()
        } else {
            used.join(", ")
        },
        spec.retry.budget,
        retry
            .next_attempt_time
            .as_ref()
            .map(|t| format!("; next attempt at {}", t.0.strftime("%H:%M:%S")))
            .unwrap_or_default()
    ));
}

/// For a migration that stopped (Failed, or waiting for a person): its last error and what to do about it.
fn what_went_wrong(
    out: &mut String,
    vmm: &VirtualMachineMigration,
    status: &VirtualMachineMigrationStatus,
) {
    let stopped = matches!(
        status.phase,
        Some(Phase::Failed) | Some(Phase::ManualInterventionRequired)
    );
    let last_error = status.retry.as_ref().and_then(|r| r.last_error.as_ref());
    let (true, Some(error)) = (stopped, last_error) else {
        return;
    };
    out.push_str("\nWhat went wrong:\n");
    out.push_str(&format!(
        "  Checkpoint: {}\n",
        phase_name(Some(error.phase))
    ));
    out.push_str(&format!(
        "  Error:      {:?} {}: {}\n",
        error.class, error.reason, error.message
    ));
    out.push_str(&format!(
        "  Next step:  {}\n",
        next_step(&error.reason, error.class, status.phase, &vmm.name_any())
    ));
}

/// The last 15 events, oldest first.
fn recent_events(out: &mut String, events: &[Event], now: Timestamp) {
    out.push_str("\nEvents:\n");
    if events.is_empty() {
        out.push_str("  none\n");
        return;
    }
    let mut rows = vec![vec![
        "  AGE".to_string(),
        "TYPE".into(),
        "REASON".into(),
        "MESSAGE".into(),
    ]];
    for e in events.iter().rev().take(15).rev() {
        rows.push(vec![
            format!("  {}", age(event_time(e), now)),
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default(),
        ]);
    }
    out.push_str(&table(&rows));
}

/// What a person should do about a stopped migration.
pub fn next_step(reason: &str, class: ErrorClass, phase: Option<Phase>, name: &str) -> String {
    let resumes = phase == Some(Phase::ManualInterventionRequired);
    let specific = match Reason::from_name(reason) {
        Some(Reason::LoginFailed) => "correct user and password in the Provider's Secret".to_string(),
        Some(Reason::ThumbprintMismatch) => "check the endpoint's certificate; if it was replaced on purpose, update the Provider's spec.tls.thumbprint".into(),
        Some(Reason::TLSVerificationFailed) => "set the Provider's spec.tls.caBundle to the CA that signs the endpoint, or pin its thumbprint".into(),
        Some(Reason::SourceVMNotFound | Reason::SourceVMNameAmbiguous) => "run `ferry inventory` to find the VM, and select it by uuid or moref".into(),
        Some(Reason::SourceVMOutOfScope) => "migrate it through a Provider whose spec.scope covers it, or ask the Provider's owner to widen it".into(),
        Some(Reason::NetworkNotMapped | Reason::MultiplePodNetworkNICs) => "map every source network in spec.target.networks or the NetworkMap it names (pod, multus or ignored)".into(),
        Some(Reason::DatastoreNotMapped | Reason::VolumeModesDiffer) => "give every datastore of the VM one entry in the StorageMap".into(),
        Some(Reason::NetworkMapNotFound | Reason::StorageMapNotFound) => "create the map spec.target names".into(),
        Some(Reason::NetworkAttachmentDefinitionNotFound) => "create the NetworkAttachmentDefinition the message names (Multus must be installed), or map the network elsewhere".into(),
        Some(Reason::StorageClassNotFound | Reason::NoDefaultStorageClass) => "create the StorageClass (or mark one as default)".into(),
        Some(Reason::SecretNotFound | Reason::ProviderSecretNotFound | Reason::SecretKeyMissing) => "create the Secret with the keys the message names".into(),
        Some(Reason::ProviderNotFound) => "create the Provider the migration names".into(),
        Some(Reason::InvalidVSphereResponse) => "check that the Provider's spec.url is a vCenter or ESXi SDK endpoint: its answers were not what vSphere sends (malformed, too large, nested too deep, or a listing without end)".into(),
        Some(
            Reason::TargetVMExists
            | Reason::DataVolumeExists
            | Reason::JobExists
            | Reason::ConfigMapExists
            | Reason::SecretExists,
        ) => "delete or rename the object in the way".into(),
        Some(Reason::ChangeTrackingOff) => "set spec.warm.enableChangeTracking: true to let Ferry turn Changed Block Tracking on (and off again at the end), or turn it on in vSphere and create a new migration".into(),
        Some(Reason::TooManyDisksForWarm) => "migrate the VM cold: a new migration without spec.warm".into(),
        Some(Reason::SourceDiskLocked) => "this vCenter does not serve a running VM's disks, even under a snapshot: set spec.warm.fallBackToCold to copy it cold at the cutover (after power-off), or cancel".into(),
        Some(Reason::SourceIdentityChanged) => "check the Provider's spec.url and the VM in vSphere; delete this migration and create a new one for the VM you mean".into(),
        Some(Reason::VolumeNotBound) => "look at the DataVolume's claim (kubectl describe pvc): a ResourceQuota, no capacity, or a StorageClass nobody provisions keeps it Pending".into(),
        Some(Reason::JobDeadlineExceeded) => "look at why the Job's pod made no progress (kubectl describe pod: image pull, scheduling, a stalled source); the attempt is retried".into(),
        Some(Reason::SourceVMInUse) => "wait for the migration it names to end, or delete one of the two".into(),
        Some(Reason::SourcePoweredOn) => "shut the source VM's guest down and power it off in vSphere (Ferry does not stop a VM when powerOff.mode is RequireOff, or one a person started after the copy)".into(),
        Some(Reason::SnapshotsPresent) => "delete or consolidate the VM's snapshots in vSphere".into(),
        Some(Reason::Forbidden) => "grant the controller's ServiceAccount the permission (see deploy/rbac)".into(),
        Some(Reason::GuestDriversMissing) => "name the virtio-win drivers in spec.conversion.virtioWin: a PersistentVolumeClaim (persistentVolumeClaim) or image (image, for example quay.io/kubevirt/virtio-container-disk:<KubeVirt version>) holding a virtio-win ISO with drivers for this Windows version, and path if it is not found by itself; or migrate it with conversion.guestAdaptation None".into(),
        Some(Reason::StaticAddressOnPodNetwork) => "map the NIC's network to a multus network (a bridge on the guest's own subnet) in spec.target.networks or the NetworkMap, or set spec.target.staticAddressOnPodNetwork Warn and give the guest DHCP on the pod network".into(),
        Some(Reason::StaticIPsNotReported) => "start the source VM with VMware Tools running, so that vSphere reports its addresses, and create the migration again; or set spec.conversion.preserveStaticIPs false and give the guest its addresses after the move".into(),
        Some(Reason::GuestFirstBootToolMissing) => "name the first-boot tool in spec.conversion.firstBootTool: a PersistentVolumeClaim (persistentVolumeClaim) or image (image) holding rhsrvany.exe (RHEL's mingw32-srvany package, or built from github.com/rwmjones/rhsrvany) or pvvxsvc.exe, and path if it is not at the volume's root; or migrate it with conversion.guestAdaptation None".into(),
        Some(Reason::GuestAdaptationUnsupported | Reason::GuestOSUnsupported) => "migrate this VM with conversion.guestAdaptation None (it keeps devices its guest has drivers for)".into(),
        Some(Reason::GuestDiskFull) => "free space in the guest's file systems (virt-v2v needs room to rebuild its initramfs) in vSphere".into(),
        Some(Reason::GuestFilesystemUnwritable) => format!("in vSphere, power the source VM on, let its guest resume, shut it down fully (in Windows `shutdown /s /t 0`; `powercfg /h off` turns Fast Startup off for good) and leave it powered off; then raise spec.recopy by one (the first time: kubectl patch vmm {name} --type merge -p '{{\"spec\":{{\"recopy\":1}}}}'): the source is copied again into the same volumes and adapted"),
        Some(Reason::VolumeNotAsConverted) => "a volume changed after it was copied; the source is unchanged, so a new migration copies it again".into(),
        Some(Reason::GuestNotReady) => {
            return format!(
                "the VM is stopped and kept with its disks. Open its console (virtctl console {name}) after \
                 starting it (virtctl start {name}): the check runs again and the migration resumes if the guest \
                 comes up. A guest without virtio drivers needs target.devices Compatibility or \
                 conversion.guestAdaptation VirtV2v in a new migration (delete this one first: it removes the VM \
                 and its disks)"
            );
        }
        _ => match class {
            ErrorClass::BoundedRetryable => "the retry budget is spent: read the Events and the failed Job's or DataVolume's log, fix the cause".into(),
            _ => "read the message above and fix its cause".into(),
        },
    };
    if resumes {
        format!("{specific}; the migration resumes by itself")
    } else {
        format!("{specific}, then delete this migration and create it again")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_network_is_shown_as_the_tools_reported_it() {
        let mut source: ferry_api::SourceVmStatus = serde_json::from_value(serde_json::json!({
            "name": "w", "moref": "vm-1", "cpus": 2, "coresPerSocket": 1, "memoryMib": 1024,
            "nics": [{"mac": "00:50:56:aa:bb:cc", "network": "VM Network", "ipAddresses": [
                {"address": "192.168.122.50", "prefixLength": 24, "origin": "manual"}]}],
            "guestNetwork": {"defaultGateways": [{"address": "192.168.122.1", "nic": 0}],
                             "dnsServers": ["192.168.122.2"]}}))
        .unwrap();
        assert_eq!(
            guest_network(&source).unwrap(),
            "00:50:56:aa:bb:cc 192.168.122.50/24 static; gateway 192.168.122.1; DNS 192.168.122.2 (as VMware \
             Tools reported it)"
        );
        source.nics[0].ip_addresses.clear();
        assert_eq!(guest_network(&source), None, "the tools reported nothing");
    }

    #[test]
    fn a_copy_made_again_is_said() {
        let mut status = VirtualMachineMigrationStatus::default();
        assert_eq!(copies_again(&status), None);
        status.recopied = 2;
        assert_eq!(
            copies_again(&status).unwrap(),
            "again from the source for spec.recopy 2 (the source was changed on purpose)"
        );
        status.rewrite_volumes = true;
        assert!(
            copies_again(&status).unwrap().ends_with(
                "before the next adaptation attempt (the last one may have changed them)"
            )
        );
    }

    #[test]
    fn missing_windows_drivers_are_named_where_they_go() {
        let waiting = next_step(
            "GuestDriversMissing",
            ErrorClass::Permanent,
            Some(Phase::ManualInterventionRequired),
            "m",
        );
        assert!(
            waiting.starts_with("name the virtio-win drivers in spec.conversion.virtioWin")
                && waiting.ends_with("the migration resumes by itself"),
            "{waiting}"
        );
        let failed = next_step(
            "GuestDriversMissing",
            ErrorClass::Permanent,
            Some(Phase::Failed),
            "m",
        );
        assert!(
            failed.ends_with("then delete this migration and create it again"),
            "{failed}"
        );
    }
}
