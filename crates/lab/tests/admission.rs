//! The lab's API server admits VirtualMachines and their instances as a cluster with KubeVirt v1.9.0 does, through
//! virt-api's own webhooks (`tools/kubevirt-admission`), and DataVolumes as one with CDI v1.65.0 does, through
//! cdi-apiserver's (`tools/cdi-admission`). Each spec below is one a cluster refuses; each is refused here, with
//! KubeVirt's or CDI's message, and the valid one they all start from is admitted.

use std::time::Duration;

use ferry_api::foreign::VmStatus;
use ferry_lab::standins::kubevirt;
use ferry_testkit::{Background, TestLab, eventually};
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

fn vm(name: &str, edit: impl FnOnce(&mut Value)) -> DynamicObject {
    let mut spec = json!({
        "domain": {
            "devices": {
                "disks": [{"name": "root", "disk": {"bus": "virtio"}}],
                "interfaces": [{"name": "default", "masquerade": {}}],
            },
            "memory": {"guest": "128Mi"},
        },
        "networks": [{"name": "default", "pod": {}}],
        "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "root"}}],
    });
    edit(&mut spec);
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"runStrategy": "Halted", "template": {"spec": spec}},
    }))
    .unwrap()
}

fn push(list: &mut Value, item: Value) {
    list.as_array_mut().expect("a list").push(item);
}

#[tokio::test]
async fn kubevirts_own_webhooks_refuse_what_a_cluster_refuses() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("kv-admission").await;
    let client = lab.client().await;
    let vms = Api::<DynamicObject>::namespaced_with(client, ns.name(), &kubevirt::vm_resource());
    let post = PostParams::default();
    vms.create(&post, &vm("valid", |_| {}))
        .await
        .expect("the valid VM is admitted");

    let refused: [(&str, DynamicObject, &str); 4] = [
        (
            "a disk that names no volume",
            vm("orphan-disk", |s| {
                push(
                    &mut s["domain"]["devices"]["disks"],
                    json!({"name": "orphan", "disk": {}}),
                )
            }),
            "disks[1].Name 'orphan' not found",
        ),
        (
            "two interfaces on the pod network",
            vm("two-pod-nics", |s| {
                push(
                    &mut s["domain"]["devices"]["interfaces"],
                    json!({"name": "second", "masquerade": {}}),
                );
                push(&mut s["networks"], json!({"name": "second", "pod": {}}));
            }),
            "more than one interface is connected to a pod network",
        ),
        (
            "a masquerade interface on multus",
            vm("masquerade-multus", |s| {
                push(
                    &mut s["domain"]["devices"]["interfaces"],
                    json!({"name": "vlan", "masquerade": {}}),
                );
                push(
                    &mut s["networks"],
                    json!({"name": "vlan", "multus": {"networkName": "vlan10"}}),
                );
            }),
            "Masquerade interface only implemented with pod network",
        ),
        (
            "a malformed MAC address",
            vm("bad-mac", |s| {
                s["domain"]["devices"]["interfaces"][0]["macAddress"] = json!("02:00:00:zz:00:01")
            }),
            "malformed MAC address",
        ),
    ];
    for (what, object, message) in refused {
        match vms.create(&post, &object).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{what}: {status:?}");
                assert!(
                    status.message.contains("admission webhook")
                        && status.message.contains(message),
                    "{what}: KubeVirt's message {message:?} in {:?}",
                    status.message
                );
            }
            other => panic!("{what} was admitted, or failed otherwise: {other:?}"),
        }
    }
    // The refused ones were never stored.
    let names: Vec<String> = vms
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|v| v.metadata.name)
        .collect();
    assert_eq!(names, ["valid"]);
}

/// A VM that asks for no memory is a valid VM but can never start: KubeVirt refuses its VMI, and virt-controller
/// (the stand-in, acting as it) says so in the VM's `Failure` condition.
#[tokio::test]
async fn a_vm_with_no_memory_is_admitted_but_its_instance_is_refused() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("kv-admission-vmi").await;
    let client = lab.client().await;
    let state = tempfile::tempdir().unwrap();
    let standin = {
        let (client, ns, dir) = (
            client.clone(),
            ns.name().to_string(),
            state.path().to_path_buf(),
        );
        let kubeconfig = lab.state().kubeconfig.clone();
        Background::spawn(move |shutdown| async move {
            let identities = kubevirt::Identities::impersonated(&kubeconfig).await?;
            kubevirt::run(
                client,
                identities,
                Some(&ns),
                &dir,
                kubevirt::Boot::Qemu,
                shutdown,
            )
            .await
        })
    };
    let vms =
        Api::<DynamicObject>::namespaced_with(client.clone(), ns.name(), &kubevirt::vm_resource());
    let mut object = vm("no-memory", |s| {
        s["domain"].as_object_mut().unwrap().remove("memory");
    });
    object.data["spec"]["runStrategy"] = json!("Always");
    vms.create(&PostParams::default(), &object)
        .await
        .expect("a VM without memory is admitted, as in a cluster");
    let refused = eventually(
        "the VM's Failure condition",
        Duration::from_secs(60),
        || async {
            let vm = vms.get("no-memory").await.ok()?;
            VmStatus::of(&vm).start_refused().map(str::to_string)
        },
    )
    .await;
    assert!(
        refused.starts_with("Failure while starting VMI: admission webhook")
            && refused.contains("no memory requested"),
        "{refused}"
    );
    let vmis = Api::<DynamicObject>::namespaced_with(client, ns.name(), &kubevirt::vmi_resource());
    assert!(vmis.get_opt("no-memory").await.unwrap().is_none());
    standin.stop().await;
}

fn data_volume(name: &str, edit: impl FnOnce(&mut Value)) -> DynamicObject {
    let mut spec = json!({
        "source": {"blank": {}},
        "storage": {"resources": {"requests": {"storage": "64Mi"}}},
    });
    edit(&mut spec);
    serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn cdis_own_webhook_refuses_what_a_cluster_refuses() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("cdi-admission").await;
    let dvs = Api::<DynamicObject>::namespaced_with(
        lab.client().await,
        ns.name(),
        &ferry_api::foreign::dv_resource(),
    );
    let post = PostParams::default();
    let valid = dvs
        .create(&post, &data_volume("valid", |_| {}))
        .await
        .expect("the valid DataVolume is admitted");

    let refused: [(&str, DynamicObject, &str); 3] = [
        (
            "both storage and pvc",
            data_volume("two-targets", |s| {
                s["pvc"] = json!({"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "64Mi"}}})
            }),
            "Duplicate storage definition, both target storage and target pvc defined",
        ),
        (
            "a blank source of archive content",
            data_volume("blank-archive", |s| s["contentType"] = json!("archive")),
            "SourceType cannot be blank and the contentType be archive",
        ),
        (
            "no source",
            data_volume("no-source", |s| {
                s.as_object_mut().unwrap().remove("source");
            }),
            "Data volume should have either Source or SourceRef, or be externally populated",
        ),
    ];
    for (what, object, message) in refused {
        match dvs.create(&post, &object).await {
            Err(kube::Error::Api(status)) => assert!(
                status.message.contains("admission webhook") && status.message.contains(message),
                "{what}: CDI's message {message:?} in {:?}",
                status.message
            ),
            other => panic!("{what} was admitted, or failed otherwise: {other:?}"),
        }
    }

    // A DataVolume's spec never changes once created.
    let mut changed = valid.clone();
    changed.data["spec"]["storage"]["resources"]["requests"]["storage"] = json!("128Mi");
    match dvs.replace("valid", &post, &changed).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("Cannot update DataVolume Spec"),
            "{status:?}"
        ),
        other => panic!("a DataVolume's spec was changed: {other:?}"),
    }
}
