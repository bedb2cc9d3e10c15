//! A seeded sample of `ferry lab chaos` trials on every run of the suite (built with `--features ferry/chaos`,
//! as `make test` does): sampled from every perturbation (crashes, failed and stale writes, pauses, vSphere
//! faults, killed pods and importers) on a 3-disk migration, a deletion while the guest boots (the source
//! must stay off until the target's VMI is gone), a bad spec corrected later, and a MigrationPlan of two VMs on
//! one host with a limit of one disk at a time (never two reading from it at once), each judged against its
//! fault-free run. The full run is
//! `ferry lab chaos --workload all --perturbation all --workers 6` (see README).
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
            "delete@ValidatingGuest",
            "--workload",
            "bad-spec",
            "--workload",
            "plan",
            "--perturbation",
            "all",
            "--sample",
            "5",
            "--seed",
            "2026",
            "--workers",
            "2",
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
    assert!(plans >= 20, "at least 20 trials ran: {stdout}");
    // A trial whose fault never struck proves nothing. Its last writes and vSphere calls vary from run to run
    // (a status write more or less, one poll fewer), so a plan aimed at the reference's tail may miss; most
    // must strike.
    let unreached = stdout.matches("(fault not reached)").count();
    assert!(
        plans - unreached >= 16,
        "only {} of {plans} trials struck: {stdout}",
        plans - unreached
    );
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
