//! The demo VM's disk: an MBR boot program that prints a marker on COM1 and halts, followed by deterministic
//! pseudo-random data. If a migrated disk boots and prints its marker, its bytes survived end to end; any
//! corruption elsewhere shows in its checksum.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Result, bail};

/// COM1's data and line-status ports.
const COM1: u16 = 0x3F8;
const COM1_LSR: u16 = 0x3FD;
const LOAD_ADDRESS: u16 = 0x7C00;

/// The 512-byte boot sector: real-mode code at 0x7C00 that writes `marker` and a newline to COM1, then halts.
pub fn boot_sector(marker: &str) -> Result<[u8; 512]> {
    let mut code: Vec<u8> = vec![
        0xFA, // cli
        0xFC, // cld: lodsb walks forward
        0x31,
        0xC0, // xor ax, ax
        0x8E,
        0xD8, // mov ds, ax
        0xBE,
        0,
        0, // mov si, <message>        (patched below)
        // next:
        0xAC, // lodsb
        0x84,
        0xC0, // test al, al
        0x74,
        0x12, // jz done                   (+18)
        0x88,
        0xC4, // mov ah, al
        // wait: until the transmitter holding register is empty
        0xBA,
        (COM1_LSR & 0xFF) as u8,
        (COM1_LSR >> 8) as u8, // mov dx, COM1_LSR
        0xEC,                  // in al, dx
        0xA8,
        0x20, // test al, 0x20
        0x74,
        0xF8, // jz wait                   (-8)
        0x88,
        0xE0, // mov al, ah
        0xBA,
        (COM1 & 0xFF) as u8,
        (COM1 >> 8) as u8, // mov dx, COM1
        0xEE,              // out dx, al
        0xEB,
        0xE9, // jmp next                  (-23)
        // done:
        0xF4, // hlt
        0xEB,
        0xFD, // jmp done
    ];
    let message_at = LOAD_ADDRESS + code.len() as u16;
    code[7..9].copy_from_slice(&message_at.to_le_bytes());
    if marker.is_empty() || !marker.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        bail!("the marker must be printable ASCII");
    }
    code.extend_from_slice(marker.as_bytes());
    code.extend_from_slice(b"\r\n\0");
    // The partition table (446..510) stays empty; 0x55AA marks the sector bootable.
    if code.len() > 446 {
        bail!(
            "the marker is too long for a boot sector ({} bytes of code and text, 446 at most)",
            code.len()
        );
    }
    let mut sector = [0u8; 512];
    sector[..code.len()].copy_from_slice(&code);
    sector[510] = 0x55;
    sector[511] = 0xAA;
    Ok(sector)
}

/// Writes a raw disk of `size` bytes: the boot sector, then pseudo-random data seeded by the marker.
/// Returns the sha256 of the whole disk.
pub fn make_boot_disk(path: &Path, size: u64, marker: &str) -> Result<String> {
    if size < (1 << 20) || !size.is_multiple_of(1 << 20) {
        bail!("the disk size must be a whole number of MiB, at least 1 MiB");
    }
    let seed = marker
        .bytes()
        .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b));
    crate::disks::write_pattern(path, size, seed)?;
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&boot_sector(marker)?)?;
    file.sync_all()?;
    drop(file);
    crate::disks::sha256_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_sector_is_bootable_and_carries_the_marker() {
        let sector = boot_sector("FERRY-MARKER-1").unwrap();
        assert_eq!(&sector[510..], &[0x55, 0xAA]);
        let text = String::from_utf8_lossy(&sector);
        assert!(text.contains("FERRY-MARKER-1\r\n"));
        // `mov si` points at the message's address once loaded at 0x7C00.
        let si = u16::from_le_bytes([sector[7], sector[8]]);
        let at = sector
            .windows(14)
            .position(|w| w == b"FERRY-MARKER-1")
            .unwrap() as u16;
        assert_eq!(si, LOAD_ADDRESS + at);
    }

    #[test]
    fn bad_markers_are_refused() {
        assert!(boot_sector("").is_err());
        assert!(boot_sector("bell\u{7}").is_err());
        assert!(boot_sector(&"x".repeat(500)).is_err());
    }
}
