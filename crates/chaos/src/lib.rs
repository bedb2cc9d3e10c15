//! `ferry lab chaos`: Sieve's and Acto's method on Ferry. A fault-free reference run of a workload records the
//! controller's writes, its vSphere calls, the Jobs and DataVolumes it made, its creates and deletes, and the
//! end state; then the workload runs again once per trial (a fault at each write or vSphere call, each pod or
//! importer killed), and each run is judged by oracles against the reference. A violating trial is saved as a
//! file that `--replay` runs again. `--workers N` runs N labs side by side.
//!
//! Built only with the `chaos` feature (`ferry`'s `chaos` feature turns it on); without it this crate is empty.
#![cfg(feature = "chaos")]

mod children;
mod lab;
mod oracles;
mod plan_run;
mod plans;
mod run;
mod under_test;
mod workload;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use clap::Args;
use serde::{Deserialize, Serialize};

use lab::ChaosLab;
use oracles::Record;
use plans::{Targets, Trial};
use workload::{WORKLOADS, Workload};

#[derive(Args)]
pub struct ChaosArgs {
    /// happy-1, happy-3, staged-3, cancel[@Checkpoint], delete[@Checkpoint], bad-spec, or all (repeat for several).
    #[arg(long, default_value = "happy-1")]
    workload: Vec<String>,
    /// P1..P12 (or their names), or all (repeat for several).
    #[arg(long, default_value = "all")]
    perturbation: Vec<String>,
    /// Run this many trials per workload, drawn with --seed from all of them; default: every trial.
    #[arg(long)]
    sample: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Labs that run trials side by side.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Where violating trials are saved.
    #[arg(long, default_value = "chaos-failures")]
    failures: PathBuf,
    /// Run one saved trial file again (after its workload's reference run).
    #[arg(long)]
    replay: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct SavedTrial {
    workload: String,
    trial: Trial,
    violations: Vec<String>,
    /// The migration's last status and the controller's last log lines, to debug from the file alone.
    #[serde(default)]
    detail: String,
}

struct Job {
    workload: Arc<Workload>,
    reference: Arc<Record>,
    trial: Trial,
    tag: String,
}

#[derive(Default)]
struct Tally {
    /// (workload, perturbation) → (trials, passed, of which the fault was not reached)
    per: BTreeMap<(String, String), (usize, usize, usize)>,
    done: usize,
}

pub async fn run(args: ChaosArgs) -> Result<()> {
    let mut work: Vec<(Workload, Option<Trial>)> = vec![];
    if let Some(file) = &args.replay {
        let saved: SavedTrial = serde_json::from_slice(&std::fs::read(file)?)?;
        work.push((Workload::parse(&saved.workload)?, Some(saved.trial)));
    } else if args.workload.iter().any(|w| w == "all") {
        for w in WORKLOADS {
            work.push((Workload::parse(w)?, None));
        }
    } else {
        for w in &args.workload {
            work.push((Workload::parse(w)?, None));
        }
    }
    let mut labs = vec![ChaosLab::start(0).await?];
    // Interrupted or terminated, it still stops its labs and removes their directories.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        outcome = run_in(&args, work, &mut labs) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
    };
    for lab in &labs {
        lab.stop();
    }
    outcome
}

async fn run_in(
    args: &ChaosArgs,
    work: Vec<(Workload, Option<Trial>)>,
    labs: &mut Vec<ChaosLab>,
) -> Result<()> {
    let started = std::time::Instant::now();
    let mut queue = VecDeque::new();
    for (w, fixed) in work {
        let reference = labs[0].run(&w, None, "reference").await?;
        anyhow::ensure!(
            reference.violations.is_empty(),
            "the fault-free run of {} broke: {:?}\n{}",
            w.name,
            reference.violations,
            reference.detail
        );
        println!(
            "{}: reference run {} in {:.1}s: {} controller writes, {} vSphere calls, vSphere changes {:?}, \
             creates {:?}, deletes {:?}, Jobs {:?}",
            w.name,
            reference.end,
            reference.seconds,
            reference.writes,
            reference.vsphere_calls,
            reference.vsphere_changes,
            reference.creates,
            reference.deletes,
            reference.jobs_seen,
        );
        let trials = match fixed {
            Some(trial) => vec![trial],
            None => {
                let targets = Targets {
                    writes: reference.writes,
                    vsphere_calls: reference.vsphere_calls,
                    jobs: reference.jobs_seen.clone(),
                    data_volumes: reference.data_volumes_seen.clone(),
                };
                let all = plans::trials(&args.perturbation, &targets);
                match args.sample {
                    Some(n) => plans::sample(all, n, args.seed),
                    None => all,
                }
            }
        };
        let (w, reference) = (Arc::new(w), Arc::new(reference));
        for (i, trial) in trials.into_iter().enumerate() {
            queue.push_back(Job {
                workload: w.clone(),
                reference: reference.clone(),
                trial,
                tag: i.to_string(),
            });
        }
    }
    let total = queue.len();
    let workers = args.workers.clamp(1, total.max(1));
    while labs.len() < workers {
        labs.push(ChaosLab::start(labs.len()).await?);
    }
    println!("{total} trial(s) on {workers} lab(s)");
    let queue = Arc::new(Mutex::new(queue));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let runs = labs
        .iter()
        .map(|lab| worker(lab, queue.clone(), tally.clone(), args, total));
    for result in futures::future::join_all(runs).await {
        result?;
    }
    let tally = tally.lock().unwrap_or_else(|p| p.into_inner());
    let (mut failed, mut not_reached) = (0, 0);
    for ((workload, perturbation), (trials, passed, missed)) in &tally.per {
        failed += trials - passed;
        not_reached += missed;
        let missed = match missed {
            0 => String::new(),
            n => format!(" (fault not reached in {n})"),
        };
        println!(
            "{workload} {perturbation}: plans {trials}, passed {passed}{missed}, violations {}",
            trials - passed
        );
    }
    println!(
        "total: {total} trial(s), {} passed (fault not reached in {not_reached}), {failed} violation(s), in {:.1} min",
        total - failed,
        started.elapsed().as_secs_f64() / 60.0
    );
    anyhow::ensure!(failed == 0, "{failed} trial(s) violated an oracle");
    Ok(())
}

async fn worker(
    lab: &ChaosLab,
    queue: Arc<Mutex<VecDeque<Job>>>,
    tally: Arc<Mutex<Tally>>,
    args: &ChaosArgs,
    total: usize,
) -> Result<()> {
    loop {
        let Some(job) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else {
            return Ok(());
        };
        // A run the harness could not finish is a violation too, with the reason; the others go on.
        let mut record = match lab.run(&job.workload, Some(&job.trial), &job.tag).await {
            Ok(record) => record,
            Err(e) => Record {
                violations: vec![format!("the run broke off: {e:#}")],
                ..Record::default()
            },
        };
        record.violations.extend(oracles::compare(
            &job.reference,
            &record,
            job.trial.expect(),
            job.workload.warm,
        ));
        let (name, trial) = (&job.workload.name, &job.trial);
        let done = {
            let mut tally = tally.lock().unwrap_or_else(|p| p.into_inner());
            let entry = tally
                .per
                .entry((name.clone(), trial.perturbation.clone()))
                .or_default();
            entry.0 += 1;
            entry.1 += usize::from(record.violations.is_empty());
            entry.2 += usize::from(record.violations.is_empty() && !record.fired);
            tally.done += 1;
            tally.done
        };
        if record.violations.is_empty() {
            let reached = if record.fired {
                ""
            } else {
                " (fault not reached)"
            };
            println!(
                "  [{done}/{total}] {name} {} {}: ok{reached}, {} in {:.1}s",
                trial.perturbation, trial.target, record.end, record.seconds
            );
            continue;
        }
        std::fs::create_dir_all(&args.failures)?;
        let file = args.failures.join(format!(
            "{}-{}-{}.json",
            job.workload.slug(),
            trial.perturbation.split(' ').next().unwrap_or_default(),
            trial.target.replace(' ', "-")
        ));
        let saved = SavedTrial {
            workload: name.clone(),
            trial: trial.clone(),
            violations: record.violations.clone(),
            detail: record.detail.clone(),
        };
        std::fs::write(&file, serde_json::to_vec_pretty(&saved)?)?;
        println!(
            "  [{done}/{total}] VIOLATION {name} {} {}: {:?} (saved {})",
            trial.perturbation,
            trial.target,
            record.violations,
            file.display()
        );
    }
}
