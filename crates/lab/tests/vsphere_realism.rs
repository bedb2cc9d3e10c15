//! The lab's vcsim with production-like behaviours switched on through `VcsimRealism`: the options reach the
//! launcher and Ferry's vSphere client works against them. What each behaviour does is tested with the launcher
//! itself (`tools/vcsim/*_test.go`).

use std::time::Duration;

use ferry_api::{Firmware, PowerState};
use ferry_lab::Lifetime;
use ferry_lab::vsphere::vcsim::{StandaloneVcsim, VcsimRealism};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::provision::{self, NewVm, Transfer, VmdkFiles};
use ferry_vsphere::{Session, power};

/// Stops the simulator even when an assertion fails (before the temporary directory goes).
struct Running(StandaloneVcsim);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.stop();
    }
}

#[tokio::test]
async fn realism_options_reach_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let realism = VcsimRealism {
        folder_auth: true,
        dc_folder: Some("Folder1".into()),
        fixtures: true,
        ..Default::default()
    };
    let tools = ferry_lab::control_plane::tools::bin_dir().unwrap();
    let vcsim = Running(
        StandaloneVcsim::start_with(
            dir.path(),
            &tools,
            false,
            &realism,
            Lifetime::TiedToThisProcess,
        )
        .await
        .unwrap(),
    );
    let endpoint = &vcsim.0.endpoint;
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(30)).unwrap())
        .await
        .unwrap();
    // The fixtures exist, and listing the inventory works with the datacenter inside a folder.
    let names: Vec<String> = inventory::list_vms(&session)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    for vm in [
        "ferry-vsan-vm",
        "ferry-vvol-vm",
        "ferry-encrypted-vm",
        "ferry-sesparse-vm",
        "ferry-multiextent-vm",
        "DC0_H0_VM0",
    ] {
        assert!(names.iter().any(|n| n == vm), "{vm} not in {names:?}");
    }
    // /folder refuses a request without the session cookie.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = std::fs::read(&endpoint.ca_file).unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let url = format!(
        "{}/folder/DC0_H0_VM0/DC0_H0_VM0.vmx?dcPath=Folder1%2FDC0&dsName=LocalDS_0",
        session.base_url()
    );
    let status = http.get(url).send().await.unwrap().status();
    assert_eq!(status, reqwest::StatusCode::UNAUTHORIZED);

    // What `ferry lab up` does to seed a VM still works with the datacenter in a folder: CreateVM into its
    // vmFolder, a disk linked into the datastore, lookup by name, description, power.
    let descriptor = dir.path().join("probe.vmdk");
    let extent = dir.path().join("probe-flat.vmdk");
    std::fs::write(
        &descriptor,
        "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\n\
         # Extent description\nRW 2048 FLAT \"probe-flat.vmdk\" 0\n\n# The Disk Data Base\n#DDB\n",
    )
    .unwrap();
    std::fs::File::create(&extent)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let spec = NewVm {
        name: "ferry-probe".into(),
        guest_id: "debian12_64Guest".into(),
        cpus: 1,
        cores_per_socket: 1,
        memory_mib: 256,
        firmware: Firmware::Bios,
        efi_secure_boot: false,
        vtpm: false,
        host: "DC0_H0".into(),
        datastore: "LocalDS_0".into(),
        networks: vec!["DC0_DVPG0".into()],
    };
    let disks = [VmdkFiles {
        descriptor: &descriptor,
        extent: &extent,
    }];
    let created =
        provision::provision_vm(&session, &spec, &disks, Transfer::LinkIntoLocalDatastore)
            .await
            .unwrap();
    let found = inventory::find_vm(&session, &VmSelector::Name("ferry-probe".into()))
        .await
        .unwrap();
    assert_eq!(found, created);
    let info = inventory::describe_vm(&session, &found).await.unwrap();
    assert_eq!(info.disks.len(), 1);
    power::power_on(&session, &found, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        power::current_power_state(&session, &found).await.unwrap(),
        PowerState::PoweredOn
    );
    session.logout().await;
}
