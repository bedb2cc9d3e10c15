//! The floor: N migrations as a straight-line script would run them, with no controller. Each creates the same
//! objects Ferry creates, from the same builders, waits for the same real work (conversion and verification Jobs,
//! CDI imports, the VMI), and writes status once per checkpoint it passes. No reconcile, no retry, no second
//! look (but a create whose admission webhook timed out, as KubeVirt's and CDI's may under a thousand creates at
//! once, is sent again, as any script would): what is left of Ferry's wall time over this is the controller's own
//! cost.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use ferry_api::foreign::{dv_resource, vm_resource, vmi_resource};
use ferry_api::{Phase, Provider, VirtualMachineMigration, VirtualMachineMigrationStatus};
use ferry_controller::surface::{
    Actions, DvState, JobState, build, children, discover, dv_state, staged_objects,
};
use ferry_datapath::report::JobReport;
use ferry_vsphere::Session;
use ferry_vsphere::soap::MoRef;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::watch::Watched;

/// Creates `object`, sending it again while an admission webhook's call times out (at most 6 tries).
async fn create_admitted(api: &Api<DynamicObject>, object: &DynamicObject) -> Result<()> {
    let mut pause = Duration::from_secs(1);
    for _ in 1..6 {
        match api.create(&PostParams::default(), object).await {
            Err(kube::Error::Api(e))
                if e.code == 500 && e.message.contains("failed calling webhook") =>
            {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return Ok(other.map(drop)?),
        }
    }
    api.create(&PostParams::default(), object).await?;
    Ok(())
}

/// One child may take this long (a thousand of them queue for the node's pod slots).
const CHILD_TIMEOUT: Duration = Duration::from_secs(1800);

pub struct Floor {
    client: kube::Client,
    actions: Actions,
    session: Session,
    ns: String,
    provider: Provider,
    jobs: Watched<Job>,
    dvs: Watched<DynamicObject>,
    vmis: Watched<DynamicObject>,
}

impl Floor {
    pub async fn new(client: kube::Client, session: Session, ns: &str) -> Result<Self> {
        let provider = Api::<Provider>::namespaced(client.clone(), ns)
            .get(ferry_lab::vsphere::demo::PROVIDER)
            .await?;
        let dynamic = |r: kube::core::ApiResource| {
            Watched::with(Api::namespaced_with(client.clone(), ns, &r), r)
        };
        Ok(Self {
            jobs: Watched::new(Api::namespaced(client.clone(), ns)),
            dvs: dynamic(dv_resource()),
            vmis: dynamic(vmi_resource()),
            actions: Actions::new(client.clone()),
            client,
            session,
            ns: ns.to_string(),
            provider,
        })
    }

    /// Runs one migration of `vm` (`manifest` is the VirtualMachineMigration) from creation to Succeeded.
    pub async fn migrate(&self, manifest: serde_json::Value, vm: &MoRef) -> Result<Duration> {
        let started = Instant::now();
        let api: Api<VirtualMachineMigration> = Api::namespaced(self.client.clone(), &self.ns);
        let mut vmm = api
            .create(&PostParams::default(), &serde_json::from_value(manifest)?)
            .await?;
        let name = vmm.name_any();

        let info = ferry_vsphere::inventory::describe_vm(&self.session, vm).await?;
        let source = discover::source_status(&info, self.session.about().instance_uuid.clone());
        // As Ferry does before a power operation: the moref still names the VM found.
        ferry_vsphere::inventory::instance_uuid(&self.session, vm).await?;
        ferry_vsphere::power::power_off(&self.session, vm, Duration::from_secs(120)).await?;
        let mut status = VirtualMachineMigrationStatus {
            disks: discover::disks(&source),
            source: Some(source.clone()),
            target_vm: Some(children::vm_name(&vmm)),
            ..Default::default()
        };
        vmm.status = Some(status.clone());
        self.record(&name, Phase::Converting, &status).await?;

        let convert = build::convert_job(&vmm, &source, &self.provider, 1, &self.worker_image());
        self.actions.create_job(&self.ns, &convert).await?;
        let report = self.job_result(&vmm, &convert.name_any()).await?;
        let staged = self
            .actions
            .converted_disks(
                &vmm,
                &status.disks,
                &build::source_vm_uuid(&source),
                report,
                &convert.name_any(),
            )
            .await?;
        for (disk, found) in status.disks.iter_mut().zip(&staged) {
            disk.staged_url = Some(found.staged.url.clone());
            disk.sha256 = Some(found.staged.source_sha256.clone());
            disk.bytes_moved = found.bytes_read as i64;
        }
        vmm.status = Some(status.clone());
        self.record(&name, Phase::Importing, &status).await?;

        let dvs =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &dv_resource());
        // The staging CA the DataVolumes name, as the import checkpoint creates it.
        if let Some(ca) = build::staging_ca(&vmm) {
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(self.client.clone(), &self.ns)
                .create(&PostParams::default(), &ca)
                .await?;
        }
        for disk in &mut status.disks {
            let dv =
                build::data_volume(&vmm, disk, &Default::default()).context("a staged disk")?;
            create_admitted(&dvs, &dv).await?;
            self.dvs
                .until(
                    &self.ns,
                    &dv.name_any(),
                    CHILD_TIMEOUT,
                    |d| match dv_state(Some(d)) {
                        DvState::Succeeded => Some(Ok(())),
                        DvState::Failed { message } => Some(Err(message)),
                        _ => None,
                    },
                )
                .await?
                .map_err(|m| anyhow::anyhow!("DataVolume {}: {m}", dv.name_any()))?;
            let verify = build::verify_job(
                &vmm,
                disk.index,
                1,
                disk.sha256.as_deref().unwrap_or_default(),
                disk.capacity_bytes,
                &self.worker_image(),
            );
            self.actions.create_job(&self.ns, &verify).await?;
            self.job_result(&vmm, &verify.name_any()).await?;
            disk.data_volume = Some(dv.name_any());
            disk.verified = true;
        }
        self.record(&name, Phase::CreatingVm, &status).await?;

        let mut target = build::virtual_machine(&vmm, &source);
        target.data["spec"]["runStrategy"] = json!("Always");
        let vms =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &vm_resource());
        create_admitted(&vms, &target).await?;
        self.record(&name, Phase::ValidatingGuest, &status).await?;
        self.vmis
            .until(&self.ns, &target.name_any(), CHILD_TIMEOUT, |vmi| {
                let conditions = vmi.data["status"]["conditions"].as_array()?;
                let up = |kind: &str| {
                    conditions
                        .iter()
                        .any(|c| c["type"] == kind && c["status"] == "True")
                };
                (up("Ready") && up("AgentConnected")).then_some(())
            })
            .await?;

        self.hand_over(&vmm, &vms, &dvs, &status).await?;
        self.record(&name, Phase::Succeeded, &status).await?;
        Ok(started.elapsed())
    }

    fn worker_image(&self) -> String {
        self.actions.worker_image()
    }

    /// The Job's result, once it finished; a failed Job fails the floor (it has no retries).
    async fn job_result(&self, vmm: &VirtualMachineMigration, name: &str) -> Result<JobReport> {
        self.jobs
            .until(&self.ns, name, CHILD_TIMEOUT, |job| {
                let conditions = job.status.as_ref()?.conditions.as_ref()?;
                conditions
                    .iter()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
                    .then_some(())
            })
            .await?;
        match self.actions.observe_job(vmm, name).await? {
            JobState::Succeeded(result) => Ok(result),
            other => bail!("Job {name}: {other:?}"),
        }
    }

    async fn record(
        &self,
        name: &str,
        phase: Phase,
        status: &VirtualMachineMigrationStatus,
    ) -> Result<()> {
        let mut status = status.clone();
        status.phase = Some(phase);
        Api::<VirtualMachineMigration>::namespaced(self.client.clone(), &self.ns)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await?;
        Ok(())
    }

    /// What Ferry does once the guest answered: the VM and disks released, the Jobs and staged images removed.
    async fn hand_over(
        &self,
        vmm: &VirtualMachineMigration,
        vms: &Api<DynamicObject>,
        dvs: &Api<DynamicObject>,
        status: &VirtualMachineMigrationStatus,
    ) -> Result<()> {
        let release = children::release_patch(vmm);
        vms.patch(
            &children::vm_name(vmm),
            &PatchParams::default(),
            &Patch::Merge(&release),
        )
        .await?;
        for disk in &status.disks {
            let name = children::data_volume(vmm, disk.index);
            dvs.patch(&name, &PatchParams::default(), &Patch::Merge(&release))
                .await?;
            self.actions
                .delete_job(vmm, &children::verify_job(vmm, disk.index, 1))
                .await?;
        }
        self.actions
            .delete_job(vmm, &children::convert_job(vmm, 1))
            .await?;
        let staging = self.actions.open_staging(vmm).await?;
        for object in staged_objects(status.disks.len()) {
            staging.delete(&object).await?;
        }
        Ok(())
    }
}
