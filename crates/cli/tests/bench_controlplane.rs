//! The control-plane benchmark's smoke run: 20 migrations through Ferry's controller in one lab, beside the
//! floor (the same work as a straight-line script). Small on purpose: it proves the benchmark runs and counts,
//! not how fast Ferry is. Every migration must succeed; the numbers are printed, not
//! judged (timing on a shared CI machine proves nothing). The full run is `ferry bench controlplane` (1000).

use std::process::Command;

#[test]
fn twenty_migrations_all_succeed_and_are_measured() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "bench",
            "controlplane",
            "--migrations",
            "20",
            "--timeout",
            "1200",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let row = |label: &str| -> Vec<String> {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} row: {stdout}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    assert_eq!(row("succeeded")[1..], ["20/20", "20/20"], "{stdout}");
    // The floor's writes are fixed by its script (15, the staging CA's ConfigMap one of them): the audit log must
    // count exactly those.
    let writes = row("writes (create/update/patch/delete)");
    assert_eq!(writes[2], "15.00", "the floor's writes: {stdout}");
    let ferry_writes: f64 = writes[3].parse().unwrap();
    assert!(
        ferry_writes >= 11.0,
        "Ferry's writes were counted: {stdout}"
    );
    for target in [
        "API writes per migration",
        "controller peak RSS",
        "controller CPU",
        "floor ratio",
    ] {
        assert!(stdout.contains(target), "{target} reported: {stdout}");
    }
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("ferry-bench-cp-{}", out_pid(&stderr)))
        })
        .collect();
    assert!(left.is_empty(), "the lab's directory is removed: {left:?}");
}

/// The benchmark names its lab after its process id, which it prints.
fn out_pid(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("lab: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|dir| dir.rsplit('-').next())
        .unwrap_or("none")
        .to_string()
}

/// 24 (three per host) as one `MigrationPlan` over eight ESXi hosts under a limit of two disks per host: the benchmark
/// checks from the migrations' recorded Converting intervals that no host ever had more.
#[test]
fn a_plan_of_twenty_four_on_eight_hosts_keeps_the_per_host_limit() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "bench",
            "controlplane",
            "--plan",
            "--hosts",
            "8",
            "--disks-per-host",
            "2",
            "--migrations",
            "24",
            "--timeout",
            "1200",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("as one MigrationPlan"), "{stdout}");
    let peaks = stdout
        .lines()
        .find(|l| l.starts_with("disks read at once, most per ESXi host (limit 2):"))
        .unwrap_or_else(|| panic!("no per-host line: {stdout}"));
    let hosts: Vec<&str> = peaks.split(": ").nth(1).unwrap().split(", ").collect();
    assert_eq!(hosts.len(), 8, "the VMs spread over 8 hosts: {peaks}");
    for host in hosts {
        let peak: usize = host.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((1..=2).contains(&peak), "{host}: {peaks}");
    }
    assert!(
        stdout.contains("disks read at once per host <= the Provider's limit")
            && stdout
                .lines()
                .any(|l| l.contains("the Provider's limit") && l.trim_end().ends_with("met")),
        "{stdout}"
    );
}
