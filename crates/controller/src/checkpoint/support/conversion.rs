//! The conversion Job, which both routes run: its spec says whether it stages the disks, writes the volumes, or
//! runs one round of a warm migration.

use ferry_api::Provider;
use ferry_datapath::spec::RoundSpec;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use super::{credentials, jobs, source};
use crate::build;
use crate::checkpoint::step::Step;
use crate::error::Result;

/// Creates attempt `attempt`'s conversion Job for the disks discovery recorded, once the source is shown to be
/// the VM discovery found.
pub async fn create_job(step: &Step<'_>, attempt: i32) -> Result<()> {
    create(step, |provider, source, image| {
        build::job::convert_job(step.vmm, source, provider, attempt, image)
    })
    .await
}

/// Creates Job `name`, which runs a warm migration's `round`, once the source is shown to be the VM discovery
/// found.
pub async fn create_round_job(step: &Step<'_>, name: &str, round: RoundSpec) -> Result<()> {
    create(step, |provider, source, image| {
        build::job::round_job(step.vmm, source, provider, name, image, round)
    })
    .await
}

async fn create(
    step: &Step<'_>,
    build: impl FnOnce(&Provider, &ferry_api::SourceVmStatus, &str) -> Job,
) -> Result<()> {
    let provider = source::provider(step.ctx, step.vmm).await?;
    let session = source::session_for(step.ctx, &provider).await?;
    source::checked_source_vm(&session, step.status).await?;
    credentials::lend(step.ctx, step.vmm, &provider).await?;
    let source = source::recorded(step.status)?;
    let job = build(&provider, &source, &step.ctx.config.worker_image);
    jobs::create(step.ctx, &step.vmm.namespace().unwrap_or_default(), &job).await
}
