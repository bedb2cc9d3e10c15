//! What a virt-v2v run's output means. virt-v2v ends a failed run with `<program>: error: <message>` (which may
//! span lines) and, for some guests, converts while warning that it could not do what Ferry needs (a Windows
//! guest without virtio drivers gets emulated devices, which Ferry's virtio VM would not boot).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdaptationFailure {
    /// No operating system virt-v2v can convert: a blank disk, a multi-boot guest, a guest type it does not
    /// know, no kernel or bootloader it understands.
    UnsupportedGuest,
    /// The guest's file systems lack the free space or inodes the conversion needs.
    NoSpace,
    /// A Windows guest, and no virtio drivers for it.
    MissingDrivers,
    /// A Windows guest, and no first-boot tool (rhsrvany.exe or pvvxsvc.exe) to install its first-boot scripts.
    MissingFirstBootTool,
    /// The guest's file system could not be written: hibernated Windows, Fast Restart, an unclean shutdown.
    GuestFilesystemUnwritable,
    /// libguestfs's appliance did not start or died: this machine's trouble, not the guest's.
    ApplianceFailed,
    /// Anything else virt-v2v refused.
    Other,
}

/// Warnings after which virt-v2v goes on converting a Windows guest, but to emulated devices (IDE, rtl8139) where
/// Ferry's VM gives it virtio ones: it would not boot, or have no network. Their wording is
/// libguestfs-common's `mlcustomize/inject_virtio_win.ml`, the same from virt-v2v 2.2 to 2.8; without `--wrap`
/// or a terminal, virt-v2v prints each on one line.
const DRIVER_WARNINGS: &[&str] = &[
    "there are no virtio drivers available for this version of Windows",
    "there is no virtio block device driver for this version of Windows",
    "there is no virtio network driver for this version of Windows",
];

/// Phrases of virt-v2v's and libguestfs's messages (virt-v2v 2.x `convert/*.ml`, libguestfs-common's
/// `mlcustomize/inject_virtio_win.ml`, libguestfs `lib/launch*.c`), checked in this order.
const PATTERNS: &[(AdaptationFailure, &str)] = &[
    (
        AdaptationFailure::MissingDrivers,
        "no virtio drivers available",
    ),
    // `VIRTIO_WIN` names a file that is not an ISO libguestfs can open.
    (AdaptationFailure::MissingDrivers, "cannot open virtio-win"),
    // An ISO without a root directory.
    (
        AdaptationFailure::MissingDrivers,
        "missing from the virtio-win directory or ISO",
    ),
    // libguestfs-common `mlcustomize/firstboot.ml`: "One of rhsrvany.exe or pvvxsvc.exe is missing in DIR".
    (
        AdaptationFailure::MissingFirstBootTool,
        "rhsrvany.exe or pvvxsvc.exe is missing",
    ),
    (
        AdaptationFailure::NoSpace,
        "not enough free space for conversion",
    ),
    (AdaptationFailure::NoSpace, "not enough available inodes"),
    (AdaptationFailure::NoSpace, "No space left on device"),
    (
        AdaptationFailure::GuestFilesystemUnwritable,
        "Windows Hibernation or Fast Restart",
    ),
    (
        AdaptationFailure::GuestFilesystemUnwritable,
        "mounted read-only",
    ),
    (
        AdaptationFailure::GuestFilesystemUnwritable,
        "could not write to the guest filesystem",
    ),
    (
        AdaptationFailure::UnsupportedGuest,
        "inspection could not detect the source guest",
    ),
    (
        AdaptationFailure::UnsupportedGuest,
        "unable to convert this guest type",
    ),
    (
        AdaptationFailure::UnsupportedGuest,
        "multi-boot operating systems are not supported",
    ),
    (
        AdaptationFailure::UnsupportedGuest,
        "not an installed operating system",
    ),
    (
        AdaptationFailure::UnsupportedGuest,
        "no installed kernel packages were found",
    ),
    (
        AdaptationFailure::UnsupportedGuest,
        "no kernels were found in the bootloader",
    ),
    (
        AdaptationFailure::UnsupportedGuest,
        "no bootloader detected",
    ),
    (AdaptationFailure::ApplianceFailed, "guestfs_launch failed"),
    (
        AdaptationFailure::ApplianceFailed,
        "child process died unexpectedly",
    ),
    (
        AdaptationFailure::ApplianceFailed,
        "supermin exited with error",
    ),
    (
        AdaptationFailure::ApplianceFailed,
        "cannot find any suitable libguestfs supermin",
    ),
    (AdaptationFailure::ApplianceFailed, "qemu-system-x86_64: "),
];

impl AdaptationFailure {
    /// The class of a run that failed (or converted with a warning that makes its result unusable) and virt-v2v's
    /// own words for it; `None` for a run whose output shows no such trouble.
    pub fn of_run(output: &str, exited_ok: bool) -> Option<(AdaptationFailure, String)> {
        // A driver warning says what went wrong better than whatever failed after it.
        if let Some(warning) = DRIVER_WARNINGS
            .iter()
            .find_map(|phrase| warning_line(output, phrase))
        {
            return Some((AdaptationFailure::MissingDrivers, warning));
        }
        // Only the error line is searched: a verbose log's traces mention everything.
        let message = error_message(output);
        let class = message.as_ref().and_then(|message| {
            PATTERNS
                .iter()
                .find(|(_, phrase)| message.contains(phrase))
                .map(|(class, _)| *class)
        });
        // An error line in a run that finished (a probe libguestfs reported and virt-v2v got past) counts only
        // when it says the drivers are unusable.
        let class = match (exited_ok, class) {
            (true, Some(AdaptationFailure::MissingDrivers)) => AdaptationFailure::MissingDrivers,
            (true, _) => return None,
            (false, class) => class.unwrap_or(AdaptationFailure::Other),
        };
        let message =
            message.unwrap_or_else(|| "virt-v2v-in-place failed without an error message".into());
        Some((class, message))
    }

    /// Whether another attempt on the same disks could succeed: only trouble of the machine's, not the guest's.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            AdaptationFailure::ApplianceFailed | AdaptationFailure::Other
        )
    }
}

/// The text after the last `: error: ` up to the bug-report advice or a blank line, on one line.
fn error_message(output: &str) -> Option<String> {
    let start = output.rfind(": error: ")? + ": error: ".len();
    let rest = &output[start..];
    let end = [
        rest.find("\n\nIf reporting bugs"),
        rest.find("If reporting bugs"),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(rest.len());
    Some(one_line(&rest[..end]))
}

/// The warning that holds `phrase`, from after its `: warning: ` up to the blank line that ends it, on one line.
fn warning_line(output: &str, phrase: &str) -> Option<String> {
    let at = output.find(phrase)?;
    let line = output[..at].rfind('\n').map_or(0, |n| n + 1);
    let start = output[line..at]
        .find(": warning: ")
        .map_or(at, |w| line + w + ": warning: ".len());
    let end = output[at..].find("\n\n").map_or(output.len(), |e| at + e);
    Some(one_line(&output[start..end]))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADVICE: &str = "\n\nIf reporting bugs, run virt-v2v-in-place with debugging enabled and include the \
                          complete output:\n\n  virt-v2v-in-place -v -x [...]\n";

    #[test]
    fn errors_are_classed_with_virt_v2vs_own_words() {
        let blank = format!(
            "[   2.0] Inspecting the source\nvirt-v2v-in-place: error: inspection could not detect the \
             source guest (or physical machine).\n\nAssuming that you are running virt-v2v/virt-p2v on a \
             source which is supported{ADVICE}"
        );
        let (class, message) = AdaptationFailure::of_run(&blank, false).unwrap();
        assert_eq!(class, AdaptationFailure::UnsupportedGuest);
        assert!(
            message
                .starts_with("inspection could not detect the source guest (or physical machine)."),
            "{message}"
        );
        assert!(!message.contains("If reporting bugs"), "{message}");
        assert!(!class.retryable());

        let full = format!(
            "virt-v2v-in-place: error: not enough free space for conversion on filesystem ‘/’.  \
             12.0 MB free < 20 MB needed{ADVICE}"
        );
        assert_eq!(
            AdaptationFailure::of_run(&full, false).unwrap().0,
            AdaptationFailure::NoSpace
        );

        let appliance = format!(
            "libguestfs: error: /usr/bin/supermin exited with error status 1, see debug messages above\n\
             virt-v2v-in-place: error: libguestfs error: /usr/bin/supermin exited with error status 1{ADVICE}"
        );
        let (class, _) = AdaptationFailure::of_run(&appliance, false).unwrap();
        assert_eq!(class, AdaptationFailure::ApplianceFailed);
        assert!(class.retryable());

        let odd = format!("virt-v2v-in-place: error: something new{ADVICE}");
        assert_eq!(
            AdaptationFailure::of_run(&odd, false).unwrap(),
            (AdaptationFailure::Other, "something new".into())
        );
        assert_eq!(
            AdaptationFailure::of_run("killed\n", false).unwrap().0,
            AdaptationFailure::Other
        );
    }

    #[test]
    fn a_windows_guest_converted_without_drivers_is_a_failure_and_a_clean_run_is_not() {
        let windows = "[  40.0] Converting Windows Server 2019 Standard to run on KVM\n\
                       virt-v2v-in-place: warning: there are no virtio drivers available for this version of \
                       Windows (10.0 x86_64 Server win2k19).  virt-v2v looks for drivers in \
                       /usr/share/virtio-win\n\nThe guest will be configured to use slower emulated devices.\n\
                       [  90.0] Finishing off\n";
        let (class, message) = AdaptationFailure::of_run(windows, true).unwrap();
        assert_eq!(class, AdaptationFailure::MissingDrivers);
        assert!(
            message
                .starts_with("there are no virtio drivers available for this version of Windows"),
            "{message}"
        );
        assert!(!class.retryable());
        // virt-v2v's words when VIRTIO_WIN lacks the block driver or the network driver for this Windows (the
        // network one as virt-v2v-in-place 2.2.0 printed it for a phony Windows Server 2022 disk).
        for (missing, driver) in [
            ("virtio block device driver", "block"),
            ("virtio network driver", "network"),
        ] {
            let output = format!(
                "[  41.0] Converting Windows Server 2022 Standard to run on KVM\n\
                 virt-v2v-in-place: warning: there is no {missing} for this version of Windows (10.0 x86_64).  \
                 virt-v2v looks for this driver in /run/ferry/virtio-win/disk/virtio-win.iso\n\n\
                 The guest will be configured to use a slower emulated device.\n[  95.0] Finishing off\n"
            );
            let (class, message) = AdaptationFailure::of_run(&output, true).unwrap();
            assert_eq!(class, AdaptationFailure::MissingDrivers, "{driver}");
            assert!(
                message.starts_with(&format!("there is no {missing}"))
                    && message.ends_with("virtio-win.iso"),
                "{message}"
            );
        }
        let linux = "[  30.0] Converting 12.15 to run on KVM\nvirt-v2v-in-place: This guest has virtio \
                     drivers installed.\n[  80.0] Finishing off\n";
        assert_eq!(AdaptationFailure::of_run(linux, true), None);
    }

    #[test]
    fn drivers_virt_v2v_cannot_read_are_missing_drivers() {
        let not_an_iso = format!(
            "virt-v2v-in-place: error: /run/ferry/virtio-win/drivers.zip: cannot open virtio-win ISO file: \
             guestfs_launch failed.\nThis usually means the libguestfs appliance failed to start{ADVICE}"
        );
        let (class, message) = AdaptationFailure::of_run(&not_an_iso, false).unwrap();
        assert_eq!(
            class,
            AdaptationFailure::MissingDrivers,
            "not the appliance's fault"
        );
        assert!(
            message.starts_with("/run/ferry/virtio-win/drivers.zip: cannot open"),
            "{message}"
        );
        let no_root = format!(
            "virt-v2v-in-place: error: root directory ‘/’ is missing from the virtio-win directory or \
             ISO.\n\nThis should not happen and may indicate that virtio-win or virt-v2v is broken in some \
             way.{ADVICE}"
        );
        assert_eq!(
            AdaptationFailure::of_run(&no_root, false).unwrap().0,
            AdaptationFailure::MissingDrivers
        );
        // A warning before an unrelated failure still names the cause that no retry fixes.
        let both = format!(
            "virt-v2v-in-place: warning: there are no virtio drivers available for this version of Windows \
             (6.3 x86_64 Server win2k12r2).  virt-v2v looks for drivers in /run/ferry/virtio-win\n\n\
             The guest will be configured to use slower emulated devices.\n\
             virt-v2v-in-place: error: libguestfs error: child process died unexpectedly{ADVICE}"
        );
        assert_eq!(
            AdaptationFailure::of_run(&both, false).unwrap().0,
            AdaptationFailure::MissingDrivers
        );
        // A warning the line does not start with is not taken from an earlier line.
        let plain = "virt-v2v-in-place: warning: unrelated\nthere is no virtio network driver for this version \
                     of Windows (10.0 x86_64)\n";
        assert_eq!(
            AdaptationFailure::of_run(plain, true).unwrap().1,
            "there is no virtio network driver for this version of Windows (10.0 x86_64)"
        );
    }
}
