//! Where each PCI device of a domain sits, as libvirt 11.3 lays out KubeVirt v1.9.0's q35 domains (read from the
//! real node's QEMU command lines): every device on a PCIe root port of its own (`pci.1`, `pci.2`, ... on bus 0,
//! slot 2 and up, eight functions each), in this order: a pcie-pci-bridge when a conventional controller is needed
//! (the AHCI controllers past the first, for a seventh SATA disk), the NICs, KubeVirt's placeholders that keep up to
//! four NIC ports free for hotplug, virtio-scsi (always), virtio-serial, the virtio disks, the balloon, and one
//! spare port. The order is visible to the guest: it names a NIC by its bus (`enp1s0`, or `enp2s0` behind the
//! bridge) and numbers virtio disks in bus order.

/// KubeVirt keeps this many ports for NICs, the ones it has and placeholders (`calculateHotplugPortCountV1`).
const NIC_PORTS: usize = 4;

/// The buses the devices go on, and the root ports (and bridge) they need.
#[derive(Debug, Default, PartialEq)]
pub struct Layout {
    /// `-device` values of the root ports and the bridge, in order.
    pub controllers: Vec<String>,
    /// The bridge's id, when there is one.
    pub bridge: Option<String>,
    pub nics: Vec<String>,
    pub scsi: String,
    pub serial: String,
    pub virtio_disks: Vec<String>,
    pub balloon: String,
}

impl Layout {
    pub fn new(nics: usize, virtio_disks: usize, needs_bridge: bool) -> Self {
        let mut layout = Layout::default();
        let mut next = 0;
        let mut port = |layout: &mut Layout| {
            next += 1;
            let (slot, function) = (2 + (next - 1) / 8, (next - 1) % 8);
            let mut device = format!(
                "pcie-root-port,port={:#x},chassis={next},id=pci.{next},bus=pcie.0,addr={slot:#x}.{function:#x}",
                0x10 + next - 1
            );
            if function == 0 {
                device.push_str(",multifunction=on");
            }
            layout.controllers.push(device);
            format!("pci.{next}")
        };
        if needs_bridge {
            let bus = port(&mut layout);
            layout
                .controllers
                .push(format!("pcie-pci-bridge,id=pci-bridge,bus={bus},addr=0x0"));
            layout.bridge = Some("pci-bridge".into());
        }
        layout.nics = (0..nics).map(|_| port(&mut layout)).collect();
        if nics > 0 {
            for _ in nics..NIC_PORTS {
                port(&mut layout);
            }
        }
        layout.scsi = port(&mut layout);
        layout.serial = port(&mut layout);
        layout.virtio_disks = (0..virtio_disks).map(|_| port(&mut layout)).collect();
        layout.balloon = port(&mut layout);
        port(&mut layout);
        layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_sit_where_kubevirt_v1_9_puts_them() {
        // One NIC and two SATA disks (the real node's `bios` VM).
        let plain = Layout::new(1, 0, false);
        assert_eq!(plain.nics, ["pci.1"]);
        assert_eq!(
            (
                plain.scsi.as_str(),
                plain.serial.as_str(),
                plain.balloon.as_str()
            ),
            ("pci.5", "pci.6", "pci.7")
        );
        assert_eq!(plain.controllers.len(), 8);
        assert_eq!(
            plain.controllers[0],
            "pcie-root-port,port=0x10,chassis=1,id=pci.1,bus=pcie.0,addr=0x2.0x0,multifunction=on"
        );
        assert_eq!(
            plain.controllers[7],
            "pcie-root-port,port=0x17,chassis=8,id=pci.8,bus=pcie.0,addr=0x2.0x7"
        );
        // Two virtio disks (`unadapted-virtio`).
        let virtio = Layout::new(1, 2, false);
        assert_eq!(virtio.virtio_disks, ["pci.7", "pci.8"]);
        assert_eq!(virtio.balloon, "pci.9");
        assert_eq!(
            virtio.controllers[8],
            "pcie-root-port,port=0x18,chassis=9,id=pci.9,bus=pcie.0,addr=0x3.0x0,multifunction=on"
        );
        // Twelve SATA disks: the bridge first, so the NIC moves to bus 2 (`twelve-sata`).
        let twelve = Layout::new(1, 0, true);
        assert_eq!(twelve.nics, ["pci.2"]);
        assert_eq!(
            twelve.controllers[1],
            "pcie-pci-bridge,id=pci-bridge,bus=pci.1,addr=0x0"
        );
        assert_eq!(
            (twelve.scsi.as_str(), twelve.serial.as_str()),
            ("pci.6", "pci.7")
        );
    }
}
