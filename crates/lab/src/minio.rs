//! MinIO, a real S3-compatible server, for staging tests (and later an s3:// staging store in the lab).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use crate::pki::write_private;
use crate::probe::Probe;
use crate::process::{self, Lifetime, ProcessRecord, ProcessSpec, free_port};

pub const BUCKET: &str = "ferry-staging";
const ACCESS_KEY: &str = "ferry-staging";

pub struct StandaloneMinio {
    pub process: ProcessRecord,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// Holds `accessKeyId` and `secretKey`, as a mounted Secret would.
    pub credentials_dir: PathBuf,
    dir: PathBuf,
}

impl StandaloneMinio {
    /// Starts MinIO over `dir/data` with the bucket `ferry-staging` already there.
    pub async fn start(dir: &Path, tools: &Path, lifetime: Lifetime) -> Result<Self> {
        let data = dir.join("data");
        // A top-level directory of a fresh single-drive MinIO is served as a bucket.
        std::fs::create_dir_all(data.join(BUCKET))?;
        let credentials_dir = dir.join("credentials");
        std::fs::create_dir_all(&credentials_dir)?;
        let secret = crate::vcsim::random_hex(20)?;
        write_private(&credentials_dir.join("accessKeyId"), ACCESS_KEY)?;
        write_private(&credentials_dir.join("secretKey"), &secret)?;
        let (port, console) = (free_port()?, free_port()?);
        let spec = ProcessSpec {
            name: "minio".into(),
            program: tools.join("minio"),
            args: vec![
                "server".into(),
                data.display().to_string(),
                format!("--address=127.0.0.1:{port}"),
                format!("--console-address=127.0.0.1:{console}"),
                "--quiet".into(),
            ],
            // MinIO takes its root credentials from the environment only; this is a test server.
            env: vec![
                ("MINIO_ROOT_USER".into(), ACCESS_KEY.into()),
                ("MINIO_ROOT_PASSWORD".into(), secret),
            ],
        };
        let log = dir.join("minio.log");
        let record = process::start(&spec, &log, lifetime)?;
        let probe = Probe::HttpOk {
            port,
            path: "/minio/health/live".into(),
        };
        if let Err(e) = crate::probe::wait_ready(&probe, &record, dir).await {
            let _ = process::stop(&record, Duration::from_secs(5));
            return Err(e);
        }
        Ok(Self {
            process: record,
            endpoint: format!("http://127.0.0.1:{port}"),
            credentials_dir,
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stop(&self) -> Result<()> {
        process::stop(&self.process, Duration::from_secs(10))
    }
}
