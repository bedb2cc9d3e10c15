//! What a real node changes on the machine outside the lab's directory, and how `ferry lab down` puts it back:
//! the bridge, three kernel settings the kubelet rewrites, fixed paths the kubelet and containerd create, the
//! `/kubepods` cgroups, their mounts, and the processes (shims, containers) that outlive the kubelet and containerd.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{API_SERVICE_IP, BRIDGE, BRIDGE_ADDRESS};

/// Kernel settings the kubelet sets on start (`setupKernelTunables`; with protectKernelDefaults it would refuse
/// to start instead).
pub const KUBELET_SYSCTLS: [&str; 6] = [
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
];

/// The kubelet's API port: fixed, so the machine's.
const KUBELET_PORT: u16 = 10250;

/// The kubelet's root: its default, which KubeVirt assumes.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Paths the kubelet, containerd, the CNI plugins and KubeVirt's virt-handler create wherever their configuration
/// cannot move them.
pub const FIXED_PATHS: [&str; 10] = [
    KUBELET_ROOT,
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    SHARED_KUBEVIRT_DIR,
    "/run/kubevirt-private",
    "/run/kubevirt-libvirt-runtimes",
    "/var/lib/kubevirt-node-labeller",
];

/// virt-handler mounts this with Bidirectional propagation (launchers' sockets and disks appear through it), which
/// the runtime allows only from a shared mount.
pub const SHARED_KUBEVIRT_DIR: &str = "/run/kubevirt";

/// What must be shared between the machine's mount namespace and containerd's (see `node::containerd`): the
/// kubelet mounts pods' volumes under its root in the one, runc mounts them into containers from the other, and
/// KubeVirt's share directory propagates both ways. `/` is private here, so each becomes a shared mount of its own
/// (a bind mount onto itself) before containerd starts; `restore` unmounts and removes them.
pub const SHARED_DIRS: [&str; 2] = [KUBELET_ROOT, SHARED_KUBEVIRT_DIR];

/// Makes each of [`SHARED_DIRS`] a shared mount.
pub fn share_mounts() -> Result<()> {
    for dir in SHARED_DIRS {
        let path = Path::new(dir);
        std::fs::create_dir_all(path)?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if !mounts_under(&mountinfo, &[path.to_path_buf()]).contains(&path.to_path_buf()) {
            super::run(
                Command::new("mount").args(["--bind", dir, dir]),
                "mount --bind",
                "",
            )?;
        }
        super::run(
            Command::new("mount").args(["--make-rshared", dir]),
            "mount --make-rshared",
            "",
        )?;
    }
    Ok(())
}

/// The cgroup every pod's cgroups sit under (the kubelet's default `cgroupRoot` with the cgroupfs driver).
pub const POD_CGROUP: &str = "kubepods";

/// What the machine looked like before the node started: what `down` restores.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostBefore {
    /// Each kernel setting and its value before the kubelet ran.
    pub sysctls: Vec<(String, String)>,
    /// The fixed paths that did not exist: removed again at `down`.
    pub absent_paths: Vec<PathBuf>,
    /// Mounts under the fixed paths that were already there (another containerd's, `ip netns`): left alone.
    #[serde(default)]
    pub mounts: Vec<PathBuf>,
}

fn sysctl_path(name: &str) -> PathBuf {
    Path::new("/proc/sys").join(name.replace('.', "/"))
}

/// Reads what `restore` will put back.
pub fn record_before() -> Result<HostBefore> {
    let mut sysctls = Vec::new();
    for name in KUBELET_SYSCTLS {
        let value = std::fs::read_to_string(sysctl_path(name))
            .with_context(|| format!("reading {name}"))?;
        sysctls.push((name.to_string(), value.trim().to_string()));
    }
    let absent_paths = FIXED_PATHS
        .iter()
        .map(PathBuf::from)
        .filter(|p| !p.exists())
        .collect();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounts = mounts_under(&mountinfo, &fixed_paths());
    Ok(HostBefore {
        sysctls,
        absent_paths,
        mounts,
    })
}

fn fixed_paths() -> Vec<PathBuf> {
    FIXED_PATHS.iter().map(PathBuf::from).collect()
}

/// What of a node's fixed resources something else holds now: a node would collide with it, and `down` would
/// take it away. Empty on a machine that can host one.
pub fn in_use() -> Vec<String> {
    let mut found = Vec::new();
    if ip(&["link", "show", BRIDGE]).is_ok() {
        found.push(format!("bridge {BRIDGE}"));
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if let Some(root) = cgroup_roots(&mountinfo)
        .into_iter()
        .find(|root| root.join(POD_CGROUP).exists())
    {
        found.push(format!("cgroup {}", root.join(POD_CGROUP).display()));
    }
    if !crate::control_plane::process::port_is_closed(KUBELET_PORT) {
        found.push(format!("port {KUBELET_PORT} (a kubelet's)"));
    }
    for address in [
        super::POD_SUBNET.to_string(),
        format!("{API_SERVICE_IP}/32"),
    ] {
        if ip(&["-o", "addr", "show", "to", &address]).is_ok_and(|out| !out.trim().is_empty()) {
            found.push(format!("address {address}"));
        }
    }
    found
}

fn ip(args: &[&str]) -> Result<String> {
    super::run(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
        " (apt-get install iproute2)",
    )
}

/// The bridge pods attach to, with the node's address and the API server's on it; none of the machine's routes
/// change but the two addresses' own.
pub fn create_bridge() -> Result<()> {
    if ip(&["link", "show", BRIDGE]).is_err() {
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    }
    let addresses = ip(&["-o", "addr", "show", "dev", BRIDGE])?;
    let api = format!("{API_SERVICE_IP}/32");
    for address in [BRIDGE_ADDRESS, api.as_str()] {
        if !addresses.contains(&format!(" {address} ")) {
            ip(&["addr", "add", address, "dev", BRIDGE])?;
        }
    }
    ip(&["link", "set", BRIDGE, "up"])?;
    Ok(())
}

/// Every veth left on the bridge, then the bridge.
fn delete_bridge() -> Result<()> {
    if ip(&["link", "show", BRIDGE]).is_err() {
        return Ok(());
    }
    for line in ip(&["-o", "link", "show", "master", BRIDGE])?.lines() {
        // "12: veth1234@if2: <...> ..." : the name sits between the index and '@' or ':'.
        if let Some(name) = line
            .split(':')
            .nth(1)
            .map(|n| n.trim().split('@').next().unwrap_or_default())
        {
            let _ = ip(&["link", "del", name]);
        }
    }
    ip(&["link", "del", BRIDGE])?;
    Ok(())
}

/// The mount points of every cgroup hierarchy (v1 controllers and the v2 tree), from `/proc/self/mountinfo`.
pub fn cgroup_roots(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mount_point = left.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .collect()
}

/// Mount points at or under any of `prefixes`, deepest first, so each unmounts before its parent.
pub fn mounts_under(mountinfo: &str, prefixes: &[PathBuf]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(unescape_mount_point)
        .filter(|p| prefixes.iter().any(|prefix| p.starts_with(prefix)))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_point(raw: &str) -> PathBuf {
    raw.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
        .into()
}

/// Every cgroup directory under `root`, deepest first.
fn cgroup_dirs_under(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        dirs.push(dir);
    }
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    dirs
}

/// The mounts the node made: under its directory or a fixed path, and not there before it.
fn node_mounts(mountinfo: &str, node_dir: &Path, before: &HostBefore) -> Vec<PathBuf> {
    let mut prefixes = fixed_paths();
    prefixes.push(node_dir.to_path_buf());
    mounts_under(mountinfo, &prefixes)
        .into_iter()
        .filter(|m| !before.mounts.contains(m))
        .collect()
}

/// The processes of every pod: whatever sits in a `/kubepods` cgroup of any hierarchy.
fn pod_processes(roots: &[PathBuf]) -> Vec<i32> {
    let mut pids: Vec<i32> = roots
        .iter()
        .map(|r| r.join(POD_CGROUP))
        .filter(|r| r.exists())
        .flat_map(|r| cgroup_dirs_under(&r))
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Processes running `program` (the shims re-parent to init and outlive containerd).
fn processes_running(program: &Path) -> Vec<i32> {
    // /proc/PID/exe is the resolved path: compare with the resolved program.
    let program = program
        .canonicalize()
        .unwrap_or_else(|_| program.to_path_buf());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == *program)
        })
        .collect()
}

/// SIGKILLs what `find` finds until it finds nothing: a pod's process can fork while the last ones die.
fn kill_until_none(find: impl Fn() -> Vec<i32>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pids: Vec<i32> = find()
            .into_iter()
            .filter(|pid| crate::control_plane::process::pid_is_running(*pid))
            .collect();
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("processes {pids:?} of the real node survived SIGKILL");
        }
        for pid in &pids {
            if let Some(pid) = rustix::process::Pid::from_raw(*pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `restore` could not undo; empty when the machine is as it was.
pub type Leftovers = Vec<String>;

/// Puts the machine back once the node's own processes (kubelet, containerd) are stopped: kills what the pods and
/// shims left running, unmounts under the node's directory and the fixed paths, removes the pod cgroups, the
/// bridge, the loop devices on the lab's files and the fixed paths that were absent, and writes the kernel settings back. Each step runs even when
/// one before failed; what failed is returned.
pub fn restore(node_dir: &Path, shim: &Path, before: &HostBefore) -> Leftovers {
    let mut leftovers = Leftovers::new();
    let mut step = |what: &str, result: Result<()>| {
        if let Err(e) = result {
            leftovers.push(format!("{what}: {e:#}"));
        }
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let roots = cgroup_roots(&mountinfo);
    step(
        "killing the pods' processes and the shims",
        kill_until_none(|| {
            let mut pids = pod_processes(&roots);
            pids.extend(processes_running(shim));
            pids
        }),
    );
    for mount in node_mounts(&mountinfo, node_dir, before) {
        step(&format!("unmounting {}", mount.display()), unmount(&mount));
    }
    for root in &roots {
        for dir in cgroup_dirs_under(&root.join(POD_CGROUP)) {
            if dir.exists() {
                step(
                    &format!("removing cgroup {}", dir.display()),
                    std::fs::remove_dir(&dir).map_err(Into::into),
                );
            }
        }
    }
    step("deleting the bridge", delete_bridge());
    // The lab's provisioner backs Block volumes with loop devices on files under the lab's directory.
    let lab_dir = node_dir.parent().unwrap_or(node_dir);
    for device in super::loops::attached_under(lab_dir) {
        step(
            &format!("detaching {}", device.display()),
            super::loops::detach_if_under(&device, lab_dir),
        );
    }
    for path in &before.absent_paths {
        if path.exists() {
            step(
                &format!("removing {}", path.display()),
                std::fs::remove_dir_all(path).map_err(Into::into),
            );
        }
    }
    for (name, value) in &before.sysctls {
        step(
            &format!("restoring {name}"),
            std::fs::write(sysctl_path(name), value).map_err(Into::into),
        );
    }
    leftovers
}

fn unmount(path: &Path) -> Result<()> {
    super::run(Command::new("umount").arg("--lazy").arg(path), "umount", "").map(drop)
}

/// What of a real node is still on the machine: processes of `tools`, pod processes, mounts under `node_dir` or a
/// fixed path, `/kubepods` cgroups, the bridge, loop devices on the lab's files, fixed paths absent before, kernel
/// settings changed. Empty when
/// nothing is; the real-node test asserts that after `ferry lab down`.
pub fn survey(node_dir: &Path, tools: &Path, before: &HostBefore) -> Vec<String> {
    let mut found = Vec::new();
    for program in [
        "containerd",
        "containerd-shim-runc-v2",
        "kubelet",
        "kube-scheduler",
    ] {
        for pid in processes_running(&tools.join(program)) {
            found.push(format!("process {program} ({pid})"));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let roots = cgroup_roots(&mountinfo);
    for pid in pod_processes(&roots) {
        found.push(format!("pod process {pid}"));
    }
    for mount in node_mounts(&mountinfo, node_dir, before) {
        found.push(format!("mount {}", mount.display()));
    }
    for root in &roots {
        if root.join(POD_CGROUP).exists() {
            found.push(format!("cgroup {}", root.join(POD_CGROUP).display()));
        }
    }
    if ip(&["link", "show", BRIDGE]).is_ok() {
        found.push(format!("bridge {BRIDGE}"));
    }
    for path in before.absent_paths.iter().filter(|p| p.exists()) {
        found.push(format!("path {}", path.display()));
    }
    for device in super::loops::attached_under(node_dir.parent().unwrap_or(node_dir)) {
        found.push(format!("loop device {}", device.display()));
    }
    for path in &before.absent_paths {
        if path.exists() {
            found.push(format!("path {}", path.display()));
        }
    }
    for (name, value) in &before.sysctls {
        let now = std::fs::read_to_string(sysctl_path(name)).unwrap_or_default();
        if now.trim() != value {
            found.push(format!("{name} = {} (was {value})", now.trim()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 24 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
32 30 0:28 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
40 24 0:50 / /lab/node/kubelet rw - ext4 /dev/vda1 rw
41 40 0:51 / /lab/node/kubelet/pods/uid/volumes/kubernetes.io~projected/token rw - tmpfs tmpfs rw
42 24 0:4 net:[4026532] /run/netns/cni-1 rw - nsfs nsfs rw
43 24 0:52 / /lab/other\\040dir rw - tmpfs tmpfs rw
";

    #[test]
    fn cgroup_hierarchies_are_read_from_mountinfo() {
        assert_eq!(
            cgroup_roots(MOUNTINFO),
            vec![
                PathBuf::from("/sys/fs/cgroup/memory"),
                PathBuf::from("/sys/fs/cgroup/unified")
            ]
        );
    }

    #[test]
    fn mounts_unmount_deepest_first_and_only_under_the_node() {
        let found = mounts_under(
            MOUNTINFO,
            &[PathBuf::from("/lab/node"), PathBuf::from("/run/netns")],
        );
        assert_eq!(
            found,
            vec![
                PathBuf::from("/lab/node/kubelet/pods/uid/volumes/kubernetes.io~projected/token"),
                PathBuf::from("/lab/node/kubelet"),
                PathBuf::from("/run/netns/cni-1"),
            ]
        );
        assert_eq!(
            mounts_under(MOUNTINFO, &[PathBuf::from("/lab/other dir")]),
            vec![PathBuf::from("/lab/other dir")]
        );
    }

    #[test]
    fn every_kubelet_sysctl_is_read_as_a_number_from_proc() {
        let before = record_before().unwrap();
        assert_eq!(before.sysctls.len(), KUBELET_SYSCTLS.len());
        for (name, value) in &before.sysctls {
            assert!(value.parse::<i64>().is_ok(), "{name} = {value:?}");
        }
    }
}
