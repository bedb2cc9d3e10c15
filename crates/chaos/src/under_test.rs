//! The controller process of a chaos run: started under a plan, stopped (SIGSTOP) and continued by the
//! harness, and stopped for good when the run ends.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use ferry_lab::control_plane::process::{self, ProcessRecord};

use super::children::Children;

/// A paused controller is continued after two changes it did not see, or after this.
const LONGEST_PAUSE: Duration = Duration::from_secs(4);

/// The run's controller, stopped when the run ends, however it ends (a stopped one is continued first).
pub struct ControllerUnderTest(pub Option<ProcessRecord>);

impl ControllerUnderTest {
    pub fn pid(&self) -> i32 {
        self.0.as_ref().map_or(0, |r| r.pid)
    }

    pub fn is_alive(&self, dir: &Path) -> bool {
        self.0.as_ref().is_some_and(|r| r.is_alive(dir))
    }

    /// Stops it off the async threads: the other labs' runs go on meanwhile.
    pub async fn stop(mut self) {
        if let Some(record) = self.0.take() {
            let _ = tokio::task::spawn_blocking(move || halt(&record)).await;
        }
    }
}

impl Drop for ControllerUnderTest {
    fn drop(&mut self) {
        if let Some(record) = self.0.take() {
            halt(&record);
        }
    }
}

fn halt(record: &ProcessRecord) {
    if stopped(record.pid) {
        cont(record.pid);
    }
    let _ = process::stop(record, Duration::from_secs(5));
}

/// A controller the plan stopped (SIGSTOP), continued after the world changed twice without it.
#[derive(Default)]
pub struct Pause {
    since: Option<Instant>,
    last: Vec<String>,
    changes: usize,
    pub continued: Option<(Duration, usize)>,
    pid: Option<i32>,
}

impl Pause {
    pub async fn tend(&mut self, pid: i32, children: &Children) -> Result<()> {
        if self.continued.is_some() || !stopped(pid) {
            return Ok(());
        }
        let now = children.fingerprint().await?;
        let Some(since) = self.since else {
            (self.since, self.last, self.pid) = (Some(Instant::now()), now, Some(pid));
            return Ok(());
        };
        if now != self.last {
            self.changes += 1;
            self.last = now;
        }
        if self.changes >= 2 || since.elapsed() > LONGEST_PAUSE {
            self.continued = Some((since.elapsed(), self.changes));
            cont(pid);
        }
        Ok(())
    }

    pub fn note(&self) -> String {
        match self.continued {
            Some((paused, changes)) => {
                format!(
                    "paused {:.1}s across {changes} change(s)\n",
                    paused.as_secs_f64()
                )
            }
            None => String::new(),
        }
    }
}

pub fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}

fn cont(pid: i32) {
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status();
}

/// Waits until the controller leads, or is gone or stopped (a plan may crash or pause it that early).
pub async fn wait_ready(
    port: u16,
    log: &Path,
    controller: &ControllerUnderTest,
    dir: &Path,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Gone, or stopped by the plan before it could answer: the run restarts or continues it.
        if !controller.is_alive(dir) || stopped(controller.pid()) {
            return Ok(());
        }
        let ok = tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args([
                    "-fsS",
                    "--max-time",
                    "2",
                    &format!("http://127.0.0.1:{port}/readyz/leader"),
                ])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .await?;
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            let logs = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = logs.lines().rev().take(15).collect();
            anyhow::bail!(
                "the controller did not lead within 60 s; its last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
