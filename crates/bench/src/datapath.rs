//! `ferry bench datapath`: Ferry's end-to-end disk path against baselines measured in the same run, on the
//! same machine: vcsim's datastore as the source and MinIO as the staging store.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferry_api::DiskFormat;
use ferry_datapath::progress::Progress;
use ferry_datapath::spec::{ConvertSpec, DiskSpec, SourceSpec, SourceTrust, StagingSpec};
use ferry_datapath::staging::Staging;
use ferry_vsphere::Session;
use ferry_vsphere::datastore::{Download, flat_disk};
use ferry_vsphere::inventory::{self, VmSelector};

use ferry_lab::minio::StandaloneMinio;
use ferry_lab::process::Lifetime;
use ferry_lab::vcsim::StandaloneVcsim;

pub struct Measurement {
    pub name: &'static str,
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Measurement {
    pub fn mib_per_s(&self) -> f64 {
        (self.bytes as f64 / (1 << 20) as f64) / self.elapsed.as_secs_f64()
    }
}

pub struct DatapathReport {
    pub size: u64,
    pub format: DiskFormat,
    pub baselines: Vec<Measurement>,
    pub ferry: Measurement,
    pub bytes_read: u64,
}

impl DatapathReport {
    pub fn slowest_baseline(&self) -> &Measurement {
        self.baselines
            .iter()
            .min_by(|a, b| a.mib_per_s().total_cmp(&b.mib_per_s()))
            .expect("baselines")
    }

    pub fn print(&self) {
        let fmt = format!("{:?}", self.format).to_lowercase();
        println!(
            "datapath benchmark: {} MiB disk, target format {fmt}",
            self.size >> 20
        );
        for m in self.baselines.iter().chain(std::iter::once(&self.ferry)) {
            println!(
                "  {:<34} {:>8.1} MiB/s  ({:.2} s)",
                m.name,
                m.mib_per_s(),
                m.elapsed.as_secs_f64()
            );
        }
        let slowest = self.slowest_baseline();
        println!(
            "  ratio ferry / slowest baseline ({}): {:.2}",
            slowest.name,
            self.ferry.mib_per_s() / slowest.mib_per_s()
        );
        println!(
            "  bytes read from source / disk size: {:.3}",
            self.bytes_read as f64 / self.size as f64
        );
    }
}

/// Runs the benchmark in `work` (a scratch directory that is left to the caller to remove).
pub async fn datapath(
    work: &Path,
    tools: &Path,
    size: u64,
    format: DiskFormat,
) -> Result<DatapathReport> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let vcsim = StandaloneVcsim::start(
        &work.join("vcsim"),
        tools,
        false,
        Lifetime::TiedToThisProcess,
    )
    .await?;
    let minio =
        StandaloneMinio::start(&work.join("minio"), tools, Lifetime::TiedToThisProcess).await?;
    let result = run(work, &vcsim, &minio, size, format).await;
    let _ = vcsim.stop();
    let _ = minio.stop();
    result
}

async fn run(
    work: &Path,
    vcsim: &StandaloneVcsim,
    minio: &StandaloneMinio,
    size: u64,
    format: DiskFormat,
) -> Result<DatapathReport> {
    let endpoint = &vcsim.endpoint;
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(600))?).await?;
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into())).await?;
    eprintln!("making a {} MiB source disk...", size >> 20);
    let disk = ferry_lab::disks::make_flat_vmdk(work, "bench", size, 42)?;
    let attached =
        ferry_vsphere::provision::attach_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
            .await?;
    let info = inventory::describe_vm(&session, &vm).await?;
    let staging_spec = StagingSpec {
        url: format!("s3://{}/bench", ferry_lab::minio::BUCKET),
        credentials_dir: Some(minio.credentials_dir.clone()),
        endpoint: Some(minio.endpoint.clone()),
        region: None,
    };

    eprintln!("baseline: download only...");
    let download = timed("download only (GET to nowhere)", size, async {
        let flat = flat_disk(&session, &info.datacenter, &attached.to_string()).await?;
        let mut stream = Download::open(&session, &info.datacenter, &flat.extent, 0).await?;
        while stream.next_chunk().await?.is_some() {}
        anyhow::Ok(())
    })
    .await?;

    eprintln!("baseline: qemu-img convert on a local file...");
    let target = work.join("baseline.out");
    let out_format = if format == DiskFormat::Qcow2 {
        "qcow2"
    } else {
        "raw"
    };
    let convert = timed("qemu-img convert (local file only)", size, async {
        ferry_lab::disks::qemu_img(
            &["convert", "-f", "raw", "-O", out_format, "-W", "-m", "8"],
            &[&disk.extent, &target],
        )
    })
    .await?;
    std::fs::remove_file(&target)?;

    eprintln!("baseline: upload only...");
    let upload = timed(
        "upload only (local file to S3)",
        size,
        upload_file(&staging_spec, &disk.extent),
    )
    .await?;

    eprintln!("ferry convert, end to end...");
    let credentials = work.join("vsphere-credentials");
    std::fs::create_dir_all(&credentials)?;
    std::fs::write(credentials.join("user"), &endpoint.username)?;
    std::fs::write(credentials.join("password"), endpoint.password()?)?;
    let spec = ConvertSpec {
        source: SourceSpec {
            url: endpoint.url.clone(),
            credentials_dir: credentials,
            trust: SourceTrust::CaFile(endpoint.ca_file.clone()),
            datacenter: info.datacenter.clone(),
            vm_uuid: info.instance_uuid.clone().unwrap_or_default(),
        },
        disks: vec![DiskSpec {
            index: 0,
            file: attached.to_string(),
            capacity_bytes: size,
        }],
        format,
        staging: Some(staging_spec),
        volumes: vec![],
        scratch_dir: work.join("scratch"),
        parallel: 1,
        transfer: Default::default(),
    };
    let mut bytes_read = 0;
    let ferry = timed("ferry convert (end to end)", size, async {
        let results = ferry_datapath::convert_all(&spec, &Progress::new(true)).await?;
        let disk0 = &results[0];
        anyhow::ensure!(
            disk0.staged.source_sha256 == disk.sha256,
            "the staged disk does not match the source"
        );
        bytes_read = disk0.bytes_read;
        anyhow::Ok(())
    })
    .await?;
    session.logout().await;
    Ok(DatapathReport {
        size,
        format,
        baselines: vec![download, convert, upload],
        ferry,
        bytes_read,
    })
}

async fn timed(
    name: &'static str,
    bytes: u64,
    work: impl Future<Output = Result<()>>,
) -> Result<Measurement> {
    let start = Instant::now();
    work.await
        .with_context(|| format!("benchmark step {name}"))?;
    Ok(Measurement {
        name,
        bytes,
        elapsed: start.elapsed(),
    })
}

async fn upload_file(spec: &StagingSpec, path: &Path) -> Result<()> {
    let staging = Staging::open(spec)?;
    ferry_datapath::convert::upload_file(&staging, "baseline-upload", path).await?;
    staging.delete("baseline-upload").await?;
    Ok(())
}
