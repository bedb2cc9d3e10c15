//! Conventions of a command-line tool around kubectl: `ferry` runs as the kubectl plugin `kubectl ferry` (an
//! executable named kubectl-ferry on PATH, found by the lab's real kubectl), and prints shell completions.

use std::path::Path;
use std::process::Command;

fn ferry() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ferry"))
}

fn output(command: &mut Command) -> String {
    let out = command.output().expect("running the command");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn kubectl_finds_and_runs_ferry_as_its_plugin() {
    let kubectl = ferry_lab::control_plane::tools::bin_dir()
        .expect("the lab's tools (FERRY_TOOLS_BIN)")
        .join("kubectl");
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(ferry(), plugins.path().join("kubectl-ferry")).unwrap();
    let path = format!(
        "{}:{}",
        plugins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let listed = output(
        Command::new(&kubectl)
            .args(["plugin", "list"])
            .env("PATH", &path),
    );
    assert!(listed.contains("kubectl-ferry"), "{listed}");
    let help = output(
        Command::new(&kubectl)
            .args(["ferry", "get", "--help"])
            .env("PATH", &path),
    );
    assert!(help.contains("Usage: kubectl ferry get"), "{help}");
    let version = output(
        Command::new(&kubectl)
            .args(["ferry", "--version"])
            .env("PATH", &path),
    );
    assert!(version.starts_with("ferry "), "{version}");
}

#[test]
fn completions_cover_every_subcommand_for_each_shell() {
    let bash = output(Command::new(ferry()).args(["completion", "bash"]));
    assert!(bash.contains("complete -F _ferry"), "{bash}");
    for sub in ["describe", "watch", "inventory", "plan", "completion"] {
        assert!(bash.contains(sub), "bash completion lacks {sub}");
    }
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        let script = output(Command::new(ferry()).args(["completion", shell]));
        assert!(script.contains("describe"), "{shell}: {script}");
    }
    let refused = Command::new(ferry())
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("possible values"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
