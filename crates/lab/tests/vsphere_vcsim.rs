//! The vSphere client (`ferry-vsphere`) against vcsim (vCenter and ESXi models), started per test by the
//! test-support crate. (Here, not in `ferry-vsphere`, so that crate needs no kube even for tests.)

use std::time::Duration;

use ferry_api::{ErrorClass, PowerState};
use ferry_testkit::TestVcsim;
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{ConnectConfig, Error, Session, TlsMode, power, snapshot};

fn config(vcsim: &TestVcsim, tls: TlsMode) -> ConnectConfig {
    let endpoint = vcsim.endpoint();
    ConnectConfig {
        url: endpoint.url.clone(),
        username: endpoint.username.clone(),
        password: endpoint.password().unwrap(),
        tls,
        timeout: Duration::from_secs(30),
    }
}

fn ca_mode(vcsim: &TestVcsim) -> TlsMode {
    TlsMode::CaBundle(std::fs::read_to_string(&vcsim.endpoint().ca_file).unwrap())
}

async fn connect(vcsim: &TestVcsim) -> Session {
    Session::connect(config(vcsim, ca_mode(vcsim)))
        .await
        .unwrap()
}

/// The SHA-256 thumbprint of the certificate vcsim serves (the lab issued it).
fn served_thumbprint(vcsim: &TestVcsim) -> String {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let pem = std::fs::read(vcsim.dir().join("pki/vcsim.crt")).unwrap();
    let der = CertificateDer::from_pem_slice(&pem).unwrap();
    ferry_vsphere::tls::thumbprint_of(der.as_ref())
}

#[tokio::test]
async fn lists_and_describes_vms_in_the_vcenter_and_esxi_models() {
    for (esx, vm_name, api_type, datacenter) in [
        (false, "DC0_H0_VM0", "VirtualCenter", "DC0"),
        (true, "ha-host_VM0", "HostAgent", "ha-datacenter"),
    ] {
        let vcsim = TestVcsim::start(esx).await.unwrap();
        let session = connect(&vcsim).await;
        assert_eq!(session.about().api_type, api_type);

        let vms = inventory::list_vms(&session).await.unwrap();
        assert!(
            vms.iter().any(|v| v.name == vm_name),
            "{vm_name} not in {vms:?}"
        );
        assert!(
            vms.iter()
                .all(|v| v.power_state == Some(PowerState::PoweredOn))
        );

        let moref = inventory::find_vm(&session, &VmSelector::Name(vm_name.into()))
            .await
            .unwrap();
        let vm = inventory::describe_vm(&session, &moref).await.unwrap();
        assert_eq!(
            (vm.name.as_str(), vm.datacenter.as_str()),
            (vm_name, datacenter)
        );
        assert_eq!(vm.power_state, PowerState::PoweredOn);
        assert!(vm.cpus >= 1 && vm.memory_mib >= 32, "{vm:?}");
        assert_eq!(vm.snapshots, 0);
        let disk = &vm.disks[0];
        assert_eq!(disk.file, format!("[LocalDS_0] {vm_name}/disk1.vmdk"));
        assert_eq!(
            (disk.datastore.as_str(), disk.bus.as_str()),
            ("LocalDS_0", "scsi")
        );
        assert!(disk.capacity_bytes > 0);
        let nic = &vm.nics[0];
        assert_eq!(nic.mac.len(), 17, "{nic:?}");
        assert!(
            !nic.network.is_empty() && !nic.network.starts_with("dvportgroup:"),
            "{nic:?}"
        );

        // Where it sits: the paths a Provider's scope is written in.
        let placed = inventory::placement(&session, &moref).await.unwrap();
        assert_eq!(placed.folder, format!("{datacenter}/vm"), "{placed:?}");
        let pool = placed.resource_pool.clone().unwrap();
        assert!(
            pool.starts_with(&format!("{datacenter}/host/")) && pool.ends_with("/Resources"),
            "{placed:?}"
        );
        if !esx {
            let in_cluster = VmSelector::Name("DC0_C0_RP0_VM0".into());
            let in_cluster = inventory::find_vm(&session, &in_cluster).await.unwrap();
            let placed = inventory::placement(&session, &in_cluster).await.unwrap();
            assert_eq!(
                placed.resource_pool.as_deref(),
                Some("DC0/host/DC0_C0/Resources"),
                "{placed:?}"
            );
        }

        // Every way of naming the VM finds the same one.
        let uuid = vm.uuid.clone().unwrap();
        let instance_uuid = vm.instance_uuid.clone().unwrap();
        for selector in [
            VmSelector::Uuid(uuid),
            VmSelector::Uuid(instance_uuid),
            VmSelector::Moref(moref.value.clone()),
            VmSelector::InventoryPath(format!("/{datacenter}/vm/{vm_name}")),
        ] {
            assert_eq!(
                inventory::find_vm(&session, &selector).await.unwrap(),
                moref,
                "{selector}"
            );
        }
        for missing in [
            VmSelector::Name("nope".into()),
            VmSelector::Moref("vm-99999".into()),
            VmSelector::Uuid("00000000-0000-0000-0000-000000000000".into()),
        ] {
            let e = inventory::find_vm(&session, &missing).await.unwrap_err();
            assert!(matches!(e, Error::VmNotFound { .. }), "{missing}: {e}");
            assert_eq!(e.class(), ErrorClass::Permanent);
        }
        session.logout().await;
    }
}

#[tokio::test]
async fn power_off_and_on_are_idempotent_and_task_faults_are_classed() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let session = connect(&vcsim).await;
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM1".into()))
        .await
        .unwrap();
    let minute = Duration::from_secs(60);

    power::power_off(&session, &vm, minute).await.unwrap();
    power::power_off(&session, &vm, minute).await.unwrap();
    assert_eq!(
        power::current_power_state(&session, &vm).await.unwrap(),
        PowerState::PoweredOff
    );
    assert_eq!(
        power::start_power_off(&session, &vm).await.unwrap(),
        None,
        "no task for a VM already off"
    );

    // Issued anyway, the task fails with InvalidPowerState: transient, and a success for a power-off.
    let response = session.call("PowerOffVM_Task", &vm, "").await.unwrap();
    let task = ferry_vsphere::MoRef::from_element(response.child("returnval").unwrap()).unwrap();
    let e = power::wait_task(&session, &task, minute).await.unwrap_err();
    assert_eq!(
        (e.fault(), e.class()),
        (Some("InvalidPowerState"), ErrorClass::Transient),
        "{e}"
    );
    power::finish_power_task(&session, &task, minute)
        .await
        .unwrap();

    power::power_on(&session, &vm, minute).await.unwrap();
    power::power_on(&session, &vm, minute).await.unwrap();
    assert_eq!(
        power::current_power_state(&session, &vm).await.unwrap(),
        PowerState::PoweredOn
    );
    // The one read Preparing makes agrees with the three it replaced.
    let view = power::power_view(&session, &vm).await.unwrap();
    assert_eq!(
        view,
        power::PowerView {
            instance_uuid: inventory::instance_uuid(&session, &vm).await.unwrap(),
            state: PowerState::PoweredOn,
            tools_running: power::tools_running(&session, &vm).await.unwrap(),
        }
    );
    assert!(view.instance_uuid.is_some(), "{view:?}");
    let gone = ferry_vsphere::MoRef::new("VirtualMachine", "vm-99999");
    let e = power::power_view(&session, &gone).await.unwrap_err();
    assert!(matches!(e, Error::VmNotFound { .. }), "{e}");

    // A guest shutdown ends powered off, gracefully or by force.
    let how = power::shutdown_guest(&session, &vm, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        matches!(how, power::Shutdown::Graceful | power::Shutdown::Forced),
        "{how:?}"
    );
    assert_eq!(
        power::current_power_state(&session, &vm).await.unwrap(),
        PowerState::PoweredOff
    );
    assert_eq!(
        power::shutdown_guest(&session, &vm, minute).await.unwrap(),
        power::Shutdown::AlreadyOff
    );
}

#[tokio::test]
async fn snapshots_are_created_and_removed() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let session = connect(&vcsim).await;
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into()))
        .await
        .unwrap();
    let minute = Duration::from_secs(60);
    let snap = snapshot::create(&session, &vm, "ferry-test", minute)
        .await
        .unwrap();
    assert_eq!(snap.type_, "VirtualMachineSnapshot");
    assert_eq!(
        inventory::describe_vm(&session, &vm)
            .await
            .unwrap()
            .snapshots,
        1
    );
    snapshot::remove(&session, &snap, minute).await.unwrap();
    assert_eq!(
        inventory::describe_vm(&session, &vm)
            .await
            .unwrap()
            .snapshots,
        0
    );
    snapshot::remove(&session, &snap, minute).await.unwrap();
}

#[tokio::test]
async fn a_wrong_password_is_a_permanent_login_error() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let mut cfg = config(&vcsim, ca_mode(&vcsim));
    cfg.password = "wrong-password".into();
    let e = Session::connect(cfg.clone()).await.unwrap_err();
    assert!(matches!(e, Error::LoginFailed { .. }), "{e}");
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert!(
        e.to_string()
            .contains(&format!("login to {} failed for user ferry", cfg.url)),
        "{e}"
    );
    assert!(!e.to_string().contains("wrong-password"));
}

#[tokio::test]
async fn tls_fails_closed_and_a_pinned_thumbprint_connects() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let right = served_thumbprint(&vcsim);
    Session::connect(config(&vcsim, TlsMode::Thumbprint(right.to_lowercase())))
        .await
        .unwrap();

    let wrong = vec!["AB"; 32].join(":");
    let e = Session::connect(config(&vcsim, TlsMode::Thumbprint(wrong.clone())))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ThumbprintMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains(&wrong) && e.to_string().contains(&right),
        "names both thumbprints: {e}"
    );
    assert_eq!(e.class(), ErrorClass::Permanent);

    // A CA that did not sign the certificate.
    let other = tempfile::tempdir().unwrap();
    let other_ca = ferry_lab::control_plane::pki::Pki::open_or_create(other.path()).unwrap();
    let e = Session::connect(config(
        &vcsim,
        TlsMode::CaBundle(std::fs::read_to_string(other_ca.ca_cert()).unwrap()),
    ))
    .await
    .unwrap_err();
    assert!(matches!(e, Error::Tls { .. }), "{e}");
    assert_eq!(e.class(), ErrorClass::Permanent);

    // Skipping verification works only when asked for, and still reports what it saw.
    let session = Session::connect(config(&vcsim, TlsMode::InsecureSkipVerify))
        .await
        .unwrap();
    assert_eq!(session.presented_thumbprint(), Some(right));
}

#[tokio::test]
async fn a_refused_certificate_means_no_request_is_ever_sent() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let pki = ferry_lab::control_plane::pki::Pki::open_or_create(dir.path()).unwrap();
    let cert = pki.issue_server("decoy").unwrap();
    let server_config = {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
        let chain = vec![CertificateDer::from_pem_file(&cert.cert).unwrap()];
        let key = PrivateKeyDer::from_pem_file(&cert.key).unwrap();
        rustls::ServerConfig::builder_with_provider(ferry_vsphere::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server_config));
        // The client aborts the handshake, so there is never a stream to read a request from.
        match acceptor.accept(tcp).await {
            Err(e) => (0usize, e.to_string()),
            Ok(mut tls) => {
                let mut received = Vec::new();
                let _ = tls.read_to_end(&mut received).await;
                (received.len(), String::from("handshake completed"))
            }
        }
    });
    let cfg = ConnectConfig {
        url: format!("https://127.0.0.1:{port}/sdk"),
        username: "ferry".into(),
        password: "canary-password".into(),
        tls: TlsMode::Thumbprint(vec!["AB"; 32].join(":")),
        timeout: Duration::from_secs(10),
    };
    let e = Session::connect(cfg).await.unwrap_err();
    assert!(matches!(e, Error::ThumbprintMismatch { .. }), "{e}");
    let (bytes, outcome) = server.await.unwrap();
    assert_eq!(bytes, 0, "the server received request bytes ({outcome})");
    assert_ne!(outcome, "handshake completed");
}
