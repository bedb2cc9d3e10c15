//! The migration's folder in the staging store, opened with keys read from its Secret (by name, in memory only),
//! and the conversion's results read back from it: each staged disk's manifest.

use ferry_api::{DiskFormat, DiskStatus, Reason, VirtualMachineMigration};
use ferry_datapath::DiskResult;
use ferry_datapath::report::{JobReport, StagedSummary};
use ferry_datapath::spec::StagingSpec;
use ferry_datapath::staging::{StagedObject, Staging, object_name};
use kube::ResourceExt;

use crate::children;
use crate::context::Context;
use crate::error::{Failure, Result};

/// Whether the migration stages its disks (`spec.staging`), or writes them into the volumes directly.
pub fn staged(vmm: &VirtualMachineMigration) -> bool {
    vmm.spec.staging.is_some()
}

pub async fn open(ctx: &Context, vmm: &VirtualMachineMigration) -> Result<Staging> {
    let (Some(url), Some(staging)) = (children::staging_url(vmm), vmm.spec.staging.as_ref()) else {
        return Err(Failure::permanent(
            Reason::StagingUnsupported,
            "this migration writes its volumes directly: it has no spec.staging",
        ));
    };
    if !url.starts_with("s3://") {
        return Err(Failure::permanent(
            Reason::StagingUnsupported,
            format!(
                "staging {} is not s3://: CDI imports staged disks over S3 (use s3://bucket/prefix and, outside AWS, \
                 spec.staging.endpoint)",
                staging.url
            ),
        ));
    }
    let secret = staging.secret_ref.as_ref().ok_or_else(|| {
        Failure::permanent(
            Reason::StagingSecretMissing,
            "s3 staging needs spec.staging.secretRef",
        )
    })?;
    let ns = vmm.namespace().unwrap_or_default();
    let [access, key] = ctx
        .secret_values(&ns, &secret.name, ["accessKeyId", "secretKey"])
        .await?;
    let spec = StagingSpec {
        url,
        credentials_dir: None,
        endpoint: staging.endpoint.clone(),
        region: None,
        ca_bundle: staging.ca_bundle.clone(),
    };
    ctx.staging_store(&spec, access, key)
}

/// Every object name the conversion Job may have written for the migration's disks, in either format.
pub fn object_names(disks: usize) -> Vec<String> {
    (0..disks as u32)
        .flat_map(|i| [DiskFormat::Raw, DiskFormat::Qcow2].map(|format| object_name(i, format)))
        .collect()
}

/// The disks a successful conversion Job staged, in `disks` order. Its report names only how many and its run;
/// each disk's result is its manifest, which the Job writes after the object, so the report's size does not grow
/// with the disks. A Job of an earlier release still sent the whole list in its report.
pub async fn converted(
    ctx: &Context,
    vmm: &VirtualMachineMigration,
    disks: &[DiskStatus],
    vm_uuid: &str,
    report: JobReport,
    job: &str,
) -> Result<Vec<DiskResult>> {
    let summary = match report {
        JobReport::Staged(summary) => summary,
        JobReport::Disks(found) => return Ok(found),
        _ => {
            return Err(Failure::bounded(
                Reason::JobResultUnreadable,
                format!("Job {job} left a result that does not parse: it lists no disks"),
            ));
        }
    };
    if summary.disks as usize != disks.len() {
        return Err(Failure::bounded(
            Reason::DiskNotConverted,
            format!(
                "Job {job} staged {} disk(s), the VM has {}",
                summary.disks,
                disks.len()
            ),
        ));
    }
    let staging = &open(ctx, vmm).await?;
    let manifests = disks.iter().map(|disk| {
        let name = object_name(disk.index as u32, summary.format);
        async move { staging.manifest(&name).await }
    });
    let manifests = futures::future::try_join_all(manifests).await?;
    disks
        .iter()
        .zip(manifests)
        .map(|(disk, manifest)| disk_result(disk, vm_uuid, manifest, &summary, job))
        .collect()
}

/// Disk `disk`'s result from its manifest, which must describe that disk of VM `vm_uuid` in the reported
/// format. Pure.
pub fn disk_result(
    disk: &DiskStatus,
    vm_uuid: &str,
    manifest: Option<StagedObject>,
    summary: &StagedSummary,
    job: &str,
) -> Result<DiskResult> {
    let name = object_name(disk.index as u32, summary.format);
    let Some(manifest) = manifest else {
        return Err(Failure::bounded(
            Reason::DiskNotConverted,
            format!(
                "Job {job} reported disk {} staged, but {name} has no manifest",
                disk.index
            ),
        ));
    };
    let format = format!("{:?}", summary.format).to_lowercase();
    let capacity = disk.capacity_bytes.max(0) as u64;
    let source = &manifest.source;
    if source.vm_uuid != vm_uuid {
        return Err(Failure::permanent(
            Reason::SourceIdentityChanged,
            format!(
                "the manifest of {name} describes a disk of VM {}, not of VM {vm_uuid} that this migration moves",
                source.vm_uuid
            ),
        ));
    }
    if source.disk_file != disk.source_file
        || source.capacity_bytes != capacity
        || manifest.format != format
    {
        return Err(Failure::bounded(
            Reason::DiskNotConverted,
            format!(
                "the manifest of {name} describes {} ({} bytes, {}), not disk {} {} ({capacity} bytes, {format})",
                source.disk_file,
                source.capacity_bytes,
                manifest.format,
                disk.index,
                disk.source_file
            ),
        ));
    }
    Ok(summary.disk(disk.index as u32, manifest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_datapath::staging::SourceIdentity;

    fn disk(index: i32) -> DiskStatus {
        DiskStatus {
            index,
            source_file: format!("[ds] vm/vm_{index}.vmdk"),
            capacity_bytes: 4 << 20,
            ..Default::default()
        }
    }

    fn manifest(disk: &DiskStatus, run: &str) -> StagedObject {
        StagedObject {
            url: format!("s3://b/p/disk-{}.raw", disk.index),
            format: "raw".into(),
            object_sha256: Some("ab".into()),
            object_bytes: 4 << 20,
            source_sha256: "ab".into(),
            source_bytes: 4 << 20,
            source: SourceIdentity {
                vm_uuid: "u".into(),
                disk_file: disk.source_file.clone(),
                capacity_bytes: 4 << 20,
            },
            e_tag: None,
            run: Some(run.into()),
            bytes_read: None,
        }
    }

    fn summary() -> StagedSummary {
        StagedSummary {
            disks: 12,
            format: DiskFormat::Raw,
            bytes_read: 44 << 20,
            run: "this".into(),
            peak_rss_bytes: None,
        }
    }

    #[test]
    fn a_disk_reads_from_its_own_manifest() {
        let d = disk(7);
        let found = disk_result(&d, "u", Some(manifest(&d, "this")), &summary(), "j").unwrap();
        assert_eq!(
            (found.index, found.bytes_read, found.skipped),
            (7, 4 << 20, false)
        );
        assert_eq!(found.staged.url, "s3://b/p/disk-7.raw");
        // Staged by an earlier attempt, and found intact by this one: nothing was read for it.
        let earlier = disk_result(&d, "u", Some(manifest(&d, "earlier")), &summary(), "j").unwrap();
        assert_eq!((earlier.bytes_read, earlier.skipped), (0, true));
    }

    #[test]
    fn a_missing_or_foreign_manifest_is_not_a_result() {
        let d = disk(2);
        let missing = disk_result(&d, "u", None, &summary(), "j").unwrap_err();
        assert_eq!(missing.reason, "DiskNotConverted");
        assert!(
            missing.message.contains("disk-2.raw has no manifest"),
            "{}",
            missing.message
        );
        let other = manifest(&disk(3), "this");
        let foreign = disk_result(&d, "u", Some(other), &summary(), "j").unwrap_err();
        assert_eq!(foreign.reason, "DiskNotConverted");
        let qcow2 = StagedSummary {
            format: DiskFormat::Qcow2,
            ..summary()
        };
        assert!(disk_result(&d, "u", Some(manifest(&d, "this")), &qcow2, "j").is_err());
        let another_vm = disk_result(&d, "v", Some(manifest(&d, "this")), &summary(), "j");
        let another_vm = another_vm.unwrap_err();
        assert_eq!(another_vm.reason, "SourceIdentityChanged");
        assert!(
            another_vm.message.contains("a disk of VM u, not of VM v"),
            "{}",
            another_vm.message
        );
        let mut resized = manifest(&d, "this");
        resized.source.capacity_bytes += 1;
        assert!(disk_result(&d, "u", Some(resized), &summary(), "j").is_err());
    }
}
