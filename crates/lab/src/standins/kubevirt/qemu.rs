//! QEMU domains of the KubeVirt stand-in: one process per VMI, tied to the stand-in, with its files in the
//! state dir: COM1 in a file, the guest agent's and the QMP sockets, the OVMF variable store. QMP's
//! `query-status` says whether the domain runs or the guest powered it off (`-no-shutdown` keeps it there).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::control_plane::process::{self, Lifetime, ProcessRecord, ProcessSpec};

/// A unix socket path longer than this cannot be bound.
const MAX_SOCKET_PATH: usize = 107;

/// Guests live under `state_dir`, each file named after the guest's key.
pub struct Guests {
    state_dir: PathBuf,
}

/// The files of one guest.
pub struct GuestFiles {
    pub serial_log: PathBuf,
    pub agent_socket: PathBuf,
    pub qmp_socket: PathBuf,
    pub efi_vars: PathBuf,
    log: PathBuf,
    record: PathBuf,
}

/// What the stand-in knows of a domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DomainState {
    /// Never started here (or already cleaned up).
    Absent,
    /// The process runs but QMP does not say `running` yet.
    Starting,
    Running,
    Paused(String),
    /// The guest powered off (or rebooted with `rebootPolicy: Terminate`).
    ShutDown,
    /// The process is gone without the guest shutting down: a crash, a kill, or a start that failed.
    Crashed(String),
}

impl Guests {
    pub fn new(state_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(state_dir)?;
        Ok(Self {
            state_dir: state_dir.canonicalize()?,
        })
    }

    pub fn files(&self, key: &str) -> GuestFiles {
        // Sockets get a short name: a unix socket path has at most 107 bytes, and keys carry a uid.
        let short = crate::disks::hex(&Sha256::digest(key.as_bytes())[..6]);
        let at = |name: String| self.state_dir.join(name);
        GuestFiles {
            serial_log: at(format!("{key}.serial")),
            agent_socket: at(format!("{short}.qga")),
            qmp_socket: at(format!("{short}.qmp")),
            efi_vars: at(format!("{key}_VARS.fd")),
            log: at(format!("{key}.qemu.log")),
            record: at(format!("{key}.json")),
        }
    }

    pub fn serial_log(&self, key: &str) -> PathBuf {
        self.files(key).serial_log
    }

    fn record(&self, key: &str) -> Option<ProcessRecord> {
        serde_json::from_slice(&std::fs::read(self.files(key).record).ok()?).ok()
    }

    pub fn is_running(&self, key: &str) -> bool {
        self.record(key)
            .is_some_and(|r| r.is_alive(&self.serial_log(key)))
    }

    /// Starts QEMU with `args` unless this guest already runs; `efi_vars` is the template of the guest's own
    /// variable store, copied once (it keeps the guest's boot entries across restarts of the same VMI).
    pub fn start(&self, key: &str, args: Vec<String>, efi_vars: Option<&Path>) -> Result<()> {
        if self.is_running(key) {
            return Ok(());
        }
        let files = self.files(key);
        for socket in [&files.agent_socket, &files.qmp_socket] {
            if socket.as_os_str().len() > MAX_SOCKET_PATH {
                bail!(
                    "{} is too long for a unix socket: use a shorter state dir",
                    socket.display()
                );
            }
            let _ = std::fs::remove_file(socket);
        }
        if let Some(template) = efi_vars
            && !files.efi_vars.exists()
        {
            std::fs::copy(template, &files.efi_vars).with_context(|| {
                format!("copying {} (Debian's ovmf package)", template.display())
            })?;
        }
        let spec = ProcessSpec {
            name: format!("qemu-{key}"),
            program: PathBuf::from("qemu-system-x86_64"),
            args,
            env: vec![],
        };
        let record = process::start(&spec, &files.log, Lifetime::TiedToThisProcess)
            .context("starting qemu-system-x86_64 (Debian qemu-system-x86)")?;
        std::fs::write(&files.record, serde_json::to_vec(&record)?)?;
        Ok(())
    }

    /// The domain's state: the process, then QMP.
    pub async fn state(&self, key: &str) -> DomainState {
        let Some(record) = self.record(key) else {
            return DomainState::Absent;
        };
        let files = self.files(key);
        if !record.is_alive(&files.serial_log) {
            return DomainState::Crashed(self.exit_message(key));
        }
        match query_status(&files.qmp_socket, Duration::from_secs(2)).await {
            Ok(status) => match status.as_str() {
                "running" => DomainState::Running,
                "shutdown" => DomainState::ShutDown,
                "guest-panicked" | "internal-error" | "io-error" => {
                    DomainState::Crashed(format!("the domain stopped: {status}"))
                }
                "prelaunch" | "inmigrate" => DomainState::Starting,
                other => DomainState::Paused(other.to_string()),
            },
            // Right after the start QMP may not listen yet.
            Err(_) => DomainState::Starting,
        }
    }

    /// What QEMU said last, for a crashed domain's message.
    fn exit_message(&self, key: &str) -> String {
        let log = std::fs::read(self.files(key).log).unwrap_or_default();
        let log = String::from_utf8_lossy(&log);
        match log.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => format!("QEMU exited: {}", line.trim()),
            None => "QEMU exited".to_string(),
        }
    }

    /// Stops the process; its files stay (the console is read after the guest is gone).
    pub fn halt(&self, key: &str) -> Result<()> {
        if let Some(record) = self.record(key)
            && record.is_alive(&self.serial_log(key))
        {
            process::stop(&record, Duration::from_secs(5))?;
        }
        Ok(())
    }

    /// Stops the guest and removes its files but its console, which stays for people to read why a guest did
    /// not come up (it goes with the lab's directory); a guest already gone is fine.
    pub fn stop(&self, key: &str) -> Result<()> {
        self.halt(key)?;
        let f = self.files(key);
        for path in [f.record, f.log, f.agent_socket, f.qmp_socket, f.efi_vars] {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }

    /// The first serial line containing `pattern`.
    pub fn serial_line(&self, key: &str, pattern: &str) -> Option<String> {
        let text = std::fs::read(self.serial_log(key)).ok()?;
        // Whole lines only: the guest may be writing the last one as it is read.
        String::from_utf8_lossy(&text)
            .split_inclusive('\n')
            .find(|l| l.ends_with('\n') && l.contains(pattern))
            .map(|l| l.trim().to_string())
    }
}

/// QMP: the greeting, `qmp_capabilities`, then `query-status`'s `status` (events in between are skipped).
async fn query_status(socket: &Path, timeout: Duration) -> Result<String> {
    let exchange = async {
        let mut stream = BufReader::new(UnixStream::connect(socket).await?);
        let mut greeting = String::new();
        stream.read_line(&mut greeting).await?;
        stream
            .get_mut()
            .write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
            .await?;
        qmp_answer(&mut stream).await?;
        stream
            .get_mut()
            .write_all(b"{\"execute\":\"query-status\"}\n")
            .await?;
        let status = qmp_answer(&mut stream).await?;
        status["return"]["status"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("query-status: {status}"))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| anyhow!("QMP did not answer in time"))?
}

/// The next answer (`return` or `error`) on a QMP connection.
async fn qmp_answer(stream: &mut BufReader<UnixStream>) -> Result<Value> {
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            bail!("QMP closed the connection");
        }
        let value: Value = serde_json::from_str(&line)?;
        if value.get("return").is_some() || value.get("error").is_some() {
            return Ok(value);
        }
    }
}
