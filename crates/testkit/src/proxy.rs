//! A TCP proxy on loopback that cuts the first connection to carry more than a given number of bytes back to
//! the client: a dropped connection in the middle of a download, on demand.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct CuttingProxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttingProxy {
    pub async fn start(upstream_port: u16, cut_after: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, connections) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (cut_flag, counter) = (cut.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(relay(client, upstream_port, cut_after, cut_flag.clone()));
            }
        });
        Self {
            port,
            cut,
            connections,
            task,
        }
    }

    /// True once a connection was cut.
    pub fn has_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn relay(
    client: tokio::net::TcpStream,
    upstream_port: u16,
    cut_after: u64,
    cut: Arc<AtomicBool>,
) {
    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let (mut sent, mut buf) = (0u64, vec![0u8; 64 * 1024]);
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
        sent += n as u64;
        if sent > cut_after && !cut.swap(true, Ordering::SeqCst) {
            break; // dropping both halves: the client sees the connection die mid-body
        }
    }
    upstream.abort();
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
