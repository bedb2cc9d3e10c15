//! The migration's folder in the staging store, opened with keys read from its Secret (by name, in memory only).

use ferry_api::{DiskFormat, Reason, VirtualMachineMigration};
use ferry_datapath::spec::StagingSpec;
use ferry_datapath::staging::{Staging, object_name};
use kube::ResourceExt;

use crate::children;
use crate::context::Context;
use crate::error::{Failure, Result};

pub async fn open(ctx: &Context, vmm: &VirtualMachineMigration) -> Result<Staging> {
    let url = children::staging_url(vmm);
    if !url.starts_with("s3://") {
        return Err(Failure::permanent(
            Reason::StagingUnsupported,
            format!(
                "staging {} is not s3://: CDI imports staged disks over S3 (use s3://bucket/prefix and, outside AWS, \
                 spec.staging.endpoint)",
                vmm.spec.staging.url
            ),
        ));
    }
    let secret = vmm.spec.staging.secret_ref.as_ref().ok_or_else(|| {
        Failure::permanent(
            Reason::StagingSecretMissing,
            "s3 staging needs spec.staging.secretRef",
        )
    })?;
    let ns = vmm.namespace().unwrap_or_default();
    let access = ctx.secret_value(&ns, &secret.name, "accessKeyId").await?;
    let key = ctx.secret_value(&ns, &secret.name, "secretKey").await?;
    let spec = StagingSpec {
        url,
        credentials_dir: None,
        endpoint: vmm.spec.staging.endpoint.clone(),
        region: None,
    };
    Ok(Staging::open_with_keys(&spec, access, key)?)
}

/// Every object name the conversion Job may have written for the migration's disks, in either format.
pub fn object_names(disks: usize) -> Vec<String> {
    (0..disks as u32)
        .flat_map(|i| [DiskFormat::Raw, DiskFormat::Qcow2].map(|format| object_name(i, format)))
        .collect()
}
