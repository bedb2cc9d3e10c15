//! Guest adaptation: `virt-v2v-in-place` turns the migrated copy of a VMware guest into a KubeVirt guest (virtio
//! drivers in its initramfs, fstab and bootloader fixed, VMware Tools removed). This crate holds the pure parts
//! (and one look into the volume that holds the virtio-win drivers):
//! - [`domain`]: the libvirt domain description virt-v2v reads (`-i libvirtxml`), built from what discovery
//!   recorded about the source VM;
//! - [`inspection`]: the guest virt-v2v found (OS, version, architecture, firmware, root), read from its log;
//! - [`spec`]: what `ferry adapt` is asked to do, as the controller passes it to the Job, and where the
//!   virtio-win drivers it names are found in the volume the Job mounted;
//! - [`clock`]: whether a Windows guest keeps its hardware clock in UTC or local time, from its SYSTEM hive, and
//!   the IANA zone KubeVirt should run it in;
//! - [`interface_names`]: which name each NIC keeps inside a Linux guest, read from the guest's own network
//!   configuration and tied to the NIC by MAC or by the addresses VMware Tools reported, and the systemd `.link`
//!   files that keep them (not yet written into guests: issue 52);
//! - [`failure`]: what a failed run means (unsupported guest, no space, missing drivers, appliance trouble), so
//!   the controller knows whether a retry can help.

pub mod clock;
pub mod domain;
pub mod failure;
pub mod inspection;
pub mod interface_names;
pub mod spec;
