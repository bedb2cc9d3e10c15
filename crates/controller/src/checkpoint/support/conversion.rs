//! The conversion Job, which both routes run: its spec says whether it stages the disks or writes the volumes.

use kube::ResourceExt;

use super::{credentials, jobs, source};
use crate::build;
use crate::checkpoint::step::Step;
use crate::error::Result;

/// Creates attempt `attempt`'s conversion Job for the disks discovery recorded, once the source is shown to be
/// the VM discovery found.
pub async fn create_job(step: &Step<'_>, attempt: i32) -> Result<()> {
    let provider = source::provider(step.ctx, step.vmm).await?;
    let session = source::session_for(step.ctx, &provider).await?;
    source::checked_source_vm(&session, step.status).await?;
    credentials::lend(step.ctx, step.vmm, &provider).await?;
    let source = source::recorded(step.status)?;
    let job = build::job::convert_job(
        step.vmm,
        &source,
        &provider,
        attempt,
        &step.ctx.config.worker_image,
    );
    jobs::create(step.ctx, &step.vmm.namespace().unwrap_or_default(), &job).await
}
