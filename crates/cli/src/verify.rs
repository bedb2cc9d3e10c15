//! `ferry verify`: the verification Job's entrypoint.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ferry_datapath::report::JobReport;

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

pub async fn run(args: VerifyArgs) -> Result<()> {
    let outcome = ferry_datapath::verify::verify(&args.file, &args.sha256, args.size).await;
    crate::convert::report(&args.result_file, outcome, |verified| {
        JobReport::Verified(verified.clone())
    })
}
