//! Before virt-v2v: a Linux guest keeps its interface names. One libguestfs appliance (guestfish, driven over its
//! standard input) inspects the guest on the overlays, reads its network configuration, and writes a systemd
//! `.link` file for each NIC whose name Ferry can tie to it ([`ferry_adapt::interface_names`]). virt-v2v then
//! rebuilds the initramfs with them and relabels the guest where SELinux needs it. Writes go to the overlays, so
//! the volumes change only if the whole adaptation succeeds.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use ferry_adapt::interface_names::{
    CONFIG_FILES, NamesOutcome, SourceNic, configured_interfaces, link_file, pins,
};
use ferry_adapt::spec::AdaptSpec;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// What guestfish prints between one batch of commands and the next.
const MARK: &str = "@@ferry-batch-done@@";

/// Long enough for an appliance under software emulation on a busy node.
const TIMEOUT: Duration = Duration::from_secs(900);

/// Keeps the names `nics` go by in the guest on `spec`'s overlays. Never fails the adaptation: a guest whose
/// configuration cannot be read is left as it is, and the outcome says why.
pub async fn keep(spec: &AdaptSpec, nics: &[SourceNic], work: &Path) -> NamesOutcome {
    let files = work.join("interface-names");
    let _ = std::fs::remove_dir_all(&files);
    let outcome = match std::fs::create_dir_all(&files) {
        Ok(()) => tokio::time::timeout(TIMEOUT, run(spec, nics, work, &files))
            .await
            .unwrap_or_else(|_| Err(format!("guestfish took over {} s", TIMEOUT.as_secs()))),
        Err(e) => Err(format!("{}: {e}", files.display())),
    };
    let _ = std::fs::remove_dir_all(&files);
    let outcome = outcome.unwrap_or_else(|e| NamesOutcome::failed(&e));
    println!("{}", outcome.describe());
    outcome
}

async fn run(
    spec: &AdaptSpec,
    nics: &[SourceNic],
    work: &Path,
    files: &Path,
) -> Result<NamesOutcome, String> {
    let mut command = tokio::process::Command::new("guestfish");
    command.args(["--rw", "-i", "--format=qcow2"]);
    for index in 0..spec.disks.len() {
        command.arg("-a").arg(spec.overlay(index));
    }
    crate::adapt::libguestfs_env(&mut command, work);
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("guestfish could not be started: {e}"))?;
    let mut session = Session::of(&mut child)?;
    let result = session.keep_names(nics, files).await;
    let closed = session.close(&mut child).await;
    match (result, closed) {
        (Ok(plan), Ok(())) => Ok(NamesOutcome::written(&plan)),
        // guestfish's own words say more than that it stopped.
        (_, Err(said)) if !said.is_empty() => Err(said),
        (Err(e), _) => Err(e),
        (Ok(_), Err(_)) => Err("guestfish failed without an error message".into()),
    }
}

/// guestfish reading commands from a pipe; it stops at the first failed command, which closes its output.
struct Session {
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: tokio::task::JoinHandle<String>,
}

impl Session {
    fn of(child: &mut Child) -> Result<Self, String> {
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("guestfish's pipes were not opened".into());
        };
        Ok(Self {
            stdin,
            stdout: BufReader::new(stdout).lines(),
            stderr: tokio::spawn(async move {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text).await;
                text
            }),
        })
    }

    /// Reads the configuration, decides, writes the `.link` files.
    async fn keep_names(
        &mut self,
        nics: &[SourceNic],
        files: &Path,
    ) -> Result<ferry_adapt::interface_names::NamePlan, String> {
        let mut paths = Vec::new();
        for pattern in CONFIG_FILES {
            let expanded = self
                .batch(&format!("glob-expand {}", quote(pattern)))
                .await?;
            paths.extend(expanded.into_iter().filter(|p| !p.is_empty()));
        }
        let mut script = String::new();
        for (index, path) in paths.iter().enumerate() {
            // `-`: a directory among the matches is skipped, not fatal.
            let local = files.join(format!("config-{index}"));
            script += &format!(
                "-download {} {}\n",
                quote(path),
                quote(&local.display().to_string())
            );
        }
        self.batch(script.trim_end()).await?;
        let mut read = Vec::new();
        for (index, path) in paths.iter().enumerate() {
            if let Ok(text) = std::fs::read_to_string(files.join(format!("config-{index}"))) {
                read.push((path.clone(), text));
            }
        }
        let configured = configured_interfaces(&read);
        let plan = pins(nics, &configured);
        let mut script = String::new();
        for pin in &plan.pins {
            let (guest_path, text) = link_file(pin);
            let local = files.join(format!("link-{}", pin.name));
            std::fs::write(&local, text).map_err(|e| format!("{}: {e}", local.display()))?;
            script += &format!(
                "mkdir-p /etc/systemd/network\nupload {} {}\nchmod 0644 {}\n",
                quote(&local.display().to_string()),
                quote(&guest_path),
                quote(&guest_path)
            );
        }
        if !script.is_empty() {
            self.batch(script.trim_end()).await?;
        }
        Ok(plan)
    }

    /// Sends `commands` and returns what they printed, up to the mark echoed after them.
    async fn batch(&mut self, commands: &str) -> Result<Vec<String>, String> {
        let input = format!("{commands}\necho {MARK}\n");
        self.stdin
            .write_all(input.as_bytes())
            .await
            .map_err(|e| format!("writing to guestfish: {e}"))?;
        self.stdin
            .flush()
            .await
            .map_err(|e| format!("writing to guestfish: {e}"))?;
        let mut printed = Vec::new();
        loop {
            match self.stdout.next_line().await {
                Ok(Some(line)) if line == MARK => return Ok(printed),
                Ok(Some(line)) => printed.push(line),
                Ok(None) => return Err("guestfish stopped".into()),
                Err(e) => return Err(format!("reading from guestfish: {e}")),
            }
        }
    }

    /// Ends the session (guestfish unmounts and syncs the overlays on exit); its own error lines if it failed.
    async fn close(mut self, child: &mut Child) -> Result<(), String> {
        let _ = self.stdin.write_all(b"exit\n").await;
        drop(self.stdin);
        let status = child.wait().await.map_err(|e| e.to_string())?;
        let stderr = self.stderr.await.unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .rev()
            .take(3)
            .collect();
        Err(said.into_iter().rev().collect::<Vec<_>>().join(" "))
    }
}

/// One guestfish argument: double quotes, with backslashes and quotes escaped.
fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_quoted_as_guestfish_reads_them() {
        assert_eq!(
            quote("/etc/NetworkManager/system-connections/Wired connection 1.nmconnection"),
            "\"/etc/NetworkManager/system-connections/Wired connection 1.nmconnection\""
        );
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
