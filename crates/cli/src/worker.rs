//! `ferry convert`, `ferry verify` and `ferry adapt`: the entrypoints of the conversion, verification and
//! adaptation Jobs. Each runs its
//! work in `ferry-datapath` and leaves one report where the controller reads it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use ferry_datapath::report::{JobReport, RoundSummary, StagedSummary, WrittenSummary};
use ferry_datapath::{ConvertSpec, progress::Progress};

#[derive(Args)]
pub struct ConvertArgs {
    /// The conversion spec (JSON file): source, disks, format and staging. Credentials are paths to mounted files.
    #[arg(
        long,
        required_unless_present = "spec_json",
        conflicts_with = "spec_json"
    )]
    spec: Option<PathBuf>,
    /// The same spec inline, as the controller passes it to a Job (it holds no secret, only paths).
    #[arg(long)]
    spec_json: Option<String>,
    /// Where to write the result's summary (the disks' results are their manifests in staging); in a pod, its
    /// termination message path.
    #[arg(long, default_value = "/dev/termination-log")]
    result_file: PathBuf,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
}

pub async fn convert(args: ConvertArgs) -> Result<()> {
    let spec = match (&args.spec, &args.spec_json) {
        (Some(path), _) => ConvertSpec::load(path)?,
        (None, Some(text)) => ConvertSpec::parse(text)?,
        (None, None) => anyhow::bail!("give --spec or --spec-json"),
    };
    let run = ferry_datapath::report::run_id();
    let progress = Progress::new(args.quiet);
    if spec.round.is_some() {
        let outcome = ferry_datapath::round::run_round(&spec, &progress).await;
        return report(&args.result_file, outcome, |disks| {
            JobReport::Round(RoundSummary {
                run: run.clone(),
                disks: disks.clone(),
            })
        });
    }
    if spec.staging.is_none() {
        let outcome = ferry_datapath::direct::write_all(&spec, &progress).await;
        return report(&args.result_file, outcome, |disks| {
            JobReport::Written(WrittenSummary::of(disks, &run))
        });
    }
    let outcome = ferry_datapath::convert::convert_run(&spec, &progress, &run).await;
    if let Ok(disks) = &outcome {
        // Every disk's result for the log; the termination message keeps 4 KiB, so it gets the summary.
        println!("{}", JobReport::Disks(disks.clone()).to_json());
    }
    report(&args.result_file, outcome, |disks| {
        JobReport::Staged(StagedSummary::of(disks, spec.format, &run))
    })
}

#[derive(Args)]
pub struct VerifyArgs {
    /// The imported image, for example /disk/disk.img on a Filesystem PVC.
    #[arg(long)]
    file: PathBuf,
    /// The source's sha256 (from the conversion result).
    #[arg(long)]
    sha256: String,
    /// The source disk's size in bytes: only that many bytes are read.
    #[arg(long)]
    size: u64,
    /// Where to write the result; in a pod, its termination message path.
    #[arg(long, default_value = "/dev/termination-log")]
    result_file: PathBuf,
}

pub async fn verify(args: VerifyArgs) -> Result<()> {
    let outcome = ferry_datapath::verify::verify(&args.file, &args.sha256, args.size).await;
    report(&args.result_file, outcome, |verified| {
        JobReport::Verified(verified.clone())
    })
}

#[derive(Args)]
pub struct AdaptArgs {
    /// The adaptation spec (JSON): the source VM as discovered, and each volume with the sha256 it must hold.
    #[arg(long)]
    spec_json: String,
    /// Where to write the result; in a pod, its termination message path.
    #[arg(long, default_value = "/dev/termination-log")]
    result_file: PathBuf,
}

pub async fn adapt(args: AdaptArgs) -> Result<()> {
    let mut spec = ferry_adapt::spec::AdaptSpec::parse(&args.spec_json)
        .map_err(|e| anyhow::anyhow!("invalid adaptation spec: {e}"))?;
    // The drivers are looked for in the mounted volume before anything is hashed or run: a wrong path is the
    // person's to fix, and no retry finds them.
    let drivers = match spec.virtio_win.as_deref() {
        Some(named) => ferry_adapt::spec::virtio_win_source(named).map(Some),
        None => Ok(None),
    };
    let tool = match spec.first_boot_tool.as_deref() {
        Some(named) => ferry_adapt::spec::first_boot_tool_dir(named).map(Some),
        None => Ok(None),
    };
    use ferry_adapt::failure::AdaptationFailure;
    let outcome = match (drivers, tool) {
        (Ok(drivers), Ok(tool)) => {
            if let Some(drivers) = &drivers {
                println!("virtio-win drivers: {}", drivers.display());
            }
            if let Some(tool) = &tool {
                println!("first-boot tool: {}", tool.display());
            }
            spec.virtio_win = drivers;
            spec.first_boot_tool = tool;
            ferry_datapath::adapt::adapt(&spec).await
        }
        (Err(message), _) => Err(ferry_datapath::Error::Adaptation {
            failure: AdaptationFailure::MissingDrivers,
            message,
        }),
        (_, Err(message)) => Err(ferry_datapath::Error::Adaptation {
            failure: AdaptationFailure::MissingFirstBootTool,
            message,
        }),
    };
    report(&args.result_file, outcome, |adapted| {
        JobReport::Adapted(Box::new(adapted.clone()))
    })
}

/// Writes a Job's report (`ok` of its result, or its error's class and reason) where the controller reads it
/// (the termination message), and echoes it; the exit code follows the outcome.
fn report<T>(
    result_file: &Path,
    outcome: ferry_datapath::Result<T>,
    ok: impl FnOnce(&T) -> JobReport,
) -> Result<()> {
    let text = JobReport::of(&outcome, ok)
        .write(result_file)
        .with_context(|| format!("writing {}", result_file.display()))?;
    println!("{text}");
    outcome.map(|_| ()).map_err(Into::into)
}
