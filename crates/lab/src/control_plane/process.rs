//! Starting and stopping lab processes. Each runs in its own process group, so that stopping it also stops
//! anything it forked, and a terminal's Ctrl-C never reaches it by accident.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

/// What to run.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How started processes relate to the starter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// Outlive the starter (`ferry lab up`): stopped only by `ferry lab down`.
    Detached,
    /// Die with the starting process, even when it is killed (tests).
    TiedToThisProcess,
}

/// A started process, as recorded in the lab's state file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessRecord {
    pub name: String,
    pub pid: i32,
    pub log: PathBuf,
}

impl ProcessRecord {
    /// True while the process runs and is still the one we started (its argv names `marker`).
    /// The marker check guards against a recycled pid.
    pub fn is_alive(&self, marker: &Path) -> bool {
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return false;
        };
        if is_zombie(self.pid) {
            return false;
        }
        // Right after exec the kernel can show an empty command line for a moment: still ours.
        let marker = marker.to_string_lossy();
        cmdline.is_empty() || String::from_utf8_lossy(&cmdline).contains(marker.as_ref())
    }
}

/// True while `pid` exists and is not a zombie.
pub fn pid_is_running(pid: i32) -> bool {
    !is_zombie(pid)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the parenthesised command name, which may itself contain spaces.
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|s| s == "Z")
        })
        .unwrap_or(true)
}

/// Starts `spec` with its output in `log`, which then holds this process's output only (probes read it).
pub fn start(spec: &ProcessSpec, log: &Path, lifetime: Lifetime) -> Result<ProcessRecord> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    let child = match lifetime {
        Lifetime::Detached => command.spawn(),
        Lifetime::TiedToThisProcess => spawn_tied(command),
    }
    .with_context(|| format!("starting {} ({})", spec.name, spec.program.display()))?;
    let pid = i32::try_from(child.id())?;
    // The child is reaped by `reap_later` or, when detached, by init after we exit.
    reap_later(child);
    Ok(ProcessRecord {
        name: spec.name.clone(),
        pid,
        log: log.to_path_buf(),
    })
}

/// Stops a process group: SIGTERM, then SIGKILL after `grace`. Returns once no member is left.
pub fn stop(record: &ProcessRecord, grace: Duration) -> Result<()> {
    let Some(pgid) = Pid::from_raw(record.pid) else {
        bail!("invalid pid {}", record.pid);
    };
    if !group_exists(pgid) {
        return Ok(());
    }
    let _ = rustix::process::kill_process_group(pgid, Signal::TERM);
    let deadline = Instant::now() + grace;
    while group_exists(pgid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if group_exists(pgid) {
        let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_exists(pgid) {
            if Instant::now() > deadline {
                bail!(
                    "{} (process group {}) survived SIGKILL",
                    record.name,
                    record.pid
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// SIGKILL to the whole process group, at once, as a crash or an OOM kill would; waits until it is gone.
pub fn kill_group(record: &ProcessRecord) {
    let Some(pgid) = Pid::from_raw(record.pid) else {
        return;
    };
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while group_exists(pgid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A group exists while any member is alive; zombies of our own children are reaped in the background.
fn group_exists(pgid: Pid) -> bool {
    if rustix::process::test_kill_process_group(pgid).is_err() {
        return false;
    }
    // Members that are only zombies (already dead, waiting for a reaper) count as gone.
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            return false;
        };
        process_group_of(pid) == Some(pgid.as_raw_nonzero().get()) && !is_zombie(pid)
    })
}

fn process_group_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state ppid pgrp ...
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    fields.nth(2)?.parse().ok()
}

fn reap_later(mut child: std::process::Child) {
    std::thread::spawn(move || {
        let _ = child.wait();
    });
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<std::process::Child>>);

/// Spawns on one thread that lives as long as the process. The kernel's parent-death signal fires when the
/// spawning *thread* exits, so spawning from a short-lived test thread would kill the child too early.
fn spawn_tied(command: Command) -> std::io::Result<std::process::Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("ferry-lab-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    set_parent_death_signal(&mut command);
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("starting the lab spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .expect("spawner lock")
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("lab spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("lab spawner thread is gone"))?
}

#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut Command) {
    // SAFETY: the closure runs between fork and exec and only makes one async-signal-safe prctl call.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

/// Finds a free loopback port. The port is released before use, so another process could race for it;
/// every caller retries a failed start with a new port.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// True when nothing listens on the loopback port.
pub fn port_is_closed(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_err()
}

/// True when a process of the group `pgid` holds a listening TCP socket on loopback or any address at `port`.
pub fn group_listens_on(pgid: i32, port: u16) -> bool {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| process_group_of(*pid) == Some(pgid))
        .any(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .any(|link| {
                    inodes
                        .iter()
                        .any(|i| link.as_os_str() == format!("socket:[{i}]").as_str())
                })
        })
}

/// The inodes of TCP sockets listening on `port` (IPv4 and IPv6).
fn listening_inodes(port: u16) -> Vec<String> {
    const LISTEN: &str = "0A";
    let wanted = format!("{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let local_port = fields.get(1)?.rsplit(':').next()?;
                    (local_port == wanted && *fields.get(3)? == LISTEN)
                        .then(|| fields.get(9).map(|i| i.to_string()))
                        .flatten()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod listen_tests {
    use super::*;

    #[test]
    fn a_listener_is_found_in_its_own_group_and_not_in_another() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let own_group = process_group_of(std::process::id() as i32).unwrap();
        assert!(group_listens_on(own_group, port));
        assert!(!group_listens_on(own_group, free_port().unwrap()));
        assert!(!group_listens_on(i32::MAX, port));
    }
}
