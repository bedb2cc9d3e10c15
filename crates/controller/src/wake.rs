//! Which changes of a child wake its migration. A Job's pod counts and a DataVolume's percentage change many times
//! while the migration can only wait: those wake it at most once per [`PROGRESS_INTERVAL`] (the rate its progress
//! is written at), while a change it acts on (a Job ended, a volume's phase, a deletion) wakes it at once. Kinds
//! a migration does not own (VMIs, Providers) are mapped to the migrations they concern.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::{Phase, Provider, VirtualMachineMigration};
use futures::{Stream, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::reconcile::PROGRESS_INTERVAL;

/// What the checkpoints act on in a child, and what they only show; each as a hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    pub acted_on: u64,
    pub shown: u64,
}

/// The last change of one child that woke its migration.
#[derive(Clone, Copy, Debug)]
pub struct Woke {
    summary: Summary,
    at: Instant,
}

/// Whether a child now summed up as `now` wakes its migration, given the last change that did. Pure.
pub fn wakes(last: Option<&Woke>, now: Summary, at: Instant, every: Duration) -> bool {
    match last {
        None => true,
        Some(last) if last.summary.acted_on != now.acted_on => true,
        Some(last) => last.summary.shown != now.shown && at.duration_since(last.at) >= every,
    }
}

fn hash_of(value: impl Hash) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// A Job: whether it ended (and how), and whether it is being deleted. Its pod counts are not looked at.
pub fn job_summary(job: &Job) -> Summary {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let ended: Vec<(&str, &str)> = conditions
        .into_iter()
        .flatten()
        .filter(|c| matches!(c.type_.as_str(), "Complete" | "Failed"))
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    Summary {
        acted_on: hash_of((job.uid(), job.metadata.deletion_timestamp.is_some(), ended)),
        shown: 0,
    }
}

/// A DataVolume: its phase, deletion and importer's failures are acted on; its progress is only shown. CDI
/// tells a failing importer in the same phase (`Running` False for reason `Error`, `restartCount` growing), so
/// a watch that passed phases only left it to the next poll: real CDI's third restart was acted on minutes late.
pub fn data_volume_summary(dv: &DynamicObject) -> Summary {
    let status = &dv.data["status"];
    let running = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Running");
    Summary {
        acted_on: hash_of((
            dv.uid(),
            dv.metadata.deletion_timestamp.is_some(),
            status["phase"].as_str(),
            status["restartCount"].as_i64(),
            running.map(|c| (c["status"].as_str(), c["reason"].as_str())),
        )),
        shown: hash_of(status["progress"].as_str()),
    }
}

/// The children of `events` (a reflector's) whose change wakes their migration by [`wakes`]; a deleted one always
/// does.
pub fn significant<K, S>(
    events: S,
    summary: fn(&K) -> Summary,
) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: ResourceExt + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut woke: HashMap<String, Woke> = HashMap::new();
    events
        .map_ok(move |event| {
            let at = Instant::now();
            let passed = match event {
                watcher::Event::Apply(child) | watcher::Event::InitApply(child) => {
                    let key = child.uid().unwrap_or_default();
                    let now = summary(&child);
                    if wakes(woke.get(&key), now, at, PROGRESS_INTERVAL) {
                        // Children gone while the watch was down leave entries behind: forget them all now and
                        // then (each next change then wakes its migration once more).
                        if woke.len() >= MAX_REMEMBERED {
                            woke.clear();
                        }
                        woke.insert(key, Woke { summary: now, at });
                        Some(child)
                    } else {
                        None
                    }
                }
                watcher::Event::Delete(child) => {
                    woke.remove(&child.uid().unwrap_or_default());
                    Some(child)
                }
                watcher::Event::Init | watcher::Event::InitDone => None,
            };
            futures::stream::iter(passed.map(Ok))
        })
        .try_flatten()
}

const MAX_REMEMBERED: usize = 100_000;

/// The migrations whose target is `vmi`: VMIs belong to their VM, not to the migration, so they are matched by
/// the target name the migration recorded.
pub fn migrations_of_vmi(
    migrations: &[Arc<VirtualMachineMigration>],
    vmi: &DynamicObject,
) -> Vec<ObjectRef<VirtualMachineMigration>> {
    // Every VMI event looks at every migration: compare in place, allocate nothing per migration.
    let (ns, name) = (
        vmi.metadata.namespace.as_deref(),
        vmi.metadata.name.as_deref(),
    );
    migrations
        .iter()
        .filter(|m| {
            name.is_some()
                && m.metadata.namespace.as_deref() == ns
                && m.status.as_ref().and_then(|s| s.target_vm.as_deref()) == name
        })
        .map(|m| ObjectRef::from_obj(&**m))
        .collect()
}

/// The migrations reading from `provider` that are not finished (or are being deleted). A finished migration
/// needs nothing of its Provider: at the end of a big plan, a Provider's change would otherwise wake every
/// migration it ever served.
pub fn unfinished_migrations_of_provider(
    migrations: &[Arc<VirtualMachineMigration>],
    provider: &Provider,
) -> Vec<ObjectRef<VirtualMachineMigration>> {
    let ns = provider.namespace();
    migrations
        .iter()
        .filter(|m| {
            ns.as_deref() == Some(m.provider_namespace())
                && m.spec.source.provider_ref.name == provider.name_any()
                && (m.metadata.deletion_timestamp.is_some()
                    || !m
                        .status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(Phase::is_terminal))
        })
        .map(|m| ObjectRef::from_obj(&**m))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(acted_on: u64, shown: u64) -> Summary {
        Summary { acted_on, shown }
    }

    #[test]
    fn what_is_acted_on_wakes_at_once_what_is_shown_at_most_every_interval() {
        let t0 = Instant::now();
        let every = Duration::from_secs(5);
        let last = Woke {
            summary: summary(1, 10),
            at: t0,
        };
        assert!(wakes(None, summary(1, 10), t0, every));
        assert!(wakes(Some(&last), summary(2, 10), t0, every));
        assert!(!wakes(
            Some(&last),
            summary(1, 11),
            t0 + Duration::from_secs(1),
            every
        ));
        assert!(wakes(Some(&last), summary(1, 11), t0 + every, every));
        assert!(!wakes(
            Some(&last),
            summary(1, 10),
            t0 + Duration::from_secs(60),
            every
        ));
    }

    #[test]
    fn a_jobs_pod_counts_are_not_acted_on_its_end_is() {
        let job = |status: serde_json::Value| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j", "uid": "u"}, "status": status}))
                .unwrap()
        };
        let started = job_summary(&job(json!({"active": 1})));
        assert_eq!(started, job_summary(&job(json!({"active": 1, "ready": 1}))));
        assert_eq!(
            started,
            job_summary(&job(
                json!({"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]})
            ))
        );
        assert_ne!(
            started,
            job_summary(&job(
                json!({"conditions": [{"type": "Complete", "status": "True"}]})
            ))
        );
    }

    #[test]
    fn a_volumes_percentage_is_only_shown_its_phase_is_acted_on() {
        let dv = |phase: &str, progress: &str| -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "d", "uid": "u"}, "status": {"phase": phase, "progress": progress}}))
            .unwrap()
        };
        let (a, b) = (
            data_volume_summary(&dv("ImportInProgress", "10.00%")),
            data_volume_summary(&dv("ImportInProgress", "20.00%")),
        );
        assert_eq!(a.acted_on, b.acted_on);
        assert_ne!(a.shown, b.shown);
        assert_ne!(
            a.acted_on,
            data_volume_summary(&dv("Succeeded", "100.0%")).acted_on
        );
        // Real CDI's importer failing, in the same phase: the failure and each restart are acted on.
        let failing = |restarts: i64, running: &str, reason: &str| -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "d", "uid": "u"}, "status": {"phase": "ImportInProgress", "progress": "N/A",
                "restartCount": restarts, "conditions": [{"type": "Running", "status": running, "reason": reason}]}}))
            .unwrap()
        };
        let summaries = [
            failing(2, "True", "Pod is running"),
            failing(2, "False", "Error"),
            failing(3, "True", "Pod is running"),
            failing(3, "False", "Error"),
        ]
        .map(|dv| data_volume_summary(&dv).acted_on);
        for pair in summaries.windows(2) {
            assert_ne!(pair[0], pair[1]);
        }
    }

    #[test]
    fn a_watch_passes_the_changes_that_wake_and_every_deletion() {
        use futures::StreamExt;
        let job = |status: serde_json::Value| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j", "uid": "u"}, "status": status}))
                .unwrap()
        };
        let complete = json!({"conditions": [{"type": "Complete", "status": "True"}]});
        let events = futures::stream::iter([
            watcher::Event::Init,
            watcher::Event::InitApply(job(json!({}))),
            watcher::Event::InitDone,
            watcher::Event::Apply(job(json!({"active": 1}))),
            watcher::Event::Apply(job(json!({"active": 1, "ready": 1}))),
            watcher::Event::Apply(job(complete.clone())),
            watcher::Event::Delete(job(complete)),
        ])
        .map(Ok);
        let passed: Vec<Job> = futures::executor::block_on(
            significant(events, job_summary)
                .map(Result::unwrap)
                .collect(),
        );
        let seen: Vec<_> = passed
            .iter()
            .map(|j| j.status.clone().unwrap_or_default())
            .collect();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0], Default::default());
        assert!(seen[1].conditions.is_some() && seen[2].conditions.is_some());
    }

    fn migration(name: &str, extra: serde_json::Value) -> Arc<VirtualMachineMigration> {
        let mut value = json!({
            "apiVersion": ferry_api::API_VERSION, "kind": "VirtualMachineMigration",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"source": {"providerRef": {"name": "vc"}, "vm": {"name": "x"}}, "target": {}},
        });
        merge(&mut value, extra);
        Arc::new(serde_json::from_value(value).unwrap())
    }

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(into), serde_json::Value::Object(from)) => {
                for (key, value) in from {
                    merge(into.entry(key).or_insert(json!({})), value);
                }
            }
            (into, from) => *into = from,
        }
    }

    fn names(refs: Vec<ObjectRef<VirtualMachineMigration>>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    #[test]
    fn a_vmi_wakes_the_migrations_that_target_it_in_its_namespace() {
        let migrations = [
            migration("a", json!({"status": {"targetVM": "web"}})),
            migration("b", json!({"status": {"targetVM": "db"}})),
            migration(
                "c",
                json!({"metadata": {"namespace": "other"}, "status": {"targetVM": "web"}}),
            ),
            migration("d", json!({})),
        ];
        let vmi = |meta: serde_json::Value| -> DynamicObject {
            serde_json::from_value(
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": meta}),
            )
            .unwrap()
        };
        let woken = migrations_of_vmi(
            &migrations,
            &vmi(json!({"name": "web", "namespace": "team"})),
        );
        assert_eq!(names(woken.clone()), ["a"]);
        assert_eq!(woken[0].namespace.as_deref(), Some("team"));
        assert!(migrations_of_vmi(&migrations, &vmi(json!({"namespace": "team"}))).is_empty());
    }

    #[test]
    fn a_provider_wakes_only_its_unfinished_migrations_and_those_being_deleted() {
        let migrations = [
            migration("running", json!({"status": {"phase": "Converting"}})),
            migration("new", json!({})),
            migration("done", json!({"status": {"phase": "Succeeded"}})),
            migration(
                "deleted",
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["f"]},
                    "status": {"phase": "Succeeded"}}),
            ),
            migration(
                "elsewhere",
                json!({"spec": {"source": {"providerRef": {"name": "other"}}}}),
            ),
            migration(
                "lent",
                json!({"metadata": {"namespace": "tenant"},
                "spec": {"source": {"providerRef": {"namespace": "team"}}}}),
            ),
            migration("own", json!({"metadata": {"namespace": "tenant"}})),
        ];
        let provider: Provider = serde_json::from_value(json!({
            "apiVersion": ferry_api::API_VERSION, "kind": "Provider",
            "metadata": {"name": "vc", "namespace": "team"},
            "spec": {"type": "vsphere", "url": "https://vc/sdk", "secretRef": {"name": "s"}, "tls": {}},
        }))
        .unwrap();
        assert_eq!(
            names(unfinished_migrations_of_provider(&migrations, &provider)),
            ["running", "new", "deleted", "lent"]
        );
    }
}
