//! QEMU guests of the KubeVirt stand-in: one software-emulated machine per VMI, its serial port in a file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::process::{self, Lifetime, ProcessRecord, ProcessSpec};

/// Guests live under `state_dir`, one `<key>.json` (process record) and `<key>.serial` (COM1) each.
pub struct Guests {
    state_dir: PathBuf,
}

/// What a guest needs to boot.
pub struct Machine<'a> {
    pub disk: &'a Path,
    pub memory_mib: u64,
    pub cpus: u32,
}

impl Guests {
    pub fn new(state_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(state_dir)?;
        Ok(Self {
            state_dir: state_dir.canonicalize()?,
        })
    }

    pub fn serial_log(&self, key: &str) -> PathBuf {
        self.state_dir.join(format!("{key}.serial"))
    }

    fn record_path(&self, key: &str) -> PathBuf {
        self.state_dir.join(format!("{key}.json"))
    }

    fn record(&self, key: &str) -> Option<ProcessRecord> {
        serde_json::from_slice(&std::fs::read(self.record_path(key)).ok()?).ok()
    }

    pub fn is_running(&self, key: &str) -> bool {
        self.record(key)
            .is_some_and(|r| r.is_alive(&self.serial_log(key)))
    }

    /// Boots the disk, unless this guest already runs. The guest dies with the stand-in.
    pub fn start(&self, key: &str, machine: &Machine<'_>) -> Result<()> {
        if self.is_running(key) {
            return Ok(());
        }
        let serial = self.serial_log(key);
        let spec = ProcessSpec {
            name: format!("qemu-{key}"),
            program: PathBuf::from("qemu-system-x86_64"),
            args: vec![
                "-machine".into(),
                "accel=tcg".into(),
                "-m".into(),
                machine.memory_mib.to_string(),
                "-smp".into(),
                machine.cpus.to_string(),
                "-display".into(),
                "none".into(),
                "-monitor".into(),
                "none".into(),
                "-no-reboot".into(),
                "-drive".into(),
                format!("file={},format=raw,if=ide", machine.disk.display()),
                "-serial".into(),
                format!("file:{}", serial.display()),
            ],
            env: vec![],
        };
        let record = process::start(
            &spec,
            &self.state_dir.join(format!("{key}.qemu.log")),
            Lifetime::TiedToThisProcess,
        )
        .context("starting qemu-system-x86_64 (Debian qemu-system-x86)")?;
        std::fs::write(self.record_path(key), serde_json::to_vec(&record)?)?;
        Ok(())
    }

    /// Stops the guest and forgets it; a guest already gone is fine.
    pub fn stop(&self, key: &str) -> Result<()> {
        if let Some(record) = self.record(key)
            && record.is_alive(&self.serial_log(key))
        {
            process::stop(&record, Duration::from_secs(5))?;
        }
        for path in [
            self.record_path(key),
            self.serial_log(key),
            self.state_dir.join(format!("{key}.qemu.log")),
        ] {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }

    /// The first serial line containing `pattern`.
    pub fn serial_line(&self, key: &str, pattern: &str) -> Option<String> {
        let text = std::fs::read(self.serial_log(key)).ok()?;
        String::from_utf8_lossy(&text)
            .lines()
            .find(|l| l.contains(pattern))
            .map(|l| l.trim().to_string())
    }
}
