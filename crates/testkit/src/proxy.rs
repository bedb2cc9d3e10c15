//! Proxies on loopback between a vSphere client and vcsim:
//! - [`CuttingProxy`] (TCP) cuts the first connection to carry more than a given number of bytes back to the
//!   client: a dropped connection in the middle of a download, on demand.
//! - [`FaultProxy`] (HTTPS) answers downloads the way a real vCenter sometimes does ([`Fault`]), or SOAP calls the
//!   way a hostile endpoint would ([`Hostile`]).

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

/// An HTTPS proxy in front of a [`TestVcsim`] that answers `/folder` downloads the way a real vCenter sometimes
/// does and vcsim never will: an expired cookie (401), "Out of HTTP sessions" (503), `Range` ignored, a stall, a
/// slow link. Each queued [`Fault`] applies to one download request, in order; the rest pass through. It serves
/// a certificate from the simulator's CA, so a client that trusts vcsim trusts the proxy too.
pub struct FaultProxy {
    pub port: u16,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answers this status with an empty body, without asking vcsim.
    Status(u16),
    /// Forwards without `Range`, so the whole file comes back with 200.
    IgnoreRange,
    /// Sends the first n body bytes, then closes the connection.
    CutAfter(u64),
    /// Sends the first n body bytes, then nothing, keeping the connection open until the client leaves.
    StallAfter(u64),
    /// Sends the body at about this many bytes per second.
    Throttle(u64),
    /// Answers only after a SOAP call of this method went through the proxy.
    AfterSoapCall(String),
}

/// SOAP answers no vSphere endpoint sends, from a tenant's own server posing as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostile {
    /// Every call is answered with elements nested a million deep (about 7 MB).
    DeepXml,
    /// Every call is answered with a body that never ends.
    EndlessBody,
    /// Property listings never end: each page is empty and hands out another continuation token. Other calls
    /// pass through to vcsim, so logging in works.
    EndlessTokens,
    /// Every call is answered one byte a second.
    Trickle,
    /// No call is ever answered: the connection stays open until the client gives up.
    BlackHole,
}

/// A download request as the proxy saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub target: String,
    pub range: Option<String>,
    pub cookie: Option<String>,
    /// What the client was answered.
    pub status: u16,
}

struct Shared {
    faults: std::sync::Mutex<std::collections::VecDeque<Fault>>,
    downloads: std::sync::Mutex<Vec<Seen>>,
    /// SOAP method names, in order; the watch wakes requests held by [`Fault::AfterSoapCall`].
    soap: std::sync::Mutex<Vec<String>>,
    soap_changed: tokio::sync::watch::Sender<usize>,
    hostile: std::sync::Mutex<Option<Hostile>>,
}

impl Shared {
    fn new() -> Self {
        Self {
            faults: Default::default(),
            downloads: Default::default(),
            soap: Default::default(),
            soap_changed: tokio::sync::watch::Sender::new(0),
            hostile: Default::default(),
        }
    }

    fn soap_calls(&self) -> Vec<String> {
        self.soap.lock().unwrap().clone()
    }
}

impl FaultProxy {
    pub async fn start(vcsim: &crate::TestVcsim) -> Self {
        Self::start_for(vcsim.endpoint()).await
    }

    /// A proxy in front of any vcsim, such as a lab's; its certificate comes from the CA that signed vcsim's.
    pub async fn start_for(vcsim: &ferry_lab::VcsimEndpoint) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let pki_dir = vcsim
            .ca_file
            .parent()
            .expect("vcsim's CA file is in its PKI folder");
        let pki = ferry_lab::control_plane::pki::Pki::open_or_create(pki_dir).unwrap();
        let name = format!("fault-proxy-{}", NEXT.fetch_add(1, Ordering::SeqCst));
        let cert = pki.issue_server(&name).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(&cert)));
        let (client_tls, _) =
            ferry_vsphere::tls::client_config(&ferry_vsphere::TlsMode::InsecureSkipVerify).unwrap();
        let upstream = reqwest::Client::builder()
            .use_preconfigured_tls(client_tls)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let base = format!("https://127.0.0.1:{}", vcsim.port().unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::new());
        let state = shared.clone();
        let task = tokio::spawn(async move {
            // Connections live in the set, so stopping the proxy ends them too.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, upstream, base, state) = (
                    acceptor.clone(),
                    upstream.clone(),
                    base.clone(),
                    state.clone(),
                );
                connections.spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve(tls, &upstream, &base, &state).await;
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Self { port, shared, task }
    }

    /// The SDK URL through the proxy.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/sdk", self.port)
    }

    /// From now on, SOAP calls are answered as `hostile` says.
    pub fn turn_hostile(&self, hostile: Hostile) {
        *self.shared.hostile.lock().unwrap() = Some(hostile);
    }

    /// Queues `fault` for the next download request not yet given one.
    pub fn push(&self, fault: Fault) {
        self.shared.faults.lock().unwrap().push_back(fault);
    }

    /// Download requests so far.
    pub fn downloads(&self) -> Vec<Seen> {
        self.shared.downloads.lock().unwrap().clone()
    }

    /// SOAP methods called through the proxy so far.
    pub fn soap_calls(&self) -> Vec<String> {
        self.shared.soap_calls()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn server_config(cert: &ferry_lab::control_plane::pki::CertFiles) -> rustls::ServerConfig {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let chain = vec![CertificateDer::from_pem_file(&cert.cert).unwrap()];
    let key = PrivateKeyDer::from_pem_file(&cert.key).unwrap();
    rustls::ServerConfig::builder_with_provider(ferry_vsphere::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap()
}

type Client = tokio::io::BufReader<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
}

/// HTTP/1.1 requests on one connection, one after the other, until either side closes.
async fn serve(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    upstream: &reqwest::Client,
    base: &str,
    shared: &Shared,
) {
    let mut client = tokio::io::BufReader::new(tls);
    while let Some(request) = read_request(&mut client).await {
        let download = request.method == "GET" && request.target.starts_with("/folder/");
        if request.method == "POST"
            && let Some(method) = soap_method(&request.body)
        {
            shared.soap.lock().unwrap().push(method.clone());
            shared.soap_changed.send_modify(|n| *n += 1);
            let hostile = *shared.hostile.lock().unwrap();
            if let Some(hostile) = hostile
                && answers_hostile(hostile, &method)
            {
                if !answer_hostile(&mut client, hostile, &method).await {
                    return;
                }
                continue;
            }
        }
        let fault = if download {
            shared.faults.lock().unwrap().pop_front()
        } else {
            None
        };
        let keep_open = answer(
            &mut client,
            request,
            fault,
            download,
            upstream,
            base,
            shared,
        )
        .await;
        if !keep_open {
            return;
        }
    }
}

async fn read_request(client: &mut Client) -> Option<Request> {
    use tokio::io::AsyncBufReadExt;
    let mut line = String::new();
    if client.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if client.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let mut request = Request {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    let length: usize = request
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    request.body = vec![0; length];
    client.read_exact(&mut request.body).await.ok()?;
    Some(request)
}

fn answers_hostile(hostile: Hostile, method: &str) -> bool {
    hostile != Hostile::EndlessTokens
        || matches!(
            method,
            "RetrievePropertiesEx" | "ContinueRetrievePropertiesEx"
        )
}

const SOAP_OPEN: &str = r#"<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body>"#;
const SOAP_CLOSE: &str = "</soapenv:Body></soapenv:Envelope>";

/// Answers one SOAP call as `hostile` says; false when the connection must end.
async fn answer_hostile(client: &mut Client, hostile: Hostile, method: &str) -> bool {
    static TOKENS: AtomicUsize = AtomicUsize::new(0);
    let whole = |body: String| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/xml; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    match hostile {
        Hostile::DeepXml => {
            let depth = 1_000_000;
            let body = format!(
                "{SOAP_OPEN}{}{}{SOAP_CLOSE}",
                "<a>".repeat(depth),
                "</a>".repeat(depth)
            );
            client.write_all(whole(body).as_bytes()).await.is_ok()
        }
        Hostile::EndlessTokens => {
            let token = TOKENS.fetch_add(1, Ordering::SeqCst);
            let body = format!(
                "{SOAP_OPEN}<{method}Response xmlns=\"urn:vim25\"><returnval><token>t{token}</token></returnval></{method}Response>{SOAP_CLOSE}"
            );
            client.write_all(whole(body).as_bytes()).await.is_ok()
        }
        Hostile::EndlessBody => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/xml; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n";
            if client.write_all(head.as_bytes()).await.is_err() {
                return false;
            }
            let chunk = format!("{SOAP_OPEN}<x>{}", "z".repeat(64 * 1024));
            let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
            // Until the client hangs up.
            while client.write_all(framed.as_bytes()).await.is_ok() {}
            false
        }
        Hostile::BlackHole => {
            let mut sink = [0u8; 4096];
            while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
            false
        }
        Hostile::Trickle => {
            let body = format!("{SOAP_OPEN}{}{SOAP_CLOSE}", " ".repeat(4096));
            for byte in whole(body).bytes() {
                if client.write_all(&[byte]).await.is_err() || client.flush().await.is_err() {
                    return false;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            true
        }
    }
}

/// The method of a SOAP envelope: the first element inside `Body`.
fn soap_method(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let after_body = &text[text.find("Body")?..];
    let element = &after_body[after_body.find('>')? + 1..];
    let element = element.trim_start().strip_prefix('<')?;
    let name: String = element
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    Some(name.rsplit(':').next().unwrap_or(&name).to_string())
}

/// Answers one request, applying `fault`; false when the connection must end.
#[allow(clippy::too_many_arguments)]
async fn answer(
    client: &mut Client,
    request: Request,
    fault: Option<Fault>,
    download: bool,
    upstream: &reqwest::Client,
    base: &str,
    shared: &Shared,
) -> bool {
    let record = |status: u16| {
        if download {
            shared.downloads.lock().unwrap().push(Seen {
                target: request.target.clone(),
                range: request.header("range"),
                cookie: request.header("cookie"),
                status,
            });
        }
    };
    if let Some(Fault::Status(status)) = fault {
        record(status);
        let head = format!("HTTP/1.1 {status} Fault\r\nContent-Length: 0\r\n\r\n");
        return client.write_all(head.as_bytes()).await.is_ok();
    }
    if let Some(Fault::AfterSoapCall(method)) = &fault {
        let mut changed = shared.soap_changed.subscribe();
        while !shared.soap_calls().contains(method) {
            if changed.changed().await.is_err() {
                return false;
            }
        }
    }
    let method = reqwest::Method::from_bytes(request.method.as_bytes()).unwrap();
    let mut forward = upstream.request(method, format!("{base}{}", request.target));
    for (name, value) in &request.headers {
        let skip = ["host", "content-length", "connection"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
            || (fault == Some(Fault::IgnoreRange) && name.eq_ignore_ascii_case("range"));
        if !skip {
            forward = forward.header(name.as_str(), value.as_str());
        }
    }
    let Ok(mut response) = forward.body(request.body.clone()).send().await else {
        record(502);
        let _ = client
            .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            .await;
        return false;
    };
    let status = response.status();
    record(status.as_u16());
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    for (name, value) in response.headers() {
        if !["transfer-encoding", "connection", "content-length"].contains(&name.as_str()) {
            head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap_or("")));
        }
    }
    // Downloads stream with their length; anything else is small and read whole first.
    let (length, whole) = match response.content_length() {
        Some(length) => (length, None),
        None => {
            let mut body = Vec::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                body.extend_from_slice(&chunk);
            }
            (body.len() as u64, Some(body))
        }
    };
    head.push_str(&format!("Content-Length: {length}\r\n\r\n"));
    if client.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    if let Some(body) = whole {
        return client.write_all(&body).await.is_ok();
    }
    let limit = match fault {
        Some(Fault::CutAfter(n) | Fault::StallAfter(n)) => n,
        _ => u64::MAX,
    };
    let mut sent = 0u64;
    while let Ok(Some(chunk)) = response.chunk().await {
        let take = chunk
            .len()
            .min(usize::try_from(limit - sent).unwrap_or(usize::MAX));
        if client.write_all(&chunk[..take]).await.is_err() {
            return false;
        }
        sent += take as u64;
        if sent == limit {
            let _ = client.flush().await;
            if let Some(Fault::StallAfter(_)) = fault {
                // Say nothing more; wait for the client to give up and close.
                let mut sink = [0u8; 1024];
                while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
            }
            return false;
        }
        if let Some(Fault::Throttle(rate)) = fault {
            tokio::time::sleep(std::time::Duration::from_millis(
                1000 * take as u64 / rate.max(1),
            ))
            .await;
        }
    }
    client.flush().await.is_ok() && sent == length
}
