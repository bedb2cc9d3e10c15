//! `ferry watch [NAME]`: progress bars per migration and per disk, with throughput and ETA, driven by a watch on
//! the API (no polling). Without a terminal it prints one plain line per change instead.

use std::collections::{BTreeMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use ferry_api::VirtualMachineMigration;
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
/// otherwise. Returns the migrations as last seen.
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
            _ = tick.tick(), if tty => {}
        }
        let all: Vec<&VirtualMachineMigration> = seen.values().collect();
        view.show(&all);
        let done = all.iter().all(|m| ended(m));
        let over = synced
            && until_done
            && (done && !all.is_empty() || all.is_empty() && matches!(watched, Watched::All));
        if over && plan_ended(watched).await? {
            break;
        }
    }
    Ok(seen.into_values().collect())
}

/// Whether a watched plan has ended too (anything else watched has nothing more to wait for).
async fn plan_ended(watched: Watched<'_>) -> Result<bool> {
    let Watched::Plan { plans, name, .. } = watched else {
        return Ok(true);
    };
    let phase = plans.get_opt(name).await?.and_then(|p| p.status?.phase);
    Ok(phase.is_none_or(|p| {
        matches!(
            p,
            ferry_api::PlanPhase::Succeeded
                | ferry_api::PlanPhase::Failed
                | ferry_api::PlanPhase::Cancelled
        )
    }))
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

    fn show(&mut self, all: &[&VirtualMachineMigration]) {
        let mut out = std::io::stdout().lock();
        if self.tty {
            let frame = self.frame(all);
            // Move up over the last frame and clear it, then draw the new one.
            if self.last_lines > 0 {
                let _ = write!(out, "\x1b[{}A\x1b[J", self.last_lines);
            }
            let _ = write!(out, "{frame}");
            self.last_lines = frame.lines().count();
        } else {
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
        k8s_openapi::jiff::Timestamp::now().strftime("%H:%M:%S"),
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
    fn bars_and_clocks() {
        assert_eq!(bar(0.5, 10), "[#####.....]");
        assert_eq!(bar(1.5, 4), "[####]");
        assert_eq!(clock(125.0), "2:05");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
