//! Windows guests, proven the way virt-v2v's own test suite proves them: phony Windows disks (real registry hives
//! on NTFS, a PE `cmd.exe`, and for UEFI an ESP), fake virtio-win drivers on an ISO laid out as the real one, and a
//! fake first-boot tool (`ferry_lab::windows`). Ferry migrates each phony VM from vcsim with guest adaptation;
//! then the adapted volume is read back (`ferry_lab::windows::check`): the drivers, the block driver's service and
//! device database entries (the CriticalDeviceDatabase layout on one guest, the DriverDatabase layout on the
//! other), the first-boot service and its scripts. What only a real Windows can show (that it boots from virtio,
//! that first boot runs, that the agent answers) is not claimed here. Refusals: no drivers or no first-boot tool
//! (before the source is touched); after the copy, waiting for a person with the volumes kept, a hibernated guest
//! (copied again once the person ended its hibernation and raised spec.recopy) and drivers for another Windows
//! version (adapted once the migration names the right ones).

mod support;

use std::time::Duration;

use ferry_api::{Phase, PowerState, VirtualMachineMigrationStatus};
use ferry_lab::windows::claims::{self, DRIVERS_2K19_CLAIM, DRIVERS_CLAIM};
use ferry_lab::windows::phony::PhonyFixtures;
use ferry_lab::windows::{PhonyWindows, WIN2K22, WIN2K22_HIBERNATED, WIN11};
use ferry_testkit::migration;
use kube::Api;
use kube::api::DynamicObject;
use serde_json::Value;
use support::*;

/// A 512 MiB disk through the data path, virt-v2v under software emulation, and a VM that settles.
const WINDOWS_TIMEOUT: Duration = Duration::from_secs(1200);

/// The phony VMs, seeded into the shared lab's vcsim once per test binary.
async fn fixtures() -> &'static PhonyFixtures {
    static SEEDED: tokio::sync::OnceCell<PhonyFixtures> = tokio::sync::OnceCell::const_new();
    SEEDED
        .get_or_init(|| async {
            let lab = lab().await;
            let vcsim = lab.state().vcsim.clone().unwrap();
            ferry_lab::windows::vms::seed_phony_windows_vms(&vcsim, lab.dir())
                .await
                .unwrap()
        })
        .await
}

/// One adaptation at a time: each is a core of emulation for a minute.
async fn one_adaptation_at_a_time() -> tokio::sync::OwnedMutexGuard<()> {
    source_lock("windows-adaptations").await
}

/// A namespace with the drivers' and the first-boot tool's claims; their volumes are deleted on drop.
struct WindowsNamespace {
    client: kube::Client,
    ns: ferry_testkit::TestNamespace,
    volumes: Vec<String>,
}

impl WindowsNamespace {
    async fn new(prefix: &str) -> Self {
        let fixtures = fixtures().await;
        let (client, ns) = setup(prefix).await;
        let volumes = claims::create_claims(&client, ns.name(), fixtures)
            .await
            .unwrap();
        Self {
            client,
            ns,
            volumes,
        }
    }

    fn name(&self) -> &str {
        self.ns.name()
    }

    /// Takes the adaptation turn and `guest`'s source (powered on, as a running VM is found), then migrates it
    /// as `name`; the turn is held until the returned guard drops.
    async fn start_adapted(&self, name: &str, guest: &PhonyWindows, spec: Value) -> AdaptationTurn {
        let turn = AdaptationTurn {
            _turn: one_adaptation_at_a_time().await,
            _source: source_lock(guest.name).await,
        };
        set_source_power(guest.name, true).await;
        self.migrate(name, guest, spec).await;
        turn
    }

    async fn migrate(&self, name: &str, guest: &PhonyWindows, spec: Value) {
        self.migrate_with(name, guest, spec, |_| {}).await
    }

    /// [`Self::migrate`], the manifest edited by `edit` last.
    async fn migrate_with(
        &self,
        name: &str,
        guest: &PhonyWindows,
        spec: Value,
        edit: impl FnOnce(&mut Value),
    ) {
        let lab = lab().await;
        let mut manifest = migration::migration(lab, self.name(), name, guest.name);
        if let (Some(existing), Value::Object(extra)) = (manifest["spec"].as_object_mut(), spec) {
            existing.extend(extra);
        }
        edit(&mut manifest);
        migration::apply(&self.client, self.name(), manifest)
            .await
            .unwrap();
    }
}

struct AdaptationTurn {
    _turn: tokio::sync::OwnedMutexGuard<()>,
    _source: tokio::sync::OwnedMutexGuard<()>,
}

fn assert_copied_never_adapted(status: &VirtualMachineMigrationStatus) {
    assert!(
        status
            .disks
            .iter()
            .all(|d| d.sha256.is_some() && d.adapted_sha256.is_none()),
        "copied and verified, never adapted: {:?}",
        status.disks
    );
}

impl Drop for WindowsNamespace {
    fn drop(&mut self) {
        // A client of its own on a runtime of its own: the test's runtime is blocked here, and its client would
        // wait for it forever.
        let volumes = std::mem::take(&mut self.volumes);
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let client = lab().await.client().await;
                claims::delete_volumes(&client, &volumes).await;
            })
        })
        .join();
    }
}

/// The VM Ferry built for a Windows guest: KubeVirt's admission took it with Hyper-V and Windows' timers, on
/// virtio, with the firmware of its source.
///
/// The clock: in UTC when the guest's registry says `RealTimeIsUniversal`, else in the IANA zone CLDR gives the
/// guest's Windows zone (written out here, not looked up the way Ferry looks it up).
async fn assert_windows_vm(client: &kube::Client, ns: &str, name: &str, guest: &PhonyWindows) {
    let vm = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &resource("kubevirt.io", "v1", "VirtualMachine"),
    )
    .get(name)
    .await
    .unwrap();
    let domain = &vm.data["spec"]["template"]["spec"]["domain"];
    match local_zone(guest) {
        None => assert_eq!(domain["clock"]["utc"], serde_json::json!({}), "{domain}"),
        Some(zone) => {
            assert_eq!(domain["clock"]["timezone"], zone, "{domain}");
            assert!(domain["clock"].get("utc").is_none(), "{domain}");
        }
    }
    assert_eq!(
        domain["clock"]["timer"]["hpet"]["present"], false,
        "{domain}"
    );
    assert_eq!(
        domain["clock"]["timer"]["rtc"]["tickPolicy"], "catchup",
        "{domain}"
    );
    assert_eq!(
        domain["clock"]["timer"]["pit"]["tickPolicy"], "delay",
        "{domain}"
    );
    assert!(
        domain["features"]["hyperv"]["relaxed"].is_object(),
        "{domain}"
    );
    assert!(
        domain["features"]["hyperv"]["vapic"].is_object(),
        "{domain}"
    );
    let bootloader = &domain["firmware"]["bootloader"];
    if guest.secure_boot {
        assert_eq!(bootloader["efi"]["secureBoot"], true, "{domain}");
        assert!(domain["features"]["smm"].is_object(), "{domain}");
    } else {
        assert!(bootloader["bios"].is_object(), "{domain}");
    }
    let buses: Vec<&str> = domain["devices"]["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["disk"]["bus"].as_str().unwrap())
        .collect();
    assert_eq!(buses, ["virtio"], "{domain}");
    assert_eq!(
        domain["devices"]["interfaces"][0]["model"], "virtio",
        "{domain}"
    );
    let tpm = &domain["devices"]["tpm"];
    if guest.vtpm {
        assert_eq!(tpm, &serde_json::json!({"persistent": true}), "{domain}");
    } else {
        assert!(tpm.is_null(), "{domain}");
    }
}

/// A static address VMware Tools reported, on a NIC the lab maps to the pod network: the warning, in the status
/// and as an Event; a DHCP address, none.
async fn assert_static_address_warning(
    client: &kube::Client,
    ns: &str,
    name: &str,
    status: &VirtualMachineMigrationStatus,
    guest: &PhonyWindows,
) {
    const WARNING: &str = "StaticAddressOnPodNetwork";
    let condition = status.conditions.iter().find(|c| c.type_ == WARNING);
    if !guest.tools_address.manual {
        assert!(condition.is_none(), "{condition:?}");
        return;
    }
    let condition = condition.unwrap_or_else(|| panic!("no {WARNING}: {:?}", status.conditions));
    assert!(
        condition.status == "True" && condition.message.contains(guest.tools_address.address),
        "{condition:?}"
    );
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap();
    let said = events.items.iter().filter(|e| {
        e.reason.as_deref() == Some(WARNING)
            && e.type_.as_deref() == Some("Warning")
            && e.involved_object.name.as_deref() == Some(name)
    });
    assert_eq!(said.count(), 1, "one Event when it turned True");
}

/// A source with a vTPM carries the warning that BitLocker's keys do not follow; one without, none.
fn assert_vtpm_warning(status: &VirtualMachineMigrationStatus, guest: &PhonyWindows) {
    let warning = status
        .conditions
        .iter()
        .find(|c| c.type_ == "TPMNotCarried");
    match warning {
        Some(c) => assert!(
            guest.vtpm && c.status == "True" && c.message.contains("BitLocker"),
            "{c:?}"
        ),
        None => assert!(!guest.vtpm, "{:?}", status.conditions),
    }
}

fn local_zone(guest: &PhonyWindows) -> Option<&'static str> {
    match (guest.rtc_utc, guest.time_zone) {
        (true, _) => None,
        (false, "W. Europe Standard Time") => Some("Europe/Berlin"),
        (false, other) => panic!("{}: no expected IANA zone for {other}", guest.name),
    }
}

/// Everything a guest adapted with the lab's drivers and first-boot tool shows once its migration succeeded:
/// what virt-v2v found (its clock too), the VM KubeVirt admitted, the warnings, and the adapted volume read back.
async fn assert_adapted(ns: &WindowsNamespace, name: &str, guest: &PhonyWindows) -> Vec<String> {
    let done = wait_for_phase(
        &ns.client,
        ns.name(),
        name,
        Phase::Succeeded,
        WINDOWS_TIMEOUT,
    )
    .await;
    let status = done.status.clone().unwrap();
    let adaptation = status.adaptation.clone().expect("status.adaptation");
    assert_eq!(
        (
            adaptation.os_type.as_str(),
            adaptation.distro.as_str(),
            adaptation.arch.as_str()
        ),
        ("windows", "windows", "x86_64"),
        "{adaptation:?}"
    );
    assert!(adaptation.os.contains(guest.product_name), "{adaptation:?}");
    let clock = adaptation
        .clock
        .clone()
        .expect("the clock read from SYSTEM");
    assert_eq!(
        (clock.windows_zone.as_str(), clock.timezone.as_str()),
        match local_zone(guest) {
            Some(zone) => (guest.time_zone, zone),
            None => ("", ""),
        },
        "{clock:?}"
    );
    let root = &status.disks[0];
    assert!(
        root.adapted_sha256.is_some() && root.adapted_sha256 != root.sha256,
        "{root:?}"
    );
    assert_windows_vm(&ns.client, ns.name(), name, guest).await;
    assert_vtpm_warning(&status, guest);
    assert_static_address_warning(&ns.client, ns.name(), name, &status, guest).await;
    assert!(status.source.as_ref().is_some_and(|s| s.vtpm == guest.vtpm));
    let volume = volume_image(&ns.client, ns.name(), root.data_volume.as_deref().unwrap()).await;
    let static_mac = ferry_lab::windows::check::static_mac(&done);
    assert_eq!(
        static_mac.is_some(),
        guest.tools_address.manual,
        "VMware Tools reported {:?}: {:?}",
        guest.tools_address,
        status.source.as_ref().map(|s| &s.nics)
    );
    let found = ferry_lab::windows::check::adapted_volume(&volume, guest, static_mac.as_deref())
        .unwrap_or_else(|e| panic!("{}: {e:#}", guest.name));
    assert_eq!(
        source_power(guest.name).await,
        PowerState::PoweredOff,
        "{}: a migrated source stays off",
        guest.name
    );
    found
}

/// Windows 11 (UEFI with Secure Boot and a vTPM, DriverDatabase) adapted with the lab's drivers and first-boot
/// tool and read back from its volume. Windows Server 2022 (BIOS, CriticalDeviceDatabase) is read back the same
/// way once its refusals are fixed, below.
#[tokio::test]
async fn phony_windows_guests_are_adapted_with_drivers_and_first_boot_scripts() {
    let ns = WindowsNamespace::new("windows").await;
    let (name, guest) = ("win11", WIN11);
    let _turn = ns
        .start_adapted(name, &guest, claims::adapted_spec(DRIVERS_CLAIM, true))
        .await;
    let found = assert_adapted(&ns, name, &guest).await;
    eprintln!("{}: {}", guest.name, found.join("; "));
}

/// The status of `ns/name` once its reason is `reason`.
async fn wait_for_reason(
    ns: &WindowsNamespace,
    name: &str,
    reason: &str,
) -> VirtualMachineMigrationStatus {
    let api = migrations(&ns.client, ns.name());
    ferry_testkit::eventually(
        &format!("{name} to say {reason}"),
        WINDOWS_TIMEOUT,
        || async {
            let status = api.get(name).await.ok()?.status?;
            (status.reason.as_deref() == Some(reason)).then_some(status)
        },
    )
    .await
}

/// No drivers or no first-boot tool named, or static addresses to keep that VMware Tools never reported: refused
/// in preflight, fixably, and the source was never powered off. A static address sent to the pod network when the
/// migration says Refuse: refused there too, for good.
#[tokio::test]
async fn a_windows_guest_without_drivers_or_a_first_boot_tool_is_refused_before_its_source_is_touched()
 {
    let ns = WindowsNamespace::new("windows-unnamed").await;
    let _source = source_lock(WIN2K22.name).await;
    set_source_power(WIN2K22.name, true).await;
    let mut no_drivers = claims::adapted_spec(DRIVERS_CLAIM, true);
    no_drivers["conversion"]
        .as_object_mut()
        .unwrap()
        .remove("virtioWin");
    for (name, spec, reason, words) in [
        (
            "no-tool",
            claims::adapted_spec(DRIVERS_CLAIM, false),
            "GuestFirstBootToolMissing",
            ["spec.conversion.firstBootTool", "rhsrvany.exe"],
        ),
        (
            "no-drivers",
            no_drivers,
            "GuestDriversMissing",
            ["spec.conversion.virtioWin", "windows2019srvNext_64Guest"],
        ),
    ] {
        ns.migrate(name, &WIN2K22, spec).await;
        let status = wait_for_reason(&ns, name, reason).await;
        let message = status.message.clone().unwrap_or_default();
        assert!(
            words.iter().all(|w| message.contains(w)),
            "{name}: {message}"
        );
        assert_eq!(
            status.phase,
            Some(Phase::ManualInterventionRequired),
            "{name}: fixable in place"
        );
        assert!(
            status.disks.iter().all(|d| d.sha256.is_none()),
            "{name}: nothing copied: {status:?}"
        );
        assert!(
            status
                .power
                .as_ref()
                .is_none_or(|p| p.current != Some(PowerState::PoweredOff)),
            "{name}: {status:?}"
        );
        assert_eq!(
            source_power(WIN2K22.name).await,
            PowerState::PoweredOn,
            "{name}: vSphere says the source runs"
        );
        migrations(&ns.client, ns.name())
            .delete(name, &Default::default())
            .await
            .unwrap();
    }
    // Static addresses asked to be kept, and VMware Tools reporting none: refused the same way.
    let vcsim = lab().await.state().vcsim.clone().unwrap();
    ferry_lab::windows::vms::report_guest_network(&vcsim, &WIN2K22, false)
        .await
        .unwrap();
    ns.migrate(
        "no-addresses",
        &WIN2K22,
        claims::adapted_spec(DRIVERS_CLAIM, true),
    )
    .await;
    let status = wait_for_reason(&ns, "no-addresses", "StaticIPsNotReported").await;
    ferry_lab::windows::vms::report_guest_network(&vcsim, &WIN2K22, true)
        .await
        .unwrap();
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("preserveStaticIPs")
            && message.contains("VMware Tools reported no address"),
        "{message}"
    );
    assert_eq!(status.phase, Some(Phase::ManualInterventionRequired));
    assert_eq!(source_power(WIN2K22.name).await, PowerState::PoweredOn);
    migrations(&ns.client, ns.name())
        .delete("no-addresses", &Default::default())
        .await
        .unwrap();
    // The static address goes to the pod network, and the migration asked for a refusal then: refused for good
    // (its target is immutable) in preflight, with nothing copied and the source never powered off.
    ns.migrate_with(
        "pod-refused",
        &WIN2K22,
        claims::adapted_spec(DRIVERS_CLAIM, true),
        |manifest| manifest["spec"]["target"]["staticAddressOnPodNetwork"] = "Refuse".into(),
    )
    .await;
    let status = wait_for_reason(&ns, "pod-refused", "StaticAddressOnPodNetwork").await;
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains(WIN2K22.tools_address.address)
            && message.contains("staticAddressOnPodNetwork is Refuse"),
        "{message}"
    );
    assert_eq!(status.phase, Some(Phase::Failed), "{message}");
    assert!(
        status.disks.iter().all(|d| d.sha256.is_none()),
        "nothing copied: {status:?}"
    );
    assert_eq!(source_power(WIN2K22.name).await, PowerState::PoweredOn);
}

/// The migration of `ns/name` with `patch` merged into it.
async fn patch_migration(ns: &WindowsNamespace, name: &str, patch: Value) {
    migrations(&ns.client, ns.name())
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .unwrap();
}

/// Refused after the copy, fixably: waiting for a person with every volume kept and the source off, never
/// adapted, the refused Job kept and its attempt uncharged while nothing changes. Returns the status.
async fn assert_waits_with_the_copy_kept(
    ns: &WindowsNamespace,
    name: &str,
    guest: &PhonyWindows,
    reason: &str,
    words: &str,
) -> VirtualMachineMigrationStatus {
    let refused = wait_for_reason(ns, name, reason).await;
    let message = refused.message.clone().unwrap_or_default();
    assert!(message.contains(words), "{message}");
    let waiting = wait_for_phase(
        &ns.client,
        ns.name(),
        name,
        Phase::ManualInterventionRequired,
        Duration::from_secs(120),
    )
    .await;
    let status = waiting.status.clone().unwrap();
    assert_copied_never_adapted(&status);
    let uid = waiting.metadata.uid.clone().unwrap();
    let kept = children_left(&ns.client, ns.name(), &uid).await;
    let volume = status.disks[0].data_volume.clone().unwrap();
    assert!(
        kept.iter().any(|c| c.ends_with(&format!(" {volume}"))),
        "the volume is kept: {kept:?}"
    );
    assert_eq!(
        source_power(guest.name).await,
        PowerState::PoweredOff,
        "the copied source stays off"
    );
    // The refused Job is kept as the evidence, its attempt uncharged. An earlier attempt may have failed
    // otherwise and been charged (an appliance that did not start under load): that is the retry, not the refusal.
    let refused_job = message
        .strip_prefix("Job ")
        .and_then(|m| m.split(':').next())
        .unwrap_or_else(|| panic!("the refusal names its Job: {message}"))
        .to_string();
    let job =
        kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(ns.client.clone(), ns.name())
            .get(&refused_job)
            .await
            .unwrap_or_else(|e| panic!("the refused Job {refused_job} is kept: {e}"));
    let charged = |s: &VirtualMachineMigrationStatus| {
        s.retry
            .as_ref()
            .map(|r| r.charged.clone())
            .unwrap_or_default()
    };
    let charged_then = charged(&status);
    if !charged_then.is_empty() {
        eprintln!(
            "{name}: attempts charged before the refusal: {:?}",
            status.retry
        );
    }
    assert!(
        !charged_then.contains(&job.metadata.uid.clone().unwrap_or_default()),
        "the refusal is not charged: {:?}",
        status.retry
    );
    // Rechecked, but not run again.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let still = migrations(&ns.client, ns.name())
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        (still.phase, still.reason.as_deref()),
        (Some(Phase::ManualInterventionRequired), Some(reason))
    );
    assert_eq!(charged(&still), charged_then, "{:?}", still.retry);
    status
}

/// After the copy, virt-v2v finds what vSphere could not tell, and what only a person can fix. First a hibernated
/// guest: the migration waits with the volumes kept and the source off; the person boots the guest in vSphere
/// and shuts it down fully, and raises spec.recopy (while the source still runs Ferry waits for it to be off):
/// the source is copied again into the same volumes. Then drivers for another Windows version only: it waits
/// again, does not run virt-v2v again while nothing changed, and once the migration names the right drivers adapts
/// the same volumes and finishes, read back like any adapted guest.
#[tokio::test]
async fn a_hibernated_guest_and_drivers_for_another_version_wait_with_the_volumes_kept_and_adapt_once_fixed()
 {
    let ns = WindowsNamespace::new("windows-fixed").await;
    let (name, guest) = ("hibernated", WIN2K22_HIBERNATED);
    let vcsim = lab().await.state().vcsim.clone().unwrap();
    let fixtures = fixtures().await;
    // Hibernated, whatever an earlier run left.
    ferry_lab::windows::vms::run_guest(&vcsim, &guest, &fixtures.disk(&guest))
        .await
        .unwrap();
    let _turn = ns
        .start_adapted(name, &guest, claims::adapted_spec(DRIVERS_2K19_CLAIM, true))
        .await;
    let hibernated = assert_waits_with_the_copy_kept(
        &ns,
        name,
        &guest,
        "GuestFilesystemUnwritable",
        "Windows Hibernation or Fast Restart",
    )
    .await;
    let volume = hibernated.disks[0].data_volume.clone().unwrap();

    // The person starts the guest, and asks for the copy before shutting it down: Ferry waits for the source.
    set_source_power(guest.name, true).await;
    patch_migration(&ns, name, serde_json::json!({"spec": {"recopy": 1}})).await;
    let waiting = wait_for_reason(&ns, name, "SourcePoweredOn").await;
    assert_eq!(waiting.phase, Some(Phase::ManualInterventionRequired));
    assert_eq!(waiting.recopied, 0, "nothing copied while the source runs");
    ferry_lab::windows::vms::run_guest(&vcsim, &guest, &fixtures.shut_down_disk(&guest))
        .await
        .unwrap();

    let other_version = assert_waits_with_the_copy_kept(
        &ns,
        name,
        &guest,
        "GuestDriversMissing",
        "no virtio drivers available for this version of Windows",
    )
    .await;
    assert_eq!(other_version.recopied, 1);
    assert_eq!(
        other_version.disks[0].data_volume.as_deref(),
        Some(volume.as_str()),
        "copied again into the same volume"
    );
    assert_ne!(
        other_version.disks[0].sha256, hibernated.disks[0].sha256,
        "the source as the person left it is the copy"
    );

    // The person names the drivers for this Windows.
    patch_migration(
        &ns,
        name,
        serde_json::json!({"spec": {"conversion": {
            "virtioWin": {"persistentVolumeClaim": DRIVERS_CLAIM}}}}),
    )
    .await;
    let found = assert_adapted(&ns, name, &guest).await;
    let done = migrations(&ns.client, ns.name()).get(name).await.unwrap();
    assert_eq!(
        done.status.unwrap().disks[0].data_volume.as_deref(),
        Some(volume.as_str()),
        "the same volume"
    );
    eprintln!("{name} once fixed: {}", found.join("; "));
}
