//! Reading devices and boot options as vSphere writes them.
use super::*;

const XSI: &str = r#"xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance""#;

fn devices_xml() -> String {
    format!(
        r#"<val {XSI} xsi:type="ArrayOfVirtualDevice">
<VirtualDevice xsi:type="VirtualIDEController"><key>200</key><busNumber>0</busNumber></VirtualDevice>
<VirtualDevice xsi:type="ParaVirtualSCSIController"><key>1000</key><busNumber>0</busNumber><device>2000</device><device>2001</device><sharedBus>noSharing</sharedBus></VirtualDevice>
<VirtualDevice xsi:type="VirtualLsiLogicSASController"><key>1001</key><busNumber>1</busNumber></VirtualDevice>
<VirtualDevice xsi:type="VirtualAHCIController"><key>15000</key><busNumber>0</busNumber></VirtualDevice>
<VirtualDevice xsi:type="VirtualDisk"><key>2000</key><deviceInfo><label>Hard disk 1</label></deviceInfo>
  <backing xsi:type="VirtualDiskFlatVer2BackingInfo"><fileName>[ds1] web/web.vmdk</fileName><diskMode>persistent</diskMode><thinProvisioned>true</thinProvisioned><uuid>6000C29a-0b1c-2d3e-4f50-617283940a1b</uuid></backing>
  <controllerKey>1000</controllerKey><unitNumber>0</unitNumber><capacityInKB>1048576</capacityInKB></VirtualDevice>
<VirtualDevice xsi:type="VirtualDisk"><key>2001</key><deviceInfo><label>Hard disk 2</label></deviceInfo>
  <backing xsi:type="VirtualDiskFlatVer2BackingInfo"><fileName>[ds1] web/web_1.vmdk</fileName><diskMode>persistent</diskMode><uuid>6000C29b-1111-2222-3333-444455556666</uuid></backing>
  <controllerKey>1000</controllerKey><unitNumber>1</unitNumber><capacityInBytes>16777216</capacityInBytes></VirtualDevice>
<VirtualDevice xsi:type="VirtualDisk"><key>2002</key><deviceInfo><label>Hard disk 3</label></deviceInfo>
  <backing xsi:type="VirtualDiskSeSparseBackingInfo"><fileName>[ds1] web/web_2.vmdk</fileName><diskMode>persistent</diskMode><uuid>6000C29c-aaaa-bbbb-cccc-ddddeeeeffff</uuid></backing>
  <controllerKey>15000</controllerKey><unitNumber>0</unitNumber><capacityInKB>1024</capacityInKB></VirtualDevice>
<VirtualDevice xsi:type="VirtualDisk"><key>2016</key><deviceInfo><label>Hard disk 4</label></deviceInfo>
  <backing xsi:type="VirtualDiskRawDiskMappingVer1BackingInfo"><fileName>[ds1] web/rdm.vmdk</fileName><compatibilityMode>physicalMode</compatibilityMode></backing>
  <controllerKey>1001</controllerKey><unitNumber>0</unitNumber><capacityInKB>1024</capacityInKB></VirtualDevice>
<VirtualDevice xsi:type="VirtualVmxnet3"><key>4000</key><deviceInfo><label>Network adapter 1</label></deviceInfo>
  <backing xsi:type="VirtualEthernetCardDistributedVirtualPortBackingInfo"><port><switchUuid>50 2a</switchUuid><portgroupKey>dvportgroup-12</portgroupKey></port></backing>
  <controllerKey>100</controllerKey><unitNumber>7</unitNumber><addressType>assigned</addressType><macAddress>00:50:56:aa:bb:cc</macAddress></VirtualDevice>
<VirtualDevice xsi:type="VirtualE1000e"><key>4001</key><deviceInfo><label>Network adapter 2</label></deviceInfo>
  <backing xsi:type="VirtualEthernetCardNetworkBackingInfo"><deviceName>VM Network</deviceName></backing>
  <controllerKey>100</controllerKey><unitNumber>8</unitNumber><macAddress>00:50:56:aa:bb:cd</macAddress></VirtualDevice>
</val>"#
    )
}

fn parsed_devices() -> Element {
    crate::xml::parse(&devices_xml()).unwrap()
}

#[test]
fn disks_carry_their_backing_uuid_and_controller_model() {
    let root = parsed_devices();
    let devices: Vec<&Element> = root.children.iter().collect();
    let disks = parse_disks(&devices);
    let seen: Vec<(i32, &str, &str, i32, Option<&str>)> = disks
        .iter()
        .map(|d| {
            (
                d.key,
                d.bus.as_str(),
                d.controller_model.as_str(),
                d.unit_number,
                d.uuid.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                2000,
                "scsi",
                "pvscsi",
                0,
                Some("6000C29a-0b1c-2d3e-4f50-617283940a1b")
            ),
            (
                2001,
                "scsi",
                "pvscsi",
                1,
                Some("6000C29b-1111-2222-3333-444455556666")
            ),
            (
                2002,
                "sata",
                "ahci",
                0,
                Some("6000C29c-aaaa-bbbb-cccc-ddddeeeeffff")
            ),
            // A physical-mode RDM has no uuid in its backing.
            (2016, "scsi", "lsilogic-sas", 0, None),
        ]
    );
    assert_eq!(disks[0].controller, "ParaVirtualSCSIController");
    assert_eq!(
        (disks[0].capacity_bytes, disks[1].capacity_bytes),
        (1 << 30, 16 << 20)
    );
    assert!(disks[0].thin && !disks[1].thin);
}

#[test]
fn every_controller_type_has_its_model_and_bus() {
    for (controller, model, bus) in [
        ("ParaVirtualSCSIController", "pvscsi", "scsi"),
        ("VirtualLsiLogicController", "lsilogic", "scsi"),
        ("VirtualLsiLogicSASController", "lsilogic-sas", "scsi"),
        ("VirtualBusLogicController", "buslogic", "scsi"),
        ("VirtualAHCIController", "ahci", "sata"),
        ("VirtualIDEController", "ide", "ide"),
        ("VirtualNVMEController", "nvme", "nvme"),
        ("VirtualUSBController", "unknown", "unknown"),
    ] {
        assert_eq!(
            (controller_model(controller), bus_of(controller)),
            (model, bus),
            "{controller}"
        );
    }
}

#[test]
fn nics_name_their_model_and_network() {
    let root = parsed_devices();
    let devices: Vec<&Element> = root.children.iter().collect();
    let nics = parse_nics(&devices);
    let seen: Vec<(&str, &str, &str)> = nics
        .iter()
        .map(|n| (n.model.as_str(), n.mac.as_str(), n.network.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("vmxnet3", "00:50:56:aa:bb:cc", "dvportgroup:dvportgroup-12"),
            ("e1000e", "00:50:56:aa:bb:cd", "VM Network"),
        ]
    );
}

#[test]
fn boot_options_give_secure_boot_and_the_disks_in_boot_order() {
    let options = crate::xml::parse(&format!(
        r#"<val {XSI} xsi:type="VirtualMachineBootOptions"><bootDelay>0</bootDelay><enterBIOSSetup>false</enterBIOSSetup><efiSecureBootEnabled>true</efiSecureBootEnabled><bootRetryEnabled>false</bootRetryEnabled><bootRetryDelay>10000</bootRetryDelay>
<bootOrder xsi:type="VirtualMachineBootOptionsBootableCdromDevice"></bootOrder>
<bootOrder xsi:type="VirtualMachineBootOptionsBootableDiskDevice"><deviceKey>2001</deviceKey></bootOrder>
<bootOrder xsi:type="VirtualMachineBootOptionsBootableEthernetDevice"><deviceKey>4000</deviceKey></bootOrder>
<bootOrder xsi:type="VirtualMachineBootOptionsBootableDiskDevice"><deviceKey>2000</deviceKey></bootOrder>
<networkBootProtocol>ipv4</networkBootProtocol></val>"#
    ))
    .unwrap();
    assert_eq!(
        parse_boot_options(Some(&options)),
        BootOptions {
            efi_secure_boot: Some(true),
            disk_order: vec![2001, 2000],
        }
    );

    // vcsim's VMs and BIOS VMs: nothing set.
    let empty = crate::xml::parse(&format!(
        r#"<val {XSI} xsi:type="VirtualMachineBootOptions"/>"#
    ))
    .unwrap();
    assert_eq!(parse_boot_options(Some(&empty)), BootOptions::default());
    assert_eq!(parse_boot_options(None), BootOptions::default());
    let off = crate::xml::parse(&format!(
        r#"<val {XSI} xsi:type="VirtualMachineBootOptions"><efiSecureBootEnabled>false</efiSecureBootEnabled></val>"#
    ))
    .unwrap();
    assert_eq!(parse_boot_options(Some(&off)).efi_secure_boot, Some(false));
}
