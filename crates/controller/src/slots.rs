//! Disk slots per ESXi host: at most the Provider's `maxConcurrentDisksPerHost` disks of its migrations are read
//! from one host at once. A migration is granted its disks before its source is powered off or read, and the
//! grant is on record in its status (`hostSlot`) before anything acts on it, so a restarted controller counts
//! every grant from what the migrations record. Waiters are served first come, first served: by creation time,
//! then name.
//!
//! Grants are decided one at a time (only the lease holder reconciles), from the watch cache overlaid with this
//! process's own grants and writes, which the cache may not show yet. So a lagging cache can only show a slot
//! still held that was freed (a waiter waits a little longer), never one free that was taken.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ferry_api::{HostSlot, Phase, Provider, VirtualMachineMigration as Vmm};
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

/// The reason a migration waits for a slot; also how other migrations see it waiting.
pub const WAITING: &str = "WaitingForHostSlot";

/// A waiter looks again this often should nothing wake it (a holder deleted without its finalizer): releases,
/// and waiters that leave the line, wake those behind them.
pub const RECHECK: Duration = Duration::from_secs(120);

/// The watch cache of migrations, the wake-up channel, and what this process granted or wrote.
#[derive(Default)]
pub struct Slots {
    store: OnceLock<Store<Vmm>>,
    wake: OnceLock<UnboundedSender<ObjectRef<Vmm>>>,
    /// The `hostSlot` this process last granted or wrote per migration, by `id`.
    ours: Mutex<HashMap<String, Option<HostSlot>>>,
}

impl Slots {
    /// Connects the controller's cache of migrations and the channel that reconciles a migration on demand.
    pub fn attach(&self, store: Store<Vmm>, wake: UnboundedSender<ObjectRef<Vmm>>) {
        let _ = self.store.set(store);
        let _ = self.wake.set(wake);
    }

    /// The controller's cache of migrations; none before the controller runs (unit tests).
    pub fn store(&self) -> Option<&Store<Vmm>> {
        self.store.get()
    }

    fn ours(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<HostSlot>>> {
        self.ours.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cache, once it holds a full listing; none without a cache (unit tests).
    async fn ready_store(&self) -> Option<&Store<Vmm>> {
        let store = self.store.get()?;
        tokio::time::timeout(RECHECK, store.wait_until_ready())
            .await
            .ok()?
            .ok()?;
        Some(store)
    }
}

/// Per host (by name), the disks granted and the migrations waiting, from the cache: what /metrics shows, so a
/// host whose slots stay full with a line behind them can page someone.
pub fn host_usage(migrations: &[Arc<Vmm>]) -> std::collections::BTreeMap<String, (u32, u32)> {
    let mut hosts = std::collections::BTreeMap::<String, (u32, u32)>::new();
    for vmm in migrations {
        let Some(status) = vmm.status.as_ref() else {
            continue;
        };
        if matches!(status.phase, Some(p) if p.is_terminal()) {
            continue;
        }
        if let Some(slot) = &status.host_slot {
            let name = host_key(&slot.host, &slot.host_moref);
            hosts.entry(name.to_string()).or_default().0 += slot.disks.max(0) as u32;
        } else if in_line(vmm, status) {
            let (name, moref) = source_host(status);
            hosts
                .entry(host_key(&name, &moref).to_string())
                .or_default()
                .1 += 1;
        }
    }
    hosts
}

impl Slots {
    /// The gauges of [`host_usage`], in the text exposition format; none before the cache holds a listing.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let Some(store) = self.store.get() else {
            return out;
        };
        let hosts = host_usage(&store.state());
        let _ = writeln!(out, "# TYPE ferry_host_disks_reading gauge");
        for (host, (reading, _)) in &hosts {
            let _ = writeln!(
                out,
                "ferry_host_disks_reading{{host=\"{}\"}} {reading}",
                crate::metrics::escaped(host)
            );
        }
        let _ = writeln!(out, "# TYPE ferry_host_migrations_waiting gauge");
        for (host, (_, waiting)) in &hosts {
            let _ = writeln!(
                out,
                "ferry_host_migrations_waiting{{host=\"{}\"}} {waiting}",
                crate::metrics::escaped(host)
            );
        }
        out
    }
}

/// One migration as the gate sees it. Pure data.
#[derive(Clone, Debug, PartialEq)]
pub struct Contender {
    /// First come, first served: creation time, then name (creation times have one-second steps).
    pub order: (i64, String),
    pub host: String,
    /// Disks granted on `host`.
    pub holds: u32,
    /// Disks it waits for on `host`.
    pub waits: u32,
}

/// Whether `cost` disks on `host` fit beside what others hold there and what migrations ahead in line wait for.
/// Pure.
pub fn admit(
    order: &(i64, String),
    host: &str,
    cost: u32,
    others: &[Contender],
    limit: u32,
) -> bool {
    let on_host = || others.iter().filter(|c| c.host == host);
    let held: u32 = on_host().map(|c| c.holds).sum();
    let ahead: u32 = on_host()
        .filter(|c| c.order < *order)
        .map(|c| c.waits)
        .sum();
    held + ahead + cost <= limit
}

/// The disks a migration needs read: those not yet copied, or all of them when they are written again from the
/// source (rewritten, or copied again as `spec.recopy` asks); at least one, and at most the limit, so a VM with
/// more disks than the limit runs on an idle host.
pub fn cost(vmm: &Vmm, status: &ferry_api::VirtualMachineMigrationStatus, limit: u32) -> u32 {
    let disks = status.disks.iter();
    let wanted = if status.rewrite_volumes || vmm.spec.recopy_wanted(status) {
        disks.count()
    } else {
        disks.filter(|d| d.sha256.is_none()).count()
    };
    (wanted as u32).clamp(1, limit.max(1))
}

/// The host a slot or a source is counted on: its moref when known, else its name.
fn host_key<'a>(moref: &'a str, name: &'a str) -> &'a str {
    if moref.is_empty() { name } else { moref }
}

fn source_host(status: &ferry_api::VirtualMachineMigrationStatus) -> (String, String) {
    let source = status.source.as_ref();
    let name = source.and_then(|s| s.host.clone()).unwrap_or_default();
    let moref = source
        .and_then(|s| s.host_moref.clone())
        .unwrap_or_default();
    (name, moref)
}

/// A migration's identity in what this process remembers: its UID, so one deleted and created again under its
/// name is another migration; `namespace/name` only for an object that never came from the API server. A waiter
/// looks at every migration of its Provider, so this allocates nothing for them.
fn id(vmm: &Vmm) -> Cow<'_, str> {
    match vmm.metadata.uid.as_deref() {
        Some(uid) => Cow::Borrowed(uid),
        None => Cow::Owned(format!(
            "{}/{}",
            vmm.metadata.namespace.as_deref().unwrap_or_default(),
            vmm.metadata.name.as_deref().unwrap_or_default()
        )),
    }
}

fn order(vmm: &Vmm) -> (i64, String) {
    let created = vmm.metadata.creation_timestamp.as_ref();
    (created.map_or(0, |t| t.0.as_second()), vmm.name_any())
}

/// `vmm` as a contender on `host` (any host when none), with `slot` as its grant; none when it neither holds nor
/// waits there. Cheap for a migration elsewhere: a waiter looks at every migration of its Provider.
fn contender(
    vmm: &Vmm,
    slot: Option<&HostSlot>,
    limit: u32,
    host: Option<&str>,
) -> Option<Contender> {
    let elsewhere = |h: &str| host.is_some_and(|wanted| wanted != h);
    // A grant first: the cache may not show the status it came with yet.
    if let Some(slot) = slot {
        let on = host_key(&slot.host_moref, &slot.host);
        return (!elsewhere(on)).then(|| Contender {
            order: order(vmm),
            host: on.to_string(),
            holds: slot.disks.max(0) as u32,
            waits: 0,
        });
    }
    let status = vmm.status.as_ref()?;
    if !in_line(vmm, status) {
        return None;
    }
    let source = status.source.as_ref()?;
    let on = host_key(
        source.host_moref.as_deref().unwrap_or_default(),
        source.host.as_deref().unwrap_or_default(),
    );
    (!elsewhere(on)).then(|| Contender {
        order: order(vmm),
        host: on.to_string(),
        holds: 0,
        waits: cost(vmm, status, limit),
    })
}

/// The status says it waits for a slot.
fn waits(status: &ferry_api::VirtualMachineMigrationStatus) -> bool {
    status.reason.as_deref() == Some(WAITING)
        && status.host_slot.is_none()
        && !matches!(status.phase, Some(p) if p.is_terminal() || p == Phase::Cancelling)
}

/// Waits for a slot and will take one: not cancelled or being deleted (those never ask again).
fn in_line(vmm: &Vmm, status: &ferry_api::VirtualMachineMigrationStatus) -> bool {
    waits(status) && !vmm.spec.cancel && vmm.metadata.deletion_timestamp.is_none()
}

fn same_provider(a: &Vmm, b: &Vmm) -> bool {
    a.provider_namespace() == b.provider_namespace()
        && a.spec.source.provider_ref.name == b.spec.source.provider_ref.name
}

/// What a migration asking for its disk slot gets.
#[derive(Debug, PartialEq)]
pub enum Grant {
    /// It holds one already.
    Held,
    /// Granted now, to be on record before anything acts on it; and the words for it.
    Granted(HostSlot, String),
    /// Not yet: why it waits.
    Wait(String),
}

/// Before the source is powered off or read: whether the migration holds its slot, is granted one now, or
/// waits.
pub async fn acquire(
    slots: &Slots,
    vmm: &Vmm,
    status: &ferry_api::VirtualMachineMigrationStatus,
    provider: &Provider,
) -> Grant {
    if status.host_slot.is_some() {
        return Grant::Held;
    }
    let limit = provider.spec.limits.max_concurrent_disks_per_host.max(1) as u32;
    let (name, moref) = source_host(status);
    let host = host_key(&moref, &name).to_string();
    let cost = cost(vmm, status, limit);
    let me = id(vmm);
    let store = slots.ready_store().await;
    let granted = {
        let mut ours = slots.ours();
        // Read under the lock: every migration granted before holds the lock was in the cache when it was.
        let migrations = store.map(Store::state);
        if let Some(migrations) = &migrations {
            forget_gone(&mut ours, migrations);
        }
        match ours.get(me.as_ref()) {
            // Granted before, but that write was lost: record it again.
            Some(Some(slot)) => Some(slot.clone()),
            _ => {
                let others: Vec<Contender> = migrations
                    .iter()
                    .flatten()
                    .filter(|m| same_provider(m, vmm))
                    .filter_map(|m| {
                        let other = id(m);
                        if other == me {
                            return None;
                        }
                        let slot = match ours.get(other.as_ref()) {
                            Some(written) => written.as_ref(),
                            None => m.status.as_ref().and_then(|s| s.host_slot.as_ref()),
                        };
                        contender(m, slot, limit, Some(&host))
                    })
                    .collect();
                admit(&order(vmm), &host, cost, &others, limit).then(|| {
                    let slot = HostSlot {
                        host: name.clone(),
                        host_moref: moref.clone(),
                        disks: cost as i32,
                        // Now, not the reconcile's start: a release this grant follows was written before it.
                        granted: MicroTime(k8s_openapi::jiff::Timestamp::now()),
                    };
                    ours.insert(me.to_string(), Some(slot.clone()));
                    slot
                })
            }
        }
    };
    let shown = if name.is_empty() { "unknown" } else { &name };
    match granted {
        Some(slot) => {
            let message = format!("{} disk read(s) granted on host {shown}", slot.disks);
            Grant::Granted(slot, message)
        }
        None => Grant::Wait(format!(
            "waiting for a disk slot on host {shown}: its {limit} are in use or promised to migrations created \
             earlier (Provider {} limits.maxConcurrentDisksPerHost)",
            provider.name_any()
        )),
    }
}

/// Drops what this process remembers of migrations the cache no longer has: they are gone. Only once it
/// remembers more than there are migrations (and some to spare), so the sweep is rare: a waiter looks often.
fn forget_gone(ours: &mut HashMap<String, Option<HostSlot>>, migrations: &[Arc<Vmm>]) {
    if ours.len() <= migrations.len() + 64 {
        return;
    }
    let present: HashSet<Cow<'_, str>> = migrations.iter().map(|m| id(m)).collect();
    ours.retain(|k, _| present.contains(k.as_str()));
}

/// After a status write of `vmm` from `before` to `written`: remembers its slot, and when the write freed a slot
/// or took the migration out of the line, wakes the migrations first in line on that host.
pub fn wrote(
    slots: &Slots,
    vmm: &Vmm,
    before: &ferry_api::VirtualMachineMigrationStatus,
    written: &ferry_api::VirtualMachineMigrationStatus,
) {
    let was = slots
        .ours()
        .insert(id(vmm).into_owned(), written.host_slot.clone());
    match (
        was.flatten().as_ref().or(before.host_slot.as_ref()),
        &written.host_slot,
    ) {
        (Some(freed), None) => {
            let host = host_key(&freed.host_moref, &freed.host);
            wake_line(slots, vmm, host, freed.disks.max(1) as u32);
        }
        (None, None) if waits(before) && !in_line(vmm, written) => left_line(slots, vmm, before),
        _ => {}
    }
}

/// A migration that waited and will not take a slot (cancelled, failed, being deleted): those behind it on its
/// host need not wait for it.
pub fn left_line(slots: &Slots, vmm: &Vmm, status: &ferry_api::VirtualMachineMigrationStatus) {
    if !waits(status) {
        return;
    }
    let (name, moref) = source_host(status);
    wake_line(
        slots,
        vmm,
        host_key(&moref, &name),
        cost(vmm, status, u32::MAX),
    );
}

/// Wakes the migrations first in line on `host` that fit in `room` disks, and one more.
fn wake_line(slots: &Slots, vmm: &Vmm, host: &str, room: u32) {
    let (Some(store), Some(wake)) = (slots.store.get(), slots.wake.get()) else {
        return;
    };
    let mut waiting: Vec<(Contender, ObjectRef<Vmm>)> = store
        .state()
        .iter()
        .filter(|m| same_provider(m, vmm) && m.metadata.name != vmm.metadata.name)
        .filter_map(|m| {
            let c = contender(m, None, u32::MAX, Some(host))?;
            (c.waits > 0).then(|| (c, ObjectRef::from_obj(&**m)))
        })
        .collect();
    waiting.sort_by(|a, b| a.0.order.cmp(&b.0.order));
    // Those that can fit in what was freed, and one more: a head of the line that waits for more than that
    // still needs to look.
    let mut room = room.max(1);
    for (c, object) in waiting {
        let _ = wake.unbounded_send(object);
        if c.waits >= room {
            break;
        }
        room -= c.waits;
    }
}

/// When a migration read its source, as recorded: from entering Converting to entering what came next (or its
/// end), in microseconds since the epoch; an interval still open runs to `now`. Pure.
pub fn source_reads(
    status: &ferry_api::VirtualMachineMigrationStatus,
    now: i64,
) -> Vec<(i64, i64)> {
    let marks = &status.checkpoints;
    let end = status
        .completion_time
        .as_ref()
        .map(|t| t.0.as_microsecond());
    marks
        .iter()
        .enumerate()
        .filter(|(_, c)| c.phase == Phase::Converting)
        .map(|(i, c)| {
            let left = marks.get(i + 1).map(|n| n.entered.0.as_microsecond());
            (c.entered.0.as_microsecond(), left.or(end).unwrap_or(now))
        })
        .collect()
}

/// The most intervals open at one moment; one that ends where another starts does not overlap it. Pure.
pub fn most_at_once(intervals: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    // At one instant, ends sort before starts.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, delta) in edges {
        open += delta;
        most = most.max(open);
    }
    most as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(created: i64, name: &str, host: &str, holds: u32, waits: u32) -> Contender {
        Contender {
            order: (created, name.into()),
            host: host.into(),
            holds,
            waits,
        }
    }

    #[test]
    fn a_grant_counts_before_the_cache_shows_any_status_of_its_migration() {
        let fresh: Vmm = serde_json::from_value(serde_json::json!({
            "apiVersion": "migration.platform.example/v1alpha1", "kind": "VirtualMachineMigration",
            "metadata": {"name": "new", "namespace": "ns"},
            "spec": {"source": {"providerRef": {"name": "p"}, "vm": {"name": "x"}}}}))
        .unwrap();
        let slot = HostSlot {
            host: "esx-1".into(),
            host_moref: "host-1".into(),
            disks: 2,
            granted: MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let counted = contender(&fresh, Some(&slot), 10, Some("host-1")).expect("a holder");
        assert_eq!((counted.host.as_str(), counted.holds), ("host-1", 2));
        assert_eq!(contender(&fresh, Some(&slot), 10, None), Some(counted));
        assert_eq!(contender(&fresh, Some(&slot), 10, Some("host-2")), None);
        assert_eq!(contender(&fresh, None, 10, None), None);
    }

    #[test]
    fn touching_intervals_do_not_overlap() {
        assert_eq!(most_at_once(&[(0, 10), (10, 20), (20, 30)]), 1);
        assert_eq!(most_at_once(&[(0, 10), (5, 20), (9, 30)]), 3);
        assert_eq!(most_at_once(&[]), 0);
    }

    #[test]
    fn a_host_grants_up_to_its_limit_and_other_hosts_do_not_count() {
        let others = [c(1, "a", "h1", 1, 0), c(2, "b", "h2", 2, 0)];
        let me = (5, "me".to_string());
        assert!(admit(&me, "h1", 1, &others, 2));
        assert!(!admit(&me, "h1", 2, &others, 2));
        assert!(!admit(&me, "h2", 1, &others, 2));
        assert!(admit(&me, "h3", 2, &others, 2));
    }

    #[test]
    fn waiters_created_earlier_go_first_and_the_name_breaks_ties() {
        let others = [c(1, "a", "h", 1, 0), c(3, "early", "h", 0, 1)];
        assert!(!admit(&(4, "late".into()), "h", 1, &others, 2));
        assert!(admit(&(2, "earlier".into()), "h", 1, &others, 2));
        assert!(admit(&(3, "eager".into()), "h", 1, &others, 2));
        assert!(!admit(&(3, "fair".into()), "h", 1, &others, 2));
    }

    #[test]
    fn a_vm_with_more_disks_than_the_limit_costs_the_limit_and_copied_disks_cost_nothing() {
        let disk = |sha: Option<&str>| ferry_api::DiskStatus {
            sha256: sha.map(String::from),
            ..Default::default()
        };
        let mut status = ferry_api::VirtualMachineMigrationStatus {
            disks: vec![disk(None), disk(None), disk(None), disk(Some("x"))],
            ..Default::default()
        };
        let mut vmm = waiter("big", "2026-01-01T00:00:00Z", WAITING);
        assert_eq!(cost(&vmm, &status, 10), 3);
        assert_eq!(cost(&vmm, &status, 2), 2);
        status.rewrite_volumes = true;
        assert_eq!(cost(&vmm, &status, 10), 4);
        status.rewrite_volumes = false;
        for disk in &mut status.disks {
            disk.sha256 = Some("copied".into());
        }
        assert_eq!(cost(&vmm, &status, 10), 1);
        vmm.spec.recopy = 1;
        assert_eq!(
            cost(&vmm, &status, 10),
            4,
            "copied again as spec.recopy asks"
        );
        status.recopied = 1;
        assert_eq!(cost(&vmm, &status, 10), 1, "copied for that recopy");
        status.disks.clear();
        assert_eq!(cost(&vmm, &status, 10), 1);
        assert!(admit(
            &(1, "big".into()),
            "h",
            cost(&vmm, &status, 2),
            &[],
            2
        ));
    }

    fn waiter(name: &str, created: &str, reason: &str) -> Vmm {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "migration.platform.example/v1alpha1", "kind": "VirtualMachineMigration",
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                         "uid": format!("uid-{name}")},
            "spec": {"source": {"providerRef": {"name": "p"}, "vm": {"name": name}}},
            "status": {"phase": "Preparing", "reason": reason,
                       "source": {"moref": "vm-1", "name": name, "host": "esx-1", "hostMoref": "host-1",
                                  "cpus": 1, "coresPerSocket": 1, "memoryMib": 64}}}))
        .unwrap()
    }

    #[test]
    fn each_host_shows_its_disks_granted_and_its_waiters_and_the_finished_count_for_nothing() {
        let mut holder = waiter("holder", "2026-01-01T00:00:00Z", "Copying");
        holder.status.as_mut().unwrap().host_slot = Some(HostSlot {
            host: "esx-1".into(),
            host_moref: "host-1".into(),
            disks: 2,
            granted: MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        });
        let mut done = holder.clone();
        done.status.as_mut().unwrap().phase = Some(Phase::Succeeded);
        let mut cancelled = waiter("c", "2026-01-01T00:00:02Z", WAITING);
        cancelled.spec.cancel = true;
        let migrations = [
            holder,
            done,
            waiter("w1", "2026-01-01T00:00:01Z", WAITING),
            waiter("w2", "2026-01-01T00:00:01Z", WAITING),
            cancelled,
            waiter("elsewhere", "2026-01-01T00:00:01Z", "Copying"),
        ]
        .map(Arc::new);
        let usage = host_usage(&migrations);
        assert_eq!(
            usage.into_iter().collect::<Vec<_>>(),
            [("esx-1".to_string(), (2, 2))]
        );
    }

    #[test]
    fn a_lent_provider_shares_its_hosts_slots_across_the_namespaces_it_serves() {
        let in_ns = |ns: &str, lent_from: Option<&str>| {
            let mut vmm = waiter("m", "2026-01-01T00:00:00Z", WAITING);
            vmm.metadata.namespace = Some(ns.into());
            vmm.spec.source.provider_ref.namespace = lent_from.map(String::from);
            vmm
        };
        let (a, b) = (
            in_ns("team-a", Some("admins")),
            in_ns("team-b", Some("admins")),
        );
        assert!(same_provider(&a, &b));
        assert!(same_provider(&in_ns("admins", None), &a));
        assert!(!same_provider(
            &in_ns("team-a", None),
            &in_ns("team-b", None)
        ));
    }

    #[test]
    fn a_migration_is_remembered_by_its_uid_and_the_gone_are_swept_only_in_bulk() {
        let again = |uid: Option<&str>| {
            let mut m = waiter("web", "2026-12-02T10:00:00Z", WAITING);
            m.metadata.uid = uid.map(String::from);
            m
        };
        assert_ne!(id(&again(Some("a"))), id(&again(Some("b"))));
        assert_eq!(id(&again(None)), "ns/web");
        let present: Vec<Arc<Vmm>> = (0..3)
            .map(|i| Arc::new(waiter(&format!("m{i}"), "2026-12-02T10:00:00Z", WAITING)))
            .collect();
        let mut ours: HashMap<String, Option<HostSlot>> =
            (0..3).map(|i| (format!("uid-m{i}"), None)).collect();
        ours.extend((0..64).map(|i| (format!("gone-{i}"), None)));
        forget_gone(&mut ours, &present);
        assert_eq!(
            ours.len(),
            67,
            "no sweep while it remembers at most 64 more than exist"
        );
        ours.insert("gone-64".into(), None);
        forget_gone(&mut ours, &present);
        let mut kept: Vec<&String> = ours.keys().collect();
        kept.sort();
        assert_eq!(kept, ["uid-m0", "uid-m1", "uid-m2"]);
    }

    #[test]
    fn a_waiter_that_leaves_the_line_wakes_the_one_behind_it_and_a_rewrite_of_its_wait_does_not() {
        let (store, mut writer) = kube::runtime::reflector::store::<Vmm>();
        let first = waiter("first", "2026-12-02T10:00:00Z", WAITING);
        let second = waiter("second", "2026-12-02T10:00:01Z", WAITING);
        let third = waiter("third", "2026-12-02T10:00:02Z", WAITING);
        for m in [&first, &second, &third] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(m.clone()));
        }
        let (wake, mut woken) = futures::channel::mpsc::unbounded();
        let slots = Slots::default();
        slots.attach(store, wake);
        let mut woken_now = || {
            let mut names = vec![];
            while let Ok(object) = woken.try_recv() {
                names.push(object.name);
            }
            names
        };
        let waiting = first.status.clone().unwrap();
        wrote(&slots, &first, &waiting, &waiting);
        assert!(woken_now().is_empty(), "still waiting: nobody moves up");
        let failed = ferry_api::VirtualMachineMigrationStatus {
            phase: Some(Phase::Failed),
            reason: Some("SourceVMNotFound".into()),
            ..waiting.clone()
        };
        wrote(&slots, &first, &waiting, &failed);
        assert_eq!(
            woken_now(),
            ["second"],
            "one disk left the line: the next one looks"
        );
        let mut ended = first.clone();
        ended.status = Some(failed);
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(ended));
        let mut cancelled = second.clone();
        cancelled.spec.cancel = true;
        wrote(&slots, &cancelled, &waiting, &waiting);
        assert_eq!(
            woken_now(),
            ["third"],
            "a cancelled waiter leaves the line too"
        );
        // Being deleted: the reconcile that sees it wakes the line.
        left_line(&slots, &third, &third.status.clone().unwrap());
        assert_eq!(woken_now(), ["second"]);
    }
}
