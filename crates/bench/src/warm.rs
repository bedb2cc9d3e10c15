//! `ferry bench migrate --warm`: what a warm migration saves in downtime. In one lab with the vCenter's changed
//! block tracking, the same disk (half random data, half zeros) is migrated cold, then warm: a first round copies
//! it whole while the source runs, the lab's guest changes `--changed-percent` of it, and the cutover powers the
//! source off and copies only that, proving each volume against the whole powered-off source (`cutoverCheck:
//! Source`, the default), or only by the rounds' read-backs (`ChangedAreas`). Downtime is from entering Preparing
//! (the power-off) to entering ValidatingGuest (the migrated VM running), read from each migration's recorded
//! checkpoints; every volume is checked against the source's disk at power-off.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ferry_api::{Phase, VirtualMachineMigration, VirtualMachineMigrationStatus};
use ferry_lab::vsphere::lab_hands::LabHands;
use ferry_vsphere::Session;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::controlplane::{LabGuard, bench_lab, namespace, scopeguard, start_controller};
use crate::delta::{self, Spread};
use crate::migrate::{attach_to_vms, half_data_disk};

const MIB: u64 = 1 << 20;

pub struct Options {
    pub size: u64,
    /// Share of the disk the guest changes between the first round and the cutover, in percent.
    pub changed_percent: f64,
    pub timeout: Duration,
}

/// One migration, as measured.
struct Measured {
    name: &'static str,
    downtime: Duration,
    /// Read from the source after power-off.
    copied_after_power_off: u64,
    /// The warm migration's first round, while the source ran.
    precopy: Option<(Duration, u64)>,
}

pub async fn run(options: &Options) -> Result<String> {
    let dir = std::env::temp_dir().join(format!("ferry-bench-warm-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _guard = LabGuard(dir.clone());
    eprintln!("lab: {}", dir.display());
    let mut lab = bench_lab(&dir, ferry_lab::lab::DEFAULT_VCSIM_VMS)?;
    lab.vcsim_realism.cbt = true;
    let state = ferry_lab::up(&lab).await?.into_state();
    ferry_lab::control_plane::controller_process::apply_rbac(&state.tools, &state.kubeconfig)?;
    let endpoint = state.vcsim.clone().context("no vcsim")?;
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(600))?).await?;
    let hands = LabHands::new(&endpoint)?;
    let half = (options.size / 2).div_ceil(MIB) * MIB;
    eprintln!("making a {} MiB source disk...", options.size / MIB);
    let disk = half_data_disk(&dir.join("source"), options.size, half)?;
    let vms = attach_to_vms(&session, &disk, 3).await?;
    let client = state.client().await?;
    let (controller, _port) = start_controller(&state).await?;
    let _stop = scopeguard(controller);

    eprintln!("cold: migrating {}...", vms[0].0);
    let ns = namespace(&client, &state, "bench-cold", 100).await?;
    let cold = manifest(&state, &ns, "cold", &vms[0].0, None);
    ferry_lab::vsphere::demo::apply(&client, &ns, cold).await?;
    let cold_status = succeeded(&client, &ns, "cold", options.timeout).await?;
    let cold = Measured {
        name: "cold",
        downtime: downtime(&cold_status)?,
        copied_after_power_off: options.size,
        precopy: None,
    };

    let disk_sha = cold_status.disks.first().and_then(|d| d.sha256.clone());
    ensure!(
        disk_sha.as_deref() == Some(disk.sha256.as_str()),
        "the cold migration's volume ({disk_sha:?}) is not the source's ({})",
        disk.sha256
    );
    let mut warm = Vec::new();
    for (check, (vm, _)) in ["Source", "ChangedAreas"].into_iter().zip(&vms[1..]) {
        warm.push(
            migrate_warm(&client, &state, &hands, vm, check, options)
                .await
                .with_context(|| format!("the warm migration checked by {check}"))?,
        );
    }
    session.logout().await;
    let blocks = guest_changes(options).len();
    Ok(render(options, blocks, &cold, &warm))
}

/// A warm migration of `vm` whose cutover is checked by `check`: the first round while it runs, the guest's
/// changes, then the cutover; its volume checked against the guest's disk at power-off.
async fn migrate_warm(
    client: &kube::Client,
    state: &ferry_lab::LabState,
    hands: &LabHands,
    vm: &str,
    check: &'static str,
    options: &Options,
) -> Result<Measured> {
    eprintln!("warm ({check}): the first round of {vm} while it runs...");
    let slug = format!("warm-{}", check.to_ascii_lowercase());
    let ns = namespace(client, state, &format!("bench-{slug}"), 100).await?;
    let warm_spec = json!({"precopyIntervalSeconds": 3600, "enableChangeTracking": true, "cutoverCheck": check});
    ferry_lab::vsphere::demo::apply(
        client,
        &ns,
        manifest(state, &ns, &slug, vm, Some(warm_spec)),
    )
    .await?;
    let migrations: Api<VirtualMachineMigration> = Api::namespaced(client.clone(), &ns);
    let first = until(&migrations, &slug, options.timeout, |s| {
        s.warm
            .as_ref()
            .is_some_and(|w| w.rounds_done >= 1 && w.snapshot.is_none())
    })
    .await?;
    let key = first
        .source
        .as_ref()
        .and_then(|s| s.disks.first())
        .context("no disk discovered")?
        .key;
    let round = first
        .warm
        .as_ref()
        .and_then(|w| w.rounds.first())
        .cloned()
        .unwrap_or_default();
    let changes = guest_changes(options);
    eprintln!(
        "warm ({check}): the guest changes {} blocks, then the cutover...",
        changes.len()
    );
    for (offset, len) in &changes {
        hands
            .write(vm, Some(key), *offset, vec![0x5a; *len as usize])
            .await?;
    }
    let cutover = json!({"spec": {"warm": {"cutover": true}}});
    migrations
        .patch(&slug, &PatchParams::default(), &Patch::Merge(&cutover))
        .await?;
    let done = succeeded(client, &ns, &slug, options.timeout).await?;
    let guest = hands.disk(vm, Some(key)).await?;
    let written = done.disks.first().and_then(|d| d.sha256.clone());
    ensure!(
        written.as_deref() == Some(guest.sha256.as_str()),
        "the volume ({written:?}) is not the guest's disk at power-off ({})",
        guest.sha256
    );
    let last = done
        .warm
        .as_ref()
        .and_then(|w| w.final_copy.clone())
        .context("no cutover copy recorded")?;
    Ok(Measured {
        name: if check == "Source" {
            "warm, cutover checked against the source"
        } else {
            "warm, cutover checked by changed areas"
        },
        downtime: downtime(&done)?,
        copied_after_power_off: last.bytes_read.max(0) as u64,
        precopy: Some((
            Duration::from_secs_f64(round.seconds().unwrap_or_default()),
            round.bytes_read.max(0) as u64,
        )),
    })
}

/// The guest's changes before the cutover: `changed_percent` of the disk in scattered 64 KiB blocks.
fn guest_changes(options: &Options) -> Vec<(u64, u64)> {
    let asked = delta::Options {
        size: options.size,
        changed_percent: options.changed_percent,
        spread: Spread::Scattered,
        rounds: 1,
    };
    delta::guest_changes(&asked, 1)
}

fn manifest(
    state: &ferry_lab::LabState,
    ns: &str,
    name: &str,
    vm: &str,
    warm: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut m = ferry_lab::vsphere::demo::migration(state, ns, name, vm);
    m["spec"]["source"]["powerOff"] = json!({"mode": "Force"});
    if let Some(warm) = warm {
        m["spec"]["warm"] = warm;
    }
    m
}

/// From entering Preparing (the power-off) to entering ValidatingGuest (the migrated VM running).
fn downtime(status: &VirtualMachineMigrationStatus) -> Result<Duration> {
    let entered = |phase: Phase| {
        status
            .checkpoints
            .iter()
            .rev()
            .find(|c| c.phase == phase)
            .map(|c| c.entered.0)
            .with_context(|| format!("no {phase:?} checkpoint"))
    };
    Duration::try_from(entered(Phase::ValidatingGuest)?.duration_since(entered(Phase::Preparing)?))
        .context("ValidatingGuest before Preparing")
}

async fn succeeded(
    client: &kube::Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<VirtualMachineMigrationStatus> {
    let migrations: Api<VirtualMachineMigration> = Api::namespaced(client.clone(), ns);
    until(&migrations, name, timeout, |s| {
        s.phase == Some(Phase::Succeeded)
    })
    .await
}

/// Polls migration `name` until `done` holds of its status; fails on another end or after `timeout`.
async fn until(
    migrations: &Api<VirtualMachineMigration>,
    name: &str,
    timeout: Duration,
    done: impl Fn(&VirtualMachineMigrationStatus) -> bool,
) -> Result<VirtualMachineMigrationStatus> {
    let begun = Instant::now();
    loop {
        let status = migrations.get(name).await?.status.unwrap_or_default();
        if done(&status) {
            return Ok(status);
        }
        if status.phase.is_some_and(Phase::is_terminal) {
            bail!("{name} ended {:?}: {:?}", status.phase, status.message);
        }
        if begun.elapsed() > timeout {
            bail!("{name} not there within {timeout:?}: {:?}", status.message);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn render(options: &Options, blocks: usize, cold: &Measured, warm: &[Measured]) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / MIB as f64);
    let mut out = format!(
        "warm benchmark: a {} MiB disk (half random data), the guest changing {}% ({blocks} scattered 64 KiB \
         blocks) before the cutover; downtime is power-off to the migrated VM running\n",
        options.size / MIB,
        options.changed_percent
    );
    out += &format!(
        "  {:<42} {:>10} {:>22} {:>24} {:>10}\n",
        "path", "downtime", "read after power-off", "precopy while running", "cold/this"
    );
    for m in std::iter::once(cold).chain(warm) {
        out += &format!(
            "  {:<42} {:>8.1} s {:>22} {:>24} {:>10.2}\n",
            m.name,
            m.downtime.as_secs_f64(),
            mib(m.copied_after_power_off),
            m.precopy.map_or("-".into(), |(took, read)| format!(
                "{} in {:.1} s",
                mib(read),
                took.as_secs_f64()
            )),
            cold.downtime.as_secs_f64() / m.downtime.as_secs_f64(),
        );
    }
    out
}
