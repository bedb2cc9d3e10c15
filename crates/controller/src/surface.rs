//! What other crates may use of the controller, chosen on purpose; everything else is private to it.
//!
//! The control-plane benchmark's floor does a migration's work as a straight-line script with the controller's
//! own builders, names and child operations, so that the two runs differ only in how the work is driven. The
//! views, the demo and the chaos harness read progress and child states the way the controller does. Running the
//! controller itself goes through [`crate::run`], [`crate::RunOptions`], [`crate::Config`] and [`crate::client`].
//!
//! The Kubernetes kinds of CDI and KubeVirt (`dv_resource`, `vm_resource`, `vmi_resource`) live in
//! [`ferry_api::foreign`], and every label, annotation and field manager in [`ferry_api::keys`].

use ferry_api::{DiskStatus, VirtualMachineMigration};
use ferry_datapath::DiskResult;
use ferry_datapath::report::JobReport;
use ferry_datapath::staging::Staging;
use k8s_openapi::api::batch::v1::Job;

use crate::checkpoint::jobs;
use crate::context::Context;

pub use crate::checkpoint::adapt::describe_interface_names;
pub use crate::checkpoint::jobs::JobState;
pub use crate::checkpoint::support::volumes::{DvState, dv_state};
/// The itinerary: the checkpoints in order, and the phases a migration moves forward through.
pub use crate::checkpoint::{CHECKPOINTS, Checkpoint, Route, itinerary, phases};
pub use crate::error::Failure;
pub use crate::slots::{most_at_once, source_reads};
pub use crate::status::{disk_fraction, progress_bytes};

/// The pure builders of what a migration creates, as the checkpoints build them.
pub mod build {
    pub use crate::build::adapt_job::adapt_spec;
    pub use crate::build::datavolume::{data_volume, staging_ca};
    pub use crate::build::job::{convert_job, source_vm_uuid, verify_job};
    pub use crate::build::vm::virtual_machine;
}

/// The names of a migration's children, and the patch that hands one over to its user.
pub mod children {
    pub use crate::children::{convert_job, data_volume, release_patch, verify_job, vm_name};
}

/// What the discovery checkpoint records of a source VM.
pub mod discover {
    pub use crate::checkpoint::discover::{disks, source_status};
}

/// Every object name the conversion Job may have written to staging for `disks` disks, in either format.
pub use crate::staging::object_names as staged_objects;

/// The controller's own child operations (Jobs and the staging store) without a running controller, with the
/// default [`crate::Config`].
pub struct Actions {
    ctx: Context,
}

impl Actions {
    pub fn new(client: kube::Client) -> Self {
        Self {
            ctx: Context::new(client, Default::default(), Default::default()),
        }
    }

    /// A session to `provider`'s vCenter with the credentials of its Secret, as the controller logs in.
    pub async fn provider_session(
        &self,
        provider: &ferry_api::Provider,
    ) -> Result<ferry_vsphere::Session, Failure> {
        self.ctx.session(provider).await
    }

    /// The worker image the Jobs run, as the controller's default configuration names it.
    pub fn worker_image(&self) -> String {
        self.ctx.config.worker_image.clone()
    }

    /// Creates the Job; one of the same name already there counts as created.
    pub async fn create_job(&self, ns: &str, job: &Job) -> Result<(), Failure> {
        jobs::create(&self.ctx, ns, job).await
    }

    /// The state of `vmm`'s Job `name`, and the result its pod left in the termination message.
    pub async fn observe_job(
        &self,
        vmm: &VirtualMachineMigration,
        name: &str,
    ) -> Result<JobState, Failure> {
        jobs::observe(&self.ctx, vmm, name).await
    }

    /// The disks a successful conversion Job staged (its `report`), read from their manifests in staging.
    pub async fn converted_disks(
        &self,
        vmm: &VirtualMachineMigration,
        disks: &[DiskStatus],
        vm_uuid: &str,
        report: JobReport,
        job: &str,
    ) -> Result<Vec<DiskResult>, Failure> {
        crate::staging::converted(&self.ctx, vmm, disks, vm_uuid, report, job).await
    }

    /// Deletes the migration's Job if it is present.
    pub async fn delete_job(
        &self,
        vmm: &VirtualMachineMigration,
        name: &str,
    ) -> Result<(), Failure> {
        jobs::delete(&self.ctx, vmm, name).await
    }

    /// The migration's folder in the staging store, opened with the keys of its Secret.
    pub async fn open_staging(&self, vmm: &VirtualMachineMigration) -> Result<Staging, Failure> {
        crate::staging::open(&self.ctx, vmm).await
    }
}
