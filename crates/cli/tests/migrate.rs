//! Migrations end to end against the lab: the real control plane, vcsim, MinIO staging, the stand-ins, and
//! `ferry controller` running as its deploy/ ServiceAccount under deploy/ RBAC.

mod support;

use std::time::Duration;

use ferry_api::{Phase, PowerState};
use ferry_testkit::migration;
use kube::api::{DeleteParams, DynamicObject};
use kube::{Api, ResourceExt};
use support::*;

async fn migrate_and_hand_over(vm: &str, name: &str, disks: usize, quiet_check: bool) {
    let _source = source_lock(vm).await;
    let (client, ns) = setup(name).await;
    let lab = lab().await;
    set_source_power(vm, true).await;
    let done =
        migrate_until_succeeded(&client, ns.name(), name, vm, Duration::from_secs(600)).await;
    let status = done.status.clone().unwrap();
    let uid = done.uid().unwrap();

    for kind in [
        "SourceDiscovered",
        "Validated",
        "DiskConverted",
        "DiskImported",
        "VMCreated",
        "VMStarted",
        "GuestReady",
        "Ready",
    ] {
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == kind)
            .unwrap_or_else(|| panic!("no {kind}"));
        assert_eq!(c.status, "True", "{kind}: {c:?}");
        assert_eq!(c.observed_generation, done.metadata.generation);
    }
    assert_eq!(
        status.conditions.last().unwrap().type_,
        "Ready",
        "Ready comes last"
    );
    assert_eq!(status.disks.len(), disks);
    for disk in &status.disks {
        assert!(disk.verified, "disk {} not verified: {disk:?}", disk.index);
        assert_eq!(disk.sha256.as_ref().map(String::len), Some(64));
    }
    assert!(
        status
            .progress
            .as_deref()
            .unwrap_or_default()
            .starts_with("100%"),
        "{:?}",
        status.progress
    );
    let power = status.power.clone().unwrap();
    assert_eq!(power.original, Some(PowerState::PoweredOn));
    assert_eq!(
        source_power(vm).await,
        PowerState::PoweredOff,
        "the source ends powered off"
    );

    // The guest printed its marker on the booted VM's serial port.
    let vmi = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns.name(),
        &resource("kubevirt.io", "v1", "VirtualMachineInstance"),
    )
    .get(name)
    .await
    .unwrap();
    let marker = vmi
        .annotations()
        .get("lab.ferry.dev/serial-marker")
        .cloned()
        .unwrap_or_default();
    assert!(
        marker.contains(&format!("FERRY-GUEST-READY {vm}")),
        "marker: {marker:?}"
    );
    // A boot sector has no guest agent: the check passed on a steady run and says what it did not see.
    let guest = status.guest.clone().expect("status.guest");
    assert_eq!(
        guest.evidence,
        ferry_api::GuestEvidence::RanSteadily,
        "{guest:?}"
    );
    assert!(
        guest
            .message
            .contains("no guest agent answered, so the guest's own boot was not observed"),
        "{guest:?}"
    );

    {
        let controller = controller().await.lock().await;
        let metrics = controller.metrics();
        assert!(
            metrics.contains("ferry_phase_transitions_total{phase=\"Succeeded\"}"),
            "{metrics}"
        );
        assert!(
            metrics.contains("ferry_reconcile_duration_seconds_count"),
            "{metrics}"
        );
        the_charts_alerts_and_dashboard_name_only_exported_series(&metrics);
        let logs = controller.logs();
        let key = format!("\"migration\":\"{}/{name}\"", ns.name());
        assert!(
            logs.lines().any(|l| l.starts_with('{') && l.contains(&key)),
            "JSON logs carry {key}"
        );
        let password =
            std::fs::read_to_string(&lab.state().vcsim.clone().unwrap().password_file).unwrap();
        assert!(
            !logs.contains(password.trim()),
            "the vSphere password leaked into the controller's logs"
        );
    }
    if quiet_check {
        // Quiet when done: no write at all from the controller in this namespace for 30 s.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = writes_in(ns.name()).await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        let after = writes_in(ns.name()).await;
        assert!(
            before > 10,
            "the audit log saw the controller's earlier writes ({before})"
        );
        assert_eq!(after, before, "a Succeeded migration caused writes");
    }

    // Handed over: deleting the migration leaves the VM and its disks, and no Job or staged object.
    migrations(&client, ns.name())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    ferry_testkit::eventually(
        "the migration to be deleted",
        Duration::from_secs(60),
        || async {
            migrations(&client, ns.name())
                .get_opt(name)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let vms = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns.name(),
        &resource("kubevirt.io", "v1", "VirtualMachine"),
    );
    let vm_object = vms.get(name).await.expect("the migrated VM stays");
    assert!(vm_object.owner_references().is_empty());
    let dvs = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns.name(),
        &resource("cdi.kubevirt.io", "v1beta1", "DataVolume"),
    );
    for i in 0..disks {
        dvs.get(&format!("{name}-disk-{i}"))
            .await
            .expect("the imported disks stay");
    }
    assert!(
        labelled(&client, ns.name(), &resource("batch", "v1", "Job"), &uid)
            .await
            .is_empty()
    );
    assert!(
        staged_objects(ns.name(), name, &uid, disks)
            .await
            .is_empty(),
        "staged objects remain"
    );
}

#[tokio::test]
async fn a_single_disk_vm_migrates_boots_and_is_handed_over() {
    migrate_and_hand_over("DC0_H0_VM0", "single", 1, true).await;
}

#[tokio::test]
async fn the_three_disk_demo_vm_migrates_boots_and_is_handed_over() {
    migrate_and_hand_over("DC0_H0_VM1", "three", 3, false).await;
}

/// A Provider named `name` like the lab's, with `tls` and credentials of its own.
async fn other_provider(
    client: &kube::Client,
    ns: &str,
    name: &str,
    password: Option<&str>,
    tls: serde_json::Value,
) {
    let lab = lab().await;
    let vcsim = lab.state().vcsim.clone().unwrap();
    let real = std::fs::read_to_string(&vcsim.password_file).unwrap();
    let password = password.unwrap_or(real.trim());
    migration::apply_secret(
        client,
        ns,
        name,
        serde_json::json!({"user": vcsim.username, "password": password}),
    )
    .await
    .unwrap();
    migration::apply(
        client,
        ns,
        serde_json::json!({
            "apiVersion": ferry_api::API_VERSION, "kind": "Provider",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"type": "vsphere", "url": vcsim.url, "secretRef": {"name": name}, "tls": tls},
        }),
    )
    .await
    .unwrap();
}

/// Runs a migration of `vm` edited by `edit`, expects it to stop in `phase` with `reason`, and checks that
/// nothing happened: the source still runs, and nothing labelled with the migration's UID exists.
async fn stops_before_side_effects(
    client: &kube::Client,
    ns: &str,
    name: &str,
    vm: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    phase: Phase,
    reason: &str,
) -> ferry_api::VirtualMachineMigration {
    let lab = lab().await;
    let mut manifest = migration::migration(lab, ns, name, vm);
    edit(&mut manifest);
    migration::apply(client, ns, manifest).await.unwrap();
    let stopped = wait_for_phase(client, ns, name, phase, Duration::from_secs(120)).await;
    let status = stopped.status.clone().unwrap();
    assert_eq!(status.reason.as_deref(), Some(reason), "{status:?}");
    let error = status
        .retry
        .as_ref()
        .and_then(|r| r.last_error.clone())
        .expect("the error is recorded");
    assert_eq!(error.reason, reason);
    assert!(
        status.power.as_ref().and_then(|p| p.original).is_none(),
        "power was touched: {status:?}"
    );
    let uid = stopped.uid().unwrap();
    for (group, version, kind) in [
        ("batch", "v1", "Job"),
        ("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        ("kubevirt.io", "v1", "VirtualMachine"),
    ] {
        assert!(
            labelled(client, ns, &resource(group, version, kind), &uid)
                .await
                .is_empty(),
            "{kind} created"
        );
    }
    if vm.starts_with("DC0") {
        assert_eq!(
            source_power(vm).await,
            PowerState::PoweredOn,
            "the source must still run"
        );
    }
    stopped
}

#[tokio::test]
async fn permanent_errors_stop_before_any_side_effect_with_a_specific_reason() {
    let _source = source_lock("DC0_C0_RP0_VM0").await;
    set_source_power("DC0_C0_RP0_VM0", true).await;
    let (client, ns) = setup("permanent").await;
    let ns = ns.name();
    stops_before_side_effects(
        &client,
        ns,
        "not-found",
        "no-such-vm",
        |m| m["spec"]["source"]["vm"]["name"] = "no-such-vm".into(),
        Phase::Failed,
        "SourceVMNotFound",
    )
    .await;

    let ca = std::fs::read_to_string(&lab().await.state().vcsim.clone().unwrap().ca_file).unwrap();
    other_provider(
        &client,
        ns,
        "wrong-password",
        Some("not-the-password"),
        serde_json::json!({
        "caBundle": ca}),
    )
    .await;
    stops_before_side_effects(
        &client,
        ns,
        "wrong-password",
        "DC0_C0_RP0_VM0",
        |m| m["spec"]["source"]["providerRef"]["name"] = "wrong-password".into(),
        Phase::Failed,
        "LoginFailed",
    )
    .await;

    let wrong = vec!["AB"; 32].join(":");
    other_provider(
        &client,
        ns,
        "wrong-thumbprint",
        None,
        serde_json::json!({"thumbprint": wrong}),
    )
    .await;
    let failed = stops_before_side_effects(
        &client,
        ns,
        "wrong-thumbprint",
        "DC0_C0_RP0_VM0",
        |m| m["spec"]["source"]["providerRef"]["name"] = "wrong-thumbprint".into(),
        Phase::Failed,
        "ThumbprintMismatch",
    )
    .await;
    let message = failed.status.unwrap().message.unwrap_or_default();
    assert!(
        message.contains("spec.tls.thumbprint"),
        "the message says what to fix: {message}"
    );

    // A Provider lent for one folder and one cluster: a VM on a standalone host is outside it, and untouched.
    let h0 = source_lock("DC0_H0_VM1").await;
    set_source_power("DC0_H0_VM1", true).await;
    other_provider(
        &client,
        ns,
        "scoped",
        None,
        serde_json::json!({"caBundle": ca}),
    )
    .await;
    let scope = serde_json::json!({"spec": {"scope": {
        "folders": ["Folder1/DC0/vm/team-a"], "clusters": ["/Folder1/DC0/host/DC0_C0"]}}});
    kube::Api::<ferry_api::Provider>::namespaced(client.clone(), ns)
        .patch(
            "scoped",
            &Default::default(),
            &kube::api::Patch::Merge(&scope),
        )
        .await
        .unwrap();
    let outside = stops_before_side_effects(
        &client,
        ns,
        "out-of-scope",
        "DC0_H0_VM1",
        |m| m["spec"]["source"]["providerRef"]["name"] = "scoped".into(),
        Phase::Failed,
        "SourceVMOutOfScope",
    )
    .await;
    let message = outside.status.unwrap().message.unwrap_or_default();
    assert!(
        message.contains(
            "sits in folder Folder1/DC0/vm and resource pool Folder1/DC0/host/DC0_H0/Resources"
        ),
        "{message}"
    );
    assert_eq!(source_power("DC0_H0_VM1").await, PowerState::PoweredOn);
    drop(h0);

    stops_before_side_effects(
        &client,
        ns,
        "unmapped",
        "DC0_C0_RP0_VM0",
        |m| m["spec"]["target"]["networks"] = serde_json::json!([]),
        Phase::Failed,
        "NetworkNotMapped",
    )
    .await;

    // Every stopped migration releases its finalizer: deleting it needs no controller.
    for name in [
        "not-found",
        "wrong-password",
        "wrong-thumbprint",
        "out-of-scope",
        "unmapped",
    ] {
        ferry_testkit::eventually("the finalizer to go", Duration::from_secs(30), || async {
            let vmm = migrations(&client, ns).get(name).await.unwrap();
            vmm.finalizers().is_empty().then_some(())
        })
        .await;
    }
}

/// What KubeVirt needs and the cluster lacks waits for a person before the source is touched: first the Multus
/// network's NetworkAttachmentDefinition (without it KubeVirt cannot attach the NIC), then the StorageClass.
#[tokio::test]
async fn a_missing_network_attachment_and_storage_class_wait_for_a_person_then_resume() {
    let vm = "DC0_C0_RP0_VM1";
    let _source = source_lock(vm).await;
    set_source_power(vm, true).await;
    let (client, ns) = setup("manual").await;
    let class = format!("arrives-later-{}", ns.name());
    let stopped = stops_before_side_effects(
        &client,
        ns.name(),
        "later",
        vm,
        |m| {
            m["spec"]["target"]["storageClassName"] = class.clone().into();
            for network in m["spec"]["target"]["networks"].as_array_mut().unwrap() {
                network.as_object_mut().unwrap().remove("pod");
                network["multus"] = serde_json::json!({"networkName": "lan"});
            }
        },
        Phase::ManualInterventionRequired,
        "NetworkAttachmentDefinitionNotFound",
    )
    .await;
    let message = stopped.status.unwrap().message.unwrap_or_default();
    assert!(
        message.contains(&format!(
            "NetworkAttachmentDefinition {}/lan does not exist",
            ns.name()
        )),
        "{message}"
    );
    create_bridge_network(&client, ns.name(), "lan", None).await;
    ferry_testkit::eventually(
        "the StorageClass to be what is missing next",
        Duration::from_secs(120),
        || async {
            let vmm = migrations(&client, ns.name()).get("later").await.ok()?;
            let status = vmm.status?;
            (status.reason.as_deref() == Some("StorageClassNotFound")
                && status.power.as_ref().and_then(|p| p.original).is_none())
            .then_some(())
        },
    )
    .await;
    let storage_class: k8s_openapi::api::storage::v1::StorageClass =
        serde_json::from_value(serde_json::json!({
        "metadata": {"name": class}, "provisioner": "lab.ferry.dev/hostpath"}))
        .unwrap();
    let classes = Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone());
    classes
        .create(&Default::default(), &storage_class)
        .await
        .unwrap();
    let done = wait_for_phase(
        &client,
        ns.name(),
        "later",
        Phase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
    classes
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        done.status
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.status == "True")
    );
}

/// A Job left under the name a migration needs (here by an earlier migration of the same name, or by hand) is
/// never adopted: its result is never read, and it is never deleted. The migration waits for a person before the
/// source is touched, naming the Job, and resumes once it is gone.
#[tokio::test]
async fn a_job_in_the_way_is_never_adopted_and_the_migration_resumes_once_it_is_gone() {
    let vm = "DC0_C0_RP0_VM0";
    let _source = source_lock(vm).await;
    set_source_power(vm, true).await;
    let (client, ns) = setup("leftover").await;
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), ns.name());
    let leftover: k8s_openapi::api::batch::v1::Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "leftover-convert-1"},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}},
    }))
    .unwrap();
    jobs.create(&Default::default(), &leftover).await.unwrap();
    let stopped = stops_before_side_effects(
        &client,
        ns.name(),
        "leftover",
        vm,
        |_| {},
        Phase::ManualInterventionRequired,
        "JobExists",
    )
    .await;
    let message = stopped.status.unwrap().message.unwrap_or_default();
    assert!(message.contains("leftover-convert-1"), "{message}");
    assert!(
        jobs.get_opt("leftover-convert-1").await.unwrap().is_some(),
        "somebody else's Job was deleted"
    );
    jobs.delete("leftover-convert-1", &DeleteParams::background())
        .await
        .unwrap();
    wait_for_phase(
        &client,
        ns.name(),
        "leftover",
        Phase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
}

/// The reason and message of `ns/name`, once its reason is `reason`.
async fn wait_for_reason(client: &kube::Client, ns: &str, name: &str, reason: &str) -> String {
    let api = migrations(client, ns);
    ferry_testkit::eventually(
        &format!("{ns}/{name} to say {reason}"),
        Duration::from_secs(180),
        || async {
            let status = api.get(name).await.ok()?.status?;
            (status.reason.as_deref() == Some(reason)).then(|| status.message.unwrap_or_default())
        },
    )
    .await
}

/// A second migration of a VM waits for the first instead of powering it off under it, and no power
/// operation or Job acts on a moref that stopped naming the VM discovered. Before, the second powered the VM off
/// while the first held it, and the first went on with whatever VM the moref named.
#[tokio::test]
async fn one_migration_at_a_time_per_source_vm_and_never_one_of_another_vm() {
    let vm = "DC0_C0_RP0_VM1";
    let _source = source_lock(vm).await;
    set_source_power(vm, true).await;
    let lab = lab().await;
    let (client, first_ns) = setup("first-of-vm").await;
    let (_, second_ns) = setup("second-of-vm").await;
    // The first records the VM's power, then waits for a person to shut it down: it holds the VM.
    let mut first = migration::migration(lab, first_ns.name(), "first", vm);
    first["spec"]["source"]["powerOff"] = serde_json::json!({"mode": "RequireOff"});
    migration::apply(&client, first_ns.name(), first)
        .await
        .unwrap();
    wait_for_reason(&client, first_ns.name(), "first", "SourcePoweredOn").await;

    // The second, which would power the VM off, waits.
    let second = migration::migration(lab, second_ns.name(), "second", vm);
    migration::apply(&client, second_ns.name(), second)
        .await
        .unwrap();
    let waiting = wait_for_reason(&client, second_ns.name(), "second", "SourceVMInUse").await;
    assert!(
        waiting.contains(&format!("{}/first", first_ns.name())),
        "{waiting}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        source_power(vm).await,
        PowerState::PoweredOn,
        "the waiting migration powered the VM off"
    );

    // The moref stops naming the VM discovered; then the VM is shut down, which would let the first go on.
    let discovered = set_instance_uuid(vm, "50ff0000-0000-4000-8000-0000000000aa").await;
    set_source_power(vm, false).await;
    let changed = wait_for_reason(&client, first_ns.name(), "first", "SourceIdentityChanged").await;
    assert!(changed.contains(&discovered), "{changed}");
    assert!(
        changed.contains("50ff0000-0000-4000-8000-0000000000aa"),
        "{changed}"
    );
    let first_uid = migrations(&client, first_ns.name())
        .get("first")
        .await
        .unwrap()
        .uid()
        .unwrap();
    assert!(
        labelled(
            &client,
            first_ns.name(),
            &resource("batch", "v1", "Job"),
            &first_uid
        )
        .await
        .is_empty(),
        "a Job was created for a VM that is not the one discovered"
    );

    // The VM it was: both migrate, the first, then the second.
    set_instance_uuid(vm, &discovered).await;
    wait_for_phase(
        &client,
        first_ns.name(),
        "first",
        Phase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
    wait_for_phase(
        &client,
        second_ns.name(),
        "second",
        Phase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
}

#[tokio::test]
async fn secrets_never_leak_and_the_controller_stays_within_its_permissions() {
    let vm = "DC0_C0_RP0_VM0";
    let _source = source_lock(vm).await;
    set_source_power(vm, true).await;
    let (client, ns) = setup("canary").await;
    let lab = lab().await;
    let state = lab.state();
    // The real credentials are the canaries: random, long, and needed for the migration to work at all.
    let password = std::fs::read_to_string(&state.vcsim.clone().unwrap().password_file)
        .unwrap()
        .trim()
        .to_string();
    let secret_key = std::fs::read_to_string(
        state
            .staging
            .clone()
            .unwrap()
            .credentials_dir
            .join("secretKey"),
    )
    .unwrap()
    .trim()
    .to_string();
    assert!(password.len() >= 16 && secret_key.len() >= 16);

    // Every pod spec the namespace ever shows, seen while the migration runs.
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns.name());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        String,
    >::new()));
    let node_dir = lab.dir().join("standin-node");
    let poller = tokio::spawn({
        let (pods, seen) = (pods.clone(), seen.clone());
        async move {
            loop {
                if let Ok(list) = pods.list(&Default::default()).await {
                    for pod in list.items {
                        let text = serde_json::to_string(&pod).unwrap();
                        seen.lock().unwrap().insert(pod.name_any(), text);
                    }
                }
                // What the conversion and verification processes print (the node agent removes it with the pod).
                for file in walk(&node_dir)
                    .into_iter()
                    .filter(|f| f.ends_with("container.log"))
                {
                    if let Ok(text) = std::fs::read_to_string(&file) {
                        seen.lock()
                            .unwrap()
                            .insert(file.display().to_string(), text);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    migration::apply(
        &client,
        ns.name(),
        migration::staged_migration(lab, ns.name(), "canary", vm),
    )
    .await
    .unwrap();
    let done = wait_for_phase(
        &client,
        ns.name(),
        "canary",
        Phase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
    poller.abort();

    let pod_specs = seen.lock().unwrap().clone();
    assert!(
        pod_specs.keys().filter(|k| !k.contains('/')).count() >= 2,
        "the conversion and verification pods were seen: {:?}",
        pod_specs.keys()
    );
    let mut places: Vec<(String, String)> = pod_specs.into_iter().collect();
    let events =
        kube::Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns.name())
            .list(&Default::default())
            .await
            .unwrap();
    places.push(("events".into(), serde_json::to_string(&events).unwrap()));
    places.push((
        "the migration (status, annotations)".into(),
        serde_json::to_string(&done).unwrap(),
    ));
    for (group, version, kind) in [
        ("kubevirt.io", "v1", "VirtualMachine"),
        ("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        ("", "v1", "PersistentVolumeClaim"),
        ("", "v1", "ConfigMap"),
        ("batch", "v1", "Job"),
    ] {
        let all = kube::Api::<DynamicObject>::namespaced_with(
            client.clone(),
            ns.name(),
            &resource(group, version, kind),
        )
        .list(&Default::default())
        .await
        .unwrap();
        places.push((kind.to_string(), serde_json::to_string(&all).unwrap()));
    }
    places.push((
        "the controller's logs".into(),
        controller().await.lock().await.logs(),
    ));
    assert!(
        places.iter().any(|(p, _)| p.ends_with("container.log")),
        "the Job processes' output was scanned"
    );
    // The restricted level really is enforced here: a pod that runs as root with privilege escalation is refused.
    let root: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "c", "image": "ferry", "securityContext": {"allowPrivilegeEscalation": true}}]}}))
    .unwrap();
    let refused = pods.create(&Default::default(), &root).await.unwrap_err();
    assert!(
        refused.to_string().contains("violates PodSecurity"),
        "{refused}"
    );
    for (place, text) in &places {
        assert!(
            !text.contains(&password),
            "the vSphere password leaked into {place}"
        );
        assert!(
            !text.contains(&secret_key),
            "the staging secret key leaked into {place}"
        );
    }

    // The audit log: the controller reads Secrets by name only, and never execs, escalates or binds.
    let audit = lab.audit_requests_by(migration::SERVICE_ACCOUNT);
    assert!(
        audit
            .iter()
            .any(|r| r.resource == "secrets" && r.verb == "get"),
        "it did read Secrets by name"
    );
    for r in &audit {
        assert!(
            !(r.resource == "secrets" && matches!(r.verb.as_str(), "list" | "watch")),
            "listed Secrets: {}",
            r.uri
        );
        assert!(
            !["/exec", "/attach", "/portforward"]
                .iter()
                .any(|s| r.uri.contains(s)),
            "pod exec: {}",
            r.uri
        );
        assert!(
            !matches!(r.verb.as_str(), "escalate" | "bind" | "impersonate"),
            "{} {}",
            r.verb,
            r.uri
        );
        assert!(
            !r.uri.contains("rbac.authorization.k8s.io") || !r.is_write(),
            "an RBAC write: {}",
            r.uri
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

/// Applies a NetworkMap or StorageMap in `ns`.
async fn apply_map(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    name: &str,
    spec: serde_json::Value,
) {
    ferry_lab::vsphere::demo::apply(
        client,
        ns,
        serde_json::json!({"apiVersion": ferry_api::API_VERSION, "kind": kind,
            "metadata": {"name": name, "namespace": ns}, "spec": spec}),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn shared_maps_place_a_vm_and_a_network_or_datastore_they_miss_waits_before_the_source_is_touched()
 {
    let vm = "DC0_C0_RP0_VM1";
    let _source = source_lock(vm).await;
    set_source_power(vm, true).await;
    let (client, ns) = setup("maps").await;
    let ns = ns.name();
    let lab = lab().await;
    let class = format!("mapped-{ns}");
    let classes = Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone());
    classes
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": class}, "provisioner": "lab.ferry.dev/hostpath"}))
            .unwrap(),
        )
        .await
        .unwrap();
    // The lab's migration maps every vcsim network inline; here the maps do, and the migration names them.
    let inline = migration::migration(lab, ns, "probe", vm)["spec"]["target"]["networks"].clone();
    let networks = inline.as_array().unwrap().clone();
    let by_maps = |m: &mut serde_json::Value| {
        m["spec"]["target"]["networks"] = serde_json::json!([]);
        m["spec"]["target"]["networkMapRef"] = serde_json::json!({"name": "site-networks"});
        m["spec"]["target"]["storageMapRef"] = serde_json::json!({"name": "site-datastores"});
    };

    // A datastore the StorageMap lacks.
    apply_map(
        &client,
        ns,
        "NetworkMap",
        "site-networks",
        serde_json::json!({"networks": networks}),
    )
    .await;
    apply_map(
        &client,
        ns,
        "StorageMap",
        "site-datastores",
        serde_json::json!({"datastores": [{"source": "elsewhere", "storageClassName": class}]}),
    )
    .await;
    let stopped = stops_before_side_effects(
        &client,
        ns,
        "no-datastore",
        vm,
        by_maps,
        Phase::ManualInterventionRequired,
        "DatastoreNotMapped",
    )
    .await;
    let message = stopped.status.unwrap().message.unwrap_or_default();
    assert!(
        message.contains("LocalDS_0") && message.contains("site-datastores"),
        "{message}"
    );
    migrations(&client, ns)
        .delete("no-datastore", &DeleteParams::default())
        .await
        .unwrap();
    ferry_testkit::eventually(
        "the stopped migration to go",
        Duration::from_secs(60),
        || async {
            migrations(&client, ns)
                .get_opt("no-datastore")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;

    // A network the NetworkMap lacks: it waits, and resumes once the map has it.
    apply_map(
        &client,
        ns,
        "StorageMap",
        "site-datastores",
        serde_json::json!({"datastores": [
        {"source": "LocalDS_0", "storageClassName": class, "accessMode": "ReadWriteMany"}]}),
    )
    .await;
    let (first, rest) = networks.split_first().unwrap();
    let partial = if rest.is_empty() {
        vec![serde_json::json!({"source": "not-this-vm", "pod": {}})]
    } else {
        rest.to_vec()
    };
    apply_map(
        &client,
        ns,
        "NetworkMap",
        "site-networks",
        serde_json::json!({"networks": partial}),
    )
    .await;
    stops_before_side_effects(
        &client,
        ns,
        "mapped",
        vm,
        by_maps,
        Phase::ManualInterventionRequired,
        "NetworkNotMapped",
    )
    .await;
    apply_map(
        &client,
        ns,
        "NetworkMap",
        "site-networks",
        serde_json::json!({"networks": networks}),
    )
    .await;
    let done = wait_for_phase(
        &client,
        ns,
        "mapped",
        Phase::Succeeded,
        Duration::from_secs(300),
    )
    .await;
    let status = done.status.unwrap();
    assert!(
        status.networks.iter().any(|n| n.source == first["source"]),
        "{:?}",
        status.networks
    );
    for disk in &status.disks {
        let placed = disk
            .storage
            .as_ref()
            .expect("Validating records where each disk goes");
        assert_eq!(placed.storage_class_name.as_deref(), Some(class.as_str()));
        assert_eq!(placed.access_mode, ferry_api::AccessMode::ReadWriteMany);
        let dv = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            ns,
            &resource("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        )
        .get(disk.data_volume.as_deref().unwrap())
        .await
        .unwrap();
        assert_eq!(
            dv.data["spec"]["storage"]["storageClassName"],
            class.as_str()
        );
        assert_eq!(
            dv.data["spec"]["storage"]["accessModes"],
            serde_json::json!(["ReadWriteMany"])
        );
    }
    classes
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
}

/// Every `ferry_*` series the chart's alert rules, their promtool tests and the Grafana dashboard name is one this
/// controller exports (a `# TYPE` family, or a histogram's `_bucket`, `_sum` or `_count`).
fn the_charts_alerts_and_dashboard_name_only_exported_series(metrics: &str) {
    let mut exported = std::collections::BTreeSet::new();
    for line in metrics.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            exported.insert(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/ferry");
    for file in [
        "files/alerts.yaml",
        "tests/alerts_test.yaml",
        "files/dashboard.json",
    ] {
        let text = std::fs::read_to_string(format!("{chart}/{file}")).unwrap();
        let named = series_named(&text);
        assert!(!named.is_empty(), "{file} names no ferry_ series");
        let unknown: Vec<&String> = named.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "{file} names series the controller does not export: {unknown:?}; exported: {exported:?}"
        );
    }
}

/// The `ferry_…` names in a text (a metric name runs on in letters, digits and underscores).
fn series_named(text: &str) -> std::collections::BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("ferry_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        if !before.is_some_and(is_name) {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}
