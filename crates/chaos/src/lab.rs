//! One chaos lab and one run of a workload in it: a fresh namespace, a controller under the trial's plan
//! (restarted once, without it, if the plan crashed it), the person's actions, and what the run left behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferry_api::Provider;
use ferry_api::keys::HOLD_ANNOTATION;
use ferry_controller::chaos::{Fault, FaultPlan, PLAN_ENV};
use ferry_lab::control_plane::process::{self, Lifetime, ProcessRecord};
use ferry_lab::{LabOptions, LabState};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::children::Children;
use super::oracles::Record;
use super::plans::Trial;
use super::run::Run;
use super::under_test::{ControllerUnderTest, Pause, wait_ready};
use super::workload::{MISSPELLED_SECRET, PLAN_HOST_LIMIT, Workload};

/// The plan workload's MigrationPlan.
pub const PLAN: &str = "p";

/// A run must end within this.
pub const BOUND: Duration = Duration::from_secs(180);

pub struct ChaosLab {
    pub state: LabState,
    ferry: PathBuf,
}

impl ChaosLab {
    pub async fn start(index: usize) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("ferry-chaos-{}-{index}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let ferry = std::env::current_exe()?;
        let options = LabOptions {
            dir,
            tools: ferry_lab::control_plane::tools::bin_dir()?,
            lifetime: Lifetime::TiedToThisProcess,
            standins: Some(ferry.clone()),
            demo_vms: true,
            controller: false,
            vcsim_vms: ferry_lab::lab::DEFAULT_VCSIM_VMS,
            boot_guests: true,
            // As `ferry lab up`: sessions that idle out, the datacenter in a folder, `/folder` behind sessions.
            // With Changed Block Tracking, for the warm workload.
            vcsim_realism: ferry_lab::lab::VcsimRealism {
                cbt: true,
                ..ferry_lab::lab::VcsimRealism::production_like()
            },
            compress_staging: false,
            real_node: None,
            real_kubevirt: false,
        };
        let state = ferry_lab::up(&options).await?.into_state();
        ferry_lab::control_plane::controller_process::apply_rbac(&state.tools, &state.kubeconfig)?;
        Ok(Self { state, ferry })
    }

    pub fn stop(&self) {
        let _ = ferry_lab::down(&self.state.dir);
        let _ = std::fs::remove_dir_all(&self.state.dir);
    }

    pub fn controller(&self, plan: Option<FaultPlan>, log: &Path) -> Result<(ProcessRecord, u16)> {
        let kubeconfig = ferry_lab::control_plane::controller_process::kubeconfig(
            &self.state.dir,
            &self.state.api_url,
        )?;
        let port = process::free_port()?;
        let mut spec = ferry_lab::control_plane::controller_process::component(
            &self.ferry,
            &kubeconfig,
            port,
            "ferry-chaos",
        )
        .spec;
        if let Some(plan) = plan {
            spec.env
                .push((PLAN_ENV.into(), serde_json::to_string(&plan)?));
        }
        Ok((
            process::start(&spec, log, Lifetime::TiedToThisProcess)?,
            port,
        ))
    }

    /// Runs `workload` under `trial` (none: the fault-free reference) in a fresh namespace.
    pub async fn run(
        &self,
        workload: &Workload,
        trial: Option<&Trial>,
        tag: &str,
    ) -> Result<Record> {
        let mut run = self.set_up(workload, trial, tag).await?;
        let end = run.drive(self).await?;
        run.finish(self, end).await?;
        run.judge(self).await?;
        let Run {
            mut record,
            controller,
            client,
            session,
            ns,
            ..
        } = run;
        controller.stop().await;
        // A controller stopped gracefully hands its lease back, so a successor leads at once.
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client.clone(), "ferry-system");
        if let Some(holder) = leases
            .get_opt("ferry-controller")
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
        {
            record.violations.push(format!(
                "the lease was still held by {holder} after a graceful stop"
            ));
        }
        session.logout().await;
        let namespaces: Api<Namespace> = Api::all(client);
        let _ = namespaces.delete(&ns, &DeleteParams::background()).await;
        Ok(record)
    }

    /// A fresh namespace with the Provider (and the trial's lab fault), the source powered on, the controller
    /// leading under the plan, and the migration applied.
    async fn set_up(&self, workload: &Workload, trial: Option<&Trial>, tag: &str) -> Result<Run> {
        let started = Instant::now();
        let client = self.state.client().await?;
        let ns = format!("chaos-{}-{tag}", workload.slug());
        // Only this run's part of the audit log is read: it grows with every run.
        let audit_from = std::fs::metadata(self.state.dir.join("audit.log")).map_or(0, |m| m.len());
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))?,
            )
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
        ferry_lab::vsphere::demo::create_provider(&client, &self.state, &ns).await?;
        if let Some(fault) = trial.and_then(|t| t.lab_fault.as_ref()) {
            let switch: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": "lab-faults"},
                "data": {fault.key.clone(): "1", format!("{}-selector", fault.key): fault.selector},
            }))?;
            Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .create(&PostParams::default(), &switch)
                .await?;
        }
        let vcsim = self.state.vcsim.as_ref().context("no vcsim")?;
        let session =
            ferry_vsphere::Session::connect(vcsim.connect_config(Duration::from_secs(30))?).await?;
        let mut sources = BTreeMap::new();
        for vm in workload.vms() {
            let source = ferry_vsphere::inventory::find_vm(
                &session,
                &ferry_vsphere::VmSelector::Name(vm.into()),
            )
            .await?;
            ferry_vsphere::power::power_on(&session, &source, Duration::from_secs(30)).await?;
            sources.insert(vm.to_string(), source);
        }
        let calls_file = self.state.dir.join(ferry_lab::vsphere::vcsim::CALLS_FILE);
        let calls_before = std::fs::read_to_string(&calls_file)
            .unwrap_or_default()
            .len();

        // Always a plan, so that the controller logs its vSphere calls; the reference injects nothing.
        let plan = trial.and_then(|t| t.plan).unwrap_or(FaultPlan {
            fault: Fault::Observe,
            at: 0,
        });
        let log = self.state.dir.join(format!("chaos-{ns}.log"));
        let (started_controller, port) = self.controller(Some(plan), &log)?;
        let controller = ControllerUnderTest(Some(started_controller));
        wait_ready(port, &log, &controller, &self.state.dir).await?;
        let manifest = match workload.plan {
            Some(vms) => {
                let limits =
                    json!({"spec": {"limits": {"maxConcurrentDisksPerHost": PLAN_HOST_LIMIT}}});
                Api::<Provider>::namespaced(client.clone(), &ns)
                    .patch(
                        ferry_lab::vsphere::demo::PROVIDER,
                        &PatchParams::default(),
                        &Patch::Merge(&limits),
                    )
                    .await?;
                plan_manifest(&self.state, &ns, vms)
            }
            None => migration_manifest(&self.state, workload, &ns),
        };
        ferry_lab::vsphere::demo::apply(&client, &ns, manifest).await?;
        Ok(Run {
            workload: workload.clone(),
            trial: trial.cloned(),
            plan,
            api: Api::namespaced(client.clone(), &ns),
            children: Children::new(&client, &ns),
            client,
            ns,
            session,
            sources,
            log,
            controller,
            pause: Pause::default(),
            record: Record::default(),
            phases: BTreeMap::new(),
            restarted: false,
            uids: BTreeMap::new(),
            vm_of: BTreeMap::new(),
            corrected: false,
            started,
            deadline: Instant::now() + Self::bound(workload),
            audit_from,
            calls_file,
            calls_before,
        })
    }

    /// The deadline: a plan's VMs take their turns on their host.
    fn bound(workload: &Workload) -> Duration {
        BOUND * workload.vms().len() as u32
    }

    /// The controller's writes in `ns`: (verb, resource, HTTP code), from the API server's audit log from byte
    /// `from` on.
    pub fn audit(&self, ns: &str, from: u64) -> Vec<(String, String, i64)> {
        use std::io::{Read, Seek, SeekFrom};
        let mut log = Vec::new();
        if let Ok(mut file) = std::fs::File::open(self.state.dir.join("audit.log")) {
            let _ = file.seek(SeekFrom::Start(from));
            let _ = file.read_to_end(&mut log);
        }
        // Lossy: a line torn by the API server's append in progress must not cost the whole log.
        String::from_utf8_lossy(&log)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|e| {
                e["stage"] == "ResponseComplete"
                    && e["user"]["username"]
                        == ferry_lab::control_plane::controller_process::SERVICE_ACCOUNT
                    && e["objectRef"]["namespace"] == ns
                    && matches!(
                        e["verb"].as_str(),
                        Some("create" | "update" | "patch" | "delete")
                    )
            })
            .map(|e| {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                (
                    text(&e["verb"]),
                    text(&e["objectRef"]["resource"]),
                    e["responseStatus"]["code"].as_i64().unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// The migration `m` of the workload's VM, as the person in it first writes it.
fn migration_manifest(state: &LabState, workload: &Workload, ns: &str) -> serde_json::Value {
    let mut manifest = if workload.staged {
        ferry_lab::vsphere::demo::staged_migration(state, ns, "m", workload.vm)
    } else {
        ferry_lab::vsphere::demo::migration(state, ns, "m", workload.vm)
    };
    if let Some((_, hold)) = &workload.act {
        manifest["metadata"]["annotations"] = json!({HOLD_ANNOTATION: hold});
    }
    if workload.bad_spec {
        manifest["spec"]["staging"]["secretRef"]["name"] = json!(MISSPELLED_SECRET);
    }
    if workload.warm {
        manifest["spec"]["warm"] =
            json!({"precopyIntervalSeconds": 60, "cutover": true, "enableChangeTracking": true});
    }
    manifest
}

/// The plan `p` of `vms`, with the lab migration's networks and guest check, all in flight at once.
fn plan_manifest(state: &LabState, ns: &str, vms: &[&str]) -> serde_json::Value {
    let single = &ferry_lab::vsphere::demo::migration(state, ns, PLAN, vms[0])["spec"];
    let listed: Vec<_> = vms.iter().map(|vm| json!({"name": vm})).collect();
    json!({
        "apiVersion": ferry_api::API_VERSION, "kind": "MigrationPlan",
        "metadata": {"name": PLAN, "namespace": ns},
        "spec": {
            "providerRef": {"name": ferry_lab::vsphere::demo::PROVIDER}, "vms": listed, "maxInFlight": vms.len(),
            "restorePowerState": true, "target": single["target"], "guestCheck": single["guestCheck"],
        },
    })
}
