//! A warm round's Job report read into its record, alike for each precopy round and the cutover's last copy.

use ferry_api::{Reason, WarmRound};
use ferry_datapath::report::RoundSummary;
use ferry_datapath::round::RoundKind;

use crate::error::{Failure, Result};

/// `round` with the totals of Job `job`'s report, once the report is shown to cover each of the VM's `disks`.
/// Pure.
pub fn tally(
    mut round: WarmRound,
    job: &str,
    summary: &RoundSummary,
    disks: usize,
) -> Result<WarmRound> {
    if summary.disks.len() != disks {
        return Err(Failure::bounded(
            Reason::DiskNotConverted,
            format!(
                "Job {job} copied {} disk(s), the VM has {disks}",
                summary.disks.len()
            ),
        ));
    }
    for disk in &summary.disks {
        round.areas += disk.areas as i64;
        round.bytes_read += disk.bytes_read as i64;
        round.bytes_written += disk.bytes_written as i64;
        if disk.kind != RoundKind::Delta {
            round.full_disks += 1;
        }
        if let Some(reason) = &disk.reason {
            round.reasons.push(format!("disk {}: {reason}", disk.index));
        }
    }
    Ok(round)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_datapath::direct::ReadBack;
    use ferry_datapath::round::RoundDisk;

    fn disk(index: u32, kind: RoundKind, reason: Option<&str>) -> RoundDisk {
        RoundDisk {
            index,
            kind,
            reason: reason.map(Into::into),
            change_id: None,
            areas: if kind == RoundKind::Delta { 3 } else { 0 },
            bytes_read: 100,
            bytes_written: 10,
            sha256: String::new(),
            read_back: ReadBack::Direct,
        }
    }

    #[test]
    fn a_round_adds_up_its_disks_and_says_why_any_was_copied_whole_again() {
        let summary = RoundSummary {
            run: "run".into(),
            disks: vec![
                disk(0, RoundKind::Delta, None),
                disk(1, RoundKind::FullAfterReset, Some("tracking reset")),
            ],
        };
        let round = tally(WarmRound::default(), "job", &summary, 2).unwrap();
        assert_eq!(
            (
                round.areas,
                round.bytes_read,
                round.bytes_written,
                round.full_disks
            ),
            (3, 200, 20, 1)
        );
        assert_eq!(round.reasons, ["disk 1: tracking reset"]);
        let short = tally(WarmRound::default(), "job", &summary, 3).unwrap_err();
        assert_eq!(short.reason, Reason::DiskNotConverted);
    }
}
