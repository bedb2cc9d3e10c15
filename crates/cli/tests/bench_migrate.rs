//! The end-to-end benchmark's smoke run: one small migration per path (direct, staged raw, staged qcow2) through
//! the controller in one lab, beside the floor. Each must succeed, hash to the source and report its figures;
//! the times are printed, not judged (timing on a shared CI machine proves nothing). The full run is
//! `ferry bench migrate --size 4GiB` in a release build.

use std::process::Command;

#[test]
fn each_path_migrates_a_half_empty_disk_and_reports_what_it_moved() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "migrate", "--size", "8MiB", "--timeout", "600"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for path in ["direct", "staged raw", "staged qcow2"] {
        let row = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{path} ")))
            .unwrap_or_else(|| panic!("no {path:?} row: {stdout}"));
        let mib: Vec<&str> = row.split(" MiB").collect();
        // Read from the source, [written,] allocated in the volume, the pod's peak RSS.
        let figures: Vec<u64> = mib[..mib.len() - 1]
            .iter()
            .map(|m| m.split_whitespace().last().unwrap().parse().unwrap())
            .collect();
        assert_eq!(figures[0], 8, "every byte read once: {row}");
        let allocated = figures[figures.len() - 2];
        assert!(
            (4..=5).contains(&allocated),
            "the 4 MiB of zeros stayed holes: {row}"
        );
        assert!(figures[figures.len() - 1] > 0, "peak RSS reported: {row}");
    }
    assert!(stdout.contains("direct is"), "{stdout}");
}
