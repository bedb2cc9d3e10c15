//! Fault injection for `ferry lab chaos` (feature `chaos`, off in release builds). A tower layer in the
//! controller's Kubernetes client crashes the process right before or right after its k-th write, fails that
//! write (timeout, 500, 409 Conflict, AlreadyExists), stops the process after it (SIGSTOP: the world moves on
//! unobserved until the harness continues it), or answers the reads that follow it with what they answered
//! before it and holds back its watches' events (stale reads and a lagging watch cache, for at most 2 s). A hook
//! in the vSphere client fails the k-th SOAP call, transiently or with `ManagedObjectNotFound`, and logs every
//! call so a fault-free run can count them. Lease renewals do not count: their timing is not the controller's
//! logic.

mod lagging;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};

/// The environment variable `ferry controller` reads its plan from.
pub const PLAN_ENV: &str = "FERRY_CHAOS_PLAN";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Fault {
    CrashBefore,
    CrashAfter,
    Timeout,
    ServerError,
    Conflict,
    AlreadyExists,
    /// SIGSTOP right after write k; the harness sends SIGCONT once the world has changed.
    PauseAfter,
    /// After write k and until the next write other than an Event (at most 2 s), each read answers what it
    /// answered before write k, and watch events wait.
    StaleReads,
    /// The k-th vSphere call cannot connect (transient).
    VsphereUnreachable,
    /// The k-th vSphere call gets a `ManagedObjectNotFound` fault (permanent: the VM seems gone).
    VsphereNotFound,
    /// Nothing is injected; vSphere calls are logged (a reference run counts them).
    Observe,
}

impl Fault {
    /// What the controller logs when this fault strikes at `at`: the harness checks that it did.
    pub fn log_marker(self, at: u32) -> String {
        match self {
            Fault::CrashBefore => format!("crash before write {at}\""),
            Fault::CrashAfter => format!("crash after write {at}\""),
            Fault::PauseAfter => format!("pause after write {at}\""),
            Fault::StaleReads => "stale read of".to_string(),
            Fault::VsphereUnreachable | Fault::VsphereNotFound => {
                format!("{self:?} on vsphere call {at}\"")
            }
            Fault::Observe => String::new(),
            _ => format!("{self:?} on write {at}\""),
        }
    }

    /// Whether `at` counts vSphere calls rather than Kubernetes writes.
    pub fn counts_vsphere_calls(self) -> bool {
        matches!(self, Fault::VsphereUnreachable | Fault::VsphereNotFound)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultPlan {
    pub fault: Fault,
    /// The write (or vSphere call) it hits, counting from 1.
    #[serde(alias = "write")]
    pub at: u32,
}

impl FaultPlan {
    pub fn from_env() -> Option<FaultPlan> {
        serde_json::from_str(&std::env::var(PLAN_ENV).ok()?).ok()
    }
}

/// The log line prefix of each vSphere call the hook saw.
pub const VSPHERE_CALL_LOG: &str = "chaos: vsphere call";

/// Counts and logs every SOAP call, and answers the plan's call with its fault.
fn install_vsphere_hook(plan: FaultPlan) {
    let calls = AtomicU32::new(0);
    ferry_vsphere::chaos::install(move |method| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        eprintln!("{{\"chaos\":\"{VSPHERE_CALL_LOG} {n} {method}\"}}");
        if n != plan.at || !plan.fault.counts_vsphere_calls() {
            return None;
        }
        eprintln!("{{\"chaos\":\"{:?} on vsphere call {n}\"}}", plan.fault);
        Some(match plan.fault {
            Fault::VsphereUnreachable => ferry_vsphere::chaos::Injected::Unreachable,
            _ => ferry_vsphere::chaos::Injected::Fault("ManagedObjectNotFound".into()),
        })
    });
}

/// Answers to earlier reads, by URI.
type Answers = HashMap<String, (StatusCode, Bytes)>;

#[derive(Default)]
struct Shared {
    writes: AtomicU32,
    /// The answers as they were just before the plan's write, served while the stale window is open.
    before: Mutex<Option<Answers>>,
    latest: Mutex<Answers>,
    /// When the stale window closes: opened by the plan's write, closed early by the next write of state (a
    /// lagging cache catches up in the end even when the controller writes nothing).
    stale_until: Mutex<Option<std::time::Instant>>,
}

impl Shared {
    /// Whether reads are answered stale and watch events held back: from the plan's write until the next write of
    /// state, for at most [`STALE_FOR`].
    fn stale_window_open(&self) -> bool {
        self.stale_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| std::time::Instant::now() < until)
    }

    fn set_window(&self, until: Option<std::time::Instant>) {
        *self.stale_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }
}

/// How long reads may stay stale after the plan's write, when the controller writes nothing meanwhile.
const STALE_FOR: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Clone)]
pub struct ChaosLayer {
    plan: FaultPlan,
    shared: Arc<Shared>,
}

impl ChaosLayer {
    pub fn new(plan: FaultPlan) -> Self {
        Self {
            plan,
            shared: Arc::default(),
        }
    }
}

impl<S> tower::Layer<S> for ChaosLayer {
    type Service = ChaosService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ChaosService {
            inner,
            plan: self.plan,
            shared: self.shared.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ChaosService<S> {
    inner: S,
    plan: FaultPlan,
    shared: Arc<Shared>,
}

type Body = kube::client::Body;
type DynBody = kube::client::DynBody;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn crash(when: &str, write: u32) -> ! {
    eprintln!("{{\"chaos\":\"crash {when} write {write}\"}}");
    std::process::exit(86)
}

fn pause(write: u32) {
    eprintln!("{{\"chaos\":\"pause after write {write}\"}}");
    // SIGSTOP stops every thread until the harness sends SIGCONT.
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP);
}

fn body_response(code: StatusCode, body: Bytes) -> Response<Box<DynBody>> {
    let full = http_body_util::Full::new(body).map_err(|never| -> BoxError { match never {} });
    let mut response = Response::new(Box::new(full) as Box<DynBody>);
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn status_response(code: u16, reason: &str) -> Response<Box<DynBody>> {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("chaos: injected {reason}"), "reason": reason, "code": code});
    body_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Bytes::from(body.to_string()),
    )
}

impl<S> tower::Service<Request<Body>> for ChaosService<S>
where
    S: tower::Service<Request<Body>, Response = Response<Box<DynBody>>, Error = BoxError>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let lease = request.uri().path().contains("/leases");
        let write = request.method() != http::Method::GET && !lease;
        let uri = request.uri().to_string();
        // Plain reads are answered stale from a copy; a watch, a stream, is held back instead.
        let watch = request.uri().query().unwrap_or_default().contains("watch=");
        let read = request.method() == http::Method::GET && !lease && !watch;
        let (plan, shared) = (self.plan, self.shared.clone());
        let n = if write {
            // A write of state ends the stale window (the controller acts on what it read); an Event is no state.
            if !request.uri().path().contains("/events") {
                shared.set_window(None);
            }
            shared.writes.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        let hit = write && n == plan.at;
        let stale_reads = plan.fault == Fault::StaleReads;
        if hit && stale_reads {
            let latest = shared
                .latest
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            *shared.before.lock().unwrap_or_else(|p| p.into_inner()) = Some(latest);
        }
        if read && stale_reads && shared.stale_window_open() {
            let before = shared.before.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((code, body)) = before.as_ref().and_then(|b| b.get(&uri)).cloned() {
                eprintln!("{{\"chaos\":\"stale read of {uri}\"}}");
                return Box::pin(async move { Ok(body_response(code, body)) });
            }
        }
        if hit && plan.fault == Fault::CrashBefore {
            crash("before", n);
        }
        let injected = match plan.fault {
            Fault::Timeout | Fault::ServerError | Fault::Conflict | Fault::AlreadyExists => {
                Some(plan.fault)
            }
            _ => None,
        };
        if let Some(fault) = injected.filter(|_| hit) {
            eprintln!("{{\"chaos\":\"{fault:?} on write {n}\"}}");
            return Box::pin(async move {
                match fault {
                    Fault::Timeout => {
                        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                        Err("chaos: injected timeout".into())
                    }
                    Fault::ServerError => Ok(status_response(500, "InternalError")),
                    Fault::Conflict => Ok(status_response(409, "Conflict")),
                    _ => Ok(status_response(409, "AlreadyExists")),
                }
            });
        }
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            if hit {
                match plan.fault {
                    Fault::CrashAfter => crash("after", n),
                    Fault::PauseAfter => pause(n),
                    Fault::StaleReads => {
                        shared.set_window(Some(std::time::Instant::now() + STALE_FOR));
                    }
                    _ => {}
                }
            }
            if watch && stale_reads {
                return Ok(response.map(|body| {
                    Box::new(lagging::LaggingWatch::new(body, shared, uri)) as Box<DynBody>
                }));
            }
            if !(read && stale_reads) {
                return Ok(response);
            }
            // Keep a copy of each read's answer, to serve it again later as a stale one.
            let code = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            shared
                .latest
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(uri, (code, body.clone()));
            Ok(body_response(code, body))
        })
    }
}

/// A client with the plan's fault layer and vSphere hook, when `FERRY_CHAOS_PLAN` holds a plan.
pub fn client(config: kube::Config) -> kube::Result<kube::Client> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(match FaultPlan::from_env() {
        Some(plan) => {
            eprintln!("{{\"chaos\":\"plan {plan:?}\"}}");
            install_vsphere_hook(plan);
            builder.with_layer(&ChaosLayer::new(plan)).build()
        }
        None => builder.build(),
    })
}
