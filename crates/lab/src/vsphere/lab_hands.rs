//! The lab's hands on its vCenter, where vcsim has no guest to ask: its launcher (`tools/vcsim`) takes what a
//! running guest would do to its disk, resets Changed Block Tracking as an administrator (or a storage move)
//! would, and locks disk files as ESXi locks the ones a running VM holds.

use std::time::Duration;

use anyhow::{Result, ensure};
use serde::Deserialize;

use crate::vsphere::vcsim::VcsimEndpoint;

/// An HTTPS client that trusts the lab vCenter's certificate.
pub fn lab_client(endpoint: &VcsimEndpoint) -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(120));
    for cert in reqwest::Certificate::from_pem_bundle(&std::fs::read(&endpoint.ca_file)?)? {
        client = client.add_root_certificate(cert);
    }
    Ok(client.build()?)
}

/// A disk as its guest sees it now (`GET /ferry-lab/disk`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GuestDisk {
    pub key: i32,
    pub capacity: u64,
    /// Of the whole disk, what a copy of it must hash to.
    pub sha256: String,
    /// "" while tracking is off or waiting for a stun.
    pub change_id: String,
    /// Whether the VM runs on a snapshot's delta over a frozen base.
    pub snapshot: bool,
}

/// Which flat files of running VMs `/folder` refuses with HTTP 500.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FolderLock {
    #[default]
    Off,
    /// The ones a running VM writes to (no snapshot over them).
    Running,
    /// Also the frozen base under a running VM's snapshot.
    Base,
}

impl FolderLock {
    pub fn flag(self) -> &'static str {
        match self {
            FolderLock::Off => "off",
            FolderLock::Running => "running",
            FolderLock::Base => "base",
        }
    }
}

/// The launcher's guest and administrator endpoints (they need `-cbt`, except the lock).
pub struct LabHands {
    client: reqwest::Client,
    base: String,
}

impl LabHands {
    pub fn new(endpoint: &VcsimEndpoint) -> Result<Self> {
        Ok(Self {
            client: lab_client(endpoint)?,
            base: endpoint.url.trim_end_matches("/sdk").to_string(),
        })
    }

    fn url(&self, path: &str, vm: &str, disk: Option<i32>) -> Result<String> {
        ensure!(
            vm.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{vm} would need escaping in a URL"
        );
        let disk = disk.map(|k| format!("&disk={k}")).unwrap_or_default();
        Ok(format!("{}{path}?vm={vm}{disk}", self.base))
    }

    /// The guest of the running `vm` writes `data` at `offset` of its disk `disk` (None: the first).
    pub async fn write(
        &self,
        vm: &str,
        disk: Option<i32>,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<()> {
        let url = format!("{}&offset={offset}", self.url("/ferry-lab/disk", vm, disk)?);
        let response = self.client.put(url).body(data).send().await?;
        let status = response.status();
        ensure!(
            status.is_success(),
            "the guest of {vm} could not write at {offset}: {status} {}",
            response.text().await.unwrap_or_default()
        );
        Ok(())
    }

    /// The disk as the guest sees it, hashed whole.
    pub async fn disk(&self, vm: &str, disk: Option<i32>) -> Result<GuestDisk> {
        let response = self
            .client
            .get(self.url("/ferry-lab/disk", vm, disk)?)
            .send()
            .await?;
        let status = response.status();
        ensure!(
            status.is_success(),
            "{vm}'s disk: {status} {}",
            response.text().await.unwrap_or_default()
        );
        Ok(serde_json::from_slice(&response.bytes().await?)?)
    }

    /// Restarts `vm`'s change tracking: every change ID handed out before is invalid.
    pub async fn reset_change_tracking(&self, vm: &str) -> Result<()> {
        let response = self
            .client
            .post(self.url("/ferry-lab/cbt-reset", vm, None)?)
            .send()
            .await?;
        ensure!(
            response.status().is_success(),
            "resetting {vm}'s change tracking: {}",
            response.status()
        );
        Ok(())
    }

    pub async fn lock_files(&self, lock: FolderLock) -> Result<()> {
        let url = format!("{}/ferry-lab/folder-lock?mode={}", self.base, lock.flag());
        let response = self.client.put(url).send().await?;
        ensure!(
            response.status().is_success(),
            "setting the folder lock: {}",
            response.status()
        );
        Ok(())
    }
}
