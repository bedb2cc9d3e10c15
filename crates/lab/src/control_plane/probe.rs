//! Readiness probes: each component counts as started only when it answers as a client would use it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::control_plane::process::ProcessRecord;

/// Cold starts of kube-apiserver on 2 busy cores have been seen to take most of a minute.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(200);

#[derive(Clone, Debug)]
pub enum Probe {
    /// etcd's `GET /health` says `"health":"true"`.
    EtcdHealth { port: u16 },
    /// An HTTPS endpoint of the control plane answers `ok`, verified against the lab CA with the admin identity.
    Https {
        url: String,
        path: String,
        kubeconfig: PathBuf,
    },
    /// A plain HTTP GET on loopback answers 200.
    HttpOk { port: u16, path: String },
    /// An HTTPS GET of `url`, verified against the CA in `ca`, answers 200.
    HttpsOk { url: String, ca: PathBuf },
    /// The process printed a line starting with `prefix`; the rest of the line is its URL.
    LogLine { prefix: String },
    /// A Unix socket at `path` accepts a connection (containerd's gRPC socket).
    UnixSocket { path: PathBuf },
}

/// What a ready component told us.
#[derive(Clone, Debug, Default)]
pub struct Ready {
    pub url: Option<String>,
}

/// Polls `probe` until it passes, the process dies, or the timeout ends.
pub async fn wait_ready(probe: &Probe, process: &ProcessRecord, dir: &Path) -> Result<Ready> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::from("no answer yet");
    loop {
        match check(probe, process).await {
            Ok(Some(ready)) => return Ok(ready),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if !process.is_alive(dir) {
            bail!(
                "{} exited during start-up; last lines of {}:\n{}",
                process.name,
                process.log.display(),
                log_tail(&process.log, 15)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{} not ready after {:?} ({last}); see {}",
                process.name,
                READY_TIMEOUT,
                process.log.display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn check(probe: &Probe, process: &ProcessRecord) -> Result<Option<Ready>> {
    // A port chosen free can be bound by another test's process before ours binds it: its answer is not ours.
    if let Probe::EtcdHealth { port } | Probe::HttpOk { port, .. } = probe
        && !crate::control_plane::process::group_listens_on(process.pid, *port)
    {
        bail!(
            "nothing of {}'s process group listens on port {port} (yet)",
            process.name
        );
    }
    match probe {
        Probe::EtcdHealth { port } => {
            let port = *port;
            let body =
                tokio::task::spawn_blocking(move || http_get_loopback(port, "/health")).await??;
            Ok(body.contains(r#""health":"true""#).then(|| Ready {
                url: Some(format!("http://127.0.0.1:{port}")),
            }))
        }
        Probe::HttpOk { port, path } => {
            let (port, path) = (*port, path.clone());
            let response =
                tokio::task::spawn_blocking(move || http_get_loopback(port, &path)).await??;
            let ok = response
                .lines()
                .next()
                .is_some_and(|status| status.split_whitespace().nth(1) == Some("200"));
            Ok(ok.then(|| Ready {
                url: Some(format!("http://127.0.0.1:{port}")),
            }))
        }
        Probe::Https {
            url,
            path,
            kubeconfig,
        } => {
            let client = client_for(kubeconfig, Some(url)).await?;
            let request = http::Request::get(path.as_str()).body(Vec::new())?;
            let body = client.request_text(request).await?;
            Ok((body.trim() == "ok").then(|| Ready {
                url: Some(url.clone()),
            }))
        }
        Probe::HttpsOk { url, ca } => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let pem = std::fs::read(ca)?;
            let mut client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(5));
            for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
                client = client.add_root_certificate(cert);
            }
            let status = client.build()?.get(url).send().await?.status();
            Ok(status.is_success().then(|| Ready {
                url: Some(url.clone()),
            }))
        }
        Probe::UnixSocket { path } => Ok(std::os::unix::net::UnixStream::connect(path)
            .is_ok()
            .then(|| Ready {
                url: Some(format!("unix://{}", path.display())),
            })),
        Probe::LogLine { prefix } => {
            let log = std::fs::read_to_string(&process.log).unwrap_or_default();
            Ok(log
                .lines()
                .rev()
                .find_map(|line| line.strip_prefix(prefix.as_str()))
                .map(|url| Ready {
                    url: Some(url.trim().to_string()),
                }))
        }
    }
}

/// A client from `kubeconfig`, optionally pointed at another server signed by the same CA.
pub async fn client_for(kubeconfig: &Path, server: Option<&str>) -> Result<kube::Client> {
    Ok(kube::Client::try_from(
        config_for(kubeconfig, server).await?,
    )?)
}

/// A client of `kubeconfig`'s identity that acts as `user` (impersonation), with the extra attributes a bound
/// ServiceAccount token would carry: how the stand-ins act as KubeVirt's and CDI's own ServiceAccounts.
pub async fn client_impersonating(
    kubeconfig: &Path,
    user: &str,
    extra: &[(&str, &str)],
) -> Result<kube::Client> {
    let mut config = config_for(kubeconfig, None).await?;
    config.auth_info.impersonate = Some(user.to_string());
    if !extra.is_empty() {
        config.auth_info.impersonate_user_extra = Some(
            extra
                .iter()
                .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
                .collect(),
        );
    }
    Ok(kube::Client::try_from(config)?)
}

async fn config_for(kubeconfig: &Path, server: Option<&str>) -> Result<kube::Config> {
    let mut config = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    if let Some(server) = server {
        for cluster in &mut config.clusters {
            if let Some(c) = cluster.cluster.as_mut() {
                c.server = Some(server.to_string());
            }
        }
    }
    Ok(kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await?)
}

/// A plain HTTP/1.0 GET to a loopback port; enough for etcd's health endpoint.
fn http_get_loopback(port: u16, path: &str) -> Result<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
