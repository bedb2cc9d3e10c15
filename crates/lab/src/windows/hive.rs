//! An empty Windows registry hive, which hivexregedit then fills from `.reg` text. No Debian package ships one and
//! hivex cannot create one, so the lab writes the smallest file `hivex_open` accepts for writing (hivex 1.3.23
//! `lib/handle.c`, `lib/write.c`): the regf header with its checksum, one 4 KiB hbin page holding the root key
//! (nk), the security cell (sk) every new key's parent must have, and a free cell filling the rest of the page.

/// The header block and one hbin page.
const SIZE: usize = 0x2000;
/// Where the hbin pages start; cell offsets count from here.
const HBINS: usize = 0x1000;
/// The root key's cell, and the security cell after it (offsets from [`HBINS`]).
const ROOT_CELL: usize = 0x20;
const ROOT_CELL_LEN: usize = 0x50;
const SK_CELL: usize = ROOT_CELL + ROOT_CELL_LEN;
const SK_CELL_LEN: usize = 0x30;
/// Absent (a key with no subkeys, values or class).
const NONE: u32 = 0xffff_ffff;

/// The hive's bytes: 8 KiB, a root key with no name, no subkeys and no values.
pub fn empty_hive() -> Vec<u8> {
    let mut hive = vec![0u8; SIZE];
    let put = |hive: &mut [u8], at: usize, value: u32| {
        hive[at..at + 4].copy_from_slice(&value.to_le_bytes())
    };
    // Header: sequence numbers equal (a clean hive), version 1.5, a normal file, root cell, hbins' length.
    hive[..4].copy_from_slice(b"regf");
    put(&mut hive, 0x04, 1);
    put(&mut hive, 0x08, 1);
    put(&mut hive, 0x14, 1);
    put(&mut hive, 0x18, 5);
    put(&mut hive, 0x20, 1);
    put(&mut hive, 0x24, ROOT_CELL as u32);
    put(&mut hive, 0x28, (SIZE - HBINS) as u32);
    put(&mut hive, 0x2c, 1);

    let page = HBINS;
    hive[page..page + 4].copy_from_slice(b"hbin");
    put(&mut hive, page + 4, 0);
    put(&mut hive, page + 8, (SIZE - HBINS) as u32);

    // A used cell's length is negative.
    let nk = HBINS + ROOT_CELL;
    put(&mut hive, nk, (ROOT_CELL_LEN as i32).wrapping_neg() as u32);
    hive[nk + 4..nk + 6].copy_from_slice(b"nk");
    // The root key's flags, as Windows writes them: root, not deletable, ASCII name.
    hive[nk + 6..nk + 8].copy_from_slice(&0x2c_u16.to_le_bytes());
    put(&mut hive, nk + 0x14, NONE); // parent
    put(&mut hive, nk + 0x20, NONE); // subkey list
    put(&mut hive, nk + 0x24, NONE); // volatile subkey list
    put(&mut hive, nk + 0x2c, NONE); // value list
    put(&mut hive, nk + 0x30, SK_CELL as u32);
    put(&mut hive, nk + 0x34, NONE); // class name

    let sk = HBINS + SK_CELL;
    put(&mut hive, sk, (SK_CELL_LEN as i32).wrapping_neg() as u32);
    hive[sk + 4..sk + 6].copy_from_slice(b"sk");
    // The only security cell: its own neighbour in the list, used by the root key.
    put(&mut hive, sk + 0x08, SK_CELL as u32);
    put(&mut hive, sk + 0x0c, SK_CELL as u32);
    put(&mut hive, sk + 0x10, 1);
    // A self-relative security descriptor with no owner, group or ACLs: hivex copies it and never reads it.
    put(&mut hive, sk + 0x14, 20);
    hive[sk + 0x18..sk + 0x1c].copy_from_slice(&[1, 0, 0, 0x80]);

    let free = HBINS + SK_CELL + SK_CELL_LEN;
    put(&mut hive, free, (SIZE - free) as u32);

    let checksum = hive[..0x1fc].chunks_exact(4).fold(0u32, |sum, dword| {
        sum ^ u32::from_le_bytes(dword.try_into().unwrap())
    });
    put(&mut hive, 0x1fc, checksum);
    hive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_checksum_covers_the_first_127_dwords_and_cells_tile_the_page() {
        let hive = empty_hive();
        assert_eq!(hive.len(), 8192);
        let dword = |at: usize| u32::from_le_bytes(hive[at..at + 4].try_into().unwrap());
        let xor = (0..127).fold(0, |sum, i| sum ^ dword(i * 4));
        assert_eq!(dword(0x1fc), xor);
        // Cells from the page's header to its end, each a multiple of 8 bytes: used, used, free.
        let mut at = HBINS + 0x20;
        let mut lengths = vec![];
        while at < SIZE {
            let len = dword(at) as i32;
            lengths.push(len);
            at += len.unsigned_abs() as usize;
        }
        assert_eq!(at, SIZE);
        assert_eq!(lengths, [-0x50, -0x30, 0xf60]);
        assert_eq!(&hive[HBINS + ROOT_CELL + 4..][..2], b"nk");
        assert_eq!(
            &hive[HBINS + dword(HBINS + ROOT_CELL + 0x30) as usize + 4..][..2],
            b"sk"
        );
    }
}
