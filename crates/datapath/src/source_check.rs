//! Before the first byte is read: the VM the Job finds is the one discovery recorded, and every disk it is told
//! to copy is still that VM's. Disks are read by datastore path, so without this a VM replaced under the same
//! BIOS uuid, or a disk detached and reused since, would be copied as if nothing had changed.

use ferry_vsphere::inventory::{self, VmInfo, VmSelector};
use ferry_vsphere::session::Session;

use crate::error::{Error, Result};
use crate::spec::{ConvertSpec, SourceSpec};

/// Fails with [`Error::SourceChanged`] unless the VM found by the spec's identity is the recorded one and holds
/// every disk file the spec names. A spec naming no VM (written by hand for `ferry convert`) is not checked.
pub async fn confirm(session: &Session, spec: &ConvertSpec) -> Result<()> {
    let source = &spec.source;
    // The instance UUID is unique per vCenter; a BIOS uuid is copied with every clone.
    let Some(uuid) = source
        .instance_uuid
        .clone()
        .or_else(|| Some(source.vm_uuid.clone()).filter(|u| !u.is_empty()))
    else {
        return Ok(());
    };
    let vm = match inventory::find_vm(session, &VmSelector::Uuid(uuid.clone())).await {
        Err(ferry_vsphere::Error::VmNotFound { .. }) if source.instance_uuid.is_some() => {
            return Err(Error::SourceChanged(format!(
                "no VM has instance UUID {uuid} any more: the VM discovery recorded was removed or replaced"
            )));
        }
        found => found?,
    };
    let found = inventory::describe_vm(session, &vm).await?;
    let wanted = spec.disks.iter().map(|d| d.file.as_str());
    match mismatch(source, wanted, &Found::of(&found)) {
        Some(change) => Err(Error::SourceChanged(change)),
        None => Ok(()),
    }
}

/// The VM as found: the words a mismatch is told in, and what is compared.
pub struct Found<'a> {
    pub vm: String,
    pub instance_uuid: Option<&'a str>,
    pub files: Vec<&'a str>,
}

impl<'a> Found<'a> {
    fn of(info: &'a VmInfo) -> Self {
        Self {
            vm: format!("VM {} ({})", info.name, info.moref),
            instance_uuid: info.instance_uuid.as_deref(),
            // A warm round reads a snapshot's base, which the running VM shows as its disk's parent.
            files: info
                .disks
                .iter()
                .flat_map(|d| std::iter::once(&d.file).chain(&d.parents))
                .map(String::as_str)
                .collect(),
        }
    }
}

/// What differs between the recorded source and the VM found, if anything. Pure.
pub fn mismatch<'a>(
    source: &SourceSpec,
    mut wanted: impl Iterator<Item = &'a str>,
    found: &Found,
) -> Option<String> {
    if let Some(recorded) = &source.instance_uuid
        && found.instance_uuid != Some(recorded.as_str())
    {
        return Some(format!(
            "{} has instance UUID {}, discovery recorded {recorded}",
            found.vm,
            found.instance_uuid.unwrap_or("none")
        ));
    }
    wanted.find(|file| !found.files.contains(file)).map(|file| {
        format!(
            "{file} is no longer a disk of {}: the VM changed since discovery",
            found.vm
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SourceTrust;

    fn source(instance: Option<&str>) -> SourceSpec {
        SourceSpec {
            url: "https://vc".into(),
            credentials_dir: "/c".into(),
            trust: SourceTrust::Insecure,
            datacenter: "DC0".into(),
            vm_uuid: "4210".into(),
            instance_uuid: instance.map(Into::into),
        }
    }

    fn found<'a>(instance: &'a str, files: &[&'a str]) -> Found<'a> {
        Found {
            vm: "VM web (vm-1)".into(),
            instance_uuid: Some(instance),
            files: files.to_vec(),
        }
    }

    #[test]
    fn the_recorded_vm_with_its_disks_passes() {
        let vm = found("5012", &["[ds] web/web.vmdk", "[ds] web/web_1.vmdk"]);
        let wanted = ["[ds] web/web_1.vmdk"].into_iter();
        assert_eq!(mismatch(&source(Some("5012")), wanted, &vm), None);
    }

    #[test]
    fn another_instance_or_a_disk_gone_is_a_changed_source() {
        let vm = found("5099", &["[ds] web/web.vmdk"]);
        let other = mismatch(
            &source(Some("5012")),
            ["[ds] web/web.vmdk"].into_iter(),
            &vm,
        );
        let other = other.unwrap();
        assert!(
            other.contains("VM web (vm-1) has instance UUID 5099, discovery recorded 5012"),
            "{other}"
        );
        let vm = found("5012", &["[ds] web/web.vmdk"]);
        let gone = mismatch(
            &source(Some("5012")),
            ["[ds] old/old.vmdk"].into_iter(),
            &vm,
        );
        let gone = gone.unwrap();
        assert!(
            gone.contains("[ds] old/old.vmdk is no longer a disk of VM web (vm-1)"),
            "{gone}"
        );
    }

    #[test]
    fn without_a_recorded_instance_only_the_disks_are_compared() {
        let vm = found("5099", &["[ds] web/web.vmdk"]);
        let wanted = ["[ds] web/web.vmdk"].into_iter();
        assert_eq!(mismatch(&source(None), wanted, &vm), None);
    }
}
