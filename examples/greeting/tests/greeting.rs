//! The Greeting controller against the lab's real kube-apiserver and garbage collector.

use std::time::Duration;

use ferry_testkit::{TestLab, TestNamespace, eventually};
use greeting::crd::{Greeting, GreetingSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use serde_json::json;

/// The controller, running in this test under an identity of its own so that its requests can be counted.
struct RunningController {
    user: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningController {
    async fn start(lab: &TestLab, ns: &TestNamespace) -> Self {
        let admin = lab.client().await;
        greeting::install_crd(&admin).await.unwrap();
        let user = format!("greeting-controller-{}", ns.name());
        let client = lab.client_as(&user, &["system:masters"]).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let ns_name = ns.name().to_string();
        let task = tokio::spawn(async move {
            greeting::controller::run(client, Some(&ns_name), async {
                let _ = stopped.await;
            })
            .await
        });
        Self {
            user,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

fn ready_condition(g: &Greeting) -> Option<(String, String)> {
    let c = g
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone()))
}

async fn create_hello(client: &Client, ns: &str, message: &str) -> (Api<Greeting>, Greeting) {
    let greetings: Api<Greeting> = Api::namespaced(client.clone(), ns);
    let hello = Greeting::new(
        "hello",
        GreetingSpec {
            message: message.into(),
            replicas: 2,
        },
    );
    let created = greetings
        .create(&PostParams::default(), &hello)
        .await
        .unwrap();
    (greetings, created)
}

fn owned_by(meta: &kube::api::ObjectMeta, owner: &Greeting) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| Some(&r.uid) == owner.meta().uid.as_ref() && r.controller == Some(true))
}

#[tokio::test]
async fn greeting_children_follow_the_spec_and_status_follows_the_children() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("greeting").await;
    let controller = RunningController::start(lab, &ns).await;
    let client = lab.client().await;
    let (greetings, hello) = create_hello(&client, ns.name(), "Hello from the lab").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns.name());

    // Create: both children appear, owned by the Greeting.
    let cm = eventually("ConfigMap hello", Duration::from_secs(30), || async {
        config_maps.get_opt("hello").await.unwrap()
    })
    .await;
    let dep = eventually("Deployment hello", Duration::from_secs(30), || async {
        deployments.get_opt("hello").await.unwrap()
    })
    .await;
    assert!(owned_by(&cm.metadata, &hello) && owned_by(&dep.metadata, &hello));
    assert_eq!(cm.data.unwrap()["index.html"], "Hello from the lab\n");
    assert_eq!(dep.spec.replicas, Some(2));

    // No Deployment controller or kubelet runs in the lab: not ready, and the reason says why.
    let reason = eventually("Ready=False", Duration::from_secs(30), || async {
        ready_condition(&greetings.get("hello").await.unwrap()).filter(|(s, _)| s == "False")
    })
    .await;
    assert_eq!(reason.1, "DeploymentNotObserved");

    // Delete the Deployment by hand: it comes back (a new object, a new uid).
    deployments
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    let old_uid = dep.metadata.uid.clone();
    let recreated = eventually("Deployment recreated", Duration::from_secs(30), || async {
        deployments
            .get_opt("hello")
            .await
            .unwrap()
            .filter(|d| d.metadata.uid != old_uid)
    })
    .await;
    assert!(owned_by(&recreated.metadata, &hello));

    // Change the message: the ConfigMap follows, and the status records the new generation.
    let patch = json!({"spec": {"message": "Hello again"}});
    greetings
        .patch("hello", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(
        "ConfigMap follows the message",
        Duration::from_secs(30),
        || async {
            let cm = config_maps.get("hello").await.unwrap();
            (cm.data.unwrap()["index.html"] == "Hello again\n").then_some(())
        },
    )
    .await;
    eventually(
        "observedGeneration == generation",
        Duration::from_secs(30),
        || async {
            let g = greetings.get("hello").await.unwrap();
            (g.status.as_ref()?.observed_generation == g.metadata.generation).then_some(())
        },
    )
    .await;

    // Write the Deployment's status as the Deployment controller and kubelet would: Ready turns True.
    let current = deployments.get("hello").await.unwrap();
    let status = json!({"status": {"observedGeneration": current.metadata.generation, "replicas": 2,
        "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}});
    deployments
        .patch_status("hello", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let ready = eventually("Ready=True", Duration::from_secs(30), || async {
        let g = greetings.get("hello").await.unwrap();
        (ready_condition(&g)?.0 == "True").then_some(g)
    })
    .await;
    assert_eq!(ready.status.as_ref().unwrap().ready_replicas, 2);
    assert_eq!(ready_condition(&ready).unwrap().1, "DeploymentAvailable");

    // Delete the Greeting: the real garbage collector removes both children. Its discovery of a new CRD can
    // lag by 30 s, hence the long wait.
    controller.stop().await;
    greetings
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    eventually("children collected", Duration::from_secs(120), || async {
        let cm = config_maps.get_opt("hello").await.unwrap();
        let dep = deployments.get_opt("hello").await.unwrap();
        (cm.is_none() && dep.is_none()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_steady_state_makes_no_writes() {
    let lab = TestLab::shared().await;
    let ns = lab.namespace("greeting-idle").await;
    let controller = RunningController::start(lab, &ns).await;
    let client = lab.client().await;
    let (greetings, _) = create_hello(&client, ns.name(), "quiet").await;
    eventually("status recorded", Duration::from_secs(30), || async {
        let g = greetings.get("hello").await.unwrap();
        let observed = g.status.as_ref().and_then(|s| s.observed_generation);
        ready_condition(&g).filter(|_| observed == g.metadata.generation)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = |all: Vec<ferry_testkit::AuditedRequest>| {
        all.into_iter().filter(|r| r.is_write()).collect::<Vec<_>>()
    };

    let before = writes(lab.audit_requests_by(&controller.user));
    // The counter sees this controller: the config map, deployment and status writes are there.
    assert!(
        before.len() >= 3,
        "expected the controller's writes in the audit log: {before:?}"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = writes(lab.audit_requests_by(&controller.user));
    assert_eq!(
        after.len(),
        before.len(),
        "writes during 10 s of idle: {:?}",
        &after[before.len()..]
    );
    controller.stop().await;
}
