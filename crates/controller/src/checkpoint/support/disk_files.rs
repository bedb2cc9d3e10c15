//! Preflight of the disks' files, part of Validating. Observed: each disk's descriptor (and its flat extent),
//! read through `/folder` with the recorded datacenter path and the session the conversion will use. Action:
//! none. Recorded: a refusal naming the disk and why (vSAN/vVol object, encryption, sparse or delta, split
//! extents), while the source is still untouched; a 200 on the descriptor proves the `dcPath`.

use ferry_api::{Reason, SourceVmStatus};
use ferry_vsphere::preflight::{DiskCheck, check_disk};

use super::source;
use crate::checkpoint::step::Step;
use crate::error::{Failure, Result};

pub async fn check(step: &Step<'_>, vm: &SourceVmStatus) -> Result<()> {
    let datacenter = vm.datacenter.as_deref().ok_or_else(|| {
        Failure::transient(
            Reason::SourceNotDiscovered,
            "discovery recorded no datacenter for the source's disks",
        )
    })?;
    let session = source::session(step.ctx, step.vmm).await?;
    for disk in &vm.disks {
        if let DiskCheck::Refused(refusal) = check_disk(&session, datacenter, &disk.file).await? {
            return Err(Failure::permanent(
                refusal.reason(),
                format!(
                    "disk {} of {} cannot be copied: {refusal}; the source was not changed",
                    disk.file, vm.name
                ),
            ));
        }
    }
    Ok(())
}
