//! `ferry_datapath::convert_all` against vcsim holding a real 512 MiB disk, staging to a directory (`file://`).
//! (Here, not in `ferry-datapath`, so that crate needs no kube even for tests.)

use std::path::{Path, PathBuf};

use ferry_api::{DiskFormat, ErrorClass};
use ferry_datapath::progress::Progress;
use ferry_datapath::spec::{DiskSpec, SourceSpec, SourceTrust, StagingSpec};
use ferry_datapath::{ConvertSpec, convert_all};
use ferry_testkit::disks::{FlatVmdk, make_flat_vmdk, qemu_img, sha256_file, write_pattern};
use ferry_testkit::proxy::CuttingProxy;
use ferry_testkit::{TestMinio, TestVcsim};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{Session, provision};

const DISK_BYTES: u64 = 512 << 20;

struct Fixture {
    vcsim: TestVcsim,
    work: tempfile::TempDir,
    disk: FlatVmdk,
    disk_file: String,
    vm_uuid: String,
    empty_disk_file: String,
}

async fn fixture() -> Fixture {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let config = endpoint
        .connect_config(std::time::Duration::from_secs(120))
        .unwrap();
    let session = Session::connect(config).await.unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into()))
        .await
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let disk = make_flat_vmdk(work.path(), "data", DISK_BYTES, 7);
    let attached = provision::link_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
        .await
        .unwrap();
    let info = inventory::describe_vm(&session, &vm).await.unwrap();
    // vcsim's own disk1 claims 10 GiB but its flat file is empty: a source that must never count as staged.
    let empty_disk_file = info.disks[0].file.clone();
    std::fs::write(work.path().join("user"), &endpoint.username).unwrap();
    std::fs::write(work.path().join("password"), endpoint.password().unwrap()).unwrap();
    Fixture {
        disk_file: attached.to_string(),
        vm_uuid: info.instance_uuid.unwrap(),
        vcsim,
        work,
        disk,
        empty_disk_file,
    }
}

impl Fixture {
    fn staging_dir(&self) -> PathBuf {
        self.work.path().join("staging")
    }

    fn spec(&self, format: DiskFormat, url: Option<String>) -> ConvertSpec {
        ConvertSpec {
            source: SourceSpec {
                url: url.unwrap_or_else(|| self.vcsim.endpoint().url.clone()),
                credentials_dir: self.work.path().to_path_buf(),
                trust: SourceTrust::CaFile(self.vcsim.endpoint().ca_file.clone()),
                datacenter: "DC0".into(),
                vm_uuid: self.vm_uuid.clone(),
                instance_uuid: Some(self.vm_uuid.clone()),
            },
            disks: vec![DiskSpec {
                index: 0,
                file: self.disk_file.clone(),
                capacity_bytes: DISK_BYTES,
            }],
            format,
            staging: Some(StagingSpec {
                url: format!("file://{}", self.staging_dir().display()),
                credentials_dir: None,
                endpoint: None,
                region: None,
                ca_bundle: None,
            }),
            volumes: vec![],
            parallel: 2,
            transfer: Default::default(),
            round: None,
        }
    }
}

fn staged(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

#[tokio::test]
async fn raw_and_qcow2_carry_the_source_bytes_and_a_rerun_reads_nothing() {
    let f = fixture().await;
    let quiet = Progress::new(true);

    let raw = &convert_all(&f.spec(DiskFormat::Raw, None), &quiet)
        .await
        .unwrap()[0];
    assert_eq!(
        (
            raw.staged.source_sha256.as_str(),
            raw.staged.object_sha256.as_deref()
        ),
        (f.disk.sha256.as_str(), Some(f.disk.sha256.as_str()))
    );
    assert_eq!((raw.bytes_read, raw.skipped), (DISK_BYTES, false));
    assert_eq!(
        sha256_file(&staged(&f.staging_dir(), "disk-0.raw")),
        f.disk.sha256
    );

    let again = &convert_all(&f.spec(DiskFormat::Raw, None), &quiet)
        .await
        .unwrap()[0];
    assert_eq!(
        (again.bytes_read, again.skipped),
        (0, true),
        "a rerun must skip the staged disk"
    );
    assert_eq!(
        again.staged.object_sha256.as_deref(),
        Some(f.disk.sha256.as_str())
    );

    let qcow2 = &convert_all(&f.spec(DiskFormat::Qcow2, None), &quiet)
        .await
        .unwrap()[0];
    assert_eq!(qcow2.staged.source_sha256, f.disk.sha256);
    assert_eq!(
        qcow2.bytes_read, DISK_BYTES,
        "bytes read / disk size must be 1"
    );
    let staged_qcow2 = staged(&f.staging_dir(), "disk-0.qcow2");
    assert_eq!(
        std::fs::metadata(&staged_qcow2).unwrap().len(),
        qcow2.staged.object_bytes
    );
    assert_eq!(
        qcow2.staged.object_sha256, None,
        "made as it uploads, header last: no pass reads it in order"
    );
    qemu_img(&["check", "-f", "qcow2"], &[&staged_qcow2]);
    let back = f.work.path().join("back.raw");
    qemu_img(
        &["convert", "-f", "qcow2", "-O", "raw"],
        &[&staged_qcow2, &back],
    );
    assert_eq!(
        sha256_file(&back),
        f.disk.sha256,
        "the qcow2, converted back to raw, holds the source bytes"
    );
    let mut left: Vec<String> = std::fs::read_dir(f.staging_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "disk-0.qcow2",
            "disk-0.qcow2.manifest.json",
            "disk-0.raw",
            "disk-0.raw.manifest.json"
        ],
        "no upload, part or journal left"
    );
}

#[tokio::test]
async fn a_replaced_staged_object_is_detected_and_staged_again() {
    let f = fixture().await;
    let quiet = Progress::new(true);
    convert_all(&f.spec(DiskFormat::Raw, None), &quiet)
        .await
        .unwrap();

    // Corrupt the staged object: same size, other bytes.
    let object = staged(&f.staging_dir(), "disk-0.raw");
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_pattern(&object, DISK_BYTES, 99);
    let store = ferry_datapath::staging::Staging::open(
        f.spec(DiskFormat::Raw, None).staging.as_ref().unwrap(),
    )
    .unwrap();
    let manifest = store.manifest("disk-0.raw").await.unwrap().unwrap();
    assert_ne!(
        Some(store.read_sha256("disk-0.raw").await.unwrap().0),
        manifest.object_sha256,
        "reading back finds it"
    );

    let redone = &convert_all(&f.spec(DiskFormat::Raw, None), &quiet)
        .await
        .unwrap()[0];
    assert_eq!(
        (redone.skipped, redone.bytes_read),
        (false, DISK_BYTES),
        "a changed object must not be trusted"
    );
    assert_eq!(sha256_file(&object), f.disk.sha256);
}

#[tokio::test]
async fn a_connection_cut_halfway_still_ends_byte_exact() {
    let f = fixture().await;
    let proxy = CuttingProxy::start(f.vcsim.endpoint().port().unwrap(), 200 << 20).await;
    let through_proxy = format!("https://127.0.0.1:{}/sdk", proxy.port);
    let result = &convert_all(
        &f.spec(DiskFormat::Raw, Some(through_proxy)),
        &Progress::new(true),
    )
    .await
    .unwrap()[0];
    assert!(proxy.has_cut(), "the proxy never cut the connection");
    assert_eq!(
        result.staged.object_sha256.as_deref(),
        Some(f.disk.sha256.as_str())
    );
    assert_eq!(
        sha256_file(&staged(&f.staging_dir(), "disk-0.raw")),
        f.disk.sha256
    );
}

#[tokio::test]
async fn a_source_other_than_discovery_recorded_is_refused_before_a_byte_is_read() {
    let f = fixture().await;
    let quiet = Progress::new(true);
    let mut replaced = f.spec(DiskFormat::Raw, None);
    replaced.source.instance_uuid = Some("50ff0000-0000-4000-8000-0000000000aa".into());
    let mut detached = f.spec(DiskFormat::Raw, None);
    detached.disks[0].file = "[LocalDS_0] elsewhere/other.vmdk".into();
    for (spec, says) in [
        (
            replaced,
            "no VM has instance UUID 50ff0000-0000-4000-8000-0000000000aa any more",
        ),
        (
            detached,
            "[LocalDS_0] elsewhere/other.vmdk is no longer a disk of VM DC0_H0_VM0",
        ),
    ] {
        let e = convert_all(&spec, &quiet).await.unwrap_err();
        assert_eq!(
            (e.class(), e.reason().as_str()),
            (ErrorClass::Permanent, "SourceIdentityChanged"),
            "{e}"
        );
        assert!(e.to_string().contains(says), "{e}");
        assert!(
            !f.staging_dir().join("disk-0.raw").exists(),
            "nothing may be staged from a source that changed"
        );
    }
}

#[tokio::test]
async fn a_short_source_is_an_error_and_nothing_is_staged() {
    let f = fixture().await;
    let mut spec = f.spec(DiskFormat::Raw, None);
    spec.disks = vec![DiskSpec {
        index: 3,
        file: f.empty_disk_file.clone(),
        capacity_bytes: 10 << 30,
    }];
    let e = convert_all(&spec, &Progress::new(true)).await.unwrap_err();
    assert_eq!(e.class(), ErrorClass::BoundedRetryable, "{e}");
    assert!(
        matches!(e.reason().as_str(), "ShortRead" | "EmptyDisk"),
        "{e}"
    );
    assert!(
        !staged(&f.staging_dir(), "disk-3.raw").exists(),
        "a short copy must never appear under its name"
    );
    assert!(!staged(&f.staging_dir(), "disk-3.raw.manifest.json").exists());
}

#[tokio::test]
async fn staging_to_a_real_s3_server_in_both_formats() {
    let f = fixture().await;
    let minio = TestMinio::start().await.unwrap();
    let quiet = Progress::new(true);
    for format in [DiskFormat::Raw, DiskFormat::Qcow2] {
        let mut spec = f.spec(format, None);
        spec.staging = Some(StagingSpec {
            url: format!("{}/migrations/legacy-1", minio.bucket_url()),
            credentials_dir: Some(minio.credentials_dir().to_path_buf()),
            endpoint: Some(minio.endpoint().to_string()),
            region: None,
            ca_bundle: None,
        });
        let result = &convert_all(&spec, &quiet).await.unwrap()[0];
        assert_eq!(result.staged.source_sha256, f.disk.sha256);
        assert!(
            result
                .staged
                .url
                .starts_with("s3://ferry-staging/migrations/legacy-1/disk-0."),
            "{}",
            result.staged.url
        );

        // Read back through S3: the object and its manifest agree.
        let store = ferry_datapath::staging::Staging::open(spec.staging.as_ref().unwrap()).unwrap();
        let name = ferry_datapath::staging::object_name(spec.disks[0].index, format);
        let (sha, bytes) = store.read_sha256(&name).await.unwrap();
        assert_eq!(bytes, result.staged.object_bytes);
        match format {
            DiskFormat::Raw => assert_eq!(result.staged.object_sha256, Some(sha)),
            DiskFormat::Qcow2 => assert_eq!(result.staged.object_sha256, None),
        }
        let manifest = store
            .manifest(&name)
            .await
            .unwrap()
            .expect("a manifest beside the object");
        assert_eq!(manifest.source_sha256, f.disk.sha256);

        let again = &convert_all(&spec, &quiet).await.unwrap()[0];
        assert_eq!((again.skipped, again.bytes_read), (true, 0));
    }
}
