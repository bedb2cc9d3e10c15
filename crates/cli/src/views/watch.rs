//! `ferry watch [NAME]`: progress bars per migration and per disk, with throughput and ETA, driven by a watch on
//! the API (no polling). Without a terminal it prints one plain line per change instead.

use std::collections::{BTreeMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use ferry_api::{MigrationPlan, PlanPhase, VirtualMachineMigration};
use ferry_controller::surface::{disk_fraction, progress_bytes};
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};

use super::{Scope, bytes, phase_name};

#[derive(Args)]
pub struct WatchArgs {
    /// One migration, or `plan` and then a plan's name (its migrations); without it, every migration in the
    /// namespace (or all, with -A).
    name: Option<String>,
    /// With `plan`: the plan.
    plan: Option<String>,
    #[command(flatten)]
    scope: Scope,
    /// Keep watching after every migration ended.
    #[arg(long)]
    follow: bool,
}

pub async fn run(args: WatchArgs) -> Result<()> {
    let (client, namespace) = args.scope.client().await?;
    let api = args
        .scope
        .api::<VirtualMachineMigration>(&client, &namespace);
    let tty = std::io::stdout().is_terminal();
    let ended = match &args.plan {
        Some(plan) => {
            if !super::plan::names_plans(args.name.as_deref()) {
                anyhow::bail!("ferry watch takes [NAME], or plan NAME");
            }
            let plans: kube::Api<ferry_api::MigrationPlan> =
                kube::Api::namespaced(client.clone(), &namespace);
            let found = plans
                .get_opt(plan)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no plan {plan} in namespace {namespace}"))?;
            let uid = found.metadata.uid.unwrap_or_default();
            let selector = format!("{}={uid}", ferry_api::keys::PLAN_UID_LABEL);
            let watched = Watched::Plan {
                selector: &selector,
                plans: &plans,
                name: plan,
            };
            follow(api, watched, !args.follow, tty).await?
        }
        None => {
            let watched = args.name.as_deref().map_or(Watched::All, Watched::Named);
            follow(api, watched, !args.follow, tty).await?
        }
    };
    if ended.is_empty() && !args.follow {
        println!("No migrations to watch.");
    }
    Ok(())
}

/// Which migrations a watch follows.
#[derive(Clone, Copy)]
pub enum Watched<'a> {
    All,
    Named(&'a str),
    /// A plan's migrations (`selector`), until the plan itself ends: while `maxInFlight` holds VMs back, every
    /// migration seen may have ended and more are still to come.
    Plan {
        selector: &'a str,
        plans: &'a kube::Api<ferry_api::MigrationPlan>,
        name: &'a str,
    },
}

/// Watches until every migration seen has ended (when `until_done`), drawing bars on a terminal or plain lines
/// otherwise; a watched plan's totals head the view. Returns the migrations as last seen.
pub async fn follow(
    api: kube::Api<VirtualMachineMigration>,
    watched: Watched<'_>,
    until_done: bool,
    tty: bool,
) -> Result<Vec<VirtualMachineMigration>> {
    let config = match watched {
        Watched::All => watcher::Config::default(),
        Watched::Named(name) => watcher::Config::default().fields(&format!("metadata.name={name}")),
        Watched::Plan { selector, .. } => watcher::Config::default().labels(selector),
    };
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut plan = PlanSeen::new(watched);
    let mut view = View::new(tty);
    let mut seen: BTreeMap<String, VirtualMachineMigration> = BTreeMap::new();
    let mut synced = false;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { break };
                match event? {
                    watcher::Event::Apply(m) | watcher::Event::InitApply(m) => { seen.insert(key(&m), m); }
                    watcher::Event::Delete(m) => { seen.remove(&key(&m)); }
                    watcher::Event::Init => {}
                    watcher::Event::InitDone => synced = true,
                }
            }
            event = plan.events.next() => {
                let Some(event) = event else { break };
                plan.observe(event?);
            }
            _ = tick.tick(), if tty => {}
        }
        let all: Vec<&VirtualMachineMigration> = seen.values().collect();
        view.show(&all, plan.totals());
        let done = all.iter().all(|m| ended(m));
        let over = synced
            && until_done
            && (done && !all.is_empty() || all.is_empty() && matches!(watched, Watched::All));
        if over && plan.ended() {
            break;
        }
    }
    Ok(seen.into_values().collect())
}

/// A watched plan, from its own watch: its totals head the view, and the watch ends only once it has ended (or
/// is gone). Nothing for other watches.
struct PlanSeen {
    events:
        futures::stream::BoxStream<'static, Result<watcher::Event<MigrationPlan>, watcher::Error>>,
    watched: bool,
    synced: bool,
    plan: Option<MigrationPlan>,
    /// A listing in progress: what it found so far.
    listing: Option<MigrationPlan>,
}

impl PlanSeen {
    fn new(watched: Watched<'_>) -> Self {
        let events = match watched {
            Watched::Plan { plans, name, .. } => watcher(
                plans.clone(),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .default_backoff()
            .boxed(),
            _ => futures::stream::pending().boxed(),
        };
        Self {
            events,
            watched: matches!(watched, Watched::Plan { .. }),
            synced: false,
            plan: None,
            listing: None,
        }
    }

    fn observe(&mut self, event: watcher::Event<MigrationPlan>) {
        match event {
            watcher::Event::Apply(p) => self.plan = Some(p),
            watcher::Event::Delete(_) => self.plan = None,
            watcher::Event::Init => self.listing = None,
            watcher::Event::InitApply(p) => self.listing = Some(p),
            watcher::Event::InitDone => {
                self.plan = self.listing.take();
                self.synced = true;
            }
        }
    }

    fn totals(&self) -> Option<String> {
        self.plan.as_ref().map(super::plan::totals_line)
    }

    /// Whether there is nothing more to wait for: no plan is watched, or it ended or is gone. A plan the
    /// controller has not summed up yet has not ended.
    fn ended(&self) -> bool {
        if !self.watched {
            return true;
        }
        self.synced
            && self.plan.as_ref().is_none_or(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .is_some_and(|phase| {
                        matches!(
                            phase,
                            PlanPhase::Succeeded | PlanPhase::Failed | PlanPhase::Cancelled
                        )
                    })
            })
    }
}

fn key(m: &VirtualMachineMigration) -> String {
    format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any())
}

pub fn ended(m: &VirtualMachineMigration) -> bool {
    m.status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(|p| p.is_terminal())
}

/// Throughput from the bytes done over the last seconds, per migration.
#[derive(Default)]
struct Rates(BTreeMap<String, VecDeque<(Instant, f64)>>);

impl Rates {
    fn observe(&mut self, key: &str, done: f64) -> Option<f64> {
        let samples = self.0.entry(key.to_string()).or_default();
        let now = Instant::now();
        if samples.back().is_none_or(|(_, d)| *d != done) {
            samples.push_back((now, done));
        }
        while samples.len() > 2 && now.duration_since(samples[0].0) > Duration::from_secs(15) {
            samples.pop_front();
        }
        let (first, last) = (samples.front()?, samples.back()?);
        let seconds = last.0.duration_since(first.0).as_secs_f64();
        (seconds > 0.5 && last.1 > first.1).then(|| (last.1 - first.1) / seconds)
    }
}

struct View {
    tty: bool,
    rates: Rates,
    last_lines: usize,
    printed: BTreeMap<String, String>,
}

impl View {
    fn new(tty: bool) -> Self {
        Self {
            tty,
            rates: Rates::default(),
            last_lines: 0,
            printed: BTreeMap::new(),
        }
    }

    fn show(&mut self, all: &[&VirtualMachineMigration], totals: Option<String>) {
        let mut out = std::io::stdout().lock();
        if self.tty {
            let mut frame = totals.map(|t| format!("{t}\n")).unwrap_or_default();
            frame.push_str(&self.frame(all));
            // Move up over the last frame and clear it, then draw the new one.
            if self.last_lines > 0 {
                let _ = write!(out, "\x1b[{}A\x1b[J", self.last_lines);
            }
            let _ = write!(out, "{frame}");
            self.last_lines = frame.lines().count();
        } else {
            if let Some(totals) = totals
                && self.printed.get(PLAN_KEY) != Some(&totals)
            {
                let _ = writeln!(out, "{} {totals}", now_clock());
                self.printed.insert(PLAN_KEY.into(), totals);
            }
            for m in all {
                let line = plain_line(m, self.rates.observe(&key(m), done_of(m)));
                let state = line
                    .split_once(' ')
                    .map(|(_, rest)| rest.to_string())
                    .unwrap_or_default();
                if self.printed.get(&key(m)) != Some(&state) {
                    let _ = writeln!(out, "{line}");
                    self.printed.insert(key(m), state);
                }
            }
        }
        let _ = out.flush();
    }

    fn frame(&mut self, all: &[&VirtualMachineMigration]) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "{:<28} {:<22} {:<32} {:>12} {:>7}\n",
            "MIGRATION", "PHASE", "PROGRESS", "RATE", "ETA"
        ));
        for m in all {
            let status = m.status.clone().unwrap_or_default();
            let (done, total) = progress_bytes(&status);
            let rate = self.rates.observe(&key(m), done);
            let fraction = if total > 0 { done / total as f64 } else { 0.0 };
            let eta = match (rate, ended(m)) {
                (_, true) => "done".to_string(),
                (Some(r), false) if r > 0.0 => clock((total as f64 - done) / r),
                _ => "-".to_string(),
            };
            out.push_str(&format!(
                "{:<28} {:<22} {} {:>4.0}% {:>12} {:>7}\n",
                truncate(&key(m), 28),
                truncate(&phase_name(status.phase), 22),
                bar(fraction, 24),
                fraction * 100.0,
                rate.map(|r| format!("{}/s", bytes(r)))
                    .unwrap_or_else(|| "-".into()),
                eta
            ));
            for d in &status.disks {
                let what = match (d.sha256.is_some(), d.verified) {
                    (_, true) => "imported, sha256 verified".to_string(),
                    (true, false) => format!(
                        "staged, importing {}",
                        d.progress.clone().unwrap_or_else(|| "0%".into())
                    ),
                    (false, _) => "converting".to_string(),
                };
                out.push_str(&format!(
                    "  disk {:<21} {:<22} {} {:>4.0}% {}\n",
                    d.index,
                    bytes(d.capacity_bytes as f64),
                    bar(disk_fraction(d), 24),
                    disk_fraction(d) * 100.0,
                    what
                ));
            }
            if let Some(reason) = status.reason.as_deref().filter(|_| {
                !ended(m)
                    || status
                        .phase
                        .is_some_and(|p| p != ferry_api::Phase::Succeeded)
            }) {
                out.push_str(&format!(
                    "  {reason}: {}\n",
                    truncate(status.message.as_deref().unwrap_or_default(), 100)
                ));
            }
        }
        out
    }
}

fn done_of(m: &VirtualMachineMigration) -> f64 {
    m.status.as_ref().map_or(0.0, |s| progress_bytes(s).0)
}

/// `12:00:01 ns/name Importing 52% (33 MiB of 64 MiB) 12.1 MiB/s ImportRetrying`: one line per change.
pub fn plain_line(m: &VirtualMachineMigration, rate: Option<f64>) -> String {
    let status = m.status.clone().unwrap_or_default();
    let mut line = format!(
        "{} {} {} {}",
        now_clock(),
        key(m),
        phase_name(status.phase),
        status.progress.unwrap_or_else(|| "-".into())
    );
    if let Some(r) = rate {
        line.push_str(&format!(" {}/s", bytes(r)));
    }
    if let Some(reason) = status.reason {
        line.push_str(&format!(" {reason}"));
    }
    line
}

/// Where plain output remembers the plan's totals line: no migration's `namespace/name` starts with a space.
const PLAN_KEY: &str = " plan";

fn now_clock() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%H:%M:%S")
        .to_string()
}

pub fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0)) * width as f64).round() as usize;
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        s.chars()
            .take(width.saturating_sub(1))
            .chain(['…'])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_plan_has_ended_only_once_it_says_so_or_is_gone() {
        let plan = |status: serde_json::Value| -> MigrationPlan {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "migration.platform.example/v1alpha1", "kind": "MigrationPlan",
                "metadata": {"name": "wave", "namespace": "apps"},
                "spec": {"providerRef": {"name": "vc"}, "vms": [{"name": "web"}]},
                "status": status}))
            .unwrap()
        };
        let mut seen = PlanSeen {
            events: futures::stream::pending().boxed(),
            watched: true,
            synced: false,
            plan: None,
            listing: None,
        };
        assert!(!seen.ended(), "not listed yet");
        seen.observe(watcher::Event::Init);
        seen.observe(watcher::Event::InitApply(plan(serde_json::json!(null))));
        seen.observe(watcher::Event::InitDone);
        assert!(!seen.ended(), "not summed up by the controller yet");
        seen.observe(watcher::Event::Apply(plan(
            serde_json::json!({"phase": "Running", "total": 1}),
        )));
        assert!(!seen.ended());
        assert!(seen.totals().unwrap().contains("Running: 1 VMs"));
        seen.observe(watcher::Event::Apply(plan(
            serde_json::json!({"phase": "Succeeded", "total": 1, "succeeded": 1}),
        )));
        assert!(seen.ended());
        seen.observe(watcher::Event::Apply(plan(
            serde_json::json!({"phase": "Running"}),
        )));
        seen.observe(watcher::Event::Delete(plan(serde_json::json!(null))));
        assert!(seen.ended(), "a deleted plan has nothing more to show");
        seen.watched = false;
        seen.plan = Some(plan(serde_json::json!({"phase": "Running"})));
        assert!(seen.ended(), "no plan watched: nothing to wait for");
    }

    #[test]
    fn bars_and_clocks() {
        assert_eq!(bar(0.5, 10), "[#####.....]");
        assert_eq!(bar(1.5, 4), "[####]");
        assert_eq!(clock(125.0), "2:05");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
