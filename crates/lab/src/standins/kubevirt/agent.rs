//! A client of the QEMU guest agent (qemu-ga) over its channel's unix socket, as libvirt talks to it for
//! virt-launcher: resynchronise with `guest-sync-delimited`, then one JSON command per line. Every read has a
//! deadline, so a guest without an agent costs a poll its timeout and nothing more.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// The byte that resets qemu-ga's parser and precedes `guest-sync-delimited`'s answer.
const DELIMITER: u8 = 0xFF;

/// `guest-get-osinfo`'s answer (qemu-ga's names).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestOsInfo {
    pub id: Option<String>,
    pub name: Option<String>,
    pub pretty_name: Option<String>,
    pub version: Option<String>,
    pub version_id: Option<String>,
    pub kernel_release: Option<String>,
    pub kernel_version: Option<String>,
    pub machine: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestIpAddress {
    pub ip_address_type: String,
    pub ip_address: String,
    pub prefix: u8,
}

/// One entry of `guest-network-get-interfaces`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestInterface {
    pub name: String,
    #[serde(default)]
    pub hardware_address: Option<String>,
    #[serde(default)]
    pub ip_addresses: Vec<GuestIpAddress>,
}

/// What one poll learned from an agent that answered.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentReport {
    pub os: GuestOsInfo,
    pub interfaces: Vec<GuestInterface>,
}

/// A synchronised connection to one agent.
pub struct Agent {
    stream: BufReader<UnixStream>,
    timeout: Duration,
}

pub(super) fn random_id() -> u64 {
    let mut bytes = [0u8; 8];
    // The id only has to differ from answers to earlier, abandoned requests still queued in the channel.
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = (nanos as u64).to_le_bytes();
    }
    // qemu-ga answers with a JSON number: keep it exact in a double.
    u64::from_le_bytes(bytes) >> 12
}

impl Agent {
    /// Connects and synchronises: a reset byte, then `guest-sync-delimited` with a random id, skipping
    /// whatever the channel still held until the answer carrying that id.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self> {
        let stream = tokio::time::timeout(timeout, UnixStream::connect(socket))
            .await
            .map_err(|_| anyhow!("connecting to {} timed out", socket.display()))?
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let mut agent = Self {
            stream: BufReader::new(stream),
            timeout,
        };
        let id = random_id();
        let mut request = vec![DELIMITER];
        request.extend(serde_json::to_vec(
            &json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}),
        )?);
        request.push(b'\n');
        agent.send(&request).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let line = agent.line_until(deadline).await?;
            // Only the delimited answer counts: earlier lines may answer someone else's requests.
            let Some(start) = line.iter().rposition(|b| *b == DELIMITER) else {
                continue;
            };
            let answer: Value = match serde_json::from_slice(&line[start + 1..]) {
                Ok(v) => v,
                Err(_) => continue,
            };
            if answer["return"].as_u64() == Some(id) {
                return Ok(agent);
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        tokio::time::timeout(self.timeout, self.stream.get_mut().write_all(bytes))
            .await
            .map_err(|_| anyhow!("writing to the guest agent timed out"))??;
        Ok(())
    }

    async fn line_until(&mut self, deadline: tokio::time::Instant) -> Result<Vec<u8>> {
        let mut line = vec![];
        let read = tokio::time::timeout_at(deadline, self.stream.read_until(b'\n', &mut line))
            .await
            .map_err(|_| anyhow!("the guest agent did not answer in time"))??;
        if read == 0 {
            bail!("the guest agent's channel closed");
        }
        Ok(line)
    }

    /// Runs `command` and returns its `return` value, or the agent's error.
    pub async fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let mut request = json!({"execute": command});
        if let Some(arguments) = arguments {
            request["arguments"] = arguments;
        }
        let mut bytes = serde_json::to_vec(&request)?;
        bytes.push(b'\n');
        self.send(&bytes).await?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let line = self.line_until(deadline).await?;
            let text = line.strip_prefix(&[DELIMITER]).unwrap_or(&line);
            let Ok(answer) = serde_json::from_slice::<Value>(text) else {
                continue;
            };
            if let Some(error) = answer.get("error") {
                bail!("{command}: {}", error["desc"].as_str().unwrap_or("error"));
            }
            if let Some(value) = answer.get("return") {
                return Ok(value.clone());
            }
        }
    }

    pub async fn ping(&mut self) -> Result<()> {
        self.execute("guest-ping", None).await.map(|_| ())
    }

    pub async fn os_info(&mut self) -> Result<GuestOsInfo> {
        Ok(serde_json::from_value(
            self.execute("guest-get-osinfo", None).await?,
        )?)
    }

    pub async fn network_interfaces(&mut self) -> Result<Vec<GuestInterface>> {
        Ok(serde_json::from_value(
            self.execute("guest-network-get-interfaces", None).await?,
        )?)
    }
}

/// One poll as virt-launcher's: connected means the agent synchronised and answered `guest-ping`; the OS and
/// interfaces come along when it answers those too (an agent may block commands).
pub async fn poll(socket: &Path, timeout: Duration) -> Option<AgentReport> {
    let mut agent = Agent::connect(socket, timeout).await.ok()?;
    agent.ping().await.ok()?;
    let os = agent.os_info().await.unwrap_or_default();
    let interfaces = agent.network_interfaces().await.unwrap_or_default();
    Some(AgentReport { os, interfaces })
}
