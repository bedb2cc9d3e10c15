//! `ferry verify`: reads an imported disk back and proves it holds the source's bytes (the controller's last check
//! before a disk counts as imported).

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::error::{Error, Result};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    pub sha256: String,
    pub bytes: u64,
}

/// Hashes the first `size` bytes of `path` (a raw `disk.img` or a block device) and compares with `expected`.
/// A PVC may be larger than the disk, so only `size` bytes count; fewer bytes than that is a short image.
pub async fn verify(path: &Path, expected: &str, size: u64) -> Result<Verified> {
    let sha256 = sha256_of(path, size).await?;
    if sha256 != expected.to_ascii_lowercase() {
        return Err(Error::ChecksumMismatch {
            what: path.display().to_string(),
            expected: expected.into(),
            actual: sha256,
        });
    }
    Ok(Verified {
        sha256,
        bytes: size,
    })
}

/// The sha256 of `path`'s first `size` bytes; fewer bytes than that is a short image.
pub async fn sha256_of(path: &Path, size: u64) -> Result<String> {
    let io = |e: std::io::Error| Error::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let mut file = tokio::fs::File::open(path).await.map_err(io)?;
    let (mut hash, mut bytes, mut buf) = (Sha256::new(), 0u64, vec![0u8; 4 << 20]);
    while bytes < size {
        let want = buf.len().min((size - bytes) as usize);
        let n = file.read(&mut buf[..want]).await.map_err(io)?;
        if n == 0 {
            return Err(Error::ShortRead {
                index: 0,
                got: bytes,
                expected: size,
            });
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(crate::hex(&hash.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(bytes: &[u8]) -> String {
        crate::hex(&Sha256::digest(bytes))
    }

    #[tokio::test]
    async fn only_the_disk_size_counts_and_every_mismatch_is_retryable() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        // A PVC larger than the disk: trailing bytes after the disk do not count.
        std::fs::write(&image, [data.as_slice(), &[0u8; 4096]].concat()).unwrap();
        let ok = verify(&image, &sha(&data), data.len() as u64)
            .await
            .unwrap();
        assert_eq!(ok.bytes, data.len() as u64);

        let wrong = verify(&image, &sha(b"other"), data.len() as u64)
            .await
            .unwrap_err();
        assert_eq!(
            (wrong.reason().as_str(), wrong.class()),
            (
                "ChecksumMismatch",
                ferry_types::ErrorClass::BoundedRetryable
            )
        );
        let short = verify(&image, &sha(&data), 1 << 20).await.unwrap_err();
        assert_eq!(short.reason(), "ShortRead");
    }
}
