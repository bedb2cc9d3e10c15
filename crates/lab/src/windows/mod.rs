//! Phony Windows guests, made the way virt-v2v's own test suite makes them (`test-data/phony-guests`): no
//! Windows can be built here, so each disk holds only what virt-v2v's inspection and conversion read and write:
//! an NTFS system volume with real registry hives (SOFTWARE and SYSTEM, filled by hivexregedit from `.reg` text),
//! a `cmd.exe` that libmagic reads as a 64-bit PE, and for UEFI an ESP with the boot manager's files. Beside them,
//! fake virtio-win drivers laid out as the real ISO lays them out, and a fake first-boot tool (rhsrvany). virt-v2v
//! adapts them for real; nothing here boots, and nothing proves the real drivers or rhsrvany work.

pub mod check;
pub mod claims;
pub mod drivers;
pub mod hive;
pub mod phony;
pub mod registry;
pub mod vms;

use ferry_api::Firmware;

/// One phony Windows VM: what vSphere says of it and what its registry says of itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhonyWindows {
    /// The VM's name in vcsim and the guest's hostname.
    pub name: &'static str,
    /// vSphere's guest ID, as VMware Tools or the VM's creator set it.
    pub guest_id: &'static str,
    pub product_name: &'static str,
    pub build: &'static str,
    /// `Server` or `Client`.
    pub installation_type: &'static str,
    pub edition_id: &'static str,
    pub firmware: Firmware,
    /// Only with EFI.
    pub secure_boot: bool,
    /// Whether SYSTEM has a `DriverDatabase` key (Windows 8 and later do): virt-v2v registers the block driver
    /// there, and otherwise in `CriticalDeviceDatabase`. It is the key, not the version, that decides.
    pub driver_database: bool,
    /// Hibernated (or shut down with Fast Startup): `hiberfil.sys` holds an image, and the volume cannot be
    /// mounted for writing.
    pub hibernated: bool,
    /// A virtual TPM (`VirtualTPM`) in vSphere, as Windows 11 requires.
    pub vtpm: bool,
    /// The address VMware Tools reports on the guest's one NIC, with the lab's gateway and DNS server.
    pub tools_address: ToolsAddress,
    /// `TimeZoneInformation`: the zone's Windows name, and whether the RTC keeps UTC (`RealTimeIsUniversal`)
    /// instead of local time, Windows' default.
    pub time_zone: &'static str,
    pub rtc_utc: bool,
}

/// An IPv4 address as VMware Tools reports it: configured by hand in the guest (`manual`) or leased by DHCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolsAddress {
    pub address: &'static str,
    pub prefix_length: u8,
    pub manual: bool,
}

/// The default gateway and DNS server VMware Tools reports for every phony guest.
pub const TOOLS_GATEWAY: &str = "192.168.122.1";
pub const TOOLS_DNS: &str = "192.168.122.2";

/// Windows Server 2022 on BIOS, its block driver registered the pre-Windows 8 way, with a static address.
pub const WIN2K22: PhonyWindows = PhonyWindows {
    name: "ferry-win2k22",
    guest_id: "windows2019srvNext_64Guest",
    product_name: "Windows Server 2022 Standard",
    build: "20348",
    installation_type: "Server",
    edition_id: "ServerStandard",
    firmware: Firmware::Bios,
    secure_boot: false,
    driver_database: false,
    hibernated: false,
    vtpm: false,
    tools_address: ToolsAddress {
        address: "192.168.122.50",
        prefix_length: 24,
        manual: true,
    },
    time_zone: "W. Europe Standard Time",
    rtc_utc: false,
};

/// Windows 11 on UEFI with Secure Boot and a vTPM, with a DriverDatabase, its address from DHCP.
pub const WIN11: PhonyWindows = PhonyWindows {
    name: "ferry-win11",
    guest_id: "windows11_64Guest",
    product_name: "Windows 11 Pro",
    build: "22631",
    installation_type: "Client",
    edition_id: "Professional",
    firmware: Firmware::Efi,
    secure_boot: true,
    driver_database: true,
    hibernated: false,
    vtpm: true,
    tools_address: ToolsAddress {
        address: "192.168.122.61",
        prefix_length: 24,
        manual: false,
    },
    time_zone: "Pacific Standard Time",
    rtc_utc: true,
};

/// The Windows Server 2022 guest, hibernated.
pub const WIN2K22_HIBERNATED: PhonyWindows = PhonyWindows {
    name: "ferry-win2k22-hibernated",
    hibernated: true,
    ..WIN2K22
};

pub const ALL: [PhonyWindows; 3] = [WIN2K22, WIN11, WIN2K22_HIBERNATED];

impl PhonyWindows {
    pub fn server(&self) -> bool {
        self.installation_type == "Server"
    }
}
