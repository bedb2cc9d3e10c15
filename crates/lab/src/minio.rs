//! MinIO, a real S3-compatible server: the lab's staging store, and a server of its own for staging tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::control_plane::components::Component;
use crate::control_plane::pki::{CertFiles, write_private};
use crate::control_plane::probe::Probe;
use crate::control_plane::process::{self, Lifetime, ProcessRecord, ProcessSpec, free_port};

pub const BUCKET: &str = "ferry-staging";
const ACCESS_KEY: &str = "ferry-staging";

/// How clients reach a staging store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StagingEndpoint {
    /// `https://127.0.0.1:PORT`, or `http://` for a store started without TLS.
    pub endpoint: String,
    pub bucket: String,
    /// Holds `accessKeyId` and `secretKey`, as a mounted Secret would.
    pub credentials_dir: PathBuf,
    /// The CA that signs an `https` endpoint's certificate (the lab's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
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

    /// The PEM bundle a migration's `spec.staging.caBundle` carries; None for plain http.
    pub fn ca_bundle(&self) -> Result<Option<String>> {
        Ok(match &self.ca_file {
            Some(ca) => Some(std::fs::read_to_string(ca)?),
            None => None,
        })
    }

    /// An HTTP client that trusts the store's CA.
    fn http(&self) -> Result<reqwest::Client> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder();
        if let Some(pem) = self.ca_bundle()? {
            for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())? {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(builder.build()?)
    }
}

impl StagingEndpoint {
    fn store(&self) -> Result<object_store::aws::AmazonS3> {
        // HTTP clients take the process's TLS provider, even for plain HTTP.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let read = |key: &str| std::fs::read_to_string(self.credentials_dir.join(key));
        let mut options = object_store::ClientOptions::new();
        if let Some(pem) = self.ca_bundle()? {
            for cert in object_store::Certificate::from_pem_bundle(pem.as_bytes())? {
                options = options.with_root_certificate(cert);
            }
        }
        Ok(object_store::aws::AmazonS3Builder::new()
            .with_client_options(options)
            .with_endpoint(&self.endpoint)
            .with_allow_http(self.endpoint.starts_with("http://"))
            .with_bucket_name(&self.bucket)
            .with_region("us-east-1")
            .with_virtual_hosted_style_request(false)
            .with_access_key_id(read("accessKeyId")?.trim())
            .with_secret_access_key(read("secretKey")?.trim())
            .build()?)
    }

    /// The keys of the objects under `prefix`.
    pub async fn objects(&self, prefix: &str) -> Result<Vec<String>> {
        use futures::TryStreamExt;
        use object_store::ObjectStore;
        let prefix = object_store::path::Path::from(prefix);
        let found: Vec<_> = self.store()?.list(Some(&prefix)).try_collect().await?;
        Ok(found.into_iter().map(|o| o.location.to_string()).collect())
    }

    /// The keys of the multipart uploads under `prefix` neither completed nor aborted. object_store has no
    /// ListMultipartUploads, so this sends it as a presigned GET.
    pub async fn uploads_in_progress(&self, prefix: &str) -> Result<Vec<String>> {
        use object_store::signer::{Method, SignedUrlOptions, Signer};
        let options = SignedUrlOptions::new().with_query([("uploads", ""), ("prefix", prefix)]);
        let url = self
            .store()?
            .signed_url_opts(
                Method::GET,
                &object_store::path::Path::default(),
                Duration::from_secs(60),
                &options,
            )
            .await?;
        let response = self.http()?.get(url).send().await?;
        let response = response.error_for_status()?.text().await?;
        Ok(xml_values(&response, "Key"))
    }

    /// S3 requests of `api` (MinIO's name: `PutObjectPart`, `PutObject`, ...) the server counted since it
    /// started, from its Prometheus metrics. Version 3 of them: version 2's
    /// (`/minio/v2/metrics/cluster`, `minio_s3_requests_total`) are the same counters, but cached for 10 s.
    pub async fn s3_requests(&self, api: &str) -> Result<u64> {
        let url = format!("{}/minio/metrics/v3/api/requests", self.endpoint);
        let text = self.http()?.get(url).send().await?;
        let text = text.error_for_status()?.text().await?;
        Ok(counter(&text, "minio_api_requests_total", "name", api))
    }
}

/// The sum of the samples of `metric` whose label `label` is `value`, in Prometheus' text format. Pure.
fn counter(text: &str, metric: &str, label: &str, value: &str) -> u64 {
    let wanted = format!("{label}=\"{value}\"");
    text.lines()
        .filter_map(|line| line.strip_prefix(metric)?.strip_prefix('{'))
        .filter_map(|rest| rest.split_once('}'))
        .filter(|(labels, _)| labels.split(',').any(|l| l == wanted))
        .filter_map(|(_, sample)| sample.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The text of every `<tag>` element, in order. Enough for S3's flat listings. Pure.
fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(open.as_str())
        .skip(1)
        .filter_map(|rest| rest.split_once(close.as_str()).map(|(v, _)| v.to_string()))
        .collect()
}

/// How MinIO serves https: its certificate and key, and the CA that signs them.
pub struct Tls<'a> {
    pub serving: &'a CertFiles,
    pub ca: &'a Path,
}

/// Prepares `dir` (data with the bucket, fresh credentials) and returns MinIO's process on `port`; with
/// `compress`, MinIO compresses (S2) the staged raw images it stores; with `tls`, it serves https only.
pub fn component(
    dir: &Path,
    tools: &Path,
    host: &str,
    port: u16,
    console: u16,
    compress: bool,
    tls: Option<Tls>,
) -> Result<Component> {
    let data = dir.join("data");
    // A top-level directory of a fresh single-drive MinIO is served as a bucket.
    std::fs::create_dir_all(data.join(BUCKET))?;
    let credentials_dir = dir.join("credentials");
    std::fs::create_dir_all(&credentials_dir)?;
    let secret = match std::fs::read_to_string(credentials_dir.join("secretKey")) {
        Ok(existing) => existing,
        Err(_) => {
            let fresh = crate::vsphere::vcsim::random_hex(20)?;
            write_private(&credentials_dir.join("accessKeyId"), ACCESS_KEY)?;
            write_private(&credentials_dir.join("secretKey"), &fresh)?;
            fresh
        }
    };
    let mut env = vec![
        ("MINIO_ROOT_USER".into(), ACCESS_KEY.into()),
        ("MINIO_ROOT_PASSWORD".into(), secret),
        ("MINIO_PROMETHEUS_AUTH_TYPE".into(), "public".into()),
    ];
    if compress {
        env.push(("MINIO_COMPRESSION_ENABLE".into(), "on".into()));
        env.push(("MINIO_COMPRESSION_EXTENSIONS".into(), ".raw".into()));
    }
    let mut args = vec![
        "server".into(),
        data.display().to_string(),
        format!("--address={host}:{port}"),
        format!("--console-address=127.0.0.1:{console}"),
        "--quiet".into(),
    ];
    let probe = match &tls {
        Some(tls) => {
            // MinIO reads public.crt and private.key from its certs directory.
            let certs = dir.join("certs");
            std::fs::create_dir_all(&certs)?;
            std::fs::copy(&tls.serving.cert, certs.join("public.crt"))?;
            std::fs::copy(&tls.serving.key, certs.join("private.key"))?;
            args.push(format!("--certs-dir={}", certs.display()));
            Probe::HttpsOk {
                url: format!("https://{host}:{port}/minio/health/live"),
                ca: tls.ca.to_path_buf(),
            }
        }
        None => Probe::HttpOk {
            port,
            path: "/minio/health/live".into(),
        },
    };
    Ok(Component {
        spec: ProcessSpec {
            name: "minio".into(),
            program: tools.join("minio"),
            args,
            // MinIO takes its root credentials from the environment only; it is the lab's server, not Ferry.
            // Its Prometheus metrics are open (on loopback), so tests count the requests staging made.
            env,
        },
        ports: vec![port, console],
        probe,
    })
}

/// The store in `dir` on `host:port`: https when `ca` signs its certificate, else plain http.
pub fn endpoint(dir: &Path, host: &str, port: u16, ca: Option<&Path>) -> StagingEndpoint {
    let scheme = if ca.is_some() { "https" } else { "http" };
    StagingEndpoint {
        endpoint: format!("{scheme}://{host}:{port}"),
        bucket: BUCKET.into(),
        credentials_dir: dir.join("credentials"),
        ca_file: ca.map(Path::to_path_buf),
    }
}

const START_ATTEMPTS: usize = 3;

pub struct StandaloneMinio {
    pub process: ProcessRecord,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// Holds `accessKeyId` and `secretKey`, as a mounted Secret would.
    pub credentials_dir: PathBuf,
    dir: PathBuf,
}

impl StandaloneMinio {
    /// Starts MinIO over `dir/data` with the bucket `ferry-staging` already there; on fresh ports again when it
    /// dies on start (a port chosen free was taken before MinIO bound it).
    pub async fn start(dir: &Path, tools: &Path, lifetime: Lifetime) -> Result<Self> {
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let (port, console) = (free_port()?, free_port()?);
            let component = component(dir, tools, crate::LOOPBACK, port, console, false, None)?;
            let log = dir.join("minio.log");
            let record = process::start(&component.spec, &log, lifetime)?;
            if let Err(e) =
                crate::control_plane::probe::wait_ready(&component.probe, &record, dir).await
            {
                let _ = process::stop(&record, Duration::from_secs(5));
                last_error = Some(e);
                continue;
            }
            let endpoint = endpoint(dir, crate::LOOPBACK, port, None);
            return Ok(Self {
                process: record,
                endpoint: endpoint.endpoint,
                credentials_dir: endpoint.credentials_dir,
                dir: dir.to_path_buf(),
            });
        }
        Err(last_error.expect("at least one attempt"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stop(&self) -> Result<()> {
        process::stop(&self.process, Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_sums_its_samples_with_the_label() {
        let text = "# HELP minio_api_requests_total Total number of requests\n\
            # TYPE minio_api_requests_total counter\n\
            minio_api_requests_total{name=\"PutObjectPart\",server=\"127.0.0.1:9000\",type=\"s3\"} 6\n\
            minio_api_requests_total{name=\"PutObject\",server=\"127.0.0.1:9000\",type=\"s3\"} 14\n\
            minio_api_requests_total_other{name=\"PutObjectPart\"} 99\n\
            minio_api_requests_total{name=\"PutObjectPart\",server=\"127.0.0.1:9001\",type=\"s3\"} 1.2e+01\n";
        assert_eq!(
            counter(text, "minio_api_requests_total", "name", "PutObjectPart"),
            18
        );
        assert_eq!(
            counter(text, "minio_api_requests_total", "name", "GetObject"),
            0
        );
    }

    #[test]
    fn xml_values_in_order() {
        let xml = "<ListMultipartUploadsResult><Upload><Key>a/disk-0.raw</Key><UploadId>1</UploadId></Upload>\
            <Upload><Key>a/disk-1.raw</Key></Upload></ListMultipartUploadsResult>";
        assert_eq!(xml_values(xml, "Key"), ["a/disk-0.raw", "a/disk-1.raw"]);
        assert!(xml_values("<Empty/>", "Key").is_empty());
    }
}
