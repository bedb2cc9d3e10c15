//! The lab's Debian guests really boot in QEMU on VMware-like hardware (PVSCSI and SATA disks, a vmxnet3 NIC),
//! BIOS and EFI with Secure Boot, and really fail on virtio disks, which their initramfs has no driver for.
//! KVM when a probe shows it works here, software emulation otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry_lab::vsphere::guest_image::{GuestImage, GuestImages, ensure_guest_images};

const READY: &str = "FERRY-GUEST-READY";
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
const OVMF_VARS_MS: &str = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd";
/// Software emulation on a busy 2-core machine boots Debian in minutes; KVM in seconds.
const BOOT_LIMIT: Duration = Duration::from_secs(900);

/// One guest at a time: parallel software-emulated boots would only slow each other down.
static ONE_VM: Mutex<()> = Mutex::new(());

fn images() -> GuestImages {
    let start = Instant::now();
    let images = ensure_guest_images(None)
        .expect("the guest images build (hack/setup.sh installs the tools)");
    eprintln!(
        "guest images ready in {:.1?}: {}",
        start.elapsed(),
        images.dir.display()
    );
    images
}

/// `-accel kvm -cpu max` when the BIOS guest's kernel starts that way within seconds, else TCG. (A boot sector is
/// not enough of a probe: on some hosts KVM runs real mode but the kernel hangs right after GRUB.)
fn accel(images: &GuestImages) -> &'static [&'static str] {
    static ACCEL: OnceLock<&'static [&'static str]> = OnceLock::new();
    ACCEL.get_or_init(|| {
        const KVM: &[&str] = &["-accel", "kvm", "-cpu", "max"];
        let mut probe = start(&images.bios, images, KVM, pc, pvscsi);
        let works = probe
            .wait_for(Duration::from_secs(20), |s| s.contains("Linux version"))
            .is_ok();
        eprintln!(
            "KVM {}",
            if works {
                "works: using it"
            } else {
                "does not boot Linux here: using TCG"
            }
        );
        if works { KVM } else { &["-accel", "tcg"] }
    })
}

/// A running QEMU and its directory: killed and removed on drop, whatever the test's outcome.
struct Vm {
    child: Child,
    serial: PathBuf,
    started: Instant,
    /// Removed after QEMU is gone: fields drop after `drop` ran.
    _dir: tempfile::TempDir,
}

impl Vm {
    fn spawn(mut cmd: Command, dir: tempfile::TempDir, serial: PathBuf) -> Vm {
        cmd.arg("-serial").arg(format!("file:{}", serial.display()));
        cmd.args(["-monitor", "none", "-no-reboot"])
            .stdin(Stdio::null());
        let child = cmd
            .spawn()
            .expect("qemu-system-x86_64 (hack/setup.sh installs it)");
        Vm {
            child,
            serial,
            started: Instant::now(),
            _dir: dir,
        }
    }

    /// Polls the serial console until `done` holds; the console's text either way (Err when QEMU exited or the
    /// limit passed first).
    fn wait_for(&mut self, limit: Duration, done: impl Fn(&str) -> bool) -> Result<String, String> {
        loop {
            let exited = self.child.try_wait().ok().flatten();
            let text = std::fs::read_to_string(&self.serial).unwrap_or_default();
            if done(&text) {
                return Ok(text);
            }
            if let Some(status) = exited {
                return Err(format!("{text}\n[QEMU exited: {status}]"));
            }
            if self.started.elapsed() > limit {
                return Err(text);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A copy-on-write overlay, so the cached image stays pristine.
fn overlay(base: &Path, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.qcow2"));
    let status = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(base)
        .arg(&path)
        .status()
        .expect("qemu-img");
    assert!(status.success(), "qemu-img create failed");
    path
}

/// QEMU with the machine `machine` makes in the VM's directory, and the guest's disks behind `disks` (a function
/// of the root and data overlays' paths).
fn boot(
    guest: &GuestImage,
    images: &GuestImages,
    machine: impl Fn(&Path) -> Vec<String>,
    disks: impl Fn(&Path, &Path) -> Vec<String>,
) -> Vm {
    start(guest, images, accel(images), machine, disks)
}

fn start(
    guest: &GuestImage,
    images: &GuestImages,
    accel: &[&str],
    machine: impl Fn(&Path) -> Vec<String>,
    disks: impl Fn(&Path, &Path) -> Vec<String>,
) -> Vm {
    let dir = tempfile::tempdir().unwrap();
    let root = overlay(&guest.root, dir.path(), "root");
    let data = overlay(&images.data, dir.path(), "data");
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(accel).args(machine(dir.path()));
    cmd.args(["-m", "1024", "-display", "none", "-nodefaults"]);
    cmd.args(disks(&root, &data));
    cmd.args([
        "-netdev",
        "user,id=net0",
        "-device",
        "vmxnet3,netdev=net0,mac=52:54:00:12:34:56",
    ]);
    let serial = dir.path().join("serial.log");
    Vm::spawn(cmd, dir, serial)
}

/// The EFI guest's disks: Debian's OVMF has no PVSCSI driver (no boot option appears for such a disk), so its root
/// is a SATA disk on q35's AHCI, as a VMware VM may have; the data disk stays on PVSCSI.
fn sata_root_pvscsi_data(root: &Path, data: &Path) -> Vec<String> {
    vec![
        "-drive".into(),
        format!("if=none,id=root,format=qcow2,file={}", root.display()),
        "-device".into(),
        "ide-hd,bus=ide.0,drive=root,bootindex=0".into(),
        "-device".into(),
        "pvscsi,id=scsi0".into(),
        "-drive".into(),
        format!("if=none,id=data,format=qcow2,file={}", data.display()),
        "-device".into(),
        "scsi-hd,bus=scsi0.0,scsi-id=1,drive=data".into(),
    ]
}

/// Root and data disk on one PVSCSI controller, as vSphere gives a Linux VM.
fn pvscsi(root: &Path, data: &Path) -> Vec<String> {
    vec![
        "-device".into(),
        "pvscsi,id=scsi0".into(),
        "-drive".into(),
        format!("if=none,id=root,format=qcow2,file={}", root.display()),
        "-device".into(),
        "scsi-hd,bus=scsi0.0,scsi-id=0,drive=root,bootindex=0".into(),
        "-drive".into(),
        format!("if=none,id=data,format=qcow2,file={}", data.display()),
        "-device".into(),
        "scsi-hd,bus=scsi0.0,scsi-id=1,drive=data".into(),
    ]
}

/// SeaBIOS on i440FX, as a VMware BIOS VM has (an i440BX there).
fn pc(_: &Path) -> Vec<String> {
    vec!["-machine".into(), "pc".into()]
}

/// Whether a whole line (its newline written) carries the marker: the guest may be writing the last one.
fn has_ready_line(console: &str) -> bool {
    console
        .split_inclusive('\n')
        .any(|l| l.ends_with('\n') && l.contains(READY))
}

/// From the marker on: the guest's login prompt may share its line.
fn ready_line(console: &str) -> &str {
    console
        .lines()
        .find_map(|l| l.find(READY).map(|at| l[at..].trim()))
        .unwrap_or_default()
}

fn tail(console: &str) -> String {
    let lines: Vec<&str> = console.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The line names the guest, its kernel, its root on the SCSI disk, the NIC's MAC and DHCP address, its router
/// answering, and the data.
fn assert_ready(line: &str, guest: &GuestImage, images: &GuestImages) {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
            .to_string()
    };
    assert!(
        line.starts_with(&format!("{READY} {} ", guest.hostname)),
        "{line:?}"
    );
    assert_eq!(field("kernel"), guest.kernel, "{line:?}");
    // sda or sdb: the kernel probes the disks in parallel, which is why fstab and root= name UUIDs.
    let root = field("root");
    assert!(
        root.starts_with("/dev/sd") && root.ends_with('1'),
        "root on a SCSI disk's first partition: {line:?}"
    );
    assert_eq!(field("mac"), "52:54:00:12:34:56", "{line:?}");
    assert!(
        field("ip").starts_with("10.0.2."),
        "a DHCP lease from QEMU's user network: {line:?}"
    );
    assert_eq!(
        field("gw"),
        "reachable",
        "QEMU's router answers ping: {line:?}"
    );
    assert_eq!(field("data-sha256"), images.data_payload_sha256, "{line:?}");
}

#[test]
fn the_bios_guest_boots_on_vmware_hardware_and_reports_its_disks_and_network() {
    let images = images();
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let mut vm = boot(&images.bios, &images, pc, pvscsi);
    let console = vm
        .wait_for(BOOT_LIMIT, has_ready_line)
        .unwrap_or_else(|s| panic!("no {READY} line:\n{}", tail(&s)));
    eprintln!(
        "bios guest ready in {:.1?}: {}",
        vm.started.elapsed(),
        ready_line(&console)
    );
    assert_ready(ready_line(&console), &images.bios, &images);
}

#[test]
fn the_efi_guest_boots_with_secure_boot_on_vmware_devices() {
    let images = images();
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    // Secure Boot: SMM-protected flash, and fresh NVRAM per boot with Microsoft's keys enrolled.
    let machine = |dir: &Path| {
        let vars = dir.join("OVMF_VARS.fd");
        std::fs::copy(OVMF_VARS_MS, &vars).expect("Debian's ovmf (hack/setup.sh installs it)");
        vec![
            "-machine".to_string(),
            "q35,smm=on".into(),
            "-global".into(),
            "driver=cfi.pflash01,property=secure,value=on".into(),
            "-drive".into(),
            format!("if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"),
            "-drive".into(),
            format!("if=pflash,format=raw,unit=1,file={}", vars.display()),
        ]
    };
    let mut vm = boot(&images.efi, &images, machine, sata_root_pvscsi_data);
    let console = vm
        .wait_for(BOOT_LIMIT, has_ready_line)
        .unwrap_or_else(|s| panic!("no {READY} line:\n{}", tail(&s)));
    eprintln!(
        "efi guest ready in {:.1?}: {}",
        vm.started.elapsed(),
        ready_line(&console)
    );
    assert!(
        console.contains("Secure boot enabled"),
        "the kernel saw Secure Boot on:\n{}",
        tail(&console)
    );
    assert_ready(ready_line(&console), &images.efi, &images);
}

#[test]
fn the_bios_guest_on_virtio_disks_stops_in_its_initramfs() {
    let images = images();
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let virtio = |root: &Path, data: &Path| {
        vec![
            "-drive".to_string(),
            format!("if=virtio,format=qcow2,file={}", root.display()),
            "-drive".into(),
            format!("if=virtio,format=qcow2,file={}", data.display()),
        ]
    };
    let mut vm = boot(&images.bios, &images, pc, virtio);
    let gave_up = |s: &str| s.contains("Gave up waiting for root") || s.contains("ALERT!");
    let console = vm
        .wait_for(BOOT_LIMIT, |s| gave_up(s) || has_ready_line(s))
        .unwrap_or_else(|s| panic!("the initramfs neither gave up nor booted:\n{}", tail(&s)));
    eprintln!("the initramfs gave up after {:.1?}", vm.started.elapsed());
    assert!(
        !console.contains(READY),
        "booted without a virtio driver:\n{}",
        tail(&console)
    );
    assert!(
        console.contains(&images.bios.root_uuid),
        "it waited for the root by UUID:\n{}",
        tail(&console)
    );
}
