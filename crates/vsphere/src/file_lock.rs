//! Whether a datastore file can be read now, or a running VM holds it. vCenter's `/folder` answers HTTP 500 for
//! the flat file of a disk a running VM writes to (reported on vCenter 8.0.3; a snapshot's frozen base is then
//! readable), which [`Download`](crate::datastore::Download) would retry as a passing fault for minutes.
//! A short probe tells the two apart before a copy relies on the file.

use std::time::Duration;

use reqwest::StatusCode;

use crate::datastore::{DatastorePath, folder_url};
use crate::error::{Error, Result};
use crate::session::Session;

/// What a probe of a file found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readability {
    Readable,
    /// Every attempt answered a server error: a running VM holds the file (or the host cannot serve it).
    Locked {
        status: u16,
        detail: String,
    },
}

/// Asks for the file's first byte up to `attempts` times, `pause` apart while the answer is a server error.
/// A refused session is logged in again once; a missing file or a refusal is an error.
pub async fn probe_read(
    session: &Session,
    datacenter: &str,
    file: &DatastorePath,
    attempts: u32,
    pause: Duration,
) -> Result<Readability> {
    let url = folder_url(session, datacenter, file)?;
    let mut relogged = false;
    let mut last = (0, String::new());
    let mut attempt = 0;
    while attempt < attempts.max(1) {
        let cookie = session.cookie();
        let mut request = session.http().get(url.clone()).header("Range", "bytes=0-0");
        if let Some(cookie) = &cookie {
            request = request.header("Cookie", cookie);
        }
        let response = request.send().await.map_err(|e| Error::Unreachable {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
        let status = response.status();
        match status {
            StatusCode::OK | StatusCode::PARTIAL_CONTENT => return Ok(Readability::Readable),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN if !relogged => {
                relogged = true;
                session.relogin_unless_renewed(cookie.as_deref()).await?;
                continue;
            }
            s if s.is_server_error() => {
                let body = response.text().await.unwrap_or_default();
                last = (s.as_u16(), body.chars().take(200).collect());
            }
            _ => {
                return Err(Error::Http {
                    url: url.to_string(),
                    what: format!("GET {file}"),
                    status: status.as_u16(),
                });
            }
        }
        attempt += 1;
        if attempt < attempts {
            tokio::time::sleep(pause).await;
        }
    }
    Ok(Readability::Locked {
        status: last.0,
        detail: last.1.trim().to_string(),
    })
}
