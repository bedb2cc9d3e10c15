//! Datastore files over HTTPS (`/folder`): a streaming download that resumes with Range requests after a dropped
//! connection, and never reports a short file as complete.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::{StatusCode, Url};

use crate::error::{Error, Result};
use crate::session::Session;
use crate::vmdk::Descriptor;

/// Consecutive failed reconnects before a download gives up.
const RESUME_ATTEMPTS: u32 = 5;

/// `[datastore] dir/file.vmdk`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatastorePath {
    pub datastore: String,
    pub path: String,
}

impl DatastorePath {
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.trim().strip_prefix('[')?;
        let (datastore, path) = rest.split_once(']')?;
        Some(Self {
            datastore: datastore.to_string(),
            path: path.trim().to_string(),
        })
    }

    /// The file `name` in the same directory.
    pub fn sibling(&self, name: &str) -> Self {
        let dir = self
            .path
            .rsplit_once('/')
            .map(|(d, _)| format!("{d}/"))
            .unwrap_or_default();
        Self {
            datastore: self.datastore.clone(),
            path: format!("{dir}{name}"),
        }
    }
}

impl std::fmt::Display for DatastorePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] {}", self.datastore, self.path)
    }
}

/// `https://host/folder/<path>?dcPath=<datacenter>&dsName=<datastore>`
pub fn folder_url(session: &Session, datacenter: &str, file: &DatastorePath) -> Result<Url> {
    let mut url = Url::parse(&session.base_url()).map_err(|e| Error::InvalidResponse {
        method: "folder".into(),
        detail: format!("{}: {e}", session.base_url()),
    })?;
    url.path_segments_mut()
        .map_err(|_| Error::InvalidResponse {
            method: "folder".into(),
            detail: "URL cannot have a path".into(),
        })?
        .push("folder")
        .extend(file.path.split('/'));
    url.query_pairs_mut()
        .append_pair("dcPath", datacenter)
        .append_pair("dsName", &file.datastore);
    Ok(url)
}

/// The raw bytes of a flat disk: which file, and how long it must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatDisk {
    pub descriptor: DatastorePath,
    pub extent: DatastorePath,
    pub size: u64,
}

/// Reads the disk's descriptor and finds its flat extent. Snapshot deltas and sparse disks are refused.
pub async fn flat_disk(session: &Session, datacenter: &str, disk_file: &str) -> Result<FlatDisk> {
    let descriptor = DatastorePath::parse(disk_file).ok_or_else(|| Error::UnsupportedDisk {
        file: disk_file.to_string(),
        reason: "not a datastore path".into(),
    })?;
    let mut download = Download::open(session, datacenter, &descriptor, 0).await?;
    let mut text = Vec::new();
    while let Some(chunk) = download.next_chunk().await? {
        text.extend_from_slice(&chunk);
        if text.len() > 64 * 1024 {
            return Err(Error::UnsupportedDisk {
                file: disk_file.into(),
                reason: "the descriptor is larger than 64 KiB: a monolithic sparse disk?".into(),
            });
        }
    }
    let parsed = Descriptor::parse(&String::from_utf8_lossy(&text))?;
    let extent = parsed.flat_extent(disk_file)?;
    Ok(FlatDisk {
        extent: descriptor.sibling(&extent.file),
        size: extent.sectors * 512,
        descriptor,
    })
}

/// A file being downloaded, chunk by chunk. After a connection drops it asks again from the current offset.
pub struct Download {
    session: Session,
    url: Url,
    name: String,
    offset: u64,
    total: Option<u64>,
    body: Option<BoxStream<'static, reqwest::Result<Bytes>>>,
}

impl Download {
    /// Opens `file`, starting at byte `offset`.
    pub async fn open(
        session: &Session,
        datacenter: &str,
        file: &DatastorePath,
        offset: u64,
    ) -> Result<Self> {
        let mut download = Self {
            session: session.clone(),
            url: folder_url(session, datacenter, file)?,
            name: file.to_string(),
            offset,
            total: None,
            body: None,
        };
        download.connect().await?;
        Ok(download)
    }

    /// Bytes received so far (plus the starting offset).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The file's full length, once the server said it.
    pub fn total(&self) -> Option<u64> {
        self.total
    }

    async fn connect(&mut self) -> Result<()> {
        let mut request = self.session.http().get(self.url.clone());
        if let Some(cookie) = self.session.cookie() {
            request = request.header("Cookie", cookie);
        }
        if self.offset > 0 {
            request = request.header("Range", format!("bytes={}-", self.offset));
        }
        let response = request.send().await.map_err(|e| self.transport(&e))?;
        let status = response.status();
        let expected = if self.offset > 0 {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        };
        if status == StatusCode::NOT_FOUND {
            return Err(Error::UnsupportedDisk {
                file: self.name.clone(),
                reason: "the file does not exist on the datastore".into(),
            });
        }
        if status == StatusCode::RANGE_NOT_SATISFIABLE && Some(self.offset) == self.total {
            self.body = None;
            return Ok(());
        }
        if status != expected {
            return Err(Error::Http {
                url: self.url.to_string(),
                what: format!("GET {}", self.name),
                status: status.as_u16(),
            });
        }
        let total = content_total(&response, self.offset);
        if let (Some(known), Some(now)) = (self.total, total)
            && known != now
        {
            return Err(Error::InvalidResponse {
                method: format!("GET {}", self.name),
                detail: format!(
                    "the file changed size while downloading ({known} then {now} bytes)"
                ),
            });
        }
        self.total = self.total.or(total);
        self.body = Some(response.bytes_stream().boxed());
        Ok(())
    }

    /// The next chunk, or None at the end of the file. Reconnects (Range) when the stream breaks.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        let mut failures = 0;
        loop {
            let complete = self.total.is_some_and(|t| self.offset >= t);
            let broken = match self.body.as_mut() {
                None if complete => return Ok(None),
                None => "not connected".to_string(),
                Some(body) => match body.next().await {
                    Some(Ok(chunk)) => {
                        self.offset += chunk.len() as u64;
                        if self.total.is_some_and(|t| self.offset > t) {
                            return Err(Error::InvalidResponse {
                                method: format!("GET {}", self.name),
                                detail: format!(
                                    "received more than the {} bytes announced",
                                    self.total.unwrap_or(0)
                                ),
                            });
                        }
                        return Ok(Some(chunk));
                    }
                    // Without a known length, the end of the body is the end of the file.
                    None if complete || self.total.is_none() => {
                        self.body = None;
                        return Ok(None);
                    }
                    None => "the connection closed early".to_string(),
                    Some(Err(e)) => e.to_string(),
                },
            };
            failures += 1;
            if failures > RESUME_ATTEMPTS {
                return Err(Error::ShortRead {
                    path: self.name.clone(),
                    got: self.offset,
                    expected: self.total.unwrap_or(0),
                });
            }
            tracing::info!(file = %self.name, offset = self.offset, "download interrupted ({broken}); resuming");
            tokio::time::sleep(Duration::from_millis(200 * u64::from(failures))).await;
            self.body = None;
            if let Err(e) = self.connect().await {
                tracing::info!(file = %self.name, "resume failed: {e}");
            }
        }
    }

    fn transport(&self, e: &reqwest::Error) -> Error {
        if e.is_timeout() {
            Error::Timeout {
                url: self.url.to_string(),
                seconds: 0,
            }
        } else {
            Error::Unreachable {
                url: self.url.to_string(),
                detail: e.to_string(),
            }
        }
    }
}

/// The full length: from `Content-Range: bytes a-b/total`, or `Content-Length` plus the offset.
fn content_total(response: &reqwest::Response, offset: u64) -> Option<u64> {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    if let Some(range) = header("content-range") {
        return range.rsplit('/').next().and_then(|t| t.parse().ok());
    }
    header("content-length")
        .and_then(|l| l.parse::<u64>().ok())
        .map(|l| l + offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datastore_paths() {
        let p = DatastorePath::parse("[LocalDS_0] DC0_H0_VM0/disk1.vmdk").unwrap();
        assert_eq!(
            (p.datastore.as_str(), p.path.as_str()),
            ("LocalDS_0", "DC0_H0_VM0/disk1.vmdk")
        );
        assert_eq!(
            p.sibling("disk1-flat.vmdk").to_string(),
            "[LocalDS_0] DC0_H0_VM0/disk1-flat.vmdk"
        );
        assert!(DatastorePath::parse("no brackets").is_none());
    }
}
