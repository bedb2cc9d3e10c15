//! A real disk in vcsim: a 256 MiB flat VMDK made with qemu-img is downloaded byte-exact, also when the
//! connection is cut halfway.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ferry_testkit::TestVcsim;
use ferry_vsphere::datastore::{Download, flat_disk};
use ferry_vsphere::inventory::{self, VmSelector};
use ferry_vsphere::{ConnectConfig, Session, TlsMode, seed};
use sha2::{Digest, Sha256};

const DISK_BYTES: u64 = 256 << 20;

/// Deterministic, incompressible, and never zero: corruption anywhere changes the checksum.
fn write_pattern(path: &Path, bytes: u64) -> String {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut hash = Sha256::new();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..bytes / block.len() as u64 {
        for word in block.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&(state | 1).to_le_bytes());
        }
        hash.update(&block);
        out.write_all(&block).unwrap();
    }
    out.flush().unwrap();
    hex(&hash.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `qemu-img convert` to a monolithicFlat VMDK: a descriptor and a `-flat` extent holding the raw bytes.
fn make_flat_vmdk(dir: &Path) -> (PathBuf, PathBuf, String) {
    let raw = dir.join("source.raw");
    let sha = write_pattern(&raw, DISK_BYTES);
    let vmdk = dir.join("migrate-me.vmdk");
    let status = std::process::Command::new("qemu-img")
        .args([
            "convert",
            "-f",
            "raw",
            "-O",
            "vmdk",
            "-o",
            "subformat=monolithicFlat",
        ])
        .arg(&raw)
        .arg(&vmdk)
        .status()
        .expect("qemu-img (Debian qemu-utils) is installed by hack/setup.sh");
    assert!(status.success());
    std::fs::remove_file(&raw).unwrap();
    (vmdk, dir.join("migrate-me-flat.vmdk"), sha)
}

async fn download_sha(session: &Session, datacenter: &str, disk_file: &str) -> (String, u64) {
    let flat = flat_disk(session, datacenter, disk_file).await.unwrap();
    assert_eq!(flat.size, DISK_BYTES);
    let mut download = Download::open(session, datacenter, &flat.extent, 0)
        .await
        .unwrap();
    let mut hash = Sha256::new();
    while let Some(chunk) = download.next_chunk().await.unwrap() {
        hash.update(&chunk);
    }
    (hex(&hash.finalize()), download.offset())
}

/// A TCP proxy that cuts the first connection to carry more than `cut_after` bytes back to the client.
struct CuttingProxy {
    port: u16,
    cut: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttingProxy {
    async fn start(upstream_port: u16, cut_after: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, connections) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (cut2, connections2) = (cut.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                connections2.fetch_add(1, Ordering::SeqCst);
                let cut = cut2.clone();
                tokio::spawn(async move {
                    let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream_port))
                        .await
                        .unwrap();
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upstream = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    });
                    let mut sent = 0u64;
                    let mut buf = vec![0u8; 64 * 1024];
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
                            break; // drop both halves: the client sees the connection die mid-body
                        }
                    }
                    upstream.abort();
                });
            }
        });
        Self {
            port,
            cut,
            connections,
            task,
        }
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_real_flat_vmdk_downloads_byte_exact_even_when_the_connection_is_cut() {
    let vcsim = TestVcsim::start(false).await.unwrap();
    let endpoint = vcsim.endpoint().clone();
    let ca = TlsMode::CaBundle(std::fs::read_to_string(&endpoint.ca_file).unwrap());
    let config = ConnectConfig {
        url: endpoint.url.clone(),
        username: endpoint.username.clone(),
        password: endpoint.password().unwrap(),
        tls: ca,
        timeout: Duration::from_secs(120),
    };
    let session = Session::connect(config.clone()).await.unwrap();
    let vm = inventory::find_vm(&session, &VmSelector::Name("DC0_H0_VM0".into()))
        .await
        .unwrap();

    let work = tempfile::tempdir().unwrap();
    let (descriptor, extent, source_sha) = make_flat_vmdk(work.path());
    let attached = seed::attach_flat_vmdk(&session, &vm, &descriptor, &extent)
        .await
        .unwrap();

    let info = inventory::describe_vm(&session, &vm).await.unwrap();
    let disk = info
        .disks
        .iter()
        .find(|d| d.file == attached.to_string())
        .expect("the attached disk is described");
    assert_eq!(disk.capacity_bytes as u64, DISK_BYTES);

    let (sha, bytes) = download_sha(&session, &info.datacenter, &disk.file).await;
    assert_eq!((sha.as_str(), bytes), (source_sha.as_str(), DISK_BYTES));

    // Again through a proxy that drops the connection after 96 MiB: the download resumes with Range.
    let proxy = CuttingProxy::start(endpoint.port().unwrap(), 96 << 20).await;
    let through_proxy = ConnectConfig {
        url: format!("https://127.0.0.1:{}/sdk", proxy.port),
        ..config
    };
    let session = Session::connect(through_proxy).await.unwrap();
    let (sha, bytes) = download_sha(&session, &info.datacenter, &disk.file).await;
    assert!(
        proxy.cut.load(Ordering::SeqCst),
        "the proxy never cut the connection"
    );
    assert!(
        proxy.connections.load(Ordering::SeqCst) >= 2,
        "the download did not reconnect"
    );
    assert_eq!((sha.as_str(), bytes), (source_sha.as_str(), DISK_BYTES));
}
