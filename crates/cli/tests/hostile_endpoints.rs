//! Issue 23: a tenant points Providers at its own server posing as vCenter, which answers with elements nested a
//! million deep, a body without end, property listings whose continuation tokens never end, and one byte a
//! second. Each Provider (or its migration) stops with a reason that says what was wrong, the controller never
//! restarts, and a migration in another namespace succeeds meanwhile.
//!
//! Before the bounds of issue 23, the deep answer overflowed the controller's stack (every tenant's migrations
//! stopped, and the standby, taking over, crashed on the same Provider), and the endless answers grew its memory
//! without limit.

mod support;

use std::time::Duration;

use ferry_api::{Provider, VirtualMachineMigration};
use ferry_testkit::migration::{VSPHERE_SECRET, apply, migration};
use ferry_testkit::proxy::{FaultProxy, Hostile};
use kube::Api;
use serde_json::json;
use support::*;

const GOOD_VM: &str = "DC0_C0_RP0_VM1";

/// (Provider, what its endpoint does, the reason it must end with, words its message must hold)
const CASES: [(&str, Hostile, &str, &str); 4] = [
    (
        "deep",
        Hostile::DeepXml,
        "InvalidVSphereResponse",
        "nested more than 128 deep",
    ),
    (
        "endless",
        Hostile::EndlessBody,
        "InvalidVSphereResponse",
        "larger than 32 MiB",
    ),
    (
        "tokens",
        Hostile::EndlessTokens,
        "InvalidVSphereResponse",
        "the listing did not end after",
    ),
    (
        "trickle",
        Hostile::Trickle,
        "EndpointTimeout",
        "did not answer within",
    ),
];

#[tokio::test]
async fn hostile_endpoints_stop_their_own_provider_and_harm_no_other_tenant() {
    let lab = lab().await;
    let (client, good) = setup("tenant-good").await;
    let (_, hostile) = setup("tenant-hostile").await;
    let vcsim = lab.state().vcsim.as_ref().unwrap();
    let ca = std::fs::read_to_string(&vcsim.ca_file).unwrap();
    let mut proxies = Vec::new();
    for (name, behaviour, _, _) in CASES {
        let proxy = FaultProxy::start_for(vcsim).await;
        proxy.turn_hostile(behaviour);
        apply(&client, hostile.name(), json!({
            "apiVersion": ferry_api::API_VERSION, "kind": "Provider",
            "metadata": {"name": name, "namespace": hostile.name()},
            "spec": {"type": "vsphere", "url": proxy.url(), "secretRef": {"name": VSPHERE_SECRET},
                     "tls": {"caBundle": ca}},
        }))
        .await
        .unwrap();
        // Found by name: discovery lists the inventory, where the endless tokens wait.
        let mut manifest = migration(lab, hostile.name(), name, "DC0_H0_VM0");
        manifest["spec"]["source"]["providerRef"]["name"] = json!(name);
        apply(&client, hostile.name(), manifest).await.unwrap();
        proxies.push(proxy);
    }

    migrate_until_succeeded(
        &client,
        good.name(),
        "good",
        GOOD_VM,
        Duration::from_secs(600),
    )
    .await;

    let providers: Api<Provider> = Api::namespaced(client.clone(), hostile.name());
    let hostile_migrations: Api<VirtualMachineMigration> =
        Api::namespaced(client.clone(), hostile.name());
    for (name, _, reason, words) in CASES {
        let what = format!("Provider or migration {name} to stop with {reason}");
        let said = ferry_testkit::eventually(&what, Duration::from_secs(300), || async {
            let provider = providers.get(name).await.ok()?;
            let ready = provider
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .filter(|c| c.status == "False")
                .map(|c| (c.reason.clone(), c.message.clone()));
            let migration = hostile_migrations.get(name).await.ok()?;
            let recorded = migration
                .status
                .as_ref()
                .and_then(|s| Some((s.reason.clone()?, s.message.clone()?)));
            [ready, recorded]
                .into_iter()
                .flatten()
                .find(|(r, m)| r == reason && m.contains(words))
        })
        .await;
        eprintln!("{name}: {} {}", said.0, said.1);
    }
    // The tokens were followed no further than the bound, and then given up.
    let calls = proxies[2].soap_calls();
    let pages = calls
        .iter()
        .filter(|m| *m == "ContinueRetrievePropertiesEx")
        .count();
    assert!(
        pages <= 2 * ferry_vsphere::props::MAX_PAGES,
        "{pages} pages"
    );

    let controller = controller().await.lock().await;
    assert!(controller.is_running(), "the controller died");
    assert_eq!(
        controller.launches(),
        1,
        "the controller had to start again: {}",
        controller.logs()
    );
}
