//! vcsim, govmomi's vSphere simulator: in the lab, or alone for vSphere client tests.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::components::Component;
use crate::pki::{CertFiles, Pki, write_private};
use crate::probe::Probe;
use crate::process::{self, Lifetime, ProcessRecord, ProcessSpec};

pub const USER: &str = "ferry";
const PASSWORD_FILE: &str = "vcsim-password";

/// The simulator's SDK endpoint and the credentials it accepts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VcsimEndpoint {
    /// The SDK URL, without credentials.
    pub url: String,
    pub username: String,
    /// The password lives in this file only (mode 0600), never in argv or the environment.
    pub password_file: PathBuf,
    /// The CA that signed the simulator's certificate (empty in labs started before it existed).
    #[serde(default)]
    pub ca_file: PathBuf,
}

impl VcsimEndpoint {
    pub fn port(&self) -> Result<u16> {
        let authority = self.url.split("://").nth(1).unwrap_or(&self.url);
        let host_port = authority.split('/').next().unwrap_or(authority);
        host_port
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .with_context(|| format!("no port in {}", self.url))
    }

    /// A client configuration trusting the lab CA, with the simulator's credentials.
    pub fn connect_config(
        &self,
        timeout: std::time::Duration,
    ) -> Result<ferry_vsphere::ConnectConfig> {
        Ok(ferry_vsphere::ConnectConfig {
            url: self.url.clone(),
            username: self.username.clone(),
            password: self.password()?,
            tls: ferry_vsphere::TlsMode::CaBundle(std::fs::read_to_string(&self.ca_file)?),
            timeout,
        })
    }

    pub fn password(&self) -> Result<String> {
        Ok(std::fs::read_to_string(&self.password_file)?
            .trim()
            .to_string())
    }
}

/// Where vcsim appends the name of every SOAP method it is asked to run (the lab's record of vSphere calls).
pub const CALLS_FILE: &str = "vcsim-calls.log";

/// Creates `DIR/vcsim-password` with a random password, once.
pub fn ensure_password(dir: &Path) -> Result<PathBuf> {
    let path = dir.join(PASSWORD_FILE);
    if !path.exists() {
        write_private(&path, &random_hex(16)?)?;
    }
    Ok(path)
}

/// The vcsim process: a vCenter model, or a standalone ESXi host with `esx`. It serves `cert`.
/// `vms`: VMs per host and per resource pool.
pub fn component(dir: &Path, tools: &Path, cert: &CertFiles, esx: bool, vms: usize) -> Component {
    let mut args = vec![
        "-l=127.0.0.1:0".to_string(),
        format!("-username={USER}"),
        format!("-password-file={}", dir.join(PASSWORD_FILE).display()),
        format!("-tlscert={}", cert.cert.display()),
        format!("-tlskey={}", cert.key.display()),
        format!("-calls-file={}", dir.join(CALLS_FILE).display()),
        format!("-vm={vms}"),
    ];
    if esx {
        args.push("-esx".into());
    }
    Component {
        spec: ProcessSpec {
            name: if esx { "vcsim-esx" } else { "vcsim" }.into(),
            program: tools.join("vcsim"),
            args,
            // Its datastores' files (`govcsim-*`) go in `dir`, so they go with it even when vcsim is killed
            // before it can remove them.
            env: vec![("TMPDIR".into(), dir.display().to_string())],
        },
        // vcsim picks its own port and prints it; the URL is recorded instead.
        ports: vec![],
        probe: Probe::LogLine {
            prefix: "GOVC_URL=".into(),
        },
    }
}

pub fn endpoint(dir: &Path, url: Option<String>) -> Result<VcsimEndpoint> {
    Ok(VcsimEndpoint {
        url: url.context("vcsim printed no URL")?,
        username: USER.to_string(),
        password_file: dir.join(PASSWORD_FILE),
        ca_file: Pki::ca_cert_path(&dir.join("pki")),
    })
}

/// A vcsim of its own in `dir`, outside any lab.
pub struct StandaloneVcsim {
    pub process: ProcessRecord,
    pub endpoint: VcsimEndpoint,
    dir: PathBuf,
}

impl StandaloneVcsim {
    pub async fn start(dir: &Path, tools: &Path, esx: bool, lifetime: Lifetime) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let pki = Pki::open_or_create(&dir.join("pki"))?;
        let cert = pki.issue_server("vcsim")?;
        ensure_password(&dir)?;
        let component = component(&dir, tools, &cert, esx, crate::lab::DEFAULT_VCSIM_VMS);
        let log = dir.join(format!("{}.log", component.spec.name));
        let process = process::start(&component.spec, &log, lifetime)?;
        match crate::probe::wait_ready(&component.probe, &process, &dir).await {
            Ok(ready) => Ok(Self {
                endpoint: endpoint(&dir, ready.url)?,
                process,
                dir,
            }),
            Err(e) => {
                let _ = process::stop(&process, std::time::Duration::from_secs(5));
                Err(e)
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stop(&self) -> Result<()> {
        process::stop(&self.process, std::time::Duration::from_secs(5))
    }
}

pub(crate) fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
