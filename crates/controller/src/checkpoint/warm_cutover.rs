//! What the cutover's last copy records on a warm migration (Converting, direct path): each disk's volume hashed
//! whole after the changes since its last precopy round were written, which is what adaptation and the VM read.

use ferry_api::{Reason, WarmRound, WarmStatus};
use ferry_datapath::report::RoundSummary;

use super::step::{Next, Step};
use super::support::warm_round;
use crate::error::{Failure, Result};

pub fn record(step: &mut Step<'_>, job: &str, summary: RoundSummary) -> Result<Next> {
    let started = step
        .status
        .checkpoints
        .iter()
        .rev()
        .find(|c| c.phase == ferry_api::Phase::Converting)
        .map(|c| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(c.entered.0));
    let copy = warm_round::tally(
        WarmRound {
            round: 0,
            started,
            finished: Some(step.now.clone()),
            ..Default::default()
        },
        job,
        &summary,
        step.status.disks.len(),
    )?;
    for found in &summary.disks {
        let Some(disk) = step
            .status
            .disks
            .iter_mut()
            .find(|d| d.index == found.index as i32)
        else {
            return Err(Failure::bounded(
                Reason::DiskNotConverted,
                format!(
                    "Job {job} reported disk {}, which the VM lacks",
                    found.index
                ),
            ));
        };
        // At cutover every disk's sha256 is its volume's, read back whole.
        disk.sha256 = Some(found.sha256.clone());
        disk.bytes_moved = disk.capacity_bytes;
    }
    let read = copy.bytes_read;
    let message = format!(
        "cutover: {read} bytes copied after power-off ({} changed areas, {} disk(s) whole); every volume read back \
         whole and hashed",
        copy.areas, copy.full_disks
    );
    step.ctx.metrics.bytes_moved(read as u64);
    step.status
        .warm
        .get_or_insert_with(WarmStatus::default)
        .final_copy = Some(copy);
    Ok(Next::advance("DisksWritten", message))
}
