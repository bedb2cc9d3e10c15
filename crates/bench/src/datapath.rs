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

use ferry_lab::control_plane::process::Lifetime;
use ferry_lab::minio::StandaloneMinio;
use ferry_lab::vsphere::vcsim::StandaloneVcsim;

pub struct Measurement {
    pub name: &'static str,
    pub bytes: u64,
    /// One elapsed time per round.
    pub rounds: Vec<Duration>,
}

impl Measurement {
    fn new(name: &'static str, bytes: u64) -> Self {
        Self {
            name,
            bytes,
            rounds: Vec::new(),
        }
    }

    pub fn median(&self) -> Duration {
        median(self.rounds.clone())
    }

    pub fn mib_per_s(&self) -> f64 {
        (self.bytes as f64 / (1 << 20) as f64) / self.median().as_secs_f64()
    }
}

fn median<T: PartialOrd + Copy>(mut values: Vec<T>) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
    values[values.len() / 2]
}

pub struct DatapathReport {
    pub size: u64,
    pub format: DiskFormat,
    pub baselines: Vec<Measurement>,
    pub ferry: Measurement,
    pub bytes_read: u64,
}

impl DatapathReport {
    /// Per round, Ferry's speed over the slowest baseline's in that round (the same bytes, so the ratio of
    /// their times): pairing within a round keeps a machine that slows down between rounds out of the ratio.
    pub fn ratios(&self) -> Vec<f64> {
        (0..self.ferry.rounds.len())
            .map(|round| {
                let slowest = self
                    .baselines
                    .iter()
                    .map(|b| b.rounds[round])
                    .max()
                    .expect("baselines");
                slowest.as_secs_f64() / self.ferry.rounds[round].as_secs_f64()
            })
            .collect()
    }

    pub fn slowest_baseline(&self) -> &Measurement {
        self.baselines
            .iter()
            .min_by(|a, b| a.mib_per_s().total_cmp(&b.mib_per_s()))
            .expect("baselines")
    }

    pub fn print(&self) {
        let fmt = format!("{:?}", self.format).to_lowercase();
        println!(
            "datapath benchmark: {} MiB disk, target format {fmt}, {} rounds (medians; min-max)",
            self.size >> 20,
            self.ferry.rounds.len()
        );
        for m in self.baselines.iter().chain(std::iter::once(&self.ferry)) {
            let secs = |d: &Duration| d.as_secs_f64();
            println!(
                "  {:<34} {:>8.1} MiB/s  ({:.2} s; {:.2}-{:.2})",
                m.name,
                m.mib_per_s(),
                m.median().as_secs_f64(),
                m.rounds.iter().map(secs).fold(f64::MAX, f64::min),
                m.rounds.iter().map(secs).fold(0.0, f64::max),
            );
        }
        let ratios = self.ratios();
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "  ratio ferry / slowest baseline, per round: {}; median {:.2} (slowest by median: {})",
            each.join(" "),
            median(ratios.clone()),
            self.slowest_baseline().name
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
    rounds: usize,
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
    let result = run(work, &vcsim, &minio, size, format, rounds).await;
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
    rounds: usize,
) -> Result<DatapathReport> {
    let endpoint = &vcsim.endpoint;
    let session = Session::connect(endpoint.connect_config(Duration::from_secs(600))?).await?;
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into())).await?;
    eprintln!("making a {} MiB source disk...", size >> 20);
    let disk = ferry_lab::disks::make_flat_vmdk(work, "bench", size, 42)?;
    let attached =
        ferry_vsphere::provision::link_flat_vmdk(&session, &vm, &disk.descriptor, &disk.extent)
            .await?;
    let info = inventory::describe_vm(&session, &vm).await?;
    let staging_spec = StagingSpec {
        url: format!("s3://{}/bench", ferry_lab::minio::BUCKET),
        credentials_dir: Some(minio.credentials_dir.clone()),
        endpoint: Some(minio.endpoint.clone()),
        region: None,
        ca_bundle: None,
    };

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
            instance_uuid: None,
        },
        disks: vec![DiskSpec {
            index: 0,
            file: attached.to_string(),
            capacity_bytes: size,
        }],
        format,
        staging: Some(staging_spec.clone()),
        volumes: vec![],
        parallel: 1,
        transfer: Default::default(),
        round: None,
    };
    let staged_name = ferry_datapath::staging::object_name(0, format);
    let out_format = if format == DiskFormat::Qcow2 {
        "qcow2"
    } else {
        "raw"
    };

    let mut download = Measurement::new("download only (GET to nowhere)", size);
    let mut convert = Measurement::new("qemu-img convert (local file only)", size);
    let mut upload = Measurement::new("upload only (local file to S3)", size);
    let mut ferry = Measurement::new("ferry convert (end to end)", size);
    let mut bytes_read = 0;
    for round in 1..=rounds {
        eprintln!("round {round} of {rounds}: download only...");
        timed(&mut download, async {
            let flat = flat_disk(&session, &info.datacenter, &attached.to_string()).await?;
            let mut stream = Download::open(&session, &info.datacenter, &flat.extent, 0).await?;
            while stream.next_chunk().await?.is_some() {}
            anyhow::Ok(())
        })
        .await?;

        eprintln!("round {round} of {rounds}: qemu-img convert on a local file...");
        let target = work.join("baseline.out");
        timed(&mut convert, async {
            ferry_lab::disks::qemu_img(
                &["convert", "-f", "raw", "-O", out_format, "-W", "-m", "8"],
                &[&disk.extent, &target],
            )
        })
        .await?;
        std::fs::remove_file(&target)?;

        eprintln!("round {round} of {rounds}: upload only...");
        timed(&mut upload, upload_file(&staging_spec, &disk.extent)).await?;

        eprintln!("round {round} of {rounds}: ferry convert, end to end...");
        timed(&mut ferry, async {
            let results = ferry_datapath::convert_all(&spec, &Progress::new(true)).await?;
            let disk0 = &results[0];
            anyhow::ensure!(
                disk0.staged.source_sha256 == disk.sha256 && !disk0.skipped,
                "the staged disk does not match the source"
            );
            bytes_read = disk0.bytes_read;
            anyhow::Ok(())
        })
        .await?;
        // The next round stages it again rather than finding it staged.
        Staging::open(&staging_spec)?.delete(&staged_name).await?;
    }
    session.logout().await;
    Ok(DatapathReport {
        size,
        format,
        baselines: vec![download, convert, upload],
        ferry,
        bytes_read,
    })
}

async fn timed(into: &mut Measurement, work: impl Future<Output = Result<()>>) -> Result<()> {
    let start = Instant::now();
    work.await
        .with_context(|| format!("benchmark step {}", into.name))?;
    into.rounds.push(start.elapsed());
    Ok(())
}

async fn upload_file(spec: &StagingSpec, path: &Path) -> Result<()> {
    let staging = Staging::open(spec)?;
    ferry_datapath::convert::upload_file(&staging, "baseline-upload", path).await?;
    staging.delete("baseline-upload").await?;
    Ok(())
}
