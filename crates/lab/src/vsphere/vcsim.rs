//! vcsim, govmomi's vSphere simulator: in the lab, or alone for vSphere client tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::control_plane::components::Component;
use crate::control_plane::pki::{CertFiles, Pki, write_private};
use crate::control_plane::probe::Probe;
use crate::control_plane::process::{self, Lifetime, ProcessRecord, ProcessSpec};
use crate::vsphere::lab_hands::FolderLock;

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
    pub fn connect_config(&self, timeout: Duration) -> Result<ferry_vsphere::ConnectConfig> {
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

/// The folder `ferry lab up` puts the datacenter in: `dcPath` is then `Folder1/DC0`.
pub const PRODUCTION_DC_FOLDER: &str = "Folder1";

/// Behaviours of a production vCenter that vcsim lacks, each one flag of the lab's launcher (`tools/vcsim`).
/// The default is vcsim as it is: every behaviour off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VcsimRealism {
    /// `/folder` answers 401 unless the request carries a live `vmware_soap_session` cookie (`-folder-auth`).
    pub folder_auth: bool,
    /// Sessions expire after this long without a SOAP call; `/folder` transfers do not refresh them, a body
    /// already streaming is not cut (`-session-idle`).
    pub session_idle: Option<Duration>,
    /// The datacenters move into this root-level folder (`NAME/DC0`), and `/folder` then answers 404 unless
    /// `dcPath` is the full inventory path (`-dc-folder`).
    pub dc_folder: Option<String>,
    /// Bytes per second of each `/folder` download (`-folder-throttle`).
    pub folder_throttle: Option<u64>,
    /// The first download of each file that reaches this offset loses its connection there
    /// (`-folder-cut-at`).
    pub folder_cut_at: Option<u64>,
    /// `/folder` answers a Range request with 200 and the whole file (`-folder-ignore-range`).
    pub folder_ignore_range: bool,
    /// The first N downloads of each file answer 503 "Out of HTTP sessions" (`-folder-503`).
    pub folder_503: u32,
    /// Each SOAP answer is delayed this long (`-soap-delay`).
    pub soap_delay: Option<Duration>,
    /// VMs whose disks Ferry must refuse: `ferry-vsan-vm`, `ferry-vvol-vm`, `ferry-encrypted-vm`,
    /// `ferry-sesparse-vm`, `ferry-multiextent-vm` (`-fixtures`).
    pub fixtures: bool,
    /// Hosts' `summary.config.sslThumbprint` is the served certificate's SHA-1, `AB:CD:...` as vCenter shows
    /// it (`-host-thumbprint`).
    pub host_thumbprint: bool,
    /// ESXi hosts in the datacenter, each with the lab's VMs per host: N-1 standalone and a cluster of one
    /// (`-hosts`). None: vcsim's model, one standalone host and a cluster of three.
    pub hosts: Option<usize>,
    /// Changed Block Tracking: change IDs at stuns, snapshots that freeze the base under a private active
    /// layer, `QueryChangedDiskAreas`, and the lab's guest writes (`-cbt`).
    pub cbt: bool,
    /// Areas per `QueryChangedDiskAreas` answer (`-cbt-max-areas`; the launcher's default is ESXi's 2,000).
    pub cbt_max_areas: Option<u32>,
    /// Bytes of disk one answer covers at most, so windows without changes answer empty pages short of the
    /// end (`-cbt-window`).
    pub cbt_window: Option<u64>,
    /// Which flat files of running VMs `/folder` answers HTTP 500 for (`-folder-lock`).
    pub folder_lock: FolderLock,
}

impl VcsimRealism {
    /// What `ferry lab up` runs: a vCenter as strict as production, and stricter where it costs nothing
    /// (sessions idle out after 5 minutes, where vCenter waits 30), with the disks Ferry must refuse. Transfer
    /// faults (throttle, cuts, ignored Range, 503 bursts, slow SOAP) stay for the tests that switch them on.
    pub fn production_like() -> Self {
        Self {
            folder_auth: true,
            session_idle: Some(Duration::from_secs(300)),
            dc_folder: Some(PRODUCTION_DC_FOLDER.into()),
            fixtures: true,
            host_thumbprint: true,
            ..Self::default()
        }
    }

    /// The launcher's flags for these behaviours (none by default).
    pub fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        let mut flag = |on: bool, name: &str| {
            if on {
                args.push(format!("-{name}"));
            }
        };
        flag(self.folder_auth, "folder-auth");
        flag(self.folder_ignore_range, "folder-ignore-range");
        flag(self.fixtures, "fixtures");
        flag(self.host_thumbprint, "host-thumbprint");
        if let Some(d) = self.session_idle {
            args.push(format!("-session-idle={}", go_duration(d)));
        }
        if let Some(name) = &self.dc_folder {
            args.push(format!("-dc-folder={name}"));
        }
        if let Some(rate) = self.folder_throttle {
            args.push(format!("-folder-throttle={rate}"));
        }
        if let Some(offset) = self.folder_cut_at {
            args.push(format!("-folder-cut-at={offset}"));
        }
        if self.folder_503 > 0 {
            args.push(format!("-folder-503={}", self.folder_503));
        }
        if let Some(d) = self.soap_delay {
            args.push(format!("-soap-delay={}", go_duration(d)));
        }
        if let Some(n) = self.hosts {
            args.push(format!("-hosts={n}"));
        }
        if self.cbt {
            args.push("-cbt".into());
        }
        if let Some(n) = self.cbt_max_areas {
            args.push(format!("-cbt-max-areas={n}"));
        }
        if let Some(bytes) = self.cbt_window {
            args.push(format!("-cbt-window={bytes}"));
        }
        if self.folder_lock != FolderLock::Off {
            args.push(format!("-folder-lock={}", self.folder_lock.flag()));
        }
        args
    }
}

/// A duration as Go's `time.ParseDuration` reads it, exact to the microsecond.
fn go_duration(d: Duration) -> String {
    if d.subsec_micros().is_multiple_of(1000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}us", d.as_micros())
    }
}

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
/// It listens on `host` (loopback, or the real node's bridge, where pods reach it).
pub fn component(
    dir: &Path,
    tools: &Path,
    cert: &CertFiles,
    esx: bool,
    vms: usize,
    host: &str,
) -> Component {
    let mut args = vec![
        format!("-l={host}:0"),
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
        Self::start_with(dir, tools, esx, &VcsimRealism::default(), lifetime).await
    }

    /// Like `start`, with production-like behaviours switched on.
    pub async fn start_with(
        dir: &Path,
        tools: &Path,
        esx: bool,
        realism: &VcsimRealism,
        lifetime: Lifetime,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let pki = Pki::open_or_create(&dir.join("pki"))?;
        let cert = pki.issue_server("vcsim")?;
        ensure_password(&dir)?;
        let mut component = component(
            &dir,
            tools,
            &cert,
            esx,
            crate::lab::DEFAULT_VCSIM_VMS,
            crate::LOOPBACK,
        );
        component.spec.args.extend(realism.args());
        let log = dir.join(format!("{}.log", component.spec.name));
        let process = process::start(&component.spec, &log, lifetime)?;
        match crate::control_plane::probe::wait_ready(&component.probe, &process, &dir).await {
            Ok(ready) => Ok(Self {
                endpoint: endpoint(&dir, ready.url)?,
                process,
                dir,
            }),
            Err(e) => {
                let _ = process::stop(&process, Duration::from_secs(5));
                Err(e)
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn stop(&self) -> Result<()> {
        process::stop(&self.process, Duration::from_secs(5))
    }
}

pub(crate) fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realism_is_off_by_default() {
        assert!(VcsimRealism::default().args().is_empty());
    }

    #[test]
    fn realism_becomes_the_launchers_flags() {
        let realism = VcsimRealism {
            folder_auth: true,
            session_idle: Some(Duration::from_secs(1800)),
            dc_folder: Some("Folder1".into()),
            folder_throttle: Some(1 << 20),
            folder_cut_at: Some(300_000),
            folder_ignore_range: true,
            folder_503: 2,
            soap_delay: Some(Duration::from_micros(2500)),
            fixtures: true,
            host_thumbprint: true,
            hosts: Some(8),
            cbt: true,
            cbt_max_areas: Some(100),
            cbt_window: Some(1 << 24),
            folder_lock: FolderLock::Base,
        };
        assert_eq!(
            realism.args(),
            [
                "-folder-auth",
                "-folder-ignore-range",
                "-fixtures",
                "-host-thumbprint",
                "-session-idle=1800000ms",
                "-dc-folder=Folder1",
                "-folder-throttle=1048576",
                "-folder-cut-at=300000",
                "-folder-503=2",
                "-soap-delay=2500us",
                "-hosts=8",
                "-cbt",
                "-cbt-max-areas=100",
                "-cbt-window=16777216",
                "-folder-lock=base",
            ]
        );
    }
}
