//! Datastore files over HTTPS (`/folder`): a streaming download that resumes with Range requests after a dropped
//! connection, and never reports a short file as complete.

use bytes::Bytes;
use ferry_types::ErrorClass;
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::{StatusCode, Url};

use crate::error::{Error, Result};
use crate::session::Session;
use crate::transfer::{parse_content_range, skip_prefix};

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

/// `https://host/folder/<path>?dcPath=<datacenter>&dsName=<datastore>`. `datacenter` is the datacenter's
/// inventory path (`Folder/DC0`): names are form-encoded as govmomi's `url.Values` does, so `/` becomes `%2F`.
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

/// Reads the disk's descriptor and finds its flat extent; disks that are not one raw file are refused
/// ([`Descriptor::refusal`], as preflight refuses them).
pub async fn flat_disk(session: &Session, datacenter: &str, disk_file: &str) -> Result<FlatDisk> {
    let descriptor = crate::preflight::datastore_path(disk_file)?;
    let parsed = crate::preflight::read_descriptor(session, datacenter, &descriptor).await?;
    let extent = parsed.flat_extent(disk_file)?;
    Ok(FlatDisk {
        extent: descriptor.sibling(&extent.file),
        size: extent.sectors * 512,
        descriptor,
    })
}

/// A file being downloaded, chunk by chunk. A dropped or idle connection, a 5xx or a refused cookie does not end
/// it: it asks again from the current offset, after the session's [`Backoff`](crate::transfer::Backoff) steps
/// (started over by progress), logging in again once when the cookie is refused.
pub struct Download {
    session: Session,
    url: Url,
    name: String,
    offset: u64,
    total: Option<u64>,
    /// Where a bounded download stops (exclusive): it asks `bytes=offset-(end-1)`.
    end: Option<u64>,
    body: Option<BoxStream<'static, reqwest::Result<Bytes>>>,
    /// Attempts in a row without a new byte.
    failures: u32,
    /// Bytes still to drop from the body: the server ignored `Range` and sends the file from its start.
    skip: u64,
    range_ignored_logged: bool,
}

/// Why a request did not give a body to read.
enum Refused {
    /// Worth asking again after a while: a dropped connection, a timeout, a 5xx or 429.
    Retry(Error),
    /// Asking again cannot help.
    Fatal(Error),
}

impl Download {
    /// Opens `file`, starting at byte `offset`.
    pub async fn open(
        session: &Session,
        datacenter: &str,
        file: &DatastorePath,
        offset: u64,
    ) -> Result<Self> {
        Self::open_bounded(session, datacenter, file, offset, None).await
    }

    /// Opens bytes `start..end` of `file`: the download ends at `end` (a warm migration's changed area).
    pub async fn open_range(
        session: &Session,
        datacenter: &str,
        file: &DatastorePath,
        range: std::ops::Range<u64>,
    ) -> Result<Self> {
        Self::open_bounded(session, datacenter, file, range.start, Some(range.end)).await
    }

    async fn open_bounded(
        session: &Session,
        datacenter: &str,
        file: &DatastorePath,
        offset: u64,
        end: Option<u64>,
    ) -> Result<Self> {
        let mut download = Self {
            session: session.clone(),
            url: folder_url(session, datacenter, file)?,
            name: file.to_string(),
            offset,
            total: None,
            end,
            body: None,
            failures: 0,
            skip: 0,
            range_ignored_logged: false,
        };
        match download.connect().await {
            Ok(()) => {}
            Err(Refused::Fatal(e)) => return Err(e),
            Err(Refused::Retry(e)) => download.reconnect(e, false).await?,
        }
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

    /// One GET from the current offset, logging in again once if the cookie is refused.
    async fn connect(&mut self) -> Result<(), Refused> {
        let (response, cookie) = self.get().await?;
        let response = match response.status() {
            refused @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                drop(response);
                // The session expired (vCenter ends idle ones after about 30 minutes), or vpxd restarted.
                tracing::info!(file = %self.name, status = refused.as_u16(), "the datastore refused the session; logging in again");
                self.session
                    .relogin_unless_renewed(cookie.as_deref())
                    .await
                    .map_err(|e| match e.class() {
                        ErrorClass::Permanent => Refused::Fatal(e),
                        _ => Refused::Retry(e),
                    })?;
                let (again, _) = self.get().await?;
                if matches!(
                    again.status(),
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                ) {
                    return Err(Refused::Fatal(Error::DatastoreAccessDenied {
                        url: self.url.to_string(),
                        what: format!("GET {}", self.name),
                        status: again.status().as_u16(),
                    }));
                }
                again
            }
            _ => response,
        };
        self.accept(response)
    }

    /// Sends the GET; returns the response and the cookie it carried. The future borrows nothing from the
    /// download (whose body stream is not `Sync`), so callers' futures stay `Send`.
    fn get(
        &self,
    ) -> impl Future<Output = Result<(reqwest::Response, Option<String>), Refused>> + Send + 'static
    {
        let cookie = self.session.cookie();
        let mut request = self.session.http().get(self.url.clone());
        if let Some(cookie) = &cookie {
            request = request.header("Cookie", cookie);
        }
        match self.end {
            Some(end) => {
                let last = end.saturating_sub(1);
                request = request.header("Range", format!("bytes={}-{last}", self.offset));
            }
            None if self.offset > 0 => {
                request = request.header("Range", format!("bytes={}-", self.offset));
            }
            None => {}
        }
        let broken = self.transport();
        async move {
            let response = request
                .send()
                .await
                .map_err(|e| Refused::Retry(broken(&e)))?;
            Ok((response, cookie))
        }
    }

    /// Takes the body of an answer, or says why not.
    fn accept(&mut self, response: reqwest::Response) -> Result<(), Refused> {
        let status = response.status();
        let http_error = Error::Http {
            url: self.url.to_string(),
            what: format!("GET {}", self.name),
            status: status.as_u16(),
        };
        if status == StatusCode::NOT_FOUND {
            return Err(Refused::Fatal(Error::UnsupportedDisk {
                file: self.name.clone(),
                reason: "the file does not exist on the datastore".into(),
            }));
        }
        if status == StatusCode::RANGE_NOT_SATISFIABLE && Some(self.offset) == self.total {
            self.body = None;
            return Ok(());
        }
        // vCenter answers 503 when out of HTTP sessions; a proxy or a restarting vpxd gives other 5xx.
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            return Err(Refused::Retry(http_error));
        }
        let from = match status {
            StatusCode::OK => 0,
            StatusCode::PARTIAL_CONTENT if self.offset > 0 || self.end.is_some() => {
                header(&response, "content-range")
                    .and_then(|r| parse_content_range(&r))
                    .map(|(start, _)| start)
                    .ok_or_else(|| {
                        Refused::Fatal(Error::InvalidResponse {
                            method: format!("GET {}", self.name),
                            detail: "a partial answer without a Content-Range".into(),
                        })
                    })?
            }
            _ => return Err(Refused::Fatal(http_error)),
        };
        if from > self.offset {
            return Err(Refused::Fatal(Error::InvalidResponse {
                method: format!("GET {}", self.name),
                detail: format!("asked for bytes from {}, got from {from}", self.offset),
            }));
        }
        // A 200 to a Range request is the whole file again (govmomi accepts it too): drop what we have.
        if from < self.offset && !self.range_ignored_logged {
            self.range_ignored_logged = true;
            tracing::warn!(file = %self.name, offset = self.offset, "the server ignored Range; reading past the bytes already received");
        }
        let total = content_total(&response, from);
        if let (Some(known), Some(now)) = (self.total, total)
            && known != now
        {
            return Err(Refused::Fatal(Error::InvalidResponse {
                method: format!("GET {}", self.name),
                detail: format!(
                    "the file changed size while downloading ({known} then {now} bytes)"
                ),
            }));
        }
        self.total = self.total.or(total);
        self.skip = self.offset - from;
        self.body = Some(response.bytes_stream().boxed());
        Ok(())
    }

    /// The next chunk, or None at the end of the file (of the range, when bounded). Reconnects (Range) when
    /// the stream breaks.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        if let Some(end) = self.end
            && self.offset >= end
        {
            self.body = None;
            return Ok(None);
        }
        let chunk = self.next_of_file().await?;
        Ok(match (chunk, self.end) {
            // A server that ignored the bound (or sent more) stops being read at the range's end.
            (Some(chunk), Some(end)) if self.offset > end => {
                let extra = (self.offset - end) as usize;
                self.offset = end;
                self.body = None;
                Some(chunk.slice(..chunk.len() - extra))
            }
            (chunk, _) => chunk,
        })
    }

    async fn next_of_file(&mut self) -> Result<Option<Bytes>> {
        loop {
            let complete = self.total.is_some_and(|t| self.offset >= t);
            let broken = match self.body.as_mut() {
                None if complete => return Ok(None),
                None => "not connected".to_string(),
                Some(body) => match body.next().await {
                    Some(Ok(chunk)) => {
                        let wanted = chunk.slice(skip_prefix(&chunk, &mut self.skip));
                        if wanted.is_empty() {
                            continue;
                        }
                        self.offset += wanted.len() as u64;
                        if self.total.is_some_and(|t| self.offset > t) {
                            return Err(Error::InvalidResponse {
                                method: format!("GET {}", self.name),
                                detail: format!(
                                    "received more than the {} bytes announced",
                                    self.total.unwrap_or(0)
                                ),
                            });
                        }
                        self.failures = 0;
                        return Ok(Some(wanted));
                    }
                    // Without a known length, the end of the body is the end of the file.
                    None if complete || self.total.is_none() => {
                        self.body = None;
                        return Ok(None);
                    }
                    None => "the connection closed early".to_string(),
                    Some(Err(e)) if e.is_timeout() => format!(
                        "no data for {}s",
                        self.session.transfer().idle_timeout.as_secs_f64()
                    ),
                    Some(Err(e)) => e.to_string(),
                },
            };
            self.body = None;
            let short = Error::ShortRead {
                path: format!("{} ({broken})", self.name),
                got: self.offset,
                expected: self.total.unwrap_or(0),
            };
            self.reconnect(short, true).await?;
        }
    }

    /// Asks again after the backoff steps until a body comes, the attempts are spent (`last` is returned) or
    /// the answer says asking again cannot help.
    async fn reconnect(&mut self, mut last: Error, interrupted: bool) -> Result<()> {
        self.body = None;
        loop {
            self.failures += 1;
            let Some(delay) = self.session.transfer().backoff.delay(self.failures) else {
                tracing::warn!(file = %self.name, offset = self.offset, attempts = self.failures - 1, "giving up: {last}");
                return Err(last);
            };
            let what = if interrupted {
                "download interrupted"
            } else {
                "download refused"
            };
            tracing::info!(file = %self.name, offset = self.offset, attempt = self.failures, "{what} ({last}); asking again in {delay:?}");
            tokio::time::sleep(delay).await;
            match self.connect().await {
                Ok(()) => return Ok(()),
                Err(Refused::Fatal(e)) => return Err(e),
                Err(Refused::Retry(e)) => last = e,
            }
        }
    }

    /// How a failed request reads as an error, without borrowing the download.
    fn transport(&self) -> impl Fn(&reqwest::Error) -> Error + Send + 'static {
        let url = self.url.to_string();
        let idle = self.session.transfer().idle_timeout.as_secs();
        move |e| {
            if e.is_timeout() {
                Error::Timeout {
                    url: url.clone(),
                    seconds: idle,
                }
            } else {
                Error::Unreachable {
                    url: url.clone(),
                    detail: e.to_string(),
                }
            }
        }
    }
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

/// The full length: from `Content-Range: bytes a-b/total`, or `Content-Length` plus where the body starts.
fn content_total(response: &reqwest::Response, from: u64) -> Option<u64> {
    if let Some(range) = header(response, "content-range") {
        return parse_content_range(&range).and_then(|(_, total)| total);
    }
    header(response, "content-length")
        .and_then(|l| l.parse::<u64>().ok())
        .map(|l| l + from)
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
