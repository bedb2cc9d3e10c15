//! A tenant points Providers at its own server posing as vCenter, which answers with elements nested a
//! million deep, a body without end, property listings whose continuation tokens never end, and one byte a
//! second. Each Provider (or its migration) stops with a reason that says what was wrong, the controller never
//! restarts, and a migration in another namespace succeeds meanwhile.
//!
//! A second test black-holes one tenant's endpoint under 40 migrations: they hold at most their namespace's
//! share of the controller's reconcile slots, and another tenant's migration takes its normal time meanwhile.
//!
//! Before vSphere answers were bounded, the deep answer overflowed the controller's stack (every tenant's migrations
//! stopped, and the standby, taking over, crashed on the same Provider), and the endless answers grew its memory
//! without limit.

mod support;

use std::time::{Duration, Instant};

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

/// This binary's tests one after the other: each judges one tenant's time by the slots the others leave it.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn hostile_endpoints_stop_their_own_provider_and_harm_no_other_tenant() {
    let _alone = ONE_AT_A_TIME.lock().await;
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

/// Migrations of the black-holed tenant: more than the controller's 32 reconcile slots.
const STUCK: usize = 40;

#[tokio::test]
async fn a_tenant_stuck_on_an_endpoint_that_never_answers_leaves_the_others_their_normal_time() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let lab = lab().await;
    let (client, patient) = setup("tenant-patient").await;
    let (_, stuck) = setup("tenant-stuck").await;

    // The normal time, measured here: one migration with the controller to itself.
    let started = Instant::now();
    migrate_until_succeeded(
        &client,
        patient.name(),
        "alone",
        "DC0_C0_RP0_VM0",
        Duration::from_secs(600),
    )
    .await;
    let alone = started.elapsed();

    let vcsim = lab.state().vcsim.as_ref().unwrap();
    let proxy = FaultProxy::start_for(vcsim).await;
    proxy.turn_hostile(Hostile::BlackHole);
    apply(
        &client,
        stuck.name(),
        json!({
            "apiVersion": ferry_api::API_VERSION, "kind": "Provider",
            "metadata": {"name": "void", "namespace": stuck.name()},
            "spec": {"type": "vsphere", "url": proxy.url(), "secretRef": {"name": VSPHERE_SECRET},
                     "tls": {"caBundle": std::fs::read_to_string(&vcsim.ca_file).unwrap()}},
        }),
    )
    .await
    .unwrap();
    for n in 0..STUCK {
        let mut manifest = migration(lab, stuck.name(), &format!("stuck-{n}"), "DC0_H0_VM0");
        manifest["spec"]["source"]["providerRef"]["name"] = json!("void");
        apply(&client, stuck.name(), manifest).await.unwrap();
    }
    // Until the stuck tenant holds all it may: each of its reconciles then waits a minute for an answer.
    let metric = |name: &str, text: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let held = ferry_testkit::eventually(
        "the stuck tenant to hold its share of the reconcile slots",
        Duration::from_secs(120),
        || async {
            let text = controller().await.lock().await.metrics();
            let (running, waiting) = (
                metric("ferry_reconciles_in_flight ", &text),
                metric("ferry_reconciles_waiting ", &text),
            );
            (running >= 16 && waiting > 0).then_some((running, waiting))
        },
    )
    .await;
    eprintln!("reconciles running {}, waiting {}", held.0, held.1);

    let started = Instant::now();
    migrate_until_succeeded(
        &client,
        patient.name(),
        "meanwhile",
        "DC0_C0_RP0_VM1",
        Duration::from_secs(900),
    )
    .await;
    let meanwhile = started.elapsed();
    let text = controller().await.lock().await.metrics();
    eprintln!(
        "alone {alone:?}, beside {STUCK} stuck migrations {meanwhile:?}; now running {}, waiting {}",
        metric("ferry_reconciles_in_flight ", &text),
        metric("ferry_reconciles_waiting ", &text)
    );
    assert!(
        meanwhile <= alone * 2 + Duration::from_secs(60),
        "beside the stuck tenant the migration took {meanwhile:?}, alone {alone:?}"
    );

    // The stuck ones say why.
    let stuck_migrations: Api<VirtualMachineMigration> =
        Api::namespaced(client.clone(), stuck.name());
    let said = ferry_testkit::eventually(
        "a stuck migration to say its endpoint did not answer",
        Duration::from_secs(180),
        || async {
            let m = stuck_migrations.get("stuck-0").await.ok()?;
            let status = m.status?;
            (status.reason.as_deref() == Some("EndpointTimeout")).then_some(status.message?)
        },
    )
    .await;
    eprintln!("stuck-0: {said}");
    let controller = controller().await.lock().await;
    assert!(controller.is_running(), "the controller died");
    drop(proxy);
}
