//! Test support: a real lab (etcd, kube-apiserver, kube-controller-manager, vcsim) for integration tests.
//!
//! - [`TestLab::shared`] starts one lab per test binary on first use; tests isolate themselves with
//!   [`TestLab::namespace`]. It stops when the binary exits, whether tests passed or failed.
//! - [`TestLab::start`] gives a test a lab of its own, stopped on drop (and so on panic).
//!
//! Lab processes get a parent-death signal, so even a test binary killed with SIGKILL leaves none behind;
//! directories left by such a binary are swept by the next run.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};
use ferry_lab::lab::VcsimRealism;
use ferry_lab::{LabOptions, LabState, Lifetime};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

pub mod disks;
mod exit;
pub mod http;
pub mod migration;
pub mod proxy;
pub mod real_node;

/// A running lab owned by this test process.
pub struct TestLab {
    state: LabState,
}

static SHARED: tokio::sync::OnceCell<TestLab> = tokio::sync::OnceCell::const_new();
static NEXT_ID: AtomicU32 = AtomicU32::new(0);

impl TestLab {
    /// The lab shared by every test of this binary.
    pub async fn shared() -> &'static TestLab {
        SHARED
            .get_or_try_init(TestLab::start)
            .await
            .expect("starting the shared test lab")
    }

    /// A lab of this test's own.
    pub async fn start() -> Result<TestLab> {
        // Tests run the stand-ins they need in-process.
        Self::start_with(None).await
    }

    /// The whole lab as `ferry lab up` runs it (stand-ins run by `ferry`, demo VMs, a production-like vCenter),
    /// shared by every test of this binary.
    pub async fn shared_with_standins(ferry: &Path) -> &'static TestLab {
        Self::shared_with_standins_and(ferry, VcsimRealism::production_like()).await
    }

    /// As [`Self::shared_with_standins`], with vcsim's production-like behaviours `realism`. The first call in a
    /// test binary starts the lab, so a binary that needs them calls this before anything else.
    pub async fn shared_with_standins_and(ferry: &Path, realism: VcsimRealism) -> &'static TestLab {
        Self::shared_full(ferry, realism, false).await
    }

    /// As [`Self::shared_with_standins`], with MinIO compressing staged raw images, so a test can stage a mostly
    /// empty disk larger than the machine's free space. Call it first, as above.
    pub async fn shared_with_standins_compressing_staging(ferry: &Path) -> &'static TestLab {
        Self::shared_full(ferry, VcsimRealism::production_like(), true).await
    }

    async fn shared_full(
        ferry: &Path,
        realism: VcsimRealism,
        compress_staging: bool,
    ) -> &'static TestLab {
        static FULL: tokio::sync::OnceCell<TestLab> = tokio::sync::OnceCell::const_new();
        FULL.get_or_try_init(|| {
            TestLab::start_shaped(Some(ferry.to_path_buf()), realism, compress_staging)
        })
        .await
        .expect("starting the shared lab with stand-ins")
    }

    async fn start_with(standins: Option<PathBuf>) -> Result<TestLab> {
        Self::start_shaped(standins, VcsimRealism::default(), false).await
    }

    async fn start_shaped(
        standins: Option<PathBuf>,
        vcsim_realism: VcsimRealism,
        compress_staging: bool,
    ) -> Result<TestLab> {
        let dir = fresh_dir()?;
        let options = LabOptions {
            dir: dir.clone(),
            tools: ferry_lab::control_plane::tools::bin_dir()?,
            lifetime: Lifetime::TiedToThisProcess,
            demo_vms: standins.is_some(),
            controller: false,
            standins,
            vcsim_vms: ferry_lab::lab::DEFAULT_VCSIM_VMS,
            boot_guests: true,
            vcsim_realism,
            compress_staging,
            real_node: None,
            real_kubevirt: false,
        };
        match ferry_lab::up(&options).await {
            Ok(outcome) => Ok(TestLab {
                state: outcome.into_state(),
            }),
            Err(e) => {
                exit::teardown(&dir);
                Err(e.context(format!("starting a test lab in {}", dir.display())))
            }
        }
    }

    pub fn state(&self) -> &LabState {
        &self.state
    }

    pub fn dir(&self) -> &Path {
        &self.state.dir
    }

    /// A fresh admin client. Each test makes its own: a client is tied to the runtime that made it.
    pub async fn client(&self) -> Client {
        self.state
            .client()
            .await
            .expect("a client for the test lab")
    }

    /// A `kubectl` for this lab.
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(self.state.tools.join("kubectl"));
        cmd.env("KUBECONFIG", &self.state.kubeconfig);
        cmd
    }

    /// A kubeconfig for another identity: a client certificate signed by the lab's CA.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        ferry_lab::control_plane::components::write_identity_kubeconfig(
            &self.state.dir,
            &self.state.api_url,
            user,
            groups,
        )
    }

    /// A client with the identity of a ServiceAccount, for RBAC tests.
    pub async fn client_as_service_account(&self, namespace: &str, name: &str) -> Result<Client> {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let groups = [
            "system:serviceaccounts",
            &format!("system:serviceaccounts:{namespace}"),
            "system:authenticated",
        ];
        self.client_as(&user, &groups).await
    }

    /// A client for any identity, signed by the lab's CA.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Result<Client> {
        let kubeconfig = self.kubeconfig_for(user, groups)?;
        ferry_lab::control_plane::probe::client_for(&kubeconfig, None).await
    }

    /// Requests made by `user`, read from the API server's audit log (one entry per completed request).
    pub fn audit_requests_by(&self, user: &str) -> Vec<AuditedRequest> {
        // Read while the API server appends: a torn last line may split a UTF-8 character, which must not
        // lose the whole log (as read_to_string would); the torn line itself fails to parse and is skipped.
        let log = std::fs::read(self.state.dir.join("audit.log")).unwrap_or_default();
        String::from_utf8_lossy(&log)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|e| e["stage"] == "ResponseComplete" && e["user"]["username"] == user)
            .map(|e| AuditedRequest {
                verb: e["verb"].as_str().unwrap_or_default().to_string(),
                uri: e["requestURI"].as_str().unwrap_or_default().to_string(),
                code: e["responseStatus"]["code"].as_i64().unwrap_or_default(),
                resource: e["objectRef"]["resource"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                namespace: e["objectRef"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                name: e["objectRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect()
    }

    /// A namespace for one test, deleted when the guard drops.
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let client = self.client().await;
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        );
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"ferry.test/namespace": "true"}}
        }))
        .expect("namespace manifest");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        TestNamespace {
            name,
            kubeconfig: self.state.kubeconfig.clone(),
        }
    }
}

impl Drop for TestLab {
    fn drop(&mut self) {
        exit::teardown(&self.state.dir);
    }
}

/// A vSphere simulator of its own (vCenter model, or ESXi with `esx`), stopped and removed on drop.
pub struct TestVcsim {
    inner: ferry_lab::vsphere::vcsim::StandaloneVcsim,
}

impl TestVcsim {
    pub async fn start(esx: bool) -> Result<Self> {
        Self::start_with(esx, &VcsimRealism::default()).await
    }

    /// A simulator with some of a production vCenter's behaviours (`tools/vcsim`'s flags).
    pub async fn start_with(esx: bool, realism: &VcsimRealism) -> Result<Self> {
        let dir = fresh_dir()?;
        let tools = ferry_lab::control_plane::tools::bin_dir()?;
        match ferry_lab::vsphere::vcsim::StandaloneVcsim::start_with(
            &dir,
            &tools,
            esx,
            realism,
            Lifetime::TiedToThisProcess,
        )
        .await
        {
            Ok(inner) => Ok(Self { inner }),
            Err(e) => {
                exit::teardown(&dir);
                Err(e)
            }
        }
    }

    pub fn endpoint(&self) -> &ferry_lab::VcsimEndpoint {
        &self.inner.endpoint
    }

    pub fn dir(&self) -> &Path {
        self.inner.dir()
    }
}

impl Drop for TestVcsim {
    fn drop(&mut self) {
        let _ = self.inner.stop();
        exit::teardown(self.inner.dir());
    }
}

/// A MinIO server of its own with the bucket `ferry-staging`, stopped and removed on drop.
pub struct TestMinio {
    inner: ferry_lab::minio::StandaloneMinio,
}

impl TestMinio {
    pub async fn start() -> Result<Self> {
        let dir = fresh_dir()?;
        let tools = ferry_lab::control_plane::tools::bin_dir()?;
        match ferry_lab::minio::StandaloneMinio::start(&dir, &tools, Lifetime::TiedToThisProcess)
            .await
        {
            Ok(inner) => Ok(Self { inner }),
            Err(e) => {
                exit::teardown(&dir);
                Err(e)
            }
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// `accessKeyId` and `secretKey` files.
    pub fn credentials_dir(&self) -> &Path {
        &self.inner.credentials_dir
    }

    /// `s3://ferry-staging`
    pub fn bucket_url(&self) -> String {
        format!("s3://{}", ferry_lab::minio::BUCKET)
    }
}

impl Drop for TestMinio {
    fn drop(&mut self) {
        let _ = self.inner.stop();
        exit::teardown(self.inner.dir());
    }
}

/// One request as the API server's audit log recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedRequest {
    pub verb: String,
    pub uri: String,
    /// The HTTP status answered, for example 201 for a create that made something.
    pub code: i64,
    /// The resource (`jobs`, `datavolumes`, ...) and its namespace, when the request names them.
    pub resource: String,
    pub namespace: String,
    /// The object's name; the API server fills it in for creates too.
    pub name: String,
}

impl AuditedRequest {
    /// Writes change stored state; reads (get, list, watch) do not.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// A namespace deleted on drop. The real namespace controller then removes what is in it.
pub struct TestNamespace {
    name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let (name, kubeconfig) = (self.name.clone(), self.kubeconfig.clone());
        // Drop may run inside a test's runtime, which cannot be blocked on: delete from a thread of its own.
        let deleted = std::thread::spawn(move || -> Result<()> {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(async {
                    let client =
                        ferry_lab::control_plane::probe::client_for(&kubeconfig, None).await?;
                    Api::<Namespace>::all(client)
                        .delete(&name, &DeleteParams::background())
                        .await
                        .context("deleting the test namespace")?;
                    Ok(())
                })
        })
        .join();
        if let Ok(Err(e)) = deleted {
            tracing::warn!("test namespace {} not deleted: {e:#}", self.name);
        }
    }
}

/// A new directory for one lab or server, removed at drop or exit; abandoned ones are swept first.
fn fresh_dir() -> Result<PathBuf> {
    let root = tests_root();
    std::fs::create_dir_all(&root)?;
    sweep_abandoned(&root);
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    exit::register(&dir);
    Ok(dir)
}

fn tests_root() -> PathBuf {
    std::env::temp_dir().join("ferry-tests")
}

/// Removes labs left by test binaries that no longer run (killed before their exit handler ran).
fn sweep_abandoned(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid != std::process::id() as i32
            && !ferry_lab::control_plane::process::pid_is_running(pid)
        {
            exit::teardown(&entry.path());
        }
    }
}

/// Labs started by this process; guarded so the exit handler and drops never stop one twice.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Command lines of running processes that mention `path`: what a clean teardown must leave empty.
pub fn processes_mentioning(path: &Path) -> Vec<String> {
    let needle = path.to_string_lossy().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&needle))
        .collect()
}

/// Polls `probe` until it yields a value; fails the test after `timeout`, naming `what` it waited for.
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    timeout: std::time::Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The shutdown signal handed to a [`Background`] task.
pub type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// A controller (a stand-in, say) run in the background of a test until [`Background::stop`].
pub struct Background {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Background {
    pub fn spawn<Fut>(run: impl FnOnce(Shutdown) -> Fut) -> Self
    where
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let future = run(Box::pin(async move {
            let _ = stopped.await;
        }));
        let task = tokio::spawn(async move {
            if let Err(e) = future.await {
                panic!("background task failed: {e:#}");
            }
        });
        Self { stop, task }
    }

    /// Signals shutdown and waits (up to 10 s) for the task to end.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), self.task).await;
    }
}
