//! Progress per disk: a human line on stderr at most every few seconds, and a JSON line the controller or the
//! CLI can parse (`{"ferryProgress":{...}}`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const EVERY: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct Progress {
    quiet: bool,
    last: Mutex<HashMap<u32, Instant>>,
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        Self {
            quiet,
            last: Mutex::default(),
        }
    }

    pub fn bytes(&self, disk: u32, done: u64, total: u64) {
        let now = Instant::now();
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if last
                .get(&disk)
                .is_some_and(|t| now.duration_since(*t) < EVERY)
            {
                return;
            }
            last.insert(disk, now);
        }
        self.emit(disk, done, total, "copying");
    }

    pub fn done(&self, disk: u32, total: u64) {
        self.emit(disk, total, total, "staged");
    }

    /// An earlier attempt staged the first `done` bytes already; copying goes on from there.
    pub fn resumed(&self, disk: u32, done: u64, total: u64) {
        self.emit(disk, done, total, "resuming");
    }

    pub fn skipped(&self, disk: u32, total: u64) {
        self.emit(disk, total, total, "already-staged");
    }

    fn emit(&self, disk: u32, done: u64, total: u64, state: &str) {
        if self.quiet {
            return;
        }
        let percent = if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        };
        eprintln!(
            "disk {disk}: {state} {} of {} MiB ({percent:.1}%)",
            done >> 20,
            total >> 20
        );
        eprintln!(
            "{}",
            serde_json::json!({"ferryProgress": {"disk": disk, "state": state, "bytes": done, "total": total}})
        );
    }
}
