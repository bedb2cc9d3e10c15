//! `ferry convert`: the conversion Job's entrypoint.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ferry_datapath::{ConvertSpec, progress::Progress};

#[derive(Args)]
pub struct ConvertArgs {
    /// The conversion spec (JSON): source, disks, format and staging. Credentials are paths to mounted files.
    #[arg(long)]
    spec: PathBuf,
    /// Where to write the result manifest; in a pod, its termination message path.
    #[arg(long, default_value = "/dev/termination-log")]
    result_file: PathBuf,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
}

pub async fn run(args: ConvertArgs) -> Result<()> {
    let spec = ConvertSpec::load(&args.spec)?;
    let outcome = ferry_datapath::convert_all(&spec, &Progress::new(args.quiet)).await;
    // The controller reads the result, or the error's class and reason, from the termination message.
    let report = match &outcome {
        Ok(disks) => serde_json::json!({"disks": disks}),
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
