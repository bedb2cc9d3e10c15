//! MinIO, a real S3-compatible server: the lab's staging store, and a server of its own for staging tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::components::Component;
use crate::pki::write_private;
use crate::probe::Probe;
use crate::process::{self, Lifetime, ProcessRecord, ProcessSpec, free_port};

pub const BUCKET: &str = "ferry-staging";
const ACCESS_KEY: &str = "ferry-staging";

/// How clients reach a staging store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StagingEndpoint {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub bucket: String,
    /// Holds `accessKeyId` and `secretKey`, as a mounted Secret would.
    pub credentials_dir: PathBuf,
}

impl StagingEndpoint {
    /// `s3://ferry-staging/<prefix>`
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{}", self.bucket, prefix.trim_matches('/'))
    }

    /// The Secret data a migration's `spec.staging.secretRef` names.
    pub fn secret_data(&self) -> Result<std::collections::BTreeMap<String, String>> {
        let mut data = std::collections::BTreeMap::new();
        for key in ["accessKeyId", "secretKey"] {
            data.insert(
                key.to_string(),
                std::fs::read_to_string(self.credentials_dir.join(key))?,
            );
        }
        Ok(data)
    }
}

/// Prepares `dir` (data with the bucket, fresh credentials) and returns MinIO's process on `port`.
pub fn component(dir: &Path, tools: &Path, port: u16, console: u16) -> Result<Component> {
    let data = dir.join("data");
    // A top-level directory of a fresh single-drive MinIO is served as a bucket.
    std::fs::create_dir_all(data.join(BUCKET))?;
    let credentials_dir = dir.join("credentials");
    std::fs::create_dir_all(&credentials_dir)?;
    let secret = match std::fs::read_to_string(credentials_dir.join("secretKey")) {
        Ok(existing) => existing,
        Err(_) => {
            let fresh = crate::vcsim::random_hex(20)?;
            write_private(&credentials_dir.join("accessKeyId"), ACCESS_KEY)?;
            write_private(&credentials_dir.join("secretKey"), &fresh)?;
            fresh
        }
    };
    Ok(Component {
        spec: ProcessSpec {
            name: "minio".into(),
            program: tools.join("minio"),
            args: vec![
                "server".into(),
                data.display().to_string(),
                format!("--address=127.0.0.1:{port}"),
                format!("--console-address=127.0.0.1:{console}"),
                "--quiet".into(),
            ],
            // MinIO takes its root credentials from the environment only; it is the lab's server, not Ferry.
            env: vec![
                ("MINIO_ROOT_USER".into(), ACCESS_KEY.into()),
                ("MINIO_ROOT_PASSWORD".into(), secret),
            ],
        },
        ports: vec![port, console],
        probe: Probe::HttpOk {
            port,
            path: "/minio/health/live".into(),
        },
    })
}

pub fn endpoint(dir: &Path, port: u16) -> StagingEndpoint {
    StagingEndpoint {
        endpoint: format!("http://127.0.0.1:{port}"),
        bucket: BUCKET.into(),
        credentials_dir: dir.join("credentials"),
    }
}

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
        let (port, console) = (free_port()?, free_port()?);
        let component = component(dir, tools, port, console)?;
        let log = dir.join("minio.log");
        let record = process::start(&component.spec, &log, lifetime)?;
        if let Err(e) = crate::probe::wait_ready(&component.probe, &record, dir).await {
            let _ = process::stop(&record, Duration::from_secs(5));
            return Err(e);
        }
        let endpoint = endpoint(dir, port);
        Ok(Self {
            process: record,
            endpoint: endpoint.endpoint,
            credentials_dir: endpoint.credentials_dir,
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
