//! Admission against the lab's real kube-apiserver: every valid manifest is accepted, and every invalid one is
//! rejected at apply time with a message that says what to fix.

use std::time::Duration;

use ferry_api::{MigrationPlan, NetworkMap, Provider, StorageMap, VirtualMachineMigration};
use ferry_testkit::{TestLab, TestNamespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Resource};
use serde_json::{Value, json};

const MANAGER: &str = "admission-test";

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in ferry_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap()
        .unwrap();
    }
}

fn provider() -> Value {
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "Provider",
        "metadata": {"name": "vcenter"},
        "spec": {"type": "vsphere", "url": "https://vcenter.example.com/sdk", "secretRef": {"name": "vcenter-creds"},
                 "tls": {"thumbprint": thumbprint()}},
    })
}

fn thumbprint() -> String {
    vec!["AB"; 32].join(":")
}

fn migration() -> Value {
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "VirtualMachineMigration",
        "metadata": {"name": "legacy"},
        "spec": {
            "source": {"providerRef": {"name": "vcenter"}, "vm": {"name": "legacy-source-vm"},
                       "powerOff": {"mode": "Graceful", "timeoutSeconds": 300}, "restorePowerState": true},
            "target": {"name": "legacy-source-vm", "storageClassName": "standard", "volumeMode": "Filesystem",
                       "runStrategy": "Always",
                       "networks": [{"source": "VM Network", "pod": {}},
                                    {"source": "DC0_DVPG0", "multus": {"networkName": "migrations/vlan20"}}]},
            "conversion": {"format": "raw", "guestAdaptation": "None"},
            "staging": {"url": "s3://bucket/prefix", "secretRef": {"name": "staging-creds"}},
            "retry": {"budget": 3},
            "cancel": false,
        },
    })
}

/// Sets (or, with `Value::Null`, removes) the field at a JSON pointer.
fn network_map() -> Value {
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "NetworkMap",
        "metadata": {"name": "datacenter-networks"},
        "spec": {"networks": [{"source": "VM Network", "pod": {}},
                              {"source": "backup", "multus": {"networkName": "default/backup"}},
                              {"source": "dmz", "ignored": {}}]},
    })
}

fn storage_map() -> Value {
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "StorageMap",
        "metadata": {"name": "datastores"},
        "spec": {"datastores": [{"source": "datastore1", "storageClassName": "standard"},
                                {"source": "vsan-fast", "storageClassName": "ssd", "volumeMode": "Block",
                                 "accessMode": "ReadWriteMany"}]},
    })
}

fn plan() -> Value {
    json!({
        "apiVersion": "migration.platform.example/v1alpha1", "kind": "MigrationPlan",
        "metadata": {"name": "wave-1"},
        "spec": {"providerRef": {"name": "vcenter"}, "maxInFlight": 5,
                 "vms": [{"name": "web-01"}, {"moref": "vm-42", "targetName": "db"}],
                 "target": {"networkMapRef": {"name": "datacenter-networks"}, "storageMapRef": {"name": "datastores"}}},
    })
}

fn with(mut doc: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = doc
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"));
    match (target, value) {
        (Value::Object(map), Value::Null) => {
            map.remove(key);
        }
        (Value::Object(map), value) => {
            map.insert(key.to_string(), value);
        }
        (Value::Array(list), value) => list[key.parse::<usize>().unwrap()] = value,
        _ => panic!("{pointer} is not in an object"),
    }
    doc
}

fn api_for(client: &Client, ns: &str, doc: &Value) -> Api<DynamicObject> {
    let (kind, plural) = match doc["kind"].as_str().unwrap() {
        "Provider" => ("Provider", Provider::plural(&())),
        "NetworkMap" => ("NetworkMap", NetworkMap::plural(&())),
        "StorageMap" => ("StorageMap", StorageMap::plural(&())),
        "MigrationPlan" => ("MigrationPlan", MigrationPlan::plural(&())),
        _ => (
            "VirtualMachineMigration",
            VirtualMachineMigration::plural(&()),
        ),
    };
    let gvk = GroupVersionKind::gvk(ferry_api::GROUP, ferry_api::VERSION, kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

/// Server-side apply with strict field validation, as `kubectl apply --server-side` does.
async fn apply(client: &Client, ns: &TestNamespace, doc: &Value) -> Result<(), String> {
    let name = doc["metadata"]["name"].as_str().unwrap();
    api_for(client, ns.name(), doc)
        .patch(
            name,
            &PatchParams::apply(MANAGER).force().validation_strict(),
            &Patch::Apply(doc),
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            kube::Error::Api(status) => status.message,
            other => other.to_string(),
        })
}

enum Step {
    Create(Value),
    /// Apply the first document, then the second over it.
    Update(Value, Value),
}

struct Invalid {
    what: &'static str,
    step: Step,
    expect: &'static str,
}

fn create(what: &'static str, doc: Value, expect: &'static str) -> Invalid {
    Invalid {
        what,
        step: Step::Create(doc),
        expect,
    }
}

fn update(what: &'static str, before: Value, after: Value, expect: &'static str) -> Invalid {
    Invalid {
        what,
        step: Step::Update(before, after),
        expect,
    }
}

const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

fn invalid_cases() -> Vec<Invalid> {
    let p = provider;
    let m = migration;
    let long_name = "a".repeat(64);
    vec![
        // Provider
        create(
            "provider type",
            with(p(), "/spec/type", json!("hyperv")),
            r#"spec.type: Unsupported value: "hyperv""#,
        ),
        create(
            "provider url scheme",
            with(p(), "/spec/url", json!("http://vcenter/sdk")),
            "url must use https://",
        ),
        create(
            "provider url credentials",
            with(p(), "/spec/url", json!("https://root:secret@vcenter/sdk")),
            "url must not carry credentials",
        ),
        create(
            "provider url malformed",
            with(p(), "/spec/url", json!("https://vc enter/sdk")),
            "url is not a valid URL",
        ),
        create(
            "provider url missing",
            with(p(), "/spec/url", Value::Null),
            "spec.url: Required value",
        ),
        create(
            "provider secretRef missing",
            with(p(), "/spec/secretRef", Value::Null),
            "spec.secretRef: Required value",
        ),
        create(
            "provider secretRef name",
            with(p(), "/spec/secretRef/name", json!("Bad_Name")),
            "spec.secretRef.name in body should match",
        ),
        create(
            "provider tls empty",
            with(p(), "/spec/tls", json!({})),
            "tls needs exactly one of caBundle, thumbprint or insecureSkipVerify",
        ),
        create(
            "provider tls two ways",
            with(
                p(),
                "/spec/tls/caBundle",
                json!("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
            ),
            "tls needs exactly one of",
        ),
        create(
            "provider scope empty",
            with(p(), "/spec/scope", json!({})),
            "scope needs at least one folder, cluster or resource pool",
        ),
        create(
            "provider scope path with an empty segment",
            with(p(), "/spec/scope", json!({"folders": ["DC0//team-a"]})),
            "a scope path is an inventory path such as DC0/vm/team-a",
        ),
        create(
            "provider tls thumbprint and insecure",
            with(p(), "/spec/tls/insecureSkipVerify", json!(true)),
            "tls needs exactly one of",
        ),
        create(
            "provider thumbprint format",
            with(p(), "/spec/tls/thumbprint", json!("AB:CD:EF")),
            "thumbprint must be a SHA-256 fingerprint: 32 colon-separated hex pairs",
        ),
        create(
            "provider thumbprint not hex",
            with(p(), "/spec/tls/thumbprint", json!(vec!["ZZ"; 32].join(":"))),
            "thumbprint must be a SHA-256 fingerprint",
        ),
        create(
            "provider thumbprint SHA-1, as vSphere shows it",
            with(p(), "/spec/tls/thumbprint", json!(vec!["3F"; 20].join(":"))),
            "thumbprint is a SHA-1 thumbprint (20 hex pairs, as vSphere shows it), but Ferry pins SHA-256",
        ),
        create(
            "provider thumbprint SHA-1 without colons",
            with(p(), "/spec/tls/thumbprint", json!("3f".repeat(20))),
            "Ferry pins SHA-256",
        ),
        create(
            "provider caBundle not PEM",
            with(p(), "/spec/tls", json!({"caBundle": "not a certificate"})),
            "caBundle must hold PEM certificates",
        ),
        create(
            "provider insecure false",
            with(p(), "/spec/tls", json!({"insecureSkipVerify": false})),
            "insecureSkipVerify may only be set to true",
        ),
        create(
            "provider limits low",
            with(p(), "/spec/limits", json!({"maxConcurrentDisksPerHost": 0})),
            "should be greater than or equal to 1",
        ),
        create(
            "provider limits high",
            with(
                p(),
                "/spec/limits",
                json!({"maxConcurrentDisksPerHost": 101}),
            ),
            "should be less than or equal to 100",
        ),
        create(
            "provider unknown field",
            with(p(), "/spec/password", json!("hunter2")),
            ".spec.password: field not declared in schema",
        ),
        // Migration: source
        create(
            "vm selector empty",
            with(m(), "/spec/source/vm", json!({})),
            "vm needs exactly one of name, inventoryPath, uuid or moref",
        ),
        create(
            "vm selector two ways",
            with(m(), "/spec/source/vm/moref", json!("vm-42")),
            "vm needs exactly one of",
        ),
        create(
            "vm uuid format",
            with(m(), "/spec/source/vm", json!({"uuid": "not-a-uuid"})),
            "spec.source.vm.uuid in body should match",
        ),
        create(
            "vm inventory path relative",
            with(m(), "/spec/source/vm", json!({"inventoryPath": "DC0/vm/x"})),
            "spec.source.vm.inventoryPath in body should match",
        ),
        create(
            "vm moref characters",
            with(m(), "/spec/source/vm", json!({"moref": "vm 42"})),
            "spec.source.vm.moref in body should match",
        ),
        create(
            "vm name too long",
            with(m(), "/spec/source/vm", json!({"name": "x".repeat(81)})),
            "spec.source.vm.name: Too long",
        ),
        create(
            "providerRef missing",
            with(m(), "/spec/source/providerRef", Value::Null),
            "spec.source.providerRef: Required value",
        ),
        create(
            "providerRef name missing",
            with(m(), "/spec/source/providerRef", json!({})),
            "spec.source.providerRef.name: Required value",
        ),
        create(
            "providerRef namespace not a namespace name",
            with(
                m(),
                "/spec/source/providerRef/namespace",
                json!("Admins_NS"),
            ),
            "spec.source.providerRef.namespace in body should match",
        ),
        create(
            "plan providerRef namespace not a namespace name",
            with(plan(), "/spec/providerRef/namespace", json!("")),
            "spec.providerRef.namespace in body should be at least 1 chars long",
        ),
        create(
            "power-off mode",
            with(m(), "/spec/source/powerOff/mode", json!("Hard")),
            r#"spec.source.powerOff.mode: Unsupported value: "Hard""#,
        ),
        create(
            "power-off timeout low",
            with(m(), "/spec/source/powerOff/timeoutSeconds", json!(5)),
            "should be greater than or equal to 10",
        ),
        create(
            "power-off timeout high",
            with(m(), "/spec/source/powerOff/timeoutSeconds", json!(4000)),
            "should be less than or equal to 3600",
        ),
        create(
            "source unknown field",
            with(m(), "/spec/source/password", json!("hunter2")),
            ".spec.source.password: field not declared in schema",
        ),
        create(
            "source missing",
            with(m(), "/spec/source", Value::Null),
            "spec.source: Required value",
        ),
        // Migration: target
        create(
            "target name not a label",
            with(m(), "/spec/target/name", json!("Legacy_VM")),
            "spec.target.name in body should match",
        ),
        create(
            "target name too long",
            with(m(), "/spec/target/name", json!(long_name)),
            "spec.target.name: Too long",
        ),
        create(
            "metadata.name too long for a VM name",
            with(
                with(m(), "/spec/target/name", Value::Null),
                "/metadata/name",
                json!("m".repeat(70)),
            ),
            "metadata.name is longer than 63 characters, so spec.target.name must name the VM",
        ),
        create(
            "storage class name",
            with(m(), "/spec/target/storageClassName", json!("Fast SSD")),
            "spec.target.storageClassName in body should match",
        ),
        create(
            "volume mode",
            with(m(), "/spec/target/volumeMode", json!("Raw")),
            r#"spec.target.volumeMode: Unsupported value: "Raw""#,
        ),
        create(
            "run strategy",
            with(m(), "/spec/target/runStrategy", json!("Manual")),
            r#"spec.target.runStrategy: Unsupported value: "Manual""#,
        ),
        create(
            "duplicate network source",
            with(
                m(),
                "/spec/target/networks/1",
                json!({"source": "VM Network", "ignored": {}}),
            ),
            r#".spec.target.networks: duplicate entries for key [source="VM Network"]"#,
        ),
        create(
            "network with two destinations",
            with(
                m(),
                "/spec/target/networks/0",
                json!({"source": "VM Network", "pod": {}, "ignored": {}}),
            ),
            "each network mapping needs exactly one of pod, multus or ignored",
        ),
        create(
            "network with no destination",
            with(
                m(),
                "/spec/target/networks/0",
                json!({"source": "VM Network"}),
            ),
            "each network mapping needs exactly one of",
        ),
        create(
            "network source missing",
            with(m(), "/spec/target/networks/0", json!({"pod": {}})),
            r#"omits all key fields ["source"]"#,
        ),
        create(
            "multus network name",
            with(
                m(),
                "/spec/target/networks/1/multus/networkName",
                json!("Bad Name"),
            ),
            "spec.target.networks[1].multus.networkName in body should match",
        ),
        // Migration: conversion, staging, retry
        create(
            "disk format",
            with(m(), "/spec/conversion/format", json!("vmdk")),
            r#"spec.conversion.format: Unsupported value: "vmdk""#,
        ),
        create(
            "guest adaptation",
            with(m(), "/spec/conversion/guestAdaptation", json!("Magic")),
            r#"spec.conversion.guestAdaptation: Unsupported value: "Magic""#,
        ),
        create(
            "virtio-win drivers without guest adaptation",
            with(
                m(),
                "/spec/conversion/virtioWin",
                json!({"persistentVolumeClaim": "virtio-win"}),
            ),
            "conversion.virtioWin is used only by guest adaptation",
        ),
        create(
            "static addresses kept without guest adaptation",
            with(m(), "/spec/conversion/preserveStaticIPs", json!(true)),
            "conversion.preserveStaticIPs is done by guest adaptation",
        ),
        create(
            "virtio-win drivers from nowhere",
            with(
                m(),
                "/spec/conversion",
                json!({"guestAdaptation": "VirtV2v", "virtioWin": {"path": "virtio-win.iso"}}),
            ),
            "conversion.virtioWin needs exactly one of persistentVolumeClaim or image",
        ),
        create(
            "virtio-win drivers from a claim and an image",
            with(
                m(),
                "/spec/conversion",
                json!({"guestAdaptation": "VirtV2v",
                       "virtioWin": {"persistentVolumeClaim": "virtio-win", "image": "quay.io/kubevirt/virtio-container-disk"}}),
            ),
            "conversion.virtioWin needs exactly one of persistentVolumeClaim or image",
        ),
        create(
            "virtio-win path absolute",
            with(
                m(),
                "/spec/conversion",
                json!({"guestAdaptation": "VirtV2v",
                       "virtioWin": {"persistentVolumeClaim": "virtio-win", "path": "/virtio-win.iso"}}),
            ),
            "virtioWin.path is relative to the volume's root",
        ),
        create(
            "virtio-win path above the volume",
            with(
                m(),
                "/spec/conversion",
                json!({"guestAdaptation": "VirtV2v",
                       "virtioWin": {"persistentVolumeClaim": "virtio-win", "path": "drivers/../../etc"}}),
            ),
            "virtioWin.path must stay inside the volume",
        ),
        create(
            "virtio-win claim name",
            with(
                m(),
                "/spec/conversion",
                json!({"guestAdaptation": "VirtV2v", "virtioWin": {"persistentVolumeClaim": "Virtio_Win"}}),
            ),
            "spec.conversion.virtioWin.persistentVolumeClaim in body should match",
        ),
        create(
            "staging scheme",
            with(m(), "/spec/staging/url", json!("ftp://host/path")),
            "staging url must be s3://bucket or s3://bucket/prefix",
        ),
        create(
            "staging url over https, which no part of Ferry reads",
            with(
                m(),
                "/spec/staging/url",
                json!("https://store.example.com/ferry"),
            ),
            "staging url must be s3://bucket or s3://bucket/prefix",
        ),
        create(
            "staging url on a local path, which CDI's importer cannot reach",
            with(
                m(),
                "/spec/staging/url",
                json!("file:///var/lib/ferry/staging"),
            ),
            "staging url must be s3://bucket or s3://bucket/prefix",
        ),
        create(
            "staging s3 without secret",
            with(m(), "/spec/staging/secretRef", Value::Null),
            "an s3:// staging URL needs secretRef",
        ),
        create(
            "staging url credentials",
            with(
                m(),
                "/spec/staging/url",
                json!("https://key:secret@store.example.com/ferry"),
            ),
            "staging url must not carry credentials",
        ),
        create(
            "staging endpoint over plain http",
            with(
                m(),
                "/spec/staging/endpoint",
                json!("http://minio.storage:9000"),
            ),
            "staging over plain http:// sends the disks and the signed requests unencrypted",
        ),
        create(
            "staging url over plain http",
            with(
                m(),
                "/spec/staging/url",
                json!("http://store.example.com/ferry"),
            ),
            "staging url must be s3://bucket or s3://bucket/prefix",
        ),
        create(
            "staging insecure false",
            with(
                with(
                    m(),
                    "/spec/staging/endpoint",
                    json!("http://minio.storage:9000"),
                ),
                "/spec/staging/insecure",
                json!(false),
            ),
            "staging insecure may only be set to true",
        ),
        create(
            "staging caBundle not PEM",
            with(m(), "/spec/staging/caBundle", json!("not a certificate")),
            "staging caBundle must hold PEM certificates",
        ),
        create(
            "staging caBundle and insecure",
            with(
                with(m(), "/spec/staging/caBundle", json!(PEM)),
                "/spec/staging/insecure",
                json!(true),
            ),
            "staging caBundle and insecure exclude each other",
        ),
        create(
            "qcow2 without staging",
            with(
                with(m(), "/spec/staging", Value::Null),
                "/spec/conversion",
                json!({"format": "qcow2"}),
            ),
            "spec.conversion.format qcow2 is a staging format",
        ),
        create(
            "warm through staging",
            with(m(), "/spec/warm", json!({})),
            "spec.warm writes the volumes directly, round after round: remove spec.staging",
        ),
        create(
            "warm rounds more often than a minute",
            with(
                with(m(), "/spec/staging", Value::Null),
                "/spec/warm",
                json!({"precopyIntervalSeconds": 30}),
            ),
            "spec.warm.precopyIntervalSeconds: Invalid value",
        ),
        create(
            "retry budget high",
            with(m(), "/spec/retry/budget", json!(11)),
            "should be less than or equal to 10",
        ),
        create(
            "retry budget negative",
            with(m(), "/spec/retry/budget", json!(-1)),
            "should be greater than or equal to 0",
        ),
        create(
            "cancel not a bool",
            with(m(), "/spec/cancel", json!("yes")),
            ".spec.cancel: expected boolean",
        ),
        create(
            "unknown top-level spec field",
            with(m(), "/spec/turbo", json!(true)),
            ".spec.turbo: field not declared in schema",
        ),
        create(
            "unknown device model",
            with(m(), "/spec/target/devices", json!("VMXNET3")),
            "Unsupported value: \"VMXNET3\"",
        ),
        create(
            "a required agent with a VM that never starts",
            with(
                with(m(), "/spec/target/runStrategy", json!("Halted")),
                "/spec/guestCheck",
                json!({"agent": "Required"}),
            ),
            "spec.guestCheck.agent Required needs the VM started",
        ),
        create(
            "settle longer than the timeout",
            with(
                m(),
                "/spec/guestCheck",
                json!({"settleSeconds": 600, "timeoutSeconds": 300}),
            ),
            "guestCheck.settleSeconds must be shorter than guestCheck.timeoutSeconds",
        ),
        create(
            "a guest timeout too short to boot anything",
            with(m(), "/spec/guestCheck", json!({"timeoutSeconds": 5})),
            "spec.guestCheck.timeoutSeconds: Invalid value",
        ),
        // Updates
        update(
            "a Provider's endpoint cannot change under its migrations",
            provider(),
            with(
                provider(),
                "/spec/url",
                json!("https://other-vcenter.example.com/sdk"),
            ),
            "url is immutable: migrations found their VMs on the vCenter it reaches",
        ),
        update(
            "device model is part of the target",
            m(),
            with(m(), "/spec/target/devices", json!("Virtio")),
            "spec.target is immutable",
        ),
        update(
            "staging cannot be added",
            with(m(), "/spec/staging", Value::Null),
            m(),
            "spec.staging cannot be added or removed",
        ),
        update(
            "warm cannot be added",
            with(m(), "/spec/staging", Value::Null),
            with(
                with(m(), "/spec/staging", Value::Null),
                "/spec/warm",
                json!({}),
            ),
            "spec.warm cannot be added or removed",
        ),
        update(
            "a cutover cannot be taken back",
            with(
                with(m(), "/spec/staging", Value::Null),
                "/spec/warm",
                json!({"cutover": true}),
            ),
            with(
                with(m(), "/spec/staging", Value::Null),
                "/spec/warm",
                json!({"cutover": false}),
            ),
            "spec.warm.cutover cannot go back to false once set",
        ),
        update(
            "staging cannot be removed",
            m(),
            with(m(), "/spec/staging", Value::Null),
            "spec.staging cannot be added or removed",
        ),
        update(
            "source is immutable",
            m(),
            with(m(), "/spec/source/vm/name", json!("another-vm")),
            "spec.source is immutable",
        ),
        update(
            "power policy is part of the source",
            m(),
            with(m(), "/spec/source/restorePowerState", json!(false)),
            "spec.source is immutable",
        ),
        update(
            "target is immutable",
            m(),
            with(m(), "/spec/target/storageClassName", json!("fast")),
            "spec.target is immutable",
        ),
        update(
            "network map is part of the target",
            m(),
            with(m(), "/spec/target/networks/0/pod", Value::Null),
            "spec.target is immutable",
        ),
        // Maps
        create(
            "an empty network map",
            with(network_map(), "/spec/networks", json!([])),
            "spec.networks: Invalid value",
        ),
        create(
            "a source network mapped twice",
            with(
                network_map(),
                "/spec/networks/1/source",
                json!("VM Network"),
            ),
            "duplicate entries for key [source=",
        ),
        create(
            "a network mapped to two destinations",
            with(network_map(), "/spec/networks/0/ignored", json!({})),
            "exactly one of pod, multus or ignored",
        ),
        create(
            "a multus network name that is no name",
            with(
                network_map(),
                "/spec/networks/1/multus/networkName",
                json!("Backup_Net"),
            ),
            "spec.networks[1].multus.networkName",
        ),
        create(
            "an empty storage map",
            with(storage_map(), "/spec/datastores", json!([])),
            "spec.datastores: Invalid value",
        ),
        create(
            "a datastore mapped twice",
            with(
                storage_map(),
                "/spec/datastores/1/source",
                json!("datastore1"),
            ),
            "duplicate entries for key [source=",
        ),
        create(
            "a storage class that is no name",
            with(
                storage_map(),
                "/spec/datastores/0/storageClassName",
                json!("Fast SSD"),
            ),
            "spec.datastores[0].storageClassName",
        ),
        create(
            "an unknown access mode",
            with(
                storage_map(),
                "/spec/datastores/0/accessMode",
                json!("ReadOnlyMany"),
            ),
            r#"Unsupported value: "ReadOnlyMany""#,
        ),
        create(
            "a storage map entry without a class",
            with(
                storage_map(),
                "/spec/datastores/0/storageClassName",
                Value::Null,
            ),
            "spec.datastores[0].storageClassName: Required value",
        ),
        update(
            "the maps a migration names are part of its target",
            with(
                m(),
                "/spec/target/networkMapRef",
                json!({"name": "datacenter-networks"}),
            ),
            with(
                m(),
                "/spec/target/networkMapRef",
                json!({"name": "other-networks"}),
            ),
            "spec.target is immutable",
        ),
        // Plans
        create(
            "a plan without VMs",
            with(plan(), "/spec/vms", json!([])),
            "a plan needs VMs: list them in spec.vms, or choose them with spec.selector",
        ),
        create(
            "a selector that would choose a whole vCenter",
            with(plan(), "/spec/selector", json!({"powerState": "PoweredOn"})),
            "spec.selector needs a folder or a namePattern",
        ),
        create(
            "a selector folder that is no inventory path",
            with(plan(), "/spec/selector", json!({"folder": "DC0/vm/web"})),
            "spec.selector.folder",
        ),
        create(
            "a selector power state vSphere does not have",
            with(
                plan(),
                "/spec/selector",
                json!({"namePattern": "web-*", "powerState": "On"}),
            ),
            "spec.selector.powerState",
        ),
        create(
            "a start time that is no time",
            with(plan(), "/spec/startTime", json!("tomorrow")),
            "spec.startTime",
        ),
        update(
            "a plan's selector is chosen once",
            with(plan(), "/spec/selector", json!({"namePattern": "web-*"})),
            with(plan(), "/spec/selector", json!({"namePattern": "db-*"})),
            "spec.selector is resolved once, when the plan starts, and cannot change",
        ),
        update(
            "a selector cannot be added to a plan",
            plan(),
            with(plan(), "/spec/selector", json!({"namePattern": "db-*"})),
            "spec.selector is resolved once, when the plan starts, and cannot change",
        ),
        create(
            "a warm plan through staging",
            with(
                with(
                    plan(),
                    "/spec/staging",
                    json!({"url": "s3://bucket/prefix", "secretRef": {"name": "staging-creds"}}),
                ),
                "/spec/warm",
                json!({}),
            ),
            "spec.warm writes the volumes directly, round after round: remove spec.staging",
        ),
        update(
            "a plan cannot turn warm",
            plan(),
            with(plan(), "/spec/warm", json!({"cutover": true})),
            "spec.warm cannot be added or removed once a plan exists",
        ),
        update(
            "a plan's cutover cannot be taken back",
            with(plan(), "/spec/warm", json!({"cutover": true})),
            with(plan(), "/spec/warm", json!({"cutover": false})),
            "spec.warm.cutover cannot go back to false once set",
        ),
        create(
            "a plan VM found two ways",
            with(plan(), "/spec/vms/0/moref", json!("vm-7")),
            "each of spec.vms needs exactly one of name, inventoryPath, uuid or moref",
        ),
        create(
            "one target name for every VM",
            with(plan(), "/spec/target/name", json!("all-the-same")),
            "set spec.vms[].targetName instead",
        ),
        create(
            "a plan that runs nothing",
            with(plan(), "/spec/maxInFlight", json!(0)),
            "spec.maxInFlight: Invalid value",
        ),
        create(
            "a plan target name that is no DNS label",
            with(plan(), "/spec/vms/1/targetName", json!("DB_01")),
            "spec.vms[1].targetName",
        ),
        update(
            "a plan's provider is immutable",
            plan(),
            with(plan(), "/spec/providerRef/name", json!("other")),
            "spec.providerRef is immutable",
        ),
        update(
            "a plan's cancel cannot go back",
            with(plan(), "/spec/cancel", json!(true)),
            plan(),
            "spec.cancel cannot go back to false once a plan was cancelled",
        ),
        update(
            "cancel cannot go back",
            with(m(), "/spec/cancel", json!(true)),
            m(),
            "spec.cancel cannot go back to false",
        ),
    ]
}

#[tokio::test]
async fn every_invalid_manifest_is_rejected_with_a_message_that_says_what_to_fix() {
    let lab = TestLab::shared().await;
    let client = lab.client().await;
    install_crds(&client).await;
    let ns = lab.namespace("admission").await;

    let cases = invalid_cases();
    assert!(
        cases.len() >= 40,
        "the issue asks for at least 40 invalid manifests, have {}",
        cases.len()
    );
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        // Each case gets fresh names, so an earlier case cannot affect it.
        let rename = |doc: &Value| {
            let name = doc["metadata"]["name"].as_str().unwrap();
            let fresh = if name.len() > 60 {
                name.to_string()
            } else {
                format!("{name}-{i}")
            };
            with(doc.clone(), "/metadata/name", json!(fresh))
        };
        let outcome = match &case.step {
            Step::Create(doc) => apply(&client, &ns, &rename(doc)).await,
            Step::Update(before, after) => {
                apply(&client, &ns, &rename(before))
                    .await
                    .expect("the first version is valid");
                apply(&client, &ns, &rename(after)).await
            }
        };
        match outcome {
            Ok(()) => failures.push(format!("{}: accepted", case.what)),
            Err(message) if !message.contains(case.expect) => failures.push(format!(
                "{}: rejected, but the message lacks {:?}:\n    {message}",
                case.what, case.expect
            )),
            Err(_) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn valid_manifests_are_accepted_with_their_defaults() {
    let lab = TestLab::shared().await;
    let client = lab.client().await;
    install_crds(&client).await;
    let ns = lab.namespace("admission-valid").await;

    let valid = [
        provider(),
        with(
            with(provider(), "/metadata/name", json!("insecure")),
            "/spec/tls",
            json!({"insecureSkipVerify": true}),
        ),
        with(
            with(provider(), "/metadata/name", json!("scoped")),
            "/spec/scope",
            json!({"folders": ["/Europe/DC0/vm/team-a"], "clusters": ["Europe/DC0/host/cluster-1"],
                   "resourcePools": ["Europe/DC0/host/cluster-2/Resources/team-a"]}),
        ),
        with(
            with(provider(), "/metadata/name", json!("ca")),
            "/spec/tls",
            json!({"caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}),
        ),
        migration(),
        with(
            with(migration(), "/metadata/name", json!("by-uuid")),
            "/spec/source/vm",
            json!({"uuid": "4206b4a2-1c39-5b7c-4a36-2f0d9b6e1a11"}),
        ),
        with(
            with(
                with(migration(), "/metadata/name", json!("virtio-agent")),
                "/spec/target/devices",
                json!("Virtio"),
            ),
            "/spec/guestCheck",
            json!({"agent": "Required", "settleSeconds": 30, "timeoutSeconds": 600}),
        ),
        with(
            with(migration(), "/metadata/name", json!("direct")),
            "/spec/staging",
            Value::Null,
        ),
        with(
            with(
                with(migration(), "/metadata/name", json!("warm")),
                "/spec/staging",
                Value::Null,
            ),
            "/spec/warm",
            json!({"precopyIntervalSeconds": 600, "cutoverAt": "2027-01-09T22:00:00Z",
                   "enableChangeTracking": true}),
        ),
        with(
            with(migration(), "/metadata/name", json!("staging-private-ca")),
            "/spec/staging",
            json!({"url": "s3://bucket/prefix", "secretRef": {"name": "staging-creds"},
                   "endpoint": "https://minio.storage:9000", "caBundle": PEM}),
        ),
        with(
            with(migration(), "/metadata/name", json!("staging-plain-http")),
            "/spec/staging",
            json!({"url": "s3://bucket/prefix", "secretRef": {"name": "staging-creds"},
                   "endpoint": "http://minio.storage:9000", "insecure": true}),
        ),
        with(
            with(migration(), "/metadata/name", json!("windows")),
            "/spec/conversion",
            json!({"guestAdaptation": "VirtV2v",
                   "virtioWin": {"image": "quay.io/kubevirt/virtio-container-disk:v1.6.0", "path": "disk/virtio-win.iso"}}),
        ),
        with(
            with(migration(), "/metadata/name", json!("windows-claim")),
            "/spec/conversion",
            json!({"guestAdaptation": "VirtV2v", "virtioWin": {"persistentVolumeClaim": "virtio-win"}}),
        ),
        network_map(),
        storage_map(),
        plan(),
        with(
            with(
                with(plan(), "/metadata/name", json!("selected")),
                "/spec/vms",
                json!([]),
            ),
            "/spec/selector",
            json!({"folder": "/Folder1/DC0/vm/web", "namePattern": "web-*", "powerState": "PoweredOff"}),
        ),
        with(
            with(plan(), "/metadata/name", json!("tonight")),
            "/spec/startTime",
            json!("2026-12-03T01:00:00Z"),
        ),
        with(
            with(
                with(migration(), "/metadata/name", json!("mapped")),
                "/spec/target",
                json!({"networkMapRef": {"name": "datacenter-networks"}, "storageMapRef": {"name": "datastores"}}),
            ),
            "/spec/staging",
            Value::Null,
        ),
        with(
            with(migration(), "/metadata/name", json!("by-path")),
            "/spec/source/vm",
            json!({"inventoryPath": "/DC0/vm/DC0_H0_VM0"}),
        ),
        with(
            with(
                with(migration(), "/metadata/name", json!("l".repeat(80))),
                "/spec/target/name",
                json!("short"),
            ),
            "/spec/staging",
            json!({"url": "s3://ferry-staging", "secretRef": {"name": "staging-creds"}}),
        ),
    ];
    for doc in &valid {
        apply(&client, &ns, doc)
            .await
            .unwrap_or_else(|e| panic!("{} rejected: {e}", doc["metadata"]["name"]));
    }
    // The examples a user copies are valid too.
    for file in [
        "provider.yaml",
        "migration.yaml",
        "minimal.yaml",
        "maps.yaml",
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/migrations")
            .join(file);
        let out = lab
            .kubectl()
            .args(["apply", "-n", ns.name(), "-f"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Defaults from the schema.
    let migrations: Api<VirtualMachineMigration> = Api::namespaced(client.clone(), ns.name());
    let minimal = migrations.get("minimal").await.unwrap();
    assert_eq!(minimal.spec.source.power_off.timeout_seconds, 300);
    assert_eq!(minimal.spec.retry.budget, 3);
    assert_eq!(minimal.spec.target.devices, None);
    assert_eq!(minimal.spec.guest_check.agent, None);
    assert_eq!(minimal.spec.guest_check.settle_seconds, 60);
    assert_eq!(minimal.spec.guest_check.timeout_seconds, 900);
    assert_eq!(
        minimal.spec.target.run_strategy,
        ferry_api::RunStrategy::Always
    );
    assert!(!minimal.spec.cancel);
    let providers: Api<Provider> = Api::namespaced(client.clone(), ns.name());
    assert_eq!(
        providers
            .get("vcenter")
            .await
            .unwrap()
            .spec
            .limits
            .max_concurrent_disks_per_host,
        10
    );

    // Cancelling is allowed (false -> true), and the printer columns are served.
    let cancel = with(migration(), "/spec/cancel", json!(true));
    apply(&client, &ns, &cancel).await.unwrap();
    let out = lab
        .kubectl()
        .args(["get", "vmm", "-n", ns.name()])
        .output()
        .unwrap();
    let header = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    for column in ["NAME", "PHASE", "PROGRESS", "TARGET", "REASON", "AGE"] {
        assert!(
            header.contains(column),
            "column {column} missing from {header:?}"
        );
    }
}
