//! Teardown of test labs: on drop, and once more from a C `atexit` handler for the labs in statics (which
//! Rust never drops). The test harness leaves `main` or calls `process::exit`, and both run `atexit` handlers.

use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::LIVE;

pub(crate) fn register(dir: &Path) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(install_exit_handler);
    live().push(dir.to_path_buf());
}

/// Stops the lab in `dir` and removes the directory. Safe to call twice.
pub(crate) fn teardown(dir: &Path) {
    live().retain(|d| d != dir);
    if dir.exists() {
        // A standalone vcsim has no lab state; `down` then finds nothing to stop.
        if let Err(e) = ferry_lab::down(dir) {
            eprintln!(
                "ferry-testkit: stopping the lab in {}: {e:#}",
                dir.display()
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

extern "C" fn stop_live_labs() {
    let dirs: Vec<PathBuf> = live().clone();
    for dir in dirs {
        teardown(&dir);
    }
}

#[allow(unsafe_code)]
fn install_exit_handler() {
    // SAFETY: `stop_live_labs` is a plain `extern "C" fn()` that never unwinds across the boundary
    // (teardown reports errors instead of panicking).
    let rc = unsafe { libc::atexit(stop_live_labs) };
    assert_eq!(rc, 0, "registering the test lab exit handler");
}
