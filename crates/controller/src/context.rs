//! What every reconcile shares: the client, the settings, metrics, and vSphere sessions kept per Provider.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ferry_api::{Provider, Reason};
use ferry_datapath::spec::StagingSpec;
use ferry_datapath::staging::{Staging, s3_bucket_and_prefix};
use ferry_vsphere::inventory::VmNameIndex;
use ferry_vsphere::{ConnectConfig, MoRef, Session};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client, ResourceExt};

use crate::error::{Failure, Result};
use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct Config {
    /// The image conversion and verification Jobs run (its entrypoint is `ferry`).
    pub worker_image: String,
    /// The longest wait between two attempts of a transient error.
    pub max_backoff: Duration,
    /// Reconciles in flight at once: bounds memory and the load on the API server and vCenter, however many
    /// migrations run.
    pub max_concurrent_reconciles: u16,
    /// Of those, at most this many for the objects of any one namespace: a tenant whose reconciles hang (an
    /// endpoint that never answers) leaves the other slots to the other tenants.
    pub max_reconciles_per_namespace: u16,
    /// Changes to one migration arriving within this are reconciled once.
    pub debounce: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            worker_image: format!("ferry:{}", env!("CARGO_PKG_VERSION")),
            max_backoff: Duration::from_secs(300),
            max_concurrent_reconciles: 32,
            max_reconciles_per_namespace: 16,
            debounce: Duration::from_millis(100),
        }
    }
}

pub struct Context {
    pub client: Client,
    pub config: Config,
    pub metrics: Metrics,
    pub recorder: Recorder,
    /// Reconcile slots, overall and per namespace.
    pub fairness: crate::fair::Fairness,
    sessions: Mutex<HashMap<String, CachedSession>>,
    /// Consecutive failed reconciles per migration, for the error backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// This process's last write per migration, until the migration ends.
    written: Mutex<HashMap<String, OwnWrite>>,
    /// Every source VM's name per Provider, shared by the discoveries of [`VM_INDEX_TTL`]: one listing at a time
    /// per Provider, so a slow vCenter holds up only the discoveries behind its own Provider.
    vm_names: Mutex<HashMap<String, NameIndexSlot>>,
    /// Staging stores per bucket, endpoint and keys (a hash of them: the keys are not kept twice).
    stores: Mutex<HashMap<u64, Staging>>,
    /// Disk slots per ESXi host.
    pub slots: crate::slots::Slots,
    /// The watch caches of Jobs and DataVolumes.
    pub caches: crate::cache::Caches,
    /// The Provider controller's cache, for reads that may lag a moment (a waiter's look at its limits).
    providers: std::sync::OnceLock<kube::runtime::reflector::Store<ferry_api::Provider>>,
}

/// A write of this process, as the API server stored it.
struct OwnWrite {
    resource_version: String,
    at: std::time::Instant,
}

const MAX_STAGING_STORES: usize = 16;

/// A session is reused without reading its Secret again for this long: a changed password is seen this late at
/// most (and a login that fails with the old one is forgotten at once).
const SECRET_RECHECK: Duration = Duration::from_secs(10);

/// A logged-in session, with the Provider generation and Secret version it was made from.
struct CachedSession {
    generation: i64,
    secret_version: String,
    session: Session,
    /// When the Secret was last read and found unchanged.
    checked: std::time::Instant,
}

/// How long one listing of the VMs' names serves discoveries by name.
pub const VM_INDEX_TTL: Duration = Duration::from_secs(30);

impl Context {
    pub fn new(client: Client, config: Config, metrics: Metrics) -> Self {
        let reporter = Reporter {
            controller: crate::children::MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            fairness: crate::fair::Fairness::new(
                config.max_concurrent_reconciles.into(),
                config.max_reconciles_per_namespace.into(),
            ),
            client,
            config,
            metrics,
            sessions: Mutex::default(),
            failures: Mutex::default(),
            written: Mutex::default(),
            vm_names: Default::default(),
            stores: Mutex::default(),
            slots: Default::default(),
            caches: Default::default(),
            providers: Default::default(),
        }
    }

    /// Connects the Provider controller's cache.
    pub fn attach_providers(&self, store: kube::runtime::reflector::Store<ferry_api::Provider>) {
        let _ = self.providers.set(store);
    }

    /// The Provider `namespace/name` as the cache holds it; none without a cache or when it lacks it.
    pub fn cached_provider(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<std::sync::Arc<ferry_api::Provider>> {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(namespace);
        self.providers.get()?.get(&key)
    }

    /// How long to wait after another failed reconcile of `key`: 1 s, doubling, at most 60 s.
    pub fn failed(&self, key: &str) -> std::time::Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        crate::backoff::doubling(*n, MAX_ERROR_BACKOFF)
    }

    /// A reconcile of `key` went through: the next failure starts the backoff again.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// This process wrote migration `key`, which the API server stored at `resource_version`.
    pub fn wrote(&self, key: &str, resource_version: Option<String>) {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        match resource_version {
            Some(resource_version) => written.insert(
                key.to_string(),
                OwnWrite {
                    resource_version,
                    at: std::time::Instant::now(),
                },
            ),
            None => written.remove(key),
        };
    }

    /// How much of `interval` is left since this process last wrote `key`; none once it has passed.
    pub fn progress_shown_within(&self, key: &str, interval: Duration) -> Option<Duration> {
        let written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let at = written.get(key)?.at;
        interval
            .checked_sub(at.elapsed())
            .filter(|left| !left.is_zero())
    }

    /// True when `resource_version` is older than this process's last write of `key`: the watch cache has not
    /// caught up with our own write yet, and the event of that write will reconcile again.
    pub fn is_stale(&self, key: &str, resource_version: Option<&str>) -> bool {
        let written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        match (written.get(key), resource_version) {
            (Some(ours), Some(seen)) => older(seen, &ours.resource_version),
            _ => false,
        }
    }

    /// The migration ended or is gone: nothing more to compare against.
    pub fn forget(&self, key: &str) {
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// The VM named `name` behind `provider`, from a listing at most [`VM_INDEX_TTL`] old; a name it lacks, or
    /// shares, is looked up in a fresh one. True when the answer came from an earlier listing, which the caller
    /// confirms (the VM may have been renamed or removed since).
    pub async fn find_vm_by_name(
        &self,
        provider: &Provider,
        session: &Session,
        name: &str,
    ) -> Result<(MoRef, bool)> {
        // The map's lock is held only to find the Provider's slot, never across a call to vSphere.
        let slot = self
            .lock_vm_names()
            .entry(provider_key(provider))
            .or_default()
            .clone();
        let mut index = slot.lock().await;
        if let Some(listed) = index.as_ref().filter(|i| i.age() < VM_INDEX_TTL)
            && let Ok(found) = listed.lookup(name)
        {
            return Ok((found, true));
        }
        let listed = VmNameIndex::build(session).await?;
        let found = listed.lookup(name);
        *index = Some(listed);
        Ok((found?, false))
    }

    /// An earlier listing named a VM that is gone or renamed: the next lookup lists again.
    pub async fn forget_vm_names(&self, provider: &Provider) {
        self.lock_vm_names().remove(&provider_key(provider));
    }

    fn lock_vm_names(&self) -> std::sync::MutexGuard<'_, HashMap<String, NameIndexSlot>> {
        self.vm_names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads a Secret by name (never lists), and the keys `keys` of it.
    pub async fn secret_values<const N: usize>(
        &self,
        namespace: &str,
        name: &str,
        keys: [&str; N],
    ) -> Result<[String; N]> {
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?
            .ok_or_else(|| {
                Failure::fixable(
                    Reason::SecretNotFound,
                    format!("Secret {namespace}/{name} does not exist; create it, and the migration resumes"),
                )
            })?;
        let mut values = keys.map(|_| String::new());
        for (value, key) in values.iter_mut().zip(keys) {
            *value = secret_key(&secret, key)?;
        }
        Ok(values)
    }

    /// A staging store for `spec`'s bucket with these keys, opened once and kept: a new one reads the system's
    /// CA certificates, which cost more than the rest of a reconcile.
    pub fn staging_store(
        &self,
        spec: &StagingSpec,
        access: String,
        secret: String,
    ) -> Result<Staging> {
        let url = spec.url.trim_end_matches('/');
        let (bucket, _) = s3_bucket_and_prefix(url).unwrap_or((url, ""));
        let key = [
            bucket,
            spec.endpoint.as_deref().unwrap_or(""),
            spec.ca_bundle.as_deref().unwrap_or(""),
            &access,
            &secret,
        ]
        .join("\0");
        let key = ferry_api::names::fnv1a(key.as_bytes());
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(folder) = stores.get(&key).and_then(|root| root.within(url)) {
            return Ok(folder);
        }
        let root = StagingSpec {
            url: format!("s3://{bucket}"),
            ..spec.clone()
        };
        let root = Staging::open_with_keys(&root, access, secret)?;
        let folder = root.within(url).ok_or_else(|| {
            Failure::permanent(
                Reason::StagingUnsupported,
                format!("staging {url} is not an s3:// bucket URL"),
            )
        })?;
        // Rotated keys leave old entries behind: a few buckets are normal, many mean churn.
        if stores.len() >= MAX_STAGING_STORES {
            stores.clear();
        }
        stores.insert(key, root);
        Ok(folder)
    }

    /// A logged-in session for `provider`, reused while the Provider and its Secret stay the same.
    pub async fn session(&self, provider: &Provider) -> Result<Session> {
        let ns = provider.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", provider.name_any());
        let generation = provider.metadata.generation.unwrap_or_default();
        if let Some(cached) = self.lock_sessions().get(&key)
            && cached.generation == generation
            && cached.checked.elapsed() < SECRET_RECHECK
        {
            return Ok(cached.session.clone());
        }
        let secret = Api::<Secret>::namespaced(self.client.clone(), &ns)
            .get_opt(&provider.spec.secret_ref.name)
            .await?
            .ok_or_else(|| {
                Failure::fixable(
                    Reason::ProviderSecretNotFound,
                    format!(
                        "Secret {ns}/{} named by Provider {} does not exist; create it with keys user and password",
                        provider.spec.secret_ref.name,
                        provider.name_any()
                    ),
                )
            })?;
        let secret_version = secret.resource_version().unwrap_or_default();
        if let Some(cached) = self.lock_sessions().get_mut(&key)
            && cached.generation == generation
            && cached.secret_version == secret_version
        {
            cached.checked = std::time::Instant::now();
            return Ok(cached.session.clone());
        }
        let config = ConnectConfig {
            url: provider.spec.url.clone(),
            username: secret_key(&secret, "user")?,
            password: secret_key(&secret, "password")?,
            // No CA file among a Provider's choices, so nothing is read here and this cannot fail.
            tls: crate::build::job::source_trust(&provider.spec.tls).tls_mode()?,
            timeout: Duration::from_secs(60),
        };
        let session = Session::connect(config).await?;
        let cached = CachedSession {
            generation,
            secret_version,
            session: session.clone(),
            checked: std::time::Instant::now(),
        };
        self.lock_sessions().insert(key, cached);
        Ok(session)
    }

    /// Forgets a session that failed, so the next reconcile logs in afresh.
    pub fn forget_session(&self, provider: &Provider) {
        let key = format!(
            "{}/{}",
            provider.namespace().unwrap_or_default(),
            provider.name_any()
        );
        self.lock_sessions().remove(&key);
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, CachedSession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn secret_key(secret: &Secret, key: &str) -> Result<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| {
            String::from_utf8_lossy(&v.0)
                .trim_end_matches(['\r', '\n'])
                .to_string()
        })
        .ok_or_else(|| {
            Failure::fixable(
                Reason::SecretKeyMissing,
                format!("Secret {} has no key {key}", secret.name_any()),
            )
        })
}

/// One Provider's listing of VM names, behind the lock its builder holds while it lists.
type NameIndexSlot = std::sync::Arc<tokio::sync::Mutex<Option<VmNameIndex>>>;

fn provider_key(provider: &Provider) -> String {
    format!(
        "{}/{} {}",
        provider.namespace().unwrap_or_default(),
        provider.name_any(),
        provider.spec.url
    )
}

/// resourceVersions are opaque to clients, but the API server's are etcd revisions: numbers that only grow.
/// Anything else is never called older, so a copy is only skipped when that is certain.
pub fn older(seen: &str, written: &str) -> bool {
    match (seen.parse::<u64>(), written.parse::<u64>()) {
        (Ok(seen), Ok(written)) => seen < written,
        _ => false,
    }
}

/// The longest wait after failed reconciles: a failed write near the end (the finalizer's release) is tried again
/// soon, and a long outage is not hammered.
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_numerically_older_resource_version_is_stale() {
        assert!(super::older("99", "100"));
        assert!(!super::older("100", "100"));
        assert!(!super::older("101", "100"));
        assert!(!super::older("abc", "100"));
    }
}
