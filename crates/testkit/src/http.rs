//! A one-file HTTP server on loopback, optionally slow, for import sources in tests.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct FileServer {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    /// Serves `file` for any path at about `bytes_per_sec` (None: as fast as it goes).
    pub async fn start(file: PathBuf, bytes_per_sec: Option<u64>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let file = file.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = socket.read(&mut request).await;
                    let body = tokio::fs::read(&file).await.unwrap_or_default();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    for chunk in body.chunks(1 << 20) {
                        if socket.write_all(chunk).await.is_err() {
                            return;
                        }
                        if let Some(rate) = bytes_per_sec {
                            tokio::time::sleep(Duration::from_millis(
                                1000 * chunk.len() as u64 / rate,
                            ))
                            .await;
                        }
                    }
                });
            }
        });
        Self { port, task }
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
