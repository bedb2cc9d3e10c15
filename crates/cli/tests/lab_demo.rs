//! The README's first command, `ferry lab demo`, and the views a person reads: `ferry get`, `ferry describe`
//! (also of a failed migration) and `ferry watch` on a terminal (a pseudo-terminal from `script`) and without one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

struct LabGuard(PathBuf);

impl Drop for LabGuard {
    fn drop(&mut self) {
        let _ = ferry(
            &["lab", "down", "--dir", &self.0.display().to_string()],
            &self.0,
        );
    }
}

fn ferry_command(args: &[&str], lab: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ferry"));
    command.args(args).env("KUBECONFIG", lab.join("kubeconfig"));
    command
}

fn ferry(args: &[&str], lab: &Path) -> Output {
    ferry_command(args, lab).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn kubectl_apply(lab: &Path, manifest: &serde_json::Value) {
    let state = ferry_lab::LabState::load(lab).unwrap().unwrap();
    let mut child = Command::new(state.tools.join("kubectl"))
        .env("KUBECONFIG", &state.kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.to_string().as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

#[tokio::test]
async fn the_demo_migrates_both_vms_and_get_describe_and_watch_show_them() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("lab");
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    let _guard = LabGuard(dir.clone());
    let d = dir.display().to_string();

    let demo = ferry(&["lab", "demo", "--dir", &d], &dir);
    let out = text(&demo);
    println!("{out}");
    assert!(demo.status.success(), "the demo failed:\n{out}");
    for vm in ["DC0_H0_VM0", "DC0_H0_VM1"] {
        let name = vm.to_lowercase().replace('_', "-");
        assert!(
            out.contains(&format!("{vm} -> ferry-demo/{name}: Succeeded in")),
            "{vm}: {out}"
        );
        assert!(
            out.contains(&format!(
                "\"FERRY-GUEST-READY {vm}\" on the migrated VM's serial console"
            )),
            "{out}"
        );
        assert!(out.contains("guest check: RanSteadily: ran for "), "{out}");
    }
    assert!(out.contains(
        "checksum: 3 of 3 disk(s) read back from their volumes with the source's sha256 (match)"
    ));
    // The Debian VM: its own report on the console, and its agent's answer as the proof.
    assert!(
        out.contains("ferry-linux-bios -> ferry-demo/ferry-linux-bios: Succeeded in"),
        "{out}"
    );
    assert!(
        out.contains("\"FERRY-GUEST-READY ferry-linux-bios kernel="),
        "{out}"
    );
    assert!(
        out.contains("guest check: AgentAnswered: guest agent answered: Debian GNU/Linux 12"),
        "{out}"
    );
    assert!(
        out.contains("checkpoints: Discovering +0.0s, Validating"),
        "{out}"
    );

    // ferry get: a table, in one namespace or all.
    let get = text(&ferry(&["get", "-n", "ferry-demo"], &dir));
    println!("{get}");
    let lines: Vec<&str> = get.lines().collect();
    assert!(
        lines[0].starts_with("NAME")
            && lines[0].contains("PHASE")
            && lines[0].contains("PROGRESS")
            && lines[0].contains("TARGET")
            && lines[0].contains("AGE")
            && lines[0].contains("REASON")
    );
    assert!(
        lines.iter().any(|l| l.starts_with("dc0-h0-vm1")
            && l.contains("Succeeded")
            && l.contains("100% (112 MiB of 112 MiB)")),
        "{get}"
    );
    assert!(
        text(&ferry(&["get", "-A"], &dir))
            .lines()
            .next()
            .unwrap()
            .starts_with("NAMESPACE")
    );

    // ferry describe of a success.
    let described = text(&ferry(
        &["describe", "-n", "ferry-demo", "dc0-h0-vm1"],
        &dir,
    ));
    println!("{described}");
    for part in [
        "Checkpoints:",
        "Conditions:",
        "Disks:",
        "Events:",
        "DisksImportedAndVerified",
        "dc0-h0-vm1-disk-2",
        "Ready              True",
    ] {
        assert!(described.contains(part), "no {part:?} in:\n{described}");
    }

    // ferry describe of a failure names the checkpoint, the reason and the next step.
    let state = ferry_lab::LabState::load(&dir).unwrap().unwrap();
    kubectl_apply(
        &dir,
        &ferry_lab::vsphere::demo::migration(&state, "ferry-demo", "lost", "no-such-vm"),
    );
    let failed = ferry_testkit::eventually(
        "the lost migration to fail",
        Duration::from_secs(60),
        || async {
            let out = text(&ferry(&["describe", "-n", "ferry-demo", "lost"], &dir));
            out.contains("What went wrong:").then_some(out)
        },
    )
    .await;
    println!("{failed}");
    assert!(failed.contains("Checkpoint: Discovering"), "{failed}");
    assert!(failed.contains("Permanent SourceVMNotFound"), "{failed}");
    assert!(
        failed.contains("Next step:  run `ferry inventory` to find the VM"),
        "{failed}"
    );

    // ferry watch on a terminal: bars redrawn in place, per migration and per disk.
    let watched = std::thread::spawn({
        let ferry = env!("CARGO_BIN_EXE_ferry").to_string();
        let kubeconfig = dir.join("kubeconfig");
        move || {
            Command::new("timeout")
                .args([
                    "180",
                    "script",
                    "-qfec",
                    &format!("{ferry} watch -n ferry-demo cluster-vm"),
                    "/dev/null",
                ])
                .env("KUBECONFIG", kubeconfig)
                .env("COLUMNS", "120")
                .output()
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    kubectl_apply(
        &dir,
        &ferry_lab::vsphere::demo::migration(&state, "ferry-demo", "cluster-vm", "DC0_C0_RP0_VM0"),
    );
    let tty = watched.join().unwrap();
    let screen = String::from_utf8_lossy(&tty.stdout).to_string();
    assert!(tty.status.success(), "watch: {screen}");
    assert!(
        screen.contains("\x1b[") && screen.contains("\x1b[J"),
        "redrawn in place"
    );
    let frames: Vec<&str> = screen.split("\x1b[J").collect();
    let last = frames.last().unwrap().replace('\r', "");
    println!("last ferry watch frame ({} frames):\n{last}", frames.len());
    assert!(frames.len() > 3, "several frames: {screen}");
    assert!(
        last.contains("ferry-demo/cluster-vm")
            && last.contains("Succeeded")
            && last.contains("[########################]")
            && last.contains("100%"),
        "{last}"
    );
    assert!(
        last.contains("disk 0") && last.contains("imported, sha256 verified"),
        "{last}"
    );
    assert!(
        screen.contains("Converting") || screen.contains("Importing"),
        "frames during the work: {screen}"
    );

    // Without a terminal: plain lines, one per change, no escape codes.
    let plain = ferry(&["watch", "-n", "ferry-demo", "cluster-vm"], &dir);
    let plain = text(&plain);
    assert!(!plain.contains('\x1b'), "{plain:?}");
    assert!(
        plain.contains("ferry-demo/cluster-vm Succeeded 100%"),
        "{plain}"
    );
}
