//! `ferry bench ...`: benchmarks that print ratios against baselines measured in the same run.

mod controlplane;
pub mod datapath;
mod delta;
mod migrate;
mod warm;

use anyhow::{Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use ferry_api::DiskFormat;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The disk path: datastore download, conversion and staging upload, each alone, then Ferry end to end.
    Datapath {
        /// Disk size, for example 1GiB or 512MiB.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        size: u64,
        #[arg(long, value_enum, default_value = "raw")]
        format: Format,
        /// Rounds of every measurement, interleaved; the report gives medians and each round's ratio.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// A warm migration's delta round against a whole copy and the floor (the disk downloaded to nowhere), each
    /// round on the same snapshot of the lab's vCenter with changed block tracking, after the lab's guest changed
    /// a share of the disk. Fails unless every delta round is a delta and reads back equal.
    Delta {
        /// Disk size, for example 1GiB or 512MiB.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        size: u64,
        /// Share of the disk the guest changes before each round, in percent.
        #[arg(long, default_value_t = 2.0)]
        changed_percent: f64,
        #[arg(long, value_enum, default_value = "scattered")]
        spread: delta::Spread,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// One whole migration per path (direct, staged raw, staged qcow2) in the lab, of a disk that is half random
    /// data and half zeros, against the floor (the same disk downloaded from vcsim to a file): each path's wall
    /// time from Converting to verified, its ratio to the floor, bytes read and written, the conversion pod's
    /// peak RSS. Fails unless every migration succeeds and its volume hashes to the source.
    Migrate {
        /// Disk size, for example 4GiB or 512MiB.
        #[arg(long, default_value = "4GiB", value_parser = parse_size)]
        size: u64,
        /// Each path's migration must succeed within this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
        /// Instead: the same disk migrated cold, then warm (a first round while the source runs, the guest
        /// changing `--changed-percent` of the disk, then the cutover), and each one's downtime.
        #[arg(long)]
        warm: bool,
        /// With `--warm`: the share of the disk the guest changes before the cutover, in percent.
        #[arg(long, default_value_t = 2.0)]
        changed_percent: f64,
    },
    /// N single-disk migrations of 1 MiB VMs in the lab, first as a straight-line script with no controller
    /// (the floor), then through Ferry's controller: wall times and their ratio, the controller's CPU and peak
    /// RSS, API requests per migration by verb, reconciles and their latency. Fails unless all N succeed.
    Controlplane {
        #[arg(long, default_value_t = 1000)]
        migrations: usize,
        /// Each of the two runs must finish within this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
        /// Ferry's run is one MigrationPlan of every VM.
        #[arg(long)]
        plan: bool,
        /// ESXi hosts in vcsim, the VMs spread evenly over them (default: vcsim's 4, half the VMs on one).
        #[arg(long)]
        hosts: Option<usize>,
        /// The Provider's maxConcurrentDisksPerHost in Ferry's run (default: 10 with --plan, as a Provider
        /// has by default; 100 without, which the floor's unlimited script is compared with).
        #[arg(long)]
        disks_per_host: Option<i32>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Raw,
    Qcow2,
}

fn parse_size(text: &str) -> Result<u64, String> {
    let (number, unit) = text.trim().split_at(
        text.trim()
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 1GiB or 512MiB"))?;
    let scale = match unit {
        "GiB" | "G" => 1 << 30,
        "MiB" | "M" => 1 << 20,
        _ => return Err(format!("{text:?}: use MiB or GiB")),
    };
    Ok(n * scale)
}

fn warn_if_debug_build() {
    if cfg!(debug_assertions) {
        eprintln!(
            "note: a debug build; measure with `cargo run --release --bin ferry -- bench ...`"
        );
    }
}

pub async fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Migrate {
            size,
            timeout,
            warm,
            changed_percent,
        } => {
            warn_if_debug_build();
            if size < 2 << 20 {
                bail!("the disk must be at least 2 MiB");
            }
            if warm {
                if !(0.0..=100.0).contains(&changed_percent) {
                    bail!("--changed-percent is a share of the disk: 0 to 100");
                }
                let options = warm::Options {
                    size,
                    changed_percent,
                    timeout: std::time::Duration::from_secs(timeout),
                };
                print!("{}", warm::run(&options).await?);
                return Ok(());
            }
            let options = migrate::Options {
                size,
                timeout: std::time::Duration::from_secs(timeout),
            };
            print!("{}", migrate::run(&options).await?.render());
            Ok(())
        }
        BenchCommand::Controlplane {
            migrations,
            timeout,
            plan,
            hosts,
            disks_per_host,
        } => {
            if migrations == 0 {
                bail!("--migrations must be at least 1");
            }
            if plan && migrations > 2000 {
                bail!("--plan takes at most 2000 migrations (a plan's spec.vms)");
            }
            if hosts.is_some_and(|h| h == 0) {
                bail!("--hosts must be at least 1");
            }
            let disks_per_host = disks_per_host.unwrap_or(if plan { 10 } else { 100 });
            if !(1..=100).contains(&disks_per_host) {
                bail!("--disks-per-host must be 1 to 100, as the Provider takes it");
            }
            warn_if_debug_build();
            let options = controlplane::Options {
                migrations,
                timeout: std::time::Duration::from_secs(timeout),
                plan,
                hosts,
                disks_per_host,
            };
            let report = controlplane::run(&options).await?;
            print!("{}", report.render());
            if !report.all_succeeded() {
                bail!(
                    "{} of {migrations} migrations did not succeed",
                    migrations - report.ferry.succeeded
                );
            }
            Ok(())
        }
        BenchCommand::Delta {
            size,
            changed_percent,
            spread,
            rounds,
        } => {
            warn_if_debug_build();
            if rounds == 0
                || size < (1 << 20)
                || !(changed_percent > 0.0 && changed_percent <= 100.0)
            {
                bail!("--rounds at least 1, --size at least 1MiB, --changed-percent in (0, 100]");
            }
            let tools = ferry_lab::control_plane::tools::bin_dir()?;
            let work = std::env::temp_dir().join(format!("ferry-bench-{}", std::process::id()));
            std::fs::create_dir_all(&work)?;
            let options = delta::Options {
                size,
                changed_percent,
                spread,
                rounds,
            };
            let report = delta::run(&work, &tools, &options).await;
            let _ = std::fs::remove_dir_all(&work);
            print!("{}", report?);
            Ok(())
        }
        BenchCommand::Datapath {
            size,
            format,
            rounds,
        } => {
            warn_if_debug_build();
            if rounds == 0 {
                bail!("--rounds must be at least 1");
            }
            if size < (1 << 20) {
                bail!("the disk must be at least 1 MiB");
            }
            let format = match format {
                Format::Raw => DiskFormat::Raw,
                Format::Qcow2 => DiskFormat::Qcow2,
            };
            let tools = ferry_lab::control_plane::tools::bin_dir()?;
            let work = std::env::temp_dir().join(format!("ferry-bench-{}", std::process::id()));
            std::fs::create_dir_all(&work)?;
            let report = datapath::datapath(&work, &tools, size, format, rounds).await;
            let _ = std::fs::remove_dir_all(&work);
            report?.print();
            Ok(())
        }
    }
}
