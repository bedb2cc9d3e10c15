//! `ferry bench delta`: what a warm round costs against a whole copy, measured in the same run on the lab's
//! vCenter with changed block tracking. Each round the lab's guest changes a share of the disk (scattered 64 KiB
//! blocks, or one contiguous run), a snapshot freezes it, and three copies read that snapshot: the floor (the
//! whole disk downloaded to nowhere), the Job's whole copy, and the Job's delta round. The delta's time is what a
//! warm migration's cutover would spend copying once the VM is off.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use ferry_api::DiskFormat;
use ferry_datapath::progress::Progress;
use ferry_datapath::round::{RoundDisk, RoundKind, run_round};
use ferry_datapath::spec::{ConvertSpec, DiskSpec, RoundSpec, SourceSpec, SourceTrust, VolumeSpec};
use ferry_lab::control_plane::process::Lifetime;
use ferry_lab::lab::VcsimRealism;
use ferry_lab::vsphere::lab_hands::LabHands;
use ferry_lab::vsphere::vcsim::StandaloneVcsim;
use ferry_vsphere::datastore::{Download, flat_disk};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{MoRef, Session, cbt, snapshot};

const VM: &str = "DC0_H0_VM0";
const BLOCK: u64 = 64 << 10;

/// How the guest's changes lie on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Spread {
    /// Evenly spaced 64 KiB blocks: one changed area each.
    Scattered,
    /// One run from the disk's middle: one area.
    Contiguous,
}

pub struct Options {
    pub size: u64,
    /// Share of the disk the guest changes each round, in percent.
    pub changed_percent: f64,
    pub spread: Spread,
    pub rounds: usize,
}

/// One round's three times and what the delta copied.
struct Round {
    floor: Duration,
    whole: Duration,
    delta: Duration,
    areas: u64,
    bytes: u64,
}

pub async fn run(work: &Path, tools: &Path, options: &Options) -> Result<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let realism = VcsimRealism {
        cbt: true,
        ..VcsimRealism::default()
    };
    let vcsim = StandaloneVcsim::start_with(
        &work.join("vcsim"),
        tools,
        false,
        &realism,
        Lifetime::TiedToThisProcess,
    )
    .await?;
    let result = measure(work, &vcsim, options).await;
    let _ = vcsim.stop();
    result
}

async fn measure(work: &Path, vcsim: &StandaloneVcsim, options: &Options) -> Result<String> {
    let endpoint = &vcsim.endpoint;
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(600))?).await?;
    let hands = LabHands::new(endpoint)?;
    let vm = inventory::find_vm(&session, &VmSelector::Name(VM.into())).await?;
    eprintln!("making a {} MiB source disk...", options.size >> 20);
    let disk = ferry_lab::disks::make_flat_vmdk(work, "bench", options.size, 42)?;
    let attached =
        ferry_vsphere::provision::link_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
            .await?
            .to_string();
    let info = inventory::describe_vm(&session, &vm).await?;
    let key = info
        .disks
        .iter()
        .find(|d| d.file == attached)
        .map(|d| d.key)
        .ok_or_else(|| anyhow::anyhow!("the attached disk is not on {VM}"))?;
    let credentials = work.join("vsphere-credentials");
    std::fs::create_dir_all(&credentials)?;
    std::fs::write(credentials.join("user"), &endpoint.username)?;
    std::fs::write(credentials.join("password"), endpoint.password()?)?;
    let volume = work.join("volume.img");
    std::fs::File::create(&volume)?.set_len(options.size)?;
    let spec = |snapshot: &MoRef, since: Option<String>| ConvertSpec {
        source: SourceSpec {
            url: endpoint.url.clone(),
            credentials_dir: credentials.clone(),
            trust: SourceTrust::CaFile(endpoint.ca_file.clone()),
            datacenter: info.datacenter.clone(),
            vm_uuid: String::new(),
            instance_uuid: None,
        },
        disks: vec![DiskSpec {
            index: 0,
            file: attached.clone(),
            capacity_bytes: options.size,
        }],
        format: DiskFormat::Raw,
        staging: None,
        volumes: vec![VolumeSpec {
            index: 0,
            path: volume.clone(),
            block: false,
        }],
        parallel: 1,
        transfer: Default::default(),
        round: Some(RoundSpec {
            vm_moref: vm.value.clone(),
            snapshot: Some(snapshot.value.clone()),
            since: vec![since],
            hash_source: false,
        }),
    };
    let quiet = Progress::new(true);
    cbt::set_change_tracking(&session, &vm, true, Duration::from_secs(60)).await?;

    eprintln!("round 0: the first, whole copy...");
    let first = snapshot::create(&session, &vm, "ferry-bench-0", Duration::from_secs(60)).await?;
    let copied = only(run_round(&spec(&first, None), &quiet).await?)?;
    snapshot::remove(&session, &first, Duration::from_secs(60)).await?;
    let mut since = copied.change_id;

    let mut rounds = Vec::new();
    for n in 1..=options.rounds {
        eprintln!("round {n} of {}: the guest writes...", options.rounds);
        let changes = guest_changes(options, n as u8);
        for (offset, len) in &changes {
            hands
                .write(VM, Some(key), *offset, vec![n as u8; *len as usize])
                .await?;
        }
        let snap = snapshot::create(
            &session,
            &vm,
            &format!("ferry-bench-{n}"),
            Duration::from_secs(60),
        )
        .await?;
        eprintln!("round {n}: the floor, a whole copy, a delta...");
        let floor = timed(async {
            let flat = flat_disk(&session, &info.datacenter, &attached).await?;
            let mut stream = Download::open(&session, &info.datacenter, &flat.extent, 0).await?;
            while stream.next_chunk().await?.is_some() {}
            anyhow::Ok(())
        })
        .await?;
        let (whole, full) = timed_value(run_round(&spec(&snap, None), &quiet)).await?;
        ensure!(only(full)?.kind == RoundKind::Full);
        let (delta, copied) = timed_value(run_round(&spec(&snap, since.clone()), &quiet)).await?;
        let copied = only(copied)?;
        ensure!(
            copied.kind == RoundKind::Delta,
            "round {n}: {:?} ({:?})",
            copied.kind,
            copied.reason
        );
        snapshot::remove(&session, &snap, Duration::from_secs(60)).await?;
        since = copied.change_id;
        rounds.push(Round {
            floor,
            whole,
            delta,
            areas: copied.areas,
            bytes: copied.bytes_read,
        });
    }
    session.logout().await;
    Ok(render(options, &rounds))
}

/// This round's guest writes: `changed_percent` of the disk in whole 64 KiB blocks, spread as asked, shifted by
/// the round so that rounds change different blocks.
pub(crate) fn guest_changes(options: &Options, round: u8) -> Vec<(u64, u64)> {
    let blocks = options.size / BLOCK;
    let changed =
        ((blocks as f64 * options.changed_percent / 100.0).round() as u64).clamp(1, blocks);
    match options.spread {
        Spread::Scattered => {
            let stride = (blocks / changed).max(1);
            (0..changed)
                .map(|i| (((i * stride + round as u64) % blocks) * BLOCK, BLOCK))
                .collect()
        }
        Spread::Contiguous => {
            let start = (blocks / 2 + round as u64 * 17) % (blocks - changed + 1);
            // Written in 4 MiB pieces, as a guest would.
            let (from, to) = (start * BLOCK, (start + changed) * BLOCK);
            (from..to)
                .step_by(4 << 20)
                .map(|at| (at, (to - at).min(4 << 20)))
                .collect()
        }
    }
}

fn only(mut disks: Vec<RoundDisk>) -> Result<RoundDisk> {
    ensure!(disks.len() == 1, "a round of {} disks", disks.len());
    Ok(disks.remove(0))
}

async fn timed(work: impl Future<Output = Result<()>>) -> Result<Duration> {
    let start = Instant::now();
    work.await?;
    Ok(start.elapsed())
}

async fn timed_value<T>(
    work: impl Future<Output = ferry_datapath::Result<T>>,
) -> Result<(Duration, T)> {
    let start = Instant::now();
    let value = work.await?;
    Ok((start.elapsed(), value))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn render(options: &Options, rounds: &[Round]) -> String {
    let mut out = format!(
        "delta benchmark: {} MiB disk, {}% changed per round ({:?}), {} rounds\n",
        options.size >> 20,
        options.changed_percent,
        options.spread,
        rounds.len()
    );
    out += "  round  floor s  whole s  delta s  areas  delta MiB  whole/delta  floor/delta\n";
    for (n, r) in rounds.iter().enumerate() {
        out += &format!(
            "  {:>5}  {:>7.2}  {:>7.2}  {:>7.2}  {:>5}  {:>9.1}  {:>11.1}  {:>11.1}\n",
            n + 1,
            r.floor.as_secs_f64(),
            r.whole.as_secs_f64(),
            r.delta.as_secs_f64(),
            r.areas,
            r.bytes as f64 / (1 << 20) as f64,
            r.whole.as_secs_f64() / r.delta.as_secs_f64(),
            r.floor.as_secs_f64() / r.delta.as_secs_f64(),
        );
    }
    let ratio = |f: fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    out += &format!(
        "  median whole/delta {:.1}, floor/delta {:.1}; delta per area {:.2} ms\n",
        ratio(|r| r.whole.as_secs_f64() / r.delta.as_secs_f64()),
        ratio(|r| r.floor.as_secs_f64() / r.delta.as_secs_f64()),
        ratio(|r| r.delta.as_secs_f64() * 1000.0 / r.areas.max(1) as f64),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_changes_the_share_asked_and_never_past_the_disk() {
        for spread in [Spread::Scattered, Spread::Contiguous] {
            for percent in [0.5, 5.0, 100.0] {
                let options = Options {
                    size: 256 << 20,
                    changed_percent: percent,
                    spread,
                    rounds: 1,
                };
                let changes = guest_changes(&options, 3);
                let bytes: u64 = changes.iter().map(|c| c.1).sum();
                let wanted = (options.size as f64 * percent / 100.0) as u64;
                assert!(
                    bytes.abs_diff(wanted) <= BLOCK,
                    "{spread:?} {percent}%: {bytes}"
                );
                assert!(changes.iter().all(|(at, len)| at + len <= options.size));
            }
        }
    }
}
