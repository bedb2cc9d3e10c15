//! A warm migration's round, run by the conversion Job: each disk is copied from the round's snapshot (its
//! frozen base, while the VM runs on a delta) or, at cutover, from the powered-off VM, either whole or only the
//! areas Changed Block Tracking lists as written since the disk's last round. A change ID vSphere no longer
//! accepts (tracking was reset, the disk moved or grew) makes that disk's copy whole again, with the reason said.

use ferry_types::PowerState;
use ferry_vsphere::cbt::{self, ChangeId, QueryRefusal};
use ferry_vsphere::datastore::{Download, FlatDisk, flat_disk};
use ferry_vsphere::file_lock::{Readability, probe_read};
use ferry_vsphere::inventory::{self, DiskInfo};
use ferry_vsphere::{MoRef, Session, power};
use serde::{Deserialize, Serialize};

use crate::delta::{ChangedDisk, write_areas};
use crate::direct::{ReadBack, write_flat};
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::spec::{ConvertSpec, DiskSpec, VolumeSpec};

/// A reason is cut to this many characters, so a round's report fits in a termination message.
pub const REASON_CHARS: usize = 120;

/// How a disk was copied in a round.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum RoundKind {
    /// Whole: its first round.
    Full,
    /// Only the areas written since its last round.
    Delta,
    /// Whole again: vSphere no longer knew the last round's change ID (`reason` says why).
    FullAfterReset,
}

/// One disk's part of a round.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RoundDisk {
    pub index: u32,
    pub kind: RoundKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The change ID this round copied up to: the next round's `since`. None at cutover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_id: Option<String>,
    /// Changed areas copied (0 for a whole copy).
    pub areas: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Whole, or any copy at cutover: the sha256 of the volume's bytes as read back, which at cutover is what the
    /// VM boots from. A precopy's delta: the sha256 of its areas' bytes, one after the other.
    pub sha256: String,
    pub read_back: ReadBack,
}

/// Runs the round `spec.round` describes, `spec.parallel` disks at a time.
pub async fn run_round(spec: &ConvertSpec, progress: &Progress) -> Result<Vec<RoundDisk>> {
    let round = spec
        .round
        .as_ref()
        .ok_or_else(|| Error::Spec("no round to run".into()))?;
    if round.since.len() != spec.disks.len() {
        return Err(Error::Spec(format!(
            "the round names a last change ID for {} disk(s), the spec has {}",
            round.since.len(),
            spec.disks.len()
        )));
    }
    crate::direct::with_source(spec, async |session| {
        let vm = MoRef::new("VirtualMachine", round.vm_moref.clone());
        let snapshot = round
            .snapshot
            .as_ref()
            .map(|s| MoRef::new("VirtualMachineSnapshot", s.clone()));
        let disks = round_disks(session, &vm, snapshot.as_ref()).await?;
        // Each disk's descriptor is read once a round.
        let mut flats = Vec::with_capacity(spec.disks.len());
        for disk in &spec.disks {
            let flat = flat_disk(session, &spec.source.datacenter, &disk.file).await?;
            if snapshot.is_some() {
                readable(session, &spec.source.datacenter, &flat).await?;
            }
            flats.push(flat);
        }
        let source = RoundSource {
            session,
            hash_source: round.hash_source,
            spec,
            vm,
            snapshot,
            progress,
        };
        let copies =
            spec.disks
                .iter()
                .zip(&round.since)
                .zip(&flats)
                .map(|((disk, since), flat)| {
                    let found = disks.iter().find(|d| d.file == disk.file);
                    source.copy_disk(disk, flat, found, since.as_deref())
                });
        crate::direct::each_disk(spec.parallel, copies, |d| d.index).await
    })
    .await
}

/// Fails with [`Error::SourceDiskLocked`] when the base `flat` stays unreadable: vCenter answers
/// HTTP 500 for a file a running VM holds, which a download would retry for minutes as a passing fault.
async fn readable(session: &Session, datacenter: &str, flat: &FlatDisk) -> Result<()> {
    match probe_read(session, datacenter, &flat.extent, 3, PROBE_PAUSE).await? {
        Readability::Readable => Ok(()),
        Readability::Locked { status, detail } => Err(Error::SourceDiskLocked {
            file: flat.extent.to_string(),
            status,
            detail,
        }),
    }
}

/// Between probes of a file that answered a server error.
const PROBE_PAUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// What every disk of a round is read from.
struct RoundSource<'a> {
    session: &'a Session,
    /// See [`crate::spec::RoundSpec::hash_source`].
    hash_source: bool,
    spec: &'a ConvertSpec,
    vm: MoRef,
    snapshot: Option<MoRef>,
    progress: &'a Progress,
}

/// The disks a round reads: the snapshot's (base files, the change IDs it took), or the powered-off VM's.
async fn round_disks(
    session: &Session,
    vm: &MoRef,
    snapshot: Option<&MoRef>,
) -> Result<Vec<DiskInfo>> {
    if let Some(snapshot) = snapshot {
        return Ok(cbt::snapshot_disks(session, snapshot).await?);
    }
    // vSphere lists changes up to now only for a powered-off VM, and only then is its base still.
    let state = power::current_power_state(session, vm).await?;
    if state != PowerState::PoweredOff {
        return Err(Error::SourcePoweredOn(format!(
            "the cutover's last copy needs VM {vm} powered off, and it is {state:?}: only a powered-off VM's \
             disks stand still without a snapshot"
        )));
    }
    Ok(inventory::describe_vm(session, vm).await?.disks)
}

impl RoundSource<'_> {
    /// Copies one disk: its changed areas since `since`, else whole.
    async fn copy_disk(
        &self,
        disk: &DiskSpec,
        flat: &FlatDisk,
        found: Option<&DiskInfo>,
        since: Option<&str>,
    ) -> Result<RoundDisk> {
        let (session, spec, vm, progress) = (self.session, self.spec, &self.vm, self.progress);
        let snapshot = self.snapshot.as_ref();
        let found = found.ok_or_else(|| {
            Error::SourceChanged(format!(
                "{} is not a disk of {}: the VM changed since discovery",
                disk.file,
                snapshot.map_or_else(|| vm.to_string(), |s| format!("snapshot {s}"))
            ))
        })?;
        let change_id = snapshot.and(found.change_id.clone());
        let mut reason = None;
        if let Some(since) = since {
            match reset_seen(since, found.change_id.as_deref()) {
                Some(why) => reason = Some(why),
                None => {
                    let capacity = found.capacity_bytes as u64;
                    match cbt::changed_areas(session, vm, snapshot, found.key, capacity, since)
                        .await
                    {
                        Ok(changed) => {
                            let changed = ChangedDisk {
                                index: disk.index,
                                extent: flat.extent.clone(),
                                size: flat.size,
                                areas: changed.areas,
                            };
                            let volume = spec.volume(disk.index).ok_or_else(|| {
                                Error::Spec(format!("disk {} has no volume", disk.index))
                            })?;
                            let written = write_areas(
                                session,
                                &spec.source.datacenter,
                                &changed,
                                volume,
                                progress,
                            )
                            .await?;
                            let mut bytes_read = written.bytes_read;
                            let (sha256, read_back) = match snapshot {
                                Some(_) => (written.areas_sha256, written.read_back),
                                // The cutover's last copy: what the VM will boot from is hashed whole.
                                None => {
                                    let size = found.capacity_bytes as u64;
                                    let (sha256, read_back) = whole_volume(volume, size).await?;
                                    if self.hash_source {
                                        let source = whole_source(session, spec, flat).await?;
                                        bytes_read += flat.size;
                                        if source != sha256 {
                                            return Err(Error::ChecksumMismatch {
                                                what: format!(
                                                    "disk {} after the cutover's copy, against the powered-off \
                                                     source",
                                                    disk.index
                                                ),
                                                expected: source,
                                                actual: sha256,
                                            });
                                        }
                                    }
                                    (sha256, read_back)
                                }
                            };
                            return Ok(RoundDisk {
                                index: disk.index,
                                kind: RoundKind::Delta,
                                reason: None,
                                change_id,
                                areas: written.areas as u64,
                                bytes_read,
                                bytes_written: written.bytes_written,
                                sha256,
                                read_back,
                            });
                        }
                        Err(e) => match cbt::refusal(&e) {
                            Some(QueryRefusal::ChangeIdRejected(message)) => {
                                reason =
                                    Some(format!("vSphere refused change ID {since} ({message})"));
                            }
                            _ => return Err(e.into()),
                        },
                    }
                }
            }
        }
        let reason = reason.map(|r| r.chars().take(REASON_CHARS).collect::<String>());
        if let Some(why) = &reason {
            tracing::warn!(disk = disk.index, "copying the whole disk again: {why}");
        }
        let written = write_flat(session, spec, disk, flat, progress).await?;
        Ok(RoundDisk {
            index: disk.index,
            kind: if reason.is_some() {
                RoundKind::FullAfterReset
            } else {
                RoundKind::Full
            },
            reason,
            change_id,
            areas: 0,
            bytes_read: written.bytes_read,
            bytes_written: written.bytes_written,
            sha256: written.sha256,
            read_back: written.read_back,
        })
    }
}

/// The sha256 of the source disk's flat extent, read whole.
async fn whole_source(session: &Session, spec: &ConvertSpec, flat: &FlatDisk) -> Result<String> {
    // Hashed on a thread of its own, beside the reads.
    let hash = crate::hash::Hasher::start();
    let mut download = Download::open(session, &spec.source.datacenter, &flat.extent, 0).await?;
    while let Some(chunk) = download.next_chunk().await? {
        hash.update(chunk);
    }
    if download.offset() != flat.size {
        return Err(Error::Spec(format!(
            "{} ended at {} of {} bytes",
            flat.extent,
            download.offset(),
            flat.size
        )));
    }
    Ok(hash.finish())
}

/// The sha256 of a volume's first `size` bytes, read back past the page cache.
async fn whole_volume(volume: &VolumeSpec, size: u64) -> Result<(String, ReadBack)> {
    let path = volume.path.clone();
    crate::direct::blocking(move || crate::read_back::read_back(&path, size)).await
}

/// Why `since` cannot lead to the disk's change ID `now`, when the IDs themselves show it (another tracking
/// identity, or a sequence that went back); or when the disk shows none, tracking is off.
fn reset_seen(since: &str, now: Option<&str>) -> Option<String> {
    let Some(now) = now else {
        return Some(
            "the disk shows no change ID: change tracking is off or not yet active".into(),
        );
    };
    match (ChangeId::parse(since), ChangeId::parse(now)) {
        (Some(a), Some(b)) if a.reset_before(&b) => Some(format!(
            "change tracking was reset: the last round copied up to {a}, the disk is now at {b}"
        )),
        (Some(_), Some(_)) => None,
        _ => Some(format!("unreadable change IDs ({since}, then {now})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_shows_in_the_ids_before_any_query() {
        let id = |n: u32| format!("52 de c0 d9 b9 43 9d 10-61 d5 4c 1b e9 7b 65 63/{n}");
        assert_eq!(reset_seen(&id(4), Some(&id(6))), None);
        assert!(reset_seen(&id(6), Some(&id(4))).unwrap().contains("reset"));
        let other = "52 aa c0 d9 b9 43 9d 10-61 d5 4c 1b e9 7b 65 63/9";
        assert!(reset_seen(&id(4), Some(other)).unwrap().contains("reset"));
        assert!(reset_seen(&id(4), None).unwrap().contains("off"));
        assert!(
            reset_seen("x", Some(&id(1)))
                .unwrap()
                .contains("unreadable")
        );
    }
}
