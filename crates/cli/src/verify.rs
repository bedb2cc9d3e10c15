//! `ferry verify`: the verification Job's entrypoint.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

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
    let report = match &outcome {
        Ok(v) => serde_json::json!({"verified": v}),
        Err(e) => {
            serde_json::json!({"error": {"class": e.class(), "reason": e.reason(), "message": e.to_string()}})
        }
    };
    let text = serde_json::to_string(&report)?;
    std::fs::write(&args.result_file, &text)
        .with_context(|| format!("writing {}", args.result_file.display()))?;
    println!("{text}");
    outcome.map(|_| ()).map_err(Into::into)
}
