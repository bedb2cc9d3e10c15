//! VMDK text descriptors: which file holds a disk's bytes.

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
}

impl Descriptor {
    /// Parses a descriptor; qemu-img pads it with NULs to 512 bytes.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim_end_matches('\0');
        let mut create_type = None;
        let mut parent_hint = None;
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
        })
    }

    /// The one file of raw bytes behind a flat disk, or why this disk cannot be read that way.
    pub fn flat_extent(&self, disk: &str) -> Result<&Extent> {
        let unsupported = |reason: String| Error::UnsupportedDisk {
            file: disk.to_string(),
            reason,
        };
        if let Some(parent) = &self.parent_hint {
            return Err(unsupported(format!(
                "it is a snapshot delta of {parent}: consolidate the VM's snapshots first"
            )));
        }
        if !matches!(
            self.create_type.as_str(),
            "monolithicFlat" | "vmfs" | "vmfsThin" | "vmfsEagerZeroedThick"
        ) {
            return Err(unsupported(format!(
                "createType {:?} is not a flat disk",
                self.create_type
            )));
        }
        match self.extents.as_slice() {
            [one] if matches!(one.kind.as_str(), "FLAT" | "VMFS") && one.offset == 0 => Ok(one),
            [one] => Err(unsupported(format!(
                "extent type {} at offset {}",
                one.kind, one.offset
            ))),
            many => Err(unsupported(format!(
                "{} extents; only single-extent disks are supported",
                many.len()
            ))),
        }
    }
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
}
