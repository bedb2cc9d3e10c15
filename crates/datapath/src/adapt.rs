//! `ferry adapt`: virt-v2v-in-place adapts the copies on the volumes to KubeVirt, exactly once. Each volume must
//! still hash to the source's sha256 (one that does not was adapted already or torn, and is refused: the
//! controller rewrites it from the source first). virt-v2v
//! writes qcow2 overlays in scratch, never the volumes; only after it succeeded are the overlays committed into
//! them, synced and hashed again. A run that fails before the commit leaves the volumes as they were.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use ferry_adapt::clock::GuestClock;
use ferry_adapt::failure::AdaptationFailure;
use ferry_adapt::inspection::Inspection;
use ferry_adapt::interface_names::NamesOutcome;
use ferry_adapt::spec::AdaptSpec;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::error::{Error, Result};
use crate::verify::sha256_of;

/// What an adaptation did, for the controller (the termination message).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdaptedSummary {
    /// Each volume's sha256 after the commit, in disk order.
    pub sha256: Vec<String>,
    pub inspection: Inspection,
    /// The disk holding the root file system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_disk: Option<u32>,
    /// Whether a Windows guest keeps its hardware clock in UTC or local time; `None` for other guests, or when
    /// its SYSTEM hive could not be read (the worker's log says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<GuestClock>,
    /// The names a Linux guest's NICs keep; `None` when they were not Ferry's to keep (a Windows guest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_names: Option<NamesOutcome>,
    pub seconds: u64,
}

/// The most disks whose [`AdaptedSummary`] fits in a termination message, with every NIC vSphere allows named.
pub const MAX_ADAPTED_DISKS: usize = 40;

pub async fn adapt(spec: &AdaptSpec) -> Result<AdaptedSummary> {
    let started = Instant::now();
    for (index, disk) in spec.disks.iter().enumerate() {
        let actual = sha256_of(&disk.path, disk.size_bytes).await?;
        if actual != disk.source_sha256.to_ascii_lowercase() {
            return Err(Error::NotAsConverted {
                index: index as u32,
                expected: disk.source_sha256.clone(),
                actual,
            });
        }
        println!(
            "disk {index}: {} holds the source's bytes",
            disk.path.display()
        );
    }
    let work = prepare_scratch(spec)?;
    for (index, disk) in spec.disks.iter().enumerate() {
        let overlay = spec.overlay(index);
        let _ = std::fs::remove_file(&overlay);
        tool(
            "qemu-img",
            &["create", "-q", "-f", "qcow2", "-F", "raw", "-b"],
            &[&disk.path, &overlay],
        )
        .await?;
    }
    let interface_names = match &spec.keep_interface_names {
        Some(nics) => Some(crate::interface_names::keep(spec, nics, &work).await),
        None => None,
    };
    let domain = spec.scratch.join("domain.xml");
    std::fs::write(&domain, spec.domain().to_xml()).map_err(io(&domain))?;
    let (output, exited_ok) = virt_v2v(spec, &domain, &work).await?;
    if let Some((failure, message)) = spec.verdict(&output, exited_ok) {
        return Err(Error::Adaptation { failure, message });
    }
    let inspection = Inspection::from_log(&output).ok_or_else(|| Error::Adaptation {
        failure: AdaptationFailure::Other,
        message: "virt-v2v-in-place finished without printing its inspection of the guest".into(),
    })?;
    println!("virt-v2v found {}", inspection.describe());
    let mut sha256 = Vec::with_capacity(spec.disks.len());
    for (index, disk) in spec.disks.iter().enumerate() {
        let overlay = spec.overlay(index);
        tool("qemu-img", &["commit", "-q"], &[&overlay]).await?;
        sync(&disk.path).await?;
        let _ = std::fs::remove_file(&overlay);
        sha256.push(sha256_of(&disk.path, disk.size_bytes).await?);
        println!("disk {index}: adapted, sha256 {}", sha256[index]);
    }
    let clock = match inspection.kind.as_str() {
        "windows" => windows_clock(spec, &inspection).await,
        _ => None,
    };
    Ok(AdaptedSummary {
        sha256,
        clock,
        interface_names,
        boot_disk: spec.disk_of_device(&inspection.root).map(|i| i as u32),
        inspection,
        seconds: started.elapsed().as_secs(),
    })
}

/// Best effort, from the adapted volume: a guest whose clock cannot be read runs in UTC, as virt-v2v's own
/// KubeVirt output always does.
async fn windows_clock(spec: &AdaptSpec, inspection: &Inspection) -> Option<GuestClock> {
    let disk = spec
        .disks
        .get(spec.disk_of_device(&inspection.root)?)?
        .path
        .clone();
    let partition = AdaptSpec::partition_of_device(&inspection.root)?;
    let read = tokio::task::spawn_blocking(move || {
        let hive = crate::windows_volume::read_file(
            &disk,
            partition,
            &["Windows", "System32", "config", "SYSTEM"],
        )
        .map_err(|e| format!("reading the SYSTEM hive: {e}"))?;
        GuestClock::from_system_hive(&hive)
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    match read {
        Ok(clock) => {
            println!("guest clock: {}", clock.describe());
            Some(clock)
        }
        Err(e) => {
            println!("guest clock unknown, the VM's clock will run in UTC: {e}");
            None
        }
    }
}

/// Scratch's layout: the appliance's cache and libguestfs's temporary files live there too, since a container's
/// root file system is read-only.
fn prepare_scratch(spec: &AdaptSpec) -> Result<PathBuf> {
    let work = spec.scratch.join("work");
    for dir in [&spec.scratch, &work, &work.join("cache"), &work.join("run")] {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    Ok(work)
}

/// Runs virt-v2v-in-place verbosely (its inspection is printed only then), keeping its whole output for the
/// verdict and echoing its progress lines (`[  12.3] Inspecting the source`) to the pod's log.
async fn virt_v2v(spec: &AdaptSpec, domain: &Path, work: &Path) -> Result<(String, bool)> {
    let mut command = tokio::process::Command::new("virt-v2v-in-place");
    command
        .args(["-v", "-i", "libvirtxml"])
        .arg(domain)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    libguestfs_env(&mut command, work);
    if let Some(drivers) = &spec.virtio_win {
        command.env("VIRTIO_WIN", drivers);
    }
    if let Some(tools) = &spec.first_boot_tool {
        command.env("VIRT_TOOLS_DATA_DIR", tools);
    }
    for ip in &spec.static_ips {
        command
            .arg("--mac")
            .arg(ip.mac_option().map_err(Error::Spec)?);
    }
    let mut child = command.spawn().map_err(|e| Error::Adaptation {
        failure: AdaptationFailure::ApplianceFailed,
        message: format!("virt-v2v-in-place could not be started: {e}"),
    })?;
    let log_path = spec.scratch.join("virt-v2v.log");
    let mut log = tokio::fs::File::create(&log_path)
        .await
        .map_err(io(&log_path))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut output = String::new();
    while let Some(line) = rx.recv().await {
        if is_progress(&line) {
            println!("virt-v2v: {line}");
        }
        log.write_all(line.as_bytes())
            .await
            .map_err(io(&log_path))?;
        log.write_all(b"\n").await.map_err(io(&log_path))?;
        output.push_str(&line);
        output.push('\n');
    }
    let status = child
        .wait()
        .await
        .map_err(io(Path::new("virt-v2v-in-place")))?;
    if !status.success() {
        // The verdict's words are at the end; the whole log stays in scratch while the pod lives.
        let tail: Vec<&str> = output.lines().rev().take(20).collect();
        for line in tail.iter().rev() {
            println!("virt-v2v: {line}");
        }
    }
    Ok((output, status.success()))
}

/// Where a libguestfs program (virt-v2v, guestfish) keeps its appliance and temporary files, and how it runs it.
pub(crate) fn libguestfs_env(command: &mut tokio::process::Command, work: &Path) {
    command
        .env("LIBGUESTFS_BACKEND", "direct")
        .env("TMPDIR", work)
        .env("LIBGUESTFS_CACHEDIR", work.join("cache"))
        // libguestfs puts the appliance's sockets in XDG_RUNTIME_DIR, or else in /tmp whatever TMPDIR says: a
        // pod's root file system is read-only, so they go in scratch too (a short path: sockets allow 108 bytes).
        .env("XDG_RUNTIME_DIR", work.join("run"));
    if std::env::var_os("LIBGUESTFS_BACKEND_SETTINGS").is_none() && !kvm_usable() {
        // No /dev/kvm in this pod: software emulation, slower but the same result. A node whose KVM opens but
        // does not work says so by setting LIBGUESTFS_BACKEND_SETTINGS=force_tcg itself.
        command.env("LIBGUESTFS_BACKEND_SETTINGS", "force_tcg");
    }
}

/// virt-v2v's own progress lines, `[  56.1] Inspecting the source`: one decimal, unlike the appliance kernel's
/// `[   24.915530] sda: sda1`.
fn is_progress(line: &str) -> bool {
    line.strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(time, _)| time.trim().split_once('.'))
        .is_some_and(|(seconds, tenths)| {
            !seconds.is_empty()
                && seconds.bytes().all(|b| b.is_ascii_digit())
                && tenths.len() == 1
                && tenths.bytes().all(|b| b.is_ascii_digit())
        })
}

fn kvm_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

async fn tool(program: &str, args: &[&str], paths: &[&Path]) -> Result<()> {
    let output = tokio::process::Command::new(program)
        .args(args)
        .args(paths)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(io(Path::new(program)))?;
    if !output.status.success() {
        return Err(Error::Io {
            path: paths
                .last()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            detail: format!(
                "{program} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// The volume's new bytes are on it before they count: a file or a device, synced.
async fn sync(path: &Path) -> Result<()> {
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .await
        .map_err(io(path))?;
    file.sync_all().await.map_err(io(path))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_adapt::interface_names::{NamePin, NamePlan};
    use sha2::{Digest, Sha256};

    #[test]
    fn the_largest_adapted_summary_fits_in_a_termination_message() {
        let summary = AdaptedSummary {
            sha256: vec![crate::hex(&Sha256::digest(b"disk")); MAX_ADAPTED_DISKS],
            inspection: Inspection {
                root: "/dev/sdav12".into(),
                kind: "windows".into(),
                distro: "windows".into(),
                osinfo: "win2k22".into(),
                arch: "x86_64".into(),
                major_version: 10,
                minor_version: 0,
                product_name: "Windows Server 2022 Datacenter Azure Edition".into(),
                firmware: ferry_adapt::inspection::GuestFirmware::Uefi,
            },
            boot_disk: Some(39),
            clock: Some(GuestClock::LocalTime {
                windows_zone: "Central Pacific Standard Time (unmapped)".into(),
            }),
            // vSphere's most NICs, each kept under the longest name, and reasons up to their cap.
            interface_names: Some(NamesOutcome::written(&NamePlan {
                pins: (0..10)
                    .map(|i| NamePin {
                        mac: format!("00:50:56:aa:bb:{i:02x}"),
                        name: format!("enp11s0f1np{i}abc"),
                        evidence: String::new(),
                    })
                    .collect(),
                left_alone: vec!["x".repeat(99); 20],
            })),
            seconds: 86_400,
        };
        let report = crate::report::JobReport::Adapted(Box::new(summary));
        assert!(
            report.to_json().len() <= crate::report::TERMINATION_MESSAGE_BYTES,
            "{} bytes",
            report.to_json().len()
        );
    }

    #[test]
    fn progress_lines_are_told_from_the_trace() {
        assert!(is_progress("[  56.1] Inspecting the source"));
        assert!(is_progress(
            "[   0.0] Setting up the source: -i libvirtxml /s/domain.xml"
        ));
        assert!(!is_progress("[mount] /dev/sda1"));
        assert!(!is_progress("[   24.915530]  sda: sda1"));
        assert!(!is_progress("libguestfs: trace: v2v: launch"));
    }

    #[tokio::test]
    async fn a_volume_that_no_longer_holds_the_source_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        std::fs::write(&disk, vec![7u8; 8192]).unwrap();
        let spec = AdaptSpec {
            name: "vm".into(),
            memory_mib: 512,
            cpus: 1,
            firmware: ferry_adapt::domain::Firmware::Bios,
            disks: vec![ferry_adapt::spec::AdaptDisk {
                path: disk.clone(),
                block: false,
                bus: ferry_adapt::domain::Bus::Scsi,
                size_bytes: 4096,
                source_sha256: crate::hex(&Sha256::digest([7u8; 4096])),
            }],
            nics: vec![],
            scratch: dir.path().join("scratch"),
            virtio_win: None,
            first_boot_tool: None,
            static_ips: vec![],
            keep_interface_names: None,
        };
        // Only the disk's own bytes count, not the volume's tail.
        assert_eq!(
            sha256_of(&disk, 4096).await.unwrap(),
            spec.disks[0].source_sha256
        );
        let mut adapted = spec.clone();
        adapted.disks[0].source_sha256 = crate::hex(&Sha256::digest(b"other"));
        let refused = adapt(&adapted).await.unwrap_err();
        assert_eq!(refused.reason(), ferry_types::Reason::VolumeNotAsConverted);
        assert_eq!(refused.class(), ferry_types::ErrorClass::BoundedRetryable);
        assert!(
            !spec.scratch.exists(),
            "refused before any overlay was made"
        );
    }
}
