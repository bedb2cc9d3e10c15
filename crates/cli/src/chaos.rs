//! `ferry lab chaos`: Sieve's and Acto's method on Ferry. A fault-free reference run of a workload records the
//! controller's writes, its creates and deletes, and the end state; then the workload runs again once per plan
//! (crash right before or after write k, or fail write k with a timeout, 500, 409 or AlreadyExists), and each run is
//! judged by oracles against the reference. A violating plan is saved as a file that `--replay` runs again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use ferry_api::{Phase, PowerState, VirtualMachineMigration};
use ferry_controller::chaos::{Fault, PLAN_ENV, Plan};
use ferry_lab::process::{self, Lifetime, ProcessRecord};
use ferry_lab::{LabOptions, LabState};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const WORKLOADS: [&str; 4] = ["happy-1", "happy-3", "cancel", "delete"];
/// Each perturbation, and the fault it injects at every write k.
pub const PERTURBATIONS: [(&str, Fault); 6] = [
    ("P1 crash-after-write", Fault::CrashAfter),
    ("P2 crash-before-write", Fault::CrashBefore),
    ("P3 fail-write-500", Fault::ServerError),
    ("P4 fail-write-409", Fault::Conflict),
    ("P5 fail-write-already-exists", Fault::AlreadyExists),
    ("P6 fail-write-timeout", Fault::Timeout),
];
const BOUND: Duration = Duration::from_secs(180);

#[derive(Args)]
pub struct ChaosArgs {
    /// happy-1, happy-3, cancel, delete, or all (repeat the flag for several).
    #[arg(long, default_value = "happy-1")]
    workload: Vec<String>,
    /// P1..P6 (or their names), or all.
    #[arg(long, default_value = "all")]
    perturbation: Vec<String>,
    /// Run this many plans per workload, drawn with --seed from all of them; default: every plan.
    #[arg(long)]
    sample: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where violating plans are saved.
    #[arg(long, default_value = "chaos-failures")]
    failures: PathBuf,
    /// Run one saved plan file again (and its reference run).
    #[arg(long)]
    replay: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct SavedPlan {
    workload: String,
    perturbation: String,
    plan: Plan,
    violations: Vec<String>,
    /// The migration's last status and the controller's last log lines, to debug from the file alone.
    #[serde(default)]
    detail: String,
}

pub async fn run(args: ChaosArgs) -> Result<()> {
    let mut work: Vec<(String, Vec<(String, Plan)>)> = vec![];
    let workloads: Vec<String> = if args.workload.iter().any(|w| w == "all") {
        WORKLOADS.map(String::from).to_vec()
    } else {
        args.workload.clone()
    };
    if let Some(file) = &args.replay {
        let saved: SavedPlan = serde_json::from_slice(&std::fs::read(file)?)?;
        work.push((saved.workload, vec![(saved.perturbation, saved.plan)]));
    } else {
        for w in &workloads {
            anyhow::ensure!(
                WORKLOADS.contains(&w.as_str()),
                "unknown workload {w}: one of {WORKLOADS:?} or all"
            );
            work.push((w.clone(), vec![]));
        }
    }
    let lab = ChaosLab::start().await?;
    let mut failed = 0;
    for (workload, fixed) in work {
        let reference = lab.run(&workload, None, "reference").await?;
        anyhow::ensure!(
            reference.violations.is_empty(),
            "the fault-free run of {workload} broke: {:?}",
            reference.violations
        );
        println!(
            "{workload}: reference run {} in {:.1}s, {} controller writes, creates {:?}, deletes {:?}",
            reference.end,
            reference.seconds,
            reference.writes,
            reference.creates,
            reference.deletes
        );
        let plans = if fixed.is_empty() {
            plans(&args, reference.writes)
        } else {
            fixed
        };
        let mut per: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (i, (perturbation, plan)) in plans.iter().enumerate() {
            let mut record = lab.run(&workload, Some(*plan), &format!("{i}")).await?;
            record.violations.extend(compare(&reference, &record));
            let entry = per.entry(perturbation.clone()).or_default();
            entry.0 += 1;
            if record.violations.is_empty() {
                entry.1 += 1;
            } else {
                failed += 1;
                std::fs::create_dir_all(&args.failures)?;
                let file = args
                    .failures
                    .join(format!("{workload}-{:?}-{}.json", plan.fault, plan.write));
                let saved = SavedPlan {
                    workload: workload.clone(),
                    perturbation: perturbation.clone(),
                    plan: *plan,
                    violations: record.violations.clone(),
                    detail: record.detail.clone(),
                };
                std::fs::write(&file, serde_json::to_vec_pretty(&saved)?)?;
                println!(
                    "  VIOLATION {perturbation} write {}: {:?} (saved {})",
                    plan.write,
                    record.violations,
                    file.display()
                );
            }
        }
        for (perturbation, (plans, passed)) in per {
            println!(
                "{workload} {perturbation}: plans {plans}, passed {passed}, violations {}",
                plans - passed
            );
        }
    }
    lab.stop();
    anyhow::ensure!(failed == 0, "{failed} plan(s) violated an oracle");
    Ok(())
}

/// Every (perturbation, write) pair, or a seeded sample of them.
fn plans(args: &ChaosArgs, writes: usize) -> Vec<(String, Plan)> {
    let wanted = |name: &str| {
        args.perturbation
            .iter()
            .any(|p| p == "all" || name.starts_with(&format!("{p} ")) || name.ends_with(p.as_str()))
    };
    let mut all: Vec<(String, Plan)> = PERTURBATIONS
        .iter()
        .filter(|(name, _)| wanted(name))
        .flat_map(|(name, fault)| {
            (1..=writes as u32).map(move |write| {
                (
                    name.to_string(),
                    Plan {
                        fault: *fault,
                        write,
                    },
                )
            })
        })
        .collect();
    if let Some(n) = args.sample {
        let mut seed = args.seed;
        let mut sample = vec![];
        while sample.len() < n && !all.is_empty() {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            sample.push(all.remove((seed >> 33) as usize % all.len()));
        }
        all = sample;
    }
    all
}

/// What one run of a workload did and ended as.
#[derive(Debug, Default)]
struct Record {
    end: String,
    /// The migration's last reason and message, to say why a run ended elsewhere.
    why: String,
    detail: String,
    conditions: BTreeMap<String, String>,
    objects: BTreeMap<String, usize>,
    creates: BTreeMap<String, usize>,
    deletes: BTreeMap<String, usize>,
    writes: usize,
    seconds: f64,
    violations: Vec<String>,
}

/// The oracles that compare with the fault-free run.
fn compare(reference: &Record, run: &Record) -> Vec<String> {
    let mut v = vec![];
    if run.end != reference.end {
        v.push(format!(
            "ended {} ({}) instead of {}",
            run.end, run.why, reference.end
        ));
    }
    if run.conditions != reference.conditions {
        v.push(format!(
            "conditions {:?} instead of {:?}",
            run.conditions, reference.conditions
        ));
    }
    if run.objects != reference.objects {
        v.push(format!(
            "objects {:?} instead of {:?}",
            run.objects, reference.objects
        ));
    }
    if run.creates != reference.creates {
        v.push(format!(
            "creates {:?} instead of {:?}",
            run.creates, reference.creates
        ));
    }
    if run.deletes != reference.deletes {
        v.push(format!(
            "deletes {:?} instead of {:?}",
            run.deletes, reference.deletes
        ));
    }
    v
}

struct ChaosLab {
    state: LabState,
    ferry: PathBuf,
}

impl ChaosLab {
    async fn start() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("ferry-chaos-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let ferry = std::env::current_exe()?;
        let options = LabOptions {
            dir,
            tools: ferry_lab::tools::bin_dir()?,
            lifetime: Lifetime::TiedToThisProcess,
            standins: Some(ferry.clone()),
            demo_vms: true,
            controller: false,
        };
        let state = ferry_lab::up(&options).await?.into_state();
        ferry_lab::controller::apply_rbac(&state.tools, &state.kubeconfig)?;
        Ok(Self { state, ferry })
    }

    fn stop(&self) {
        let _ = ferry_lab::down(&self.state.dir);
        let _ = std::fs::remove_dir_all(&self.state.dir);
    }

    fn controller(&self, plan: Option<Plan>, log: &Path) -> Result<(ProcessRecord, u16)> {
        let kubeconfig = ferry_lab::controller::kubeconfig(&self.state.dir, &self.state.api_url)?;
        let port = process::free_port()?;
        let mut spec =
            ferry_lab::controller::component(&self.ferry, &kubeconfig, port, "ferry-chaos").spec;
        if let Some(plan) = plan {
            spec.env
                .push((PLAN_ENV.into(), serde_json::to_string(&plan)?));
        }
        Ok((
            process::start(&spec, log, Lifetime::TiedToThisProcess)?,
            port,
        ))
    }

    /// Runs `workload` under `plan` in a fresh namespace and records what happened; a crashed controller is
    /// restarted once, without the plan.
    async fn run(&self, workload: &str, plan: Option<Plan>, tag: &str) -> Result<Record> {
        let started = Instant::now();
        let client = self.state.client().await?;
        let ns = format!("chaos-{}-{tag}", workload.replace('-', ""));
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))?,
            )
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
        ferry_lab::demo::create_provider(&client, &self.state, &ns).await?;
        let vm = match workload {
            "happy-1" => "DC0_H0_VM0",
            "happy-3" => "DC0_H0_VM1",
            "cancel" => "DC0_C0_RP0_VM0",
            _ => "DC0_C0_RP0_VM1",
        };
        let session = ferry_vsphere::Session::connect(
            self.state
                .vcsim
                .as_ref()
                .context("no vcsim")?
                .connect_config(Duration::from_secs(30))?,
        )
        .await?;
        let source = ferry_vsphere::inventory::find_vm(
            &session,
            &ferry_vsphere::VmSelector::Name(vm.into()),
        )
        .await?;
        ferry_vsphere::power::power_on(&session, &source, Duration::from_secs(30)).await?;

        let log = self.state.dir.join(format!("chaos-{ns}.log"));
        let (mut controller, port) = self.controller(plan, &log)?;
        wait_ready(port).await?;
        let mut manifest = ferry_lab::demo::migration(&self.state, &ns, "m", vm);
        let hold = match workload {
            "cancel" => Some("Importing"),
            "delete" => Some("CreatingVM"),
            _ => None,
        };
        if let Some(hold) = hold {
            manifest["metadata"]["annotations"] =
                json!({"migration.platform.example/hold-before": hold});
        }
        ferry_lab::demo::apply(&client, &ns, manifest).await?;

        let api: Api<VirtualMachineMigration> = Api::namespaced(client.clone(), &ns);
        let mut record = Record::default();
        let (mut phases, mut restarted, mut acted) = (Vec::<Phase>::new(), false, false);
        let deadline = Instant::now() + BOUND;
        let end = loop {
            if Instant::now() > deadline {
                record.violations.push(format!(
                    "not terminal within {}s (phases {phases:?})",
                    BOUND.as_secs()
                ));
                break "Timeout".to_string();
            }
            if !controller.is_alive(&self.state.dir) {
                if restarted {
                    record
                        .violations
                        .push("the controller exited again without a fault".into());
                    break "ControllerDied".to_string();
                }
                restarted = true;
                let (again, port) = self.controller(None, &log.with_extension("restarted.log"))?;
                controller = again;
                wait_ready(port).await?;
            }
            let Some(m) = api.get_opt("m").await? else {
                break "Deleted".to_string();
            };
            let status = m.status.clone().unwrap_or_default();
            if let Some(p) = status.phase
                && phases.last() != Some(&p)
            {
                phases.push(p);
            }
            if hold.is_some() && !acted && status.reason.as_deref() == Some("Held") {
                acted = true;
                if workload == "cancel" {
                    api.patch(
                        "m",
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"spec": {"cancel": true}})),
                    )
                    .await?;
                } else {
                    api.delete("m", &DeleteParams::default()).await?;
                }
            }
            // Never both running: the target's VMI runs only while the source is off.
            if matches!(status.phase, Some(Phase::ValidatingGuest))
                && ferry_vsphere::power::current_power_state(&session, &source).await?
                    == PowerState::PoweredOn
            {
                record
                    .violations
                    .push("the source and the target ran at the same time".into());
            }
            record.why = format!(
                "{}: {}",
                status.reason.clone().unwrap_or_default(),
                status.message.clone().unwrap_or_default()
            );
            if let Some(p) = status.phase.filter(|p| p.is_terminal()) {
                if p == Phase::Succeeded
                    && status.power.as_ref().and_then(|p| p.original) != Some(PowerState::PoweredOn)
                {
                    record
                        .violations
                        .push("the original power state was not recorded".into());
                }
                record.conditions = status
                    .conditions
                    .iter()
                    .map(|c| (c.type_.clone(), c.status.clone()))
                    .collect();
                break format!("{p:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        record.end = end;
        record.seconds = started.elapsed().as_secs_f64();
        if !phases_move_forward(&phases) {
            record
                .violations
                .push(format!("the phase went back: {phases:?}"));
        }
        // Then quiet: no write at all for 3 s once the finalizer had a second to go.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = self.audit(&ns).len();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let audit = self.audit(&ns);
        if audit.len() != before {
            record
                .violations
                .push(format!("{} write(s) after the end", audit.len() - before));
        }
        record.writes = audit.len();
        for (verb, resource, code) in &audit {
            let counted = match verb.as_str() {
                "create" => Some(&mut record.creates),
                "delete" => Some(&mut record.deletes),
                _ => None,
            };
            if let Some(map) = counted
                && (200..300).contains(code)
                && resource != "events"
            {
                *map.entry(resource.clone()).or_default() += 1;
            }
        }
        for (kind, resource) in [
            ("VirtualMachine", ferry_controller::build::vm_resource()),
            ("DataVolume", ferry_controller::build::dv_resource()),
        ] {
            let n = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &resource)
                .list(&ListParams::default())
                .await?
                .items
                .len();
            record.objects.insert(kind.into(), n);
        }
        let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await?;
        record.objects.insert("Job".into(), jobs.items.len());
        if let Some(m) = api.get_opt("m").await?
            && !m.finalizers().is_empty()
        {
            record
                .violations
                .push("the finalizer stayed after the end".into());
        }
        let logs = std::fs::read_to_string(&log).unwrap_or_default()
            + &std::fs::read_to_string(log.with_extension("restarted.log")).unwrap_or_default();
        let last_status = api
            .get_opt("m")
            .await?
            .map(|m| serde_json::to_string_pretty(&m.status).unwrap_or_default());
        let tail: Vec<&str> = logs.lines().rev().take(60).collect();
        record.detail = format!(
            "{}\n{}",
            last_status.unwrap_or_default(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
        if logs.contains("panicked") {
            record.violations.push("the controller panicked".into());
        }
        let _ = process::stop(&controller, Duration::from_secs(5));
        session.logout().await;
        let _ = namespaces.delete(&ns, &DeleteParams::background()).await;
        Ok(record)
    }

    /// The controller's writes in `ns`: (verb, resource, HTTP code), from the API server's audit log.
    fn audit(&self, ns: &str) -> Vec<(String, String, i64)> {
        let log = std::fs::read_to_string(self.state.dir.join("audit.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|e| {
                e["stage"] == "ResponseComplete"
                    && e["user"]["username"] == ferry_lab::controller::SERVICE_ACCOUNT
            })
            .filter(|e| e["objectRef"]["namespace"] == ns)
            .filter(|e| {
                matches!(
                    e["verb"].as_str(),
                    Some("create" | "update" | "patch" | "delete")
                )
            })
            .map(|e| {
                (
                    e["verb"].as_str().unwrap_or_default().to_string(),
                    e["objectRef"]["resource"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    e["responseStatus"]["code"].as_i64().unwrap_or_default(),
                )
            })
            .collect()
    }
}

async fn wait_ready(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-fsS", &format!("http://127.0.0.1:{port}/readyz")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .await?;
        if ok {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller did not lead within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The checkpoints only move forward; Failed, ManualInterventionRequired, Cancelling and Cancelled are exits.
fn phases_move_forward(phases: &[Phase]) -> bool {
    let rank = |p: &Phase| Phase::CHECKPOINTS.iter().position(|c| c == p);
    let ranks: Vec<usize> = phases.iter().filter_map(rank).collect();
    ranks.windows(2).all(|w| w[0] <= w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_must_not_go_back() {
        assert!(phases_move_forward(&[
            Phase::Discovering,
            Phase::Validating,
            Phase::Cancelling,
            Phase::Cancelled
        ]));
        assert!(!phases_move_forward(&[
            Phase::Converting,
            Phase::Validating
        ]));
    }
}
