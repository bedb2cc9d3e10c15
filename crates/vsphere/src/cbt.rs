//! Changed Block Tracking: change IDs, the disk areas written between two of them (`QueryChangedDiskAreas`,
//! paged to the disk's end), and turning tracking on, the one change besides power and snapshots Ferry may make
//! to a source, and only when the user allows it.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::inventory::{DiskInfo, decode_devices};
use crate::power::{start_task, wait_task};
use crate::props;
use crate::session::Session;
use crate::soap::MoRef;
use crate::xml::{Element, escape};

/// A disk's change ID, `"<tracking identity>/<sequence>"` (`52 de … 65 63/81`). The identity changes when
/// tracking is reset; the sequence grows at each stun. vSphere documents neither part, so Ferry only compares
/// them: another identity, or a sequence that went back, means earlier IDs no longer describe the disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeId {
    pub identity: String,
    pub sequence: u64,
}

impl ChangeId {
    pub fn parse(text: &str) -> Option<Self> {
        let (identity, sequence) = text.trim().rsplit_once('/')?;
        if identity.is_empty() {
            return None;
        }
        Some(Self {
            identity: identity.to_string(),
            sequence: sequence.parse().ok()?,
        })
    }

    /// Whether tracking was reset between `self` and the later `current`.
    pub fn reset_before(&self, current: &ChangeId) -> bool {
        self.identity != current.identity || current.sequence < self.sequence
    }
}

impl fmt::Display for ChangeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.identity, self.sequence)
    }
}

/// One changed extent of a disk, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Area {
    pub start: u64,
    pub length: u64,
}

impl Area {
    pub fn end(&self) -> u64 {
        self.start + self.length
    }

    /// Grows this area over `next`, which starts no earlier, when the two touch or overlap.
    fn absorb(&mut self, next: &Area) -> bool {
        if next.start > self.end() {
            return false;
        }
        self.length = self.length.max(next.end() - self.start);
        true
    }
}

/// One `QueryChangedDiskAreas` answer: the window `[start, start+length)` it covers, and the areas in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub start: u64,
    pub length: u64,
    pub areas: Vec<Area>,
}

/// Checks a page against the query and returns where the next one starts. vSphere answers at most about
/// 2,000 areas per page and may answer an empty window short of the end, so only the disk's end ends paging;
/// a page that does not move forward, or areas outside their window, out of order or overlapping, would lose
/// or double data, and are refused.
pub fn next_offset(asked: u64, capacity: u64, page: &Page) -> std::result::Result<u64, String> {
    if page.start != asked {
        return Err(format!(
            "asked from byte {asked}, answered from {}",
            page.start
        ));
    }
    let end = page
        .start
        .checked_add(page.length)
        .filter(|end| *end > page.start && *end <= capacity)
        .ok_or_else(|| {
            format!(
                "a window of {} bytes from {} on a disk of {capacity}",
                page.length, page.start
            )
        })?;
    let mut covered = page.start;
    for a in &page.areas {
        if a.length == 0 || a.start < covered || a.end() > end {
            return Err(format!(
                "area [{}, {}) is empty, out of order or outside the window [{}, {end})",
                a.start,
                a.end(),
                page.start
            ));
        }
        covered = a.end();
    }
    Ok(end)
}

/// Merges touching areas (pages split an extent at their ends).
pub fn coalesce(areas: impl IntoIterator<Item = Area>) -> Vec<Area> {
    let mut out: Vec<Area> = Vec::new();
    for a in areas {
        if !out.last_mut().is_some_and(|last| last.absorb(&a)) {
            out.push(a);
        }
    }
    out
}

/// Adds a page's areas to the coalesced areas of the pages before it. Those end at or before the page's start, so
/// only their last area and the page's first can merge: coalescing them all again at each page would be
/// quadratic in the pages.
pub fn append_page(found: &mut Vec<Area>, page: Vec<Area>) {
    let page = coalesce(page);
    let merged = match (found.last_mut(), page.first()) {
        (Some(last), Some(first)) => last.absorb(first),
        _ => false,
    };
    found.extend_from_slice(&page[usize::from(merged)..]);
}

/// Every area changed on a disk, paged to its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangedAreas {
    pub areas: Vec<Area>,
    pub pages: u32,
}

impl ChangedAreas {
    pub fn bytes(&self) -> u64 {
        self.areas.iter().map(|a| a.length).sum()
    }
}

/// One page of the areas of disk `device_key` written since `change_id` (`"*"`: every allocated area), up to
/// `snapshot`, or up to now when None (vSphere allows that only while the VM is powered off).
pub async fn query_page(
    session: &Session,
    vm: &MoRef,
    snapshot: Option<&MoRef>,
    device_key: i32,
    start: u64,
    change_id: &str,
) -> Result<Page> {
    let args = format!(
        "{}<deviceKey>{device_key}</deviceKey><startOffset>{start}</startOffset><changeId>{}</changeId>",
        snapshot.map(|s| s.xml("snapshot")).unwrap_or_default(),
        escape(change_id)
    );
    let response = session.call("QueryChangedDiskAreas", vm, &args).await?;
    decode_page(&response).ok_or_else(|| Error::InvalidResponse {
        method: "QueryChangedDiskAreas".into(),
        detail: "no DiskChangeInfo with a start and length in the answer".into(),
    })
}

fn decode_page(response: &Element) -> Option<Page> {
    let info = response.child("returnval")?;
    let number = |e: &Element, name: &str| e.text_at(&[name])?.trim().parse::<u64>().ok();
    let areas = info
        .children_named("changedArea")
        .map(|a| {
            Some(Area {
                start: number(a, "start")?,
                length: number(a, "length")?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Page {
        start: number(info, "startOffset")?,
        length: number(info, "length")?,
        areas,
    })
}

/// All of a disk's changed areas, [`query_page`] after page until the disk's end, each page checked.
pub async fn changed_areas(
    session: &Session,
    vm: &MoRef,
    snapshot: Option<&MoRef>,
    device_key: i32,
    capacity: u64,
    change_id: &str,
) -> Result<ChangedAreas> {
    let mut found = ChangedAreas::default();
    let mut start = 0;
    while start < capacity {
        let page = query_page(session, vm, snapshot, device_key, start, change_id).await?;
        start = next_offset(start, capacity, &page).map_err(|detail| Error::InvalidResponse {
            method: "QueryChangedDiskAreas".into(),
            detail,
        })?;
        found.pages += 1;
        append_page(&mut found.areas, page.areas);
    }
    Ok(found)
}

/// Why vSphere would not list changes, where Ferry has an answer that is not a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueryRefusal {
    /// The change ID is not valid for the disk any more (tracking was reset, the disk grew or moved): the
    /// next copy must be a full one.
    ChangeIdRejected(String),
    /// The snapshot is gone: take another.
    SnapshotGone(String),
}

/// Reads a failed query as a [`QueryRefusal`], when it is one. Ferry checks the disk key and offsets itself,
/// so an `InvalidArgument` is taken as the change ID's (the safe reading: a full copy).
pub fn refusal(e: &Error) -> Option<QueryRefusal> {
    let Error::Fault { fault, message, .. } = e else {
        return None;
    };
    match fault.as_str() {
        "InvalidArgument" => Some(QueryRefusal::ChangeIdRejected(message.clone())),
        "NotFound" | "ManagedObjectNotFound" => Some(QueryRefusal::SnapshotGone(message.clone())),
        _ => None,
    }
}

/// Whether `vm` has Changed Block Tracking on (`config.changeTrackingEnabled`): whether a change is needed, read
/// before one is asked for, so a change repeated after a crash is not asked twice.
pub async fn change_tracking_enabled(session: &Session, vm: &MoRef) -> Result<bool> {
    props::vm_property_is(session, vm, "config.changeTrackingEnabled", "true").await
}

/// Turns Changed Block Tracking on or off (`ReconfigVM_Task`). It takes effect at the VM's next stun (power
/// on, snapshot create or remove), at once on a powered-off VM.
pub async fn set_change_tracking(
    session: &Session,
    vm: &MoRef,
    enabled: bool,
    timeout: Duration,
) -> Result<()> {
    let args = format!("<spec><changeTrackingEnabled>{enabled}</changeTrackingEnabled></spec>");
    let task = start_task(session, "ReconfigVM_Task", vm, &args).await?;
    wait_task(session, &task, timeout).await.map(|_| ())
}

/// The disks as a snapshot recorded them: its files (the frozen base while the VM runs on a delta) and each
/// disk's change ID at the snapshot.
pub async fn snapshot_disks(session: &Session, snapshot: &MoRef) -> Result<Vec<DiskInfo>> {
    let found = props::retrieve(
        session,
        "VirtualMachineSnapshot",
        std::slice::from_ref(snapshot),
        &["config.hardware.device"],
    )
    .await?;
    let devices = found
        .first()
        .and_then(|o| o.prop("config.hardware.device"))
        .ok_or_else(|| Error::InvalidResponse {
            method: "RetrievePropertiesEx".into(),
            detail: format!("snapshot {snapshot} has no devices"),
        })?;
    Ok(decode_devices(devices).0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(start: u64, length: u64) -> Area {
        Area { start, length }
    }

    #[test]
    fn change_ids_are_compared_not_interpreted() {
        let id = ChangeId::parse("52 de c0 d9 b9 43 9d 10-61 d5 4c 1b e9 7b 65 63/81").unwrap();
        assert_eq!(id.sequence, 81);
        assert_eq!(
            id.to_string(),
            "52 de c0 d9 b9 43 9d 10-61 d5 4c 1b e9 7b 65 63/81"
        );
        let later = ChangeId::parse("52 de c0 d9 b9 43 9d 10-61 d5 4c 1b e9 7b 65 63/83").unwrap();
        assert!(!id.reset_before(&later));
        assert!(later.reset_before(&id), "a sequence that went back");
        let other = ChangeId::parse("52 aa c0 d9 b9 43 9d 10-61 d5 4c 1b e9 7b 65 63/90").unwrap();
        assert!(id.reset_before(&other), "another identity");
        for bad in ["", "*", "/3", "abc", "x/y", "x/-1"] {
            assert_eq!(ChangeId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn paging_goes_on_to_the_disk_end_through_empty_windows() {
        let capacity = 1 << 30;
        let page = |start, length, areas| Page {
            start,
            length,
            areas,
        };
        // A full page ends at its last area; an empty window short of the end is not the end.
        assert_eq!(
            next_offset(
                0,
                capacity,
                &page(0, 200, vec![area(0, 100), area(100, 100)])
            ),
            Ok(200)
        );
        assert_eq!(
            next_offset(200, capacity, &page(200, 1 << 20, vec![])),
            Ok(200 + (1 << 20))
        );
        assert_eq!(
            next_offset(
                capacity - 10,
                capacity,
                &page(capacity - 10, 10, vec![area(capacity - 10, 10)])
            ),
            Ok(capacity)
        );
    }

    #[test]
    fn pages_that_would_lose_or_double_data_are_refused() {
        let capacity = 1 << 20;
        let refused = |asked, start, length, areas: Vec<Area>| {
            next_offset(
                asked,
                capacity,
                &Page {
                    start,
                    length,
                    areas,
                },
            )
            .unwrap_err()
        };
        assert!(refused(0, 0, 0, vec![]).contains("window"), "no progress");
        assert!(
            refused(0, 0, capacity + 1, vec![]).contains("window"),
            "past the end"
        );
        assert!(refused(100, 0, 200, vec![]).contains("asked from"));
        assert!(refused(0, 0, 200, vec![area(100, 50), area(120, 10)]).contains("out of order"));
        assert!(refused(0, 0, 200, vec![area(150, 100)]).contains("outside"));
        assert!(refused(0, 0, 200, vec![area(10, 0)]).contains("empty"));
    }

    #[test]
    fn touching_areas_merge_across_pages() {
        assert_eq!(
            coalesce([area(0, 10), area(10, 5), area(20, 5), area(22, 10)]),
            vec![area(0, 15), area(20, 12)]
        );
    }

    #[test]
    fn only_the_boundary_merges_when_a_page_is_added() {
        let found = || vec![area(0, 10), area(20, 10)];
        let appended = |page: Vec<Area>| {
            let mut areas = found();
            append_page(&mut areas, page);
            areas
        };
        let touching = vec![area(30, 5), area(35, 5), area(50, 5)];
        assert_eq!(
            appended(touching.clone()),
            vec![area(0, 10), area(20, 20), area(50, 5)]
        );
        let overlapping = vec![area(25, 10), area(50, 5)];
        assert_eq!(
            appended(overlapping.clone()),
            vec![area(0, 10), area(20, 15), area(50, 5)]
        );
        let separate = vec![area(31, 4), area(35, 5)];
        assert_eq!(
            appended(separate.clone()),
            vec![area(0, 10), area(20, 10), area(31, 9)]
        );
        assert_eq!(appended(vec![]), found());
        // The same as coalescing everything again, which is what paging did before.
        for page in [touching, overlapping, separate, vec![]] {
            assert_eq!(
                appended(page.clone()),
                coalesce(found().into_iter().chain(page))
            );
        }
        let mut areas = vec![];
        append_page(&mut areas, vec![area(0, 5), area(5, 5)]);
        assert_eq!(areas, vec![area(0, 10)], "the first page");
    }

    #[test]
    fn a_page_is_read_from_vsphere_xml() {
        let xml = r#"<QueryChangedDiskAreasResponse xmlns="urn:vim25"><returnval><startOffset>0</startOffset>
            <length>1048576</length><changedArea><start>0</start><length>65536</length></changedArea>
            <changedArea><start>196608</start><length>65536</length></changedArea></returnval>
            </QueryChangedDiskAreasResponse>"#;
        let element = crate::xml::parse(xml).unwrap();
        assert_eq!(
            decode_page(&element),
            Some(Page {
                start: 0,
                length: 1 << 20,
                areas: vec![area(0, 65536), area(196608, 65536)]
            })
        );
    }

    #[test]
    fn refusals_name_what_ferry_does_next() {
        let fault = |fault: &str| Error::Fault {
            method: "QueryChangedDiskAreas".into(),
            fault: fault.into(),
            message: "m".into(),
        };
        assert_eq!(
            refusal(&fault("InvalidArgument")),
            Some(QueryRefusal::ChangeIdRejected("m".into()))
        );
        assert_eq!(
            refusal(&fault("NotFound")),
            Some(QueryRefusal::SnapshotGone("m".into()))
        );
        assert_eq!(refusal(&fault("FileFault")), None);
    }
}
