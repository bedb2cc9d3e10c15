//! Everything a migration created in its namespace, found by its UID label: deleted on cleanup, handed over on
//! success.

use k8s_openapi::api::batch::v1::Job;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};

use crate::build::{dv_resource, vm_resource};
use crate::children;
use crate::context::Context;
use crate::error::Result;
use ferry_api::VirtualMachineMigration;

pub struct Owned<'a> {
    ctx: &'a Context,
    vmm: &'a VirtualMachineMigration,
    ns: String,
    selector: ListParams,
}

impl<'a> Owned<'a> {
    pub fn of(ctx: &'a Context, vmm: &'a VirtualMachineMigration) -> Self {
        Self {
            ctx,
            vmm,
            ns: vmm.namespace().unwrap_or_default(),
            selector: ListParams::default().labels(&children::uid_selector(vmm)),
        }
    }

    /// The kinds a user keeps after the hand-over: the VirtualMachine and its DataVolumes.
    fn kept_kinds(&self) -> [Api<DynamicObject>; 2] {
        [vm_resource(), dv_resource()]
            .map(|resource| Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource))
    }

    /// Deletes the VM and DataVolumes not already being deleted; how many there were.
    pub async fn delete_kept_kinds(&self) -> Result<usize> {
        let mut found = 0;
        for api in self.kept_kinds() {
            for object in api.list(&self.selector).await? {
                // Our label alone could be copied onto anything: only what we own is ours to delete.
                if !children::is_ours(&object, self.vmm) {
                    continue;
                }
                found += 1;
                if object.metadata.deletion_timestamp.is_none() {
                    let uid = object.uid().unwrap_or_default();
                    ferry_kube::delete::delete_exactly(&api, &object.name_any(), &uid).await?;
                }
            }
        }
        Ok(found)
    }

    /// Hands the VM and DataVolumes over: no owner, none of our labels (so cleanup never finds them again).
    pub async fn release_kept_kinds(&self) -> Result<()> {
        let release = children::release_patch(self.vmm);
        for api in self.kept_kinds() {
            for object in api.list(&self.selector).await? {
                let patch = Patch::Merge(&release);
                api.patch(&object.name_any(), &PatchParams::default(), &patch)
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes the Jobs (conversion, verification) not already being deleted; how many there were.
    pub async fn delete_jobs(&self) -> Result<usize> {
        let jobs = Api::<Job>::namespaced(self.ctx.client.clone(), &self.ns);
        let listed = jobs.list(&self.selector).await?;
        let mut found = 0;
        for job in listed.iter().filter(|j| children::is_ours(*j, self.vmm)) {
            found += 1;
            if job.metadata.deletion_timestamp.is_none() {
                delete_job(&jobs, job).await?;
            }
        }
        Ok(found)
    }
}

/// Deletes `job`, one of ours just read, unless it has been replaced since.
pub async fn delete_job(jobs: &Api<Job>, job: &Job) -> Result<()> {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    Ok(ferry_kube::delete::delete_exactly(jobs, &job.name_any(), uid).await?)
}
