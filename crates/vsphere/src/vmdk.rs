//! VMDK text descriptors: which file holds a disk's bytes.

use ferry_types::Reason;

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub access: String,
    pub sectors: u64,
    /// `FLAT`, `VMFS`, `SPARSE`, `VMFSSPARSE`, ...
    pub kind: String,
    pub file: String,
    pub offset: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub create_type: String,
    pub extents: Vec<Extent>,
    pub parent_hint: Option<String>,
    /// The key locator of an encrypted disk (`encryptionKeys="vmware:key/..."`): its bytes are ciphertext.
    pub encryption_keys: Option<String>,
}

/// Why a disk's bytes cannot be copied through `/folder` as one raw file. Each kind has its own reason, so a
/// person sees what to change in vSphere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The extent is an object (`vsan://`, `vvol://`), not a file: there is no flat file to read.
    ObjectExtent { scheme: String, object: String },
    /// VM Encryption: the datastore holds ciphertext, which would copy (and hash) fine and never boot.
    Encrypted,
    /// A snapshot child (a delta or seSparse redo log) whose bytes are only the changes since its parent.
    Delta { parent: String },
    /// Sparse, seSparse or another layout that is not one raw file.
    NotFlat { create_type: String },
    /// Split into several files (`twoGbMaxExtent*`) or otherwise more than one extent.
    MultiExtent { count: usize },
    /// One extent of a kind or at an offset that is not a plain raw file.
    Extent { kind: String, offset: u64 },
}

impl Refusal {
    pub fn reason(&self) -> Reason {
        match self {
            Refusal::ObjectExtent { scheme, .. } if scheme == "vsan" => Reason::VsanDisk,
            Refusal::ObjectExtent { scheme, .. } if scheme == "vvol" => Reason::VvolDisk,
            Refusal::ObjectExtent { .. } | Refusal::Extent { .. } => Reason::UnsupportedDisk,
            Refusal::Encrypted => Reason::EncryptedDisk,
            Refusal::Delta { .. } => Reason::SnapshotsPresent,
            Refusal::NotFlat { .. } => Reason::SparseDisk,
            Refusal::MultiExtent { .. } => Reason::MultiExtentDisk,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::ObjectExtent { scheme, object } => {
                let store = match scheme.as_str() {
                    "vsan" => "vSAN",
                    "vvol" => "vVols",
                    other => other,
                };
                write!(
                    f,
                    "its data is a {store} object ({object}), not a file Ferry can read; move the VM to a VMFS or \
                     NFS datastore (Storage vMotion) and create a new migration"
                )
            }
            Refusal::Encrypted => write!(
                f,
                "it is encrypted (VM Encryption): a copy would be ciphertext; decrypt the VM in vSphere first"
            ),
            Refusal::Delta { parent } => write!(
                f,
                "it is a snapshot delta of {parent}: consolidate or delete the VM's snapshots first"
            ),
            Refusal::NotFlat { create_type } => write!(
                f,
                "createType {create_type:?} is not a flat disk (sparse disks and linked clones are not supported; \
                 inflate or clone it to a flat disk first)"
            ),
            Refusal::MultiExtent { count } => write!(
                f,
                "it is split into {count} extent files; only single-extent disks are supported (convert it with \
                 vmkfstools -i)"
            ),
            Refusal::Extent { kind, offset } => write!(
                f,
                "extent type {kind} at offset {offset} is not a raw flat file"
            ),
        }
    }
}

impl Descriptor {
    /// Parses a descriptor; qemu-img pads it with NULs to 512 bytes.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim_end_matches('\0');
        let mut create_type = None;
        let mut parent_hint = None;
        let mut encryption_keys = None;
        let mut extents = Vec::new();
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            if let Some((key, value)) = line.split_once('=') {
                let value = value.trim().trim_matches('"').to_string();
                match key.trim() {
                    "createType" => create_type = Some(value),
                    "parentFileNameHint" => parent_hint = Some(value),
                    "encryptionKeys" => encryption_keys = Some(value),
                    _ => {}
                }
            } else if let Some(extent) = parse_extent(line) {
                extents.push(extent);
            }
        }
        let create_type = create_type.ok_or_else(|| invalid("no createType"))?;
        Ok(Self {
            create_type,
            extents,
            parent_hint,
            encryption_keys,
        })
    }

    /// Why this disk cannot be read as one raw file, or None when it can. Pure, so preflight and the
    /// conversion refuse the same disks.
    pub fn refusal(&self) -> Option<Refusal> {
        if self.encryption_keys.is_some() {
            return Some(Refusal::Encrypted);
        }
        if let Some(object) = self.extents.iter().find_map(|e| object_uri(&e.file)) {
            return Some(object);
        }
        if let Some(parent) = &self.parent_hint {
            return Some(Refusal::Delta {
                parent: parent.clone(),
            });
        }
        if !matches!(
            self.create_type.as_str(),
            "monolithicFlat" | "vmfs" | "vmfsThin" | "vmfsEagerZeroedThick"
        ) && !self.create_type.starts_with("twoGbMaxExtentFlat")
        {
            return Some(Refusal::NotFlat {
                create_type: self.create_type.clone(),
            });
        }
        match self.extents.as_slice() {
            [one] if matches!(one.kind.as_str(), "FLAT" | "VMFS") && one.offset == 0 => None,
            [one] => Some(Refusal::Extent {
                kind: one.kind.clone(),
                offset: one.offset,
            }),
            many => Some(Refusal::MultiExtent { count: many.len() }),
        }
    }

    /// The one file of raw bytes behind a flat disk, or why this disk cannot be read that way.
    pub fn flat_extent(&self, disk: &str) -> Result<&Extent> {
        match (self.refusal(), self.extents.first()) {
            (None, Some(extent)) => Ok(extent),
            (refusal, _) => Err(Error::UnsupportedDisk {
                file: disk.to_string(),
                reason: refusal.map_or_else(|| "it names no extent".into(), |r| r.to_string()),
            }),
        }
    }
}

/// `vsan://<uuid>` or `vvol://...`: an extent that names a storage object instead of a file.
fn object_uri(file: &str) -> Option<Refusal> {
    let (scheme, _) = file.split_once("://")?;
    Some(Refusal::ObjectExtent {
        scheme: scheme.to_ascii_lowercase(),
        object: file.to_string(),
    })
}

fn parse_extent(line: &str) -> Option<Extent> {
    // RW 2097152 FLAT "disk-flat.vmdk" 0
    let (head, rest) = line.split_once('"')?;
    let (file, tail) = rest.split_once('"')?;
    let mut words = head.split_whitespace();
    let access = words.next()?.to_string();
    let sectors = words.next()?.parse().ok()?;
    let kind = words.next()?.to_string();
    let offset = tail
        .split_whitespace()
        .next()
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    Some(Extent {
        access,
        sectors,
        kind,
        file: file.to_string(),
        offset,
    })
}

fn invalid(detail: &str) -> Error {
    Error::InvalidResponse {
        method: "descriptor".into(),
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QEMU_FLAT: &str = "# Disk DescriptorFile\nversion=1\nCID=52ecc0b6\nparentCID=ffffffff\n\
        createType=\"monolithicFlat\"\n\n# Extent description\nRW 524288 FLAT \"disk-flat.vmdk\" 0\n\n\
        ddb.virtualHWVersion = \"4\"\nddb.geometry.cylinders = \"520\"\n\0\0\0\0";

    #[test]
    fn a_monolithic_flat_descriptor_names_its_extent() {
        let d = Descriptor::parse(QEMU_FLAT).unwrap();
        let extent = d.flat_extent("[ds] vm/disk.vmdk").unwrap();
        assert_eq!(
            (extent.file.as_str(), extent.sectors),
            ("disk-flat.vmdk", 524288)
        );
    }

    #[test]
    fn deltas_and_sparse_disks_are_refused_with_a_reason() {
        let delta = "createType=\"vmfsSparse\"\nparentFileNameHint=\"vm.vmdk\"\nRW 100 VMFSSPARSE \"vm-000001-delta.vmdk\"\n";
        let e = Descriptor::parse(delta)
            .unwrap()
            .flat_extent("d")
            .unwrap_err();
        assert!(e.to_string().contains("consolidate"), "{e}");
        let sparse = "createType=\"monolithicSparse\"\nRW 100 SPARSE \"vm.vmdk\"\n";
        assert!(Descriptor::parse(sparse).unwrap().flat_extent("d").is_err());
        assert!(
            Descriptor::parse("RW 1 FLAT \"x\" 0").is_err(),
            "no createType"
        );
    }

    fn refusal_of(text: &str) -> Option<Refusal> {
        Descriptor::parse(text).unwrap().refusal()
    }

    #[test]
    fn each_layout_ferry_cannot_read_has_its_own_reason() {
        let vsan =
            "createType=\"vmfs\"\nRW 8192 VMFS \"vsan://52e3a1b4-0c1d-4b3a-9f0e-1a2b3c4d5e6f\"\n";
        let vvol = "createType=\"vmfs\"\nRW 8192 VMFS \"vvol://a1b2/rfc4122.0c1d4b3a\"\n";
        let encrypted = "encryptionKeys=\"vmware:key/list/(pair/(fqid/x,HMAC-SHA-256,y))\"\n\
            createType=\"vmfs\"\nRW 8192 VMFS \"vm-flat.vmdk\"\n";
        let sesparse = "createType=\"seSparse\"\nparentFileNameHint=\"vm.vmdk\"\n\
            RW 8192 SESPARSE \"vm-000001-sesparse.vmdk\"\n";
        let hosted_sparse = "createType=\"monolithicSparse\"\nRW 8192 SPARSE \"vm.vmdk\"\n";
        let split = "createType=\"twoGbMaxExtentFlat\"\nRW 4096 FLAT \"vm-f001.vmdk\" 0\n\
            RW 4096 FLAT \"vm-f002.vmdk\" 0\n";
        let reasons: Vec<(Reason, String)> =
            [vsan, vvol, encrypted, sesparse, hosted_sparse, split]
                .map(|t| {
                    let r = refusal_of(t).unwrap();
                    (r.reason(), r.to_string())
                })
                .into();
        let names: Vec<&str> = reasons.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "VsanDisk",
                "VvolDisk",
                "EncryptedDisk",
                "SnapshotsPresent",
                "SparseDisk",
                "MultiExtentDisk"
            ]
        );
        assert!(reasons[0].1.contains("vSAN object"), "{}", reasons[0].1);
        assert!(reasons[2].1.contains("ciphertext"), "{}", reasons[2].1);
        assert!(reasons[5].1.contains("2 extent files"), "{}", reasons[5].1);
        // The same judgement refuses the disk in the conversion, after preflight.
        assert!(Descriptor::parse(vsan).unwrap().flat_extent("d").is_err());
    }

    #[test]
    fn flat_layouts_are_readable() {
        for text in [
            QEMU_FLAT,
            "createType=\"vmfs\"\nRW 8192 VMFS \"vm-flat.vmdk\"\n",
            "createType=\"vmfsThin\"\nRW 8192 VMFS \"vm-flat.vmdk\" 0\n",
            "createType=\"twoGbMaxExtentFlat\"\nRW 4096 FLAT \"vm-f001.vmdk\" 0\n",
        ] {
            assert_eq!(refusal_of(text), None, "{text}");
        }
    }
}
