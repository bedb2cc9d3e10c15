//! The running controller: leader election on a Lease, watches on migrations, Providers and every child kind,
//! and an HTTP port with `/metrics`, `/healthz`, `/readyz` and `/readyz/leader`. It exits when it loses the lease,
//! so that a restarted process starts again from what it observes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use ferry_api::{MigrationPlan, Provider, VirtualMachineMigration};
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::api::DynamicObject;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::build::{dv_resource, vm_resource, vmi_resource};
use crate::context::{Config, Context};
use crate::fair::Fairness;
use crate::metrics::Metrics;
use crate::reconcile::within_deadline;
use crate::watched::Watched;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub config: Config,
    /// Where `/metrics`, `/healthz` and `/readyz` are served; None serves nothing.
    pub metrics_addr: Option<SocketAddr>,
    pub lease_namespace: String,
    pub lease_name: String,
    /// Who holds the lease: the pod's name in a cluster.
    pub identity: String,
    pub lease_seconds: u64,
    /// The namespaces served: all, or a chosen few.
    pub watched: Watched,
}

pub async fn run(client: Client, options: RunOptions) -> Result<()> {
    // Listening from the start: a SIGTERM that reaches a standby, or arrives as it takes the lease, is not lost.
    let shutdown = Shutdown::on_signals()?;
    let role = Arc::new(AtomicU8::new(Role::Starting as u8));
    let ctx = Arc::new(Context::new(
        client.clone(),
        options.config.clone(),
        Metrics::default(),
    ));
    if let Some(addr) = options.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics port {addr}"))?;
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz and /readyz/leader");
        tokio::spawn(serve(listener, ctx.clone(), role.clone()));
    }

    let lease = LeaseManagerBuilder::new(client.clone(), &options.lease_name)
        .with_namespace(&options.lease_namespace)
        .with_identity(&options.identity)
        .with_duration(options.lease_seconds)
        .with_grace(options.lease_seconds.div_ceil(3).max(1))
        .build()
        .await
        .context("setting up leader election")?;
    let (mut leading, lease_task) = lease.watch().await;
    role.store(Role::Standby as u8, Ordering::Relaxed);
    tracing::info!(lease = %options.lease_name, identity = %options.identity, "waiting to lead");
    while !*leading.borrow_and_update() {
        tokio::select! {
            changed = leading.changed() => changed.context("leader election stopped")?,
            () = shutdown.requested() => {
                // A standby holds nothing: it goes at once, so a rolling update does not wait out its grace period.
                tracing::info!("stopping while standing by");
                lease_task.abort();
                return Ok(());
            }
        }
    }
    tracing::info!("leading: reconciling migrations");
    role.store(Role::Leading as u8, Ordering::Relaxed);

    let lost = async move {
        loop {
            if leading.changed().await.is_err() || !*leading.borrow() {
                break;
            }
        }
    };
    let stopped = run_controllers(client, ctx, &options.watched, &shutdown);
    let lost_lease = tokio::select! {
        _ = lost => true,
        _ = stopped => false,
    };
    role.store(Role::Stopping as u8, Ordering::Relaxed);
    if lost_lease {
        lease_task.abort();
        anyhow::bail!(
            "lost the leader lease; exiting so that a fresh process observes the world again"
        )
    }
    // The watch receiver is gone with `lost`, so the lease manager releases the lease: a successor leads at once.
    let _ = tokio::time::timeout(Duration::from_secs(2), lease_task).await;
    Ok(())
}

/// A cached migration keeps what the controller reads: not who wrote which field, nor annotations outside Ferry's
/// group (kubectl's last-applied copy alone doubles a migration), however many migrations there are.
fn trim_migration(vmm: &mut VirtualMachineMigration) {
    vmm.managed_fields_mut().clear();
    let ours = format!("{}/", ferry_api::GROUP);
    vmm.annotations_mut()
        .retain(|key, _| key.starts_with(&ours));
}

/// A cached Job keeps its metadata, status and deadline, which is all the checkpoints read: its pod template (args,
/// env, volumes) was most of its size, held for every conversion in flight.
fn trim_job(job: &mut Job) {
    job.managed_fields_mut().clear();
    if let Some(spec) = job.spec.as_mut() {
        spec.template = Default::default();
    }
}

/// A cached child keeps what the checkpoints read, not who wrote which field.
fn forget_managed_fields<K: ResourceExt>(object: &mut K) {
    object.managed_fields_mut().clear();
}

/// SIGTERM or SIGINT, seen by every part of the process that waits for it.
#[derive(Clone)]
struct Shutdown(tokio::sync::watch::Receiver<bool>);

impl Shutdown {
    fn on_signals() -> Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
        let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            tracing::info!("shutdown requested");
            let _ = tx.send(true);
            // Kept open, so waiters see `true` rather than a closed channel.
            std::future::pending::<()>().await;
        });
        Ok(Self(rx))
    }

    /// Resolves once shutdown is requested (at once if it already was).
    fn requested(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|requested| *requested).await;
        }
    }
}

async fn run_controllers(
    client: Client,
    ctx: Arc<Context>,
    watched: &Watched,
    shutdown: &Shutdown,
) {
    let config = watcher::Config::default().any_semantic();
    // A plan learns of its migrations' changes from the migrations' watch, after the cache has them: a second
    // watch of every migration's metadata cost a decode of each write's managed fields.
    let (plan_wake, plan_woken) = futures::channel::mpsc::unbounded();
    let migrations =
        migration_controller(&client, ctx.clone(), watched, &config, plan_wake, shutdown);
    let providers = provider_controller(&client, ctx.clone(), watched, &config, shutdown);
    let plans = plan_controller(&client, ctx, watched, &config, plan_woken, shutdown);
    futures::future::join3(migrations, providers, plans).await;
}

/// Reconciles migrations, woken by their own changes, their children's (Jobs and DataVolumes only when it
/// matters, VMs, VMIs), their Provider's, and a freed disk slot; each migration's change also wakes its plan.
fn migration_controller(
    client: &Client,
    ctx: Arc<Context>,
    watched: &Watched,
    config: &watcher::Config,
    plan_wake: UnboundedSender<ObjectRef<MigrationPlan>>,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> {
    let (store, writer) = reflector::store::<VirtualMachineMigration>();
    let migrations = Controller::for_stream(
        migration_events(client, watched, config, writer, plan_wake),
        store.clone(),
    );
    let by_provider = store.clone();
    let by_vm = store.clone();
    let (wake, woken) = futures::channel::mpsc::unbounded();
    ctx.slots.attach(store, wake);
    let (jobs, data_volumes) = job_and_volume_changes(&ctx, client, watched, config);
    migrations
        .reconcile_on(woken)
        .owns_stream(jobs)
        .owns_stream_with(data_volumes, dv_resource())
        .owns_stream_with(
            watched
                .dynamic_metadata_events(client, &vm_resource(), config)
                .touched_objects(),
            vm_resource(),
        )
        .watches_stream_with(
            watched
                .dynamic_events(client, &vmi_resource(), config)
                .touched_objects(),
            move |vmi| crate::wake::migrations_of_vmi(&by_vm.state(), &vmi),
            vmi_resource(),
        )
        .watches_stream(
            watched.events::<Provider>(client, config).touched_objects(),
            move |provider| {
                crate::wake::unfinished_migrations_of_provider(&by_provider.state(), &provider)
            },
        )
        // Unbounded here: `fair::Fairness` bounds the reconciles, overall and per namespace.
        .with_config(controller::Config::default().debounce(ctx.config.debounce))
        .graceful_shutdown_on(shutdown.requested())
        .run(
            |vmm, ctx| async move {
                // The migration's reconcile sets its own deadline, within what its metrics measure.
                fair(&ctx.fairness, vmm.namespace(), || {
                    crate::reconcile::reconcile(vmm, ctx.clone())
                })
                .await
            },
            crate::reconcile::error_policy,
            ctx,
        )
        .for_each(|_| async {})
}

/// The migrations' changes, cached by `writer`. Each also wakes the plan that controls the migration, after the
/// cache has it.
fn migration_events(
    client: &Client,
    watched: &Watched,
    config: &watcher::Config,
    writer: Writer<VirtualMachineMigration>,
    plan_wake: UnboundedSender<ObjectRef<MigrationPlan>>,
) -> impl Stream<Item = watcher::Result<VirtualMachineMigration>> + Send + use<> {
    reflector(
        writer,
        watched
            .events::<VirtualMachineMigration>(client, config)
            .modify(trim_migration),
    )
    .inspect(move |event| {
        if let Ok(
            watcher::Event::Apply(m) | watcher::Event::InitApply(m) | watcher::Event::Delete(m),
        ) = event
            && let Some(plan) = crate::plan::owner_of(m)
        {
            let _ = plan_wake.unbounded_send(plan);
        }
    })
    .applied_objects()
}

/// The Jobs' and DataVolumes' changes that wake their migration. Both are polled while they run: their watches
/// keep the caches the checkpoints read first.
fn job_and_volume_changes(
    ctx: &Context,
    client: &Client,
    watched: &Watched,
    config: &watcher::Config,
) -> (
    impl Stream<Item = watcher::Result<Job>> + Send + use<>,
    impl Stream<Item = watcher::Result<DynamicObject>> + Send + use<>,
) {
    let job_cache = Writer::<Job>::default();
    let dv_cache = Writer::<DynamicObject>::new(dv_resource());
    ctx.caches
        .attach(job_cache.as_reader(), dv_cache.as_reader());
    let jobs = crate::wake::significant(
        reflector(
            job_cache,
            watched.events::<Job>(client, config).modify(trim_job),
        ),
        crate::wake::job_summary,
    );
    let data_volumes = crate::wake::significant(
        reflector(
            dv_cache,
            watched
                .dynamic_events(client, &dv_resource(), config)
                .modify(forget_managed_fields),
        ),
        crate::wake::data_volume_summary,
    );
    (jobs, data_volumes)
}

/// Reconciles Providers; its cache also serves the migrations' lagging reads of a Provider.
fn provider_controller(
    client: &Client,
    ctx: Arc<Context>,
    watched: &Watched,
    config: &watcher::Config,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> {
    let (provider_store, writer) = reflector::store::<Provider>();
    ctx.attach_providers(provider_store.clone());
    let provider_events = reflector(writer, watched.events::<Provider>(client, config));
    Controller::for_stream(provider_events.applied_objects(), provider_store)
        .graceful_shutdown_on(shutdown.requested())
        .run(
            |provider, ctx| async move {
                fair(&ctx.fairness, provider.namespace(), || {
                    within_deadline(crate::provider::reconcile(provider, ctx.clone()))
                })
                .await
            },
            crate::provider::error_policy,
            ctx,
        )
        .for_each(|_| async {})
}

/// Reconciles plans, woken also by their migrations' changes (`plan_woken`).
fn plan_controller(
    client: &Client,
    ctx: Arc<Context>,
    watched: &Watched,
    config: &watcher::Config,
    plan_woken: UnboundedReceiver<ObjectRef<MigrationPlan>>,
    shutdown: &Shutdown,
) -> impl Future<Output = ()> {
    let (plan_store, writer) = reflector::store::<MigrationPlan>();
    let plan_events = reflector(writer, watched.events::<MigrationPlan>(client, config));
    Controller::for_stream(plan_events.applied_objects(), plan_store)
        .reconcile_on(plan_woken)
        .graceful_shutdown_on(shutdown.requested())
        .run(
            |plan, plans| async move {
                fair(&plans.ctx.fairness, plan.namespace(), || {
                    within_deadline(crate::plan::reconcile(plan, plans.clone()))
                })
                .await
            },
            crate::plan::error_policy,
            Arc::new(crate::plan::PlanContext::new(ctx)),
        )
        .for_each(|_| async {})
}

/// Runs the reconcile that `reconcile` makes once a reconcile slot is free for its object's `namespace`: a
/// tenant whose reconciles hang leaves the other tenants theirs. The reconcile is made only once admitted, on the
/// heap: the many that wait for a slot (a whole plan's at its start) hold a few words each, not a reconcile's state
/// (about 17 KiB for a migration's).
async fn fair<T, F: Future<Output = T>>(
    fairness: &Fairness,
    namespace: Option<String>,
    reconcile: impl FnOnce() -> F,
) -> T {
    let _slot = fairness.admit(&namespace.unwrap_or_default()).await;
    Box::pin(reconcile()).await
}

/// What this process is doing, as its HTTP port reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Role {
    /// Setting up leader election: not yet talking to the API server.
    Starting,
    /// Another replica leads; this one would take over when the lease frees.
    Standby,
    Leading,
    /// Lost the lease or shutting down: about to exit.
    Stopping,
}

impl Role {
    fn from_u8(value: u8) -> Self {
        [Self::Starting, Self::Standby, Self::Leading, Self::Stopping]
            .into_iter()
            .find(|role| *role as u8 == value)
            .unwrap_or(Self::Stopping)
    }
}

/// The answer to a health path. A standby is ready: it serves and would take over, and a Deployment of two
/// replicas must reach 2/2 available for a rolling update to proceed (as controller-runtime's managers report).
/// `/readyz/leader` tells the leader apart, for whoever must wait until a replica reconciles.
fn health(path: &str, role: Role) -> Option<(&'static str, &'static str)> {
    const OK: &str = "200 OK";
    const UNAVAILABLE: &str = "503 Service Unavailable";
    Some(match (path, role) {
        ("/healthz", _) => (OK, "ok\n"),
        ("/readyz" | "/readyz/leader", Role::Leading) => (OK, "ok: leading\n"),
        ("/readyz", Role::Standby) => (OK, "ok: standby, waiting for the leader lease\n"),
        ("/readyz/leader", Role::Standby) => {
            (UNAVAILABLE, "standby: waiting for the leader lease\n")
        }
        ("/readyz" | "/readyz/leader", Role::Starting) => {
            (UNAVAILABLE, "starting: setting up leader election\n")
        }
        ("/readyz" | "/readyz/leader", Role::Stopping) => (UNAVAILABLE, "stopping\n"),
        _ => return None,
    })
}

/// A minimal HTTP/1.1 responder: four read-only paths need no framework.
async fn serve(listener: tokio::net::TcpListener, ctx: Arc<Context>, role: Arc<AtomicU8>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (ctx, role) = (ctx.clone(), role.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let n = match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let role = Role::from_u8(role.load(Ordering::Relaxed));
            let (code, body) = match (path, health(path, role)) {
                ("/metrics", _) => ("200 OK", metrics(&ctx, role)),
                (_, Some((code, body))) => (code, body.to_string()),
                (_, None) => ("404 Not Found", "not found\n".to_string()),
            };
            let response = format!(
                "HTTP/1.1 {code}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// Every series this replica exports: the leader's reconciles, slots and hosts, and whether it leads (so an alert
/// sees a fleet without a leader).
fn metrics(ctx: &Context, role: Role) -> String {
    let leading = u8::from(role == Role::Leading);
    ctx.metrics.render()
        + &ctx.fairness.render()
        + &ctx.slots.render()
        + &format!("# TYPE ferry_leader gauge\nferry_leader {leading}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_is_ready_but_only_the_leader_answers_readyz_leader() {
        let code = |path, role| health(path, role).map(|(code, _)| code);
        assert_eq!(code("/readyz", Role::Standby), Some("200 OK"));
        assert_eq!(
            code("/readyz/leader", Role::Standby),
            Some("503 Service Unavailable")
        );
        assert_eq!(code("/readyz", Role::Leading), Some("200 OK"));
        assert_eq!(code("/readyz/leader", Role::Leading), Some("200 OK"));
        for role in [Role::Starting, Role::Stopping] {
            assert_eq!(code("/readyz", role), Some("503 Service Unavailable"));
            assert_eq!(
                code("/readyz/leader", role),
                Some("503 Service Unavailable")
            );
            assert_eq!(code("/healthz", role), Some("200 OK"));
        }
        assert_eq!(code("/nope", Role::Leading), None);
        for role in [Role::Starting, Role::Standby, Role::Leading, Role::Stopping] {
            assert_eq!(Role::from_u8(role as u8), role);
        }
    }

    #[tokio::test]
    async fn a_reconcile_waiting_for_its_slot_holds_none_of_its_state() {
        let big = || async {
            let state = [7u8; 16 * 1024];
            tokio::task::yield_now().await;
            state.iter().map(|b| *b as usize).sum::<usize>()
        };
        assert!(std::mem::size_of_val(&big()) >= 16 * 1024);
        let fairness = Fairness::new(1, 1);
        let waiting = fair(&fairness, None, big);
        assert!(std::mem::size_of_val(&waiting) < 1024);
        assert_eq!(waiting.await, 7 * 16 * 1024);
    }

    #[test]
    fn a_cached_migration_keeps_only_what_ferry_reads() {
        let mut vmm: VirtualMachineMigration = serde_json::from_value(serde_json::json!({
            "apiVersion": ferry_api::API_VERSION, "kind": "VirtualMachineMigration",
            "metadata": {"name": "m", "namespace": "ns", "labels": {"team": "a"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                    (ferry_api::keys::HOLD_ANNOTATION): "Converting"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"source": {"providerRef": {"name": "vc"}, "vm": {"name": "x"}}, "target": {}},
        }))
        .unwrap();
        trim_migration(&mut vmm);
        assert!(vmm.managed_fields().is_empty());
        assert_eq!(
            vmm.annotations().keys().collect::<Vec<_>>(),
            [ferry_api::keys::HOLD_ANNOTATION]
        );
        assert_eq!(vmm.labels()["team"], "a");
    }

    #[test]
    fn a_cached_job_keeps_its_status_and_deadline_but_not_its_pod_template() {
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j", "namespace": "ns", "labels": {"app": "ferry"},
                "managedFields": [{"manager": "ferry", "operation": "Apply"}]},
            "spec": {"activeDeadlineSeconds": 1900, "template": {"spec": {"containers": [
                {"name": "convert", "image": "ferry", "args": ["convert", "--disk", "0"]}]}}},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]},
        }))
        .unwrap();
        trim_job(&mut job);
        assert!(job.managed_fields().is_empty());
        let spec = job.spec.as_ref().unwrap();
        assert_eq!(spec.active_deadline_seconds, Some(1900));
        assert_eq!(spec.template, Default::default());
        assert_eq!(job.labels()["app"], "ferry");
        assert_eq!(job.status.unwrap().conditions.unwrap()[0].type_, "Complete");
    }
}
