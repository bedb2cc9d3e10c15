//! A seeded sample of `ferry lab chaos` plans on every run of the suite (built with `--features ferry/chaos`,
//! as `make test` does): crashes and failed writes at sampled writes of a happy migration and of a deletion,
//! each judged against its fault-free run. The full run is
//! `ferry lab chaos --workload all --perturbation all` (see README).
#![cfg(feature = "chaos")]

use std::process::Command;

#[test]
fn a_seeded_sample_of_chaos_plans_violates_no_oracle() {
    let failures = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "lab",
            "chaos",
            "--workload",
            "happy-3",
            "--workload",
            "delete",
            "--sample",
            "6",
            "--seed",
            "2026",
        ])
        .arg("--failures")
        .arg(failures.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let plans: usize = stdout
        .lines()
        .filter_map(|l| {
            l.split("plans ")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert!(plans >= 12, "at least 12 plans ran: {stdout}");
    for saved in std::fs::read_dir(failures.path()).unwrap().flatten() {
        println!(
            "{}:\n{}",
            saved.path().display(),
            std::fs::read_to_string(saved.path()).unwrap_or_default()
        );
    }
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout
            .lines()
            .filter(|l| l.contains(": plans "))
            .all(|l| l.ends_with("violations 0")),
        "{stdout}"
    );
}
