//! One real node per machine: a claim file naming the lab that holds it. `ferry lab up` exits while the lab runs
//! on, so the claim is not a lock it holds: it stays held while the process that wrote it runs (the same process:
//! its start time guards against a reused PID) or while any process of the named lab's real node runs.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::LOCK_FILE;
use crate::lab::LabState;

/// The refusal a second lab gets, with the command that frees the machine.
pub fn held_by(holder: &str) -> String {
    format!(
        "a real node already runs on this machine (lab {holder}); stop it with `ferry lab down --dir {holder}`"
    )
}

/// Who holds the machine's real node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    pub lab_dir: PathBuf,
}

/// The kernel's start time of `pid` (clock ticks since boot), which a reused PID does not share.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; starttime is the 22nd field, the 20th after it.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

fn lab_node_runs(dir: &Path) -> bool {
    LabState::load(dir).ok().flatten().is_some_and(|state| {
        state.real_node.is_some() && state.processes.iter().any(|p| p.is_alive(&state.dir))
    })
}

/// The live holder recorded in `lock`; None when there is none, or neither its writer nor its lab runs.
pub fn holder(lock: &Path) -> Option<Holder> {
    let text = std::fs::read_to_string(lock).ok()?;
    let mut fields = text.trim_end().splitn(3, ' ');
    let pid: i32 = fields.next()?.parse().ok()?;
    let started: u64 = fields.next()?.parse().ok()?;
    let lab_dir = PathBuf::from(fields.next()?);
    let writer_runs =
        crate::control_plane::process::pid_is_running(pid) && start_time(pid) == Some(started);
    (writer_runs || lab_node_runs(&lab_dir)).then_some(Holder { pid, lab_dir })
}

/// Claims the machine's real node for `lab_dir`, held while this process runs: refused, naming the holder, while
/// another live lab holds it; a claim whose holder is gone is taken over. Check and write happen under an
/// exclusive lock, so two labs starting at once cannot both win.
pub fn claim(lock: &Path, lab_dir: &Path) -> Result<()> {
    let guard = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock.with_extension("guard"))
        .with_context(|| format!("opening {}", lock.display()))?;
    rustix::fs::flock(&guard, rustix::fs::FlockOperation::LockExclusive)?;
    if let Some(other) = holder(lock).filter(|h| h.lab_dir != lab_dir) {
        anyhow::bail!(held_by(&other.lab_dir.display().to_string()));
    }
    let pid = std::process::id() as i32;
    let started = start_time(pid).context("reading this process's start time")?;
    let staged = lock.with_extension(format!("{pid}.tmp"));
    let mut file = std::fs::File::create(&staged)?;
    writeln!(file, "{pid} {started} {}", lab_dir.display())?;
    file.sync_all()?;
    std::fs::rename(&staged, lock).with_context(|| format!("claiming {}", lock.display()))?;
    Ok(())
}

/// True when `lab_dir` may change the machine's node: it holds the claim, or nobody does.
pub fn may_touch(lock: &Path, lab_dir: &Path) -> bool {
    holder(lock).is_none_or(|h| h.lab_dir == lab_dir)
}

/// Gives the machine's claim up, if `lab_dir` holds it.
pub fn release_claim(lock: &Path, lab_dir: &Path) {
    let named = std::fs::read_to_string(lock)
        .ok()
        .and_then(|t| t.trim_end().splitn(3, ' ').nth(2).map(PathBuf::from));
    if named.as_deref() == Some(lab_dir) {
        let _ = std::fs::remove_file(lock);
        let _ = std::fs::remove_file(lock.with_extension("guard"));
    }
}

/// Why this machine cannot host a real node for `lab_dir` now (see [`super::refusal`]), read from the machine.
/// A lab that holds the claim already is not refused for what its own node holds.
pub fn host_refusal(lab_dir: &Path) -> Option<String> {
    let holder = holder(Path::new(LOCK_FILE));
    let ours = holder.as_ref().is_some_and(|h| h.lab_dir == lab_dir);
    let other = holder
        .filter(|h| h.lab_dir != lab_dir)
        .map(|h| h.lab_dir.display().to_string());
    let in_use = if ours { vec![] } else { super::host::in_use() };
    super::refusal(
        rustix::process::geteuid().as_raw(),
        Path::new(super::RUNC).exists(),
        other.as_deref(),
        &in_use,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_refused_while_another_live_lab_holds_it_and_taken_over_when_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("real-node.lock");
        let first = dir.path().join("first");
        let second = dir.path().join("second");
        // This test process stands for the first lab's `ferry lab up`.
        claim(&lock, &first).unwrap();
        let me = std::process::id() as i32;
        assert_eq!(
            holder(&lock),
            Some(Holder {
                pid: me,
                lab_dir: first.clone()
            })
        );
        assert!(!may_touch(&lock, &second) && may_touch(&lock, &first));
        let refused = claim(&lock, &second).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("ferry lab down --dir {}", first.display())),
            "{refused}"
        );
        // The same lab may claim again (a restart of its node).
        claim(&lock, &first).unwrap();
        // A writer whose PID now belongs to another process (another start time) holds nothing, and a lab with no
        // state file runs no node.
        std::fs::write(&lock, format!("{me} 1 {}\n", first.display())).unwrap();
        assert_eq!(holder(&lock), None);
        assert!(may_touch(&lock, &second));
        claim(&lock, &second).unwrap();
        assert_eq!(holder(&lock).map(|h| h.lab_dir), Some(second.clone()));
        // Only the holder's release removes the claim.
        release_claim(&lock, &first);
        assert!(lock.exists());
        release_claim(&lock, &second);
        assert!(!lock.exists());
    }
}
