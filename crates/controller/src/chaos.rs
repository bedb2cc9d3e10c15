//! Fault injection for `ferry lab chaos` (feature `chaos`, off in release builds): a tower layer in the
//! controller's Kubernetes client that crashes the process right before or right after its k-th write, or fails
//! that write with a timeout, a 500, a 409 Conflict or an AlreadyExists. Lease renewals do not count: their
//! timing is not the controller's logic.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub fault: Fault,
    /// The write it hits, counting from 1.
    pub write: u32,
}

impl Plan {
    pub fn from_env() -> Option<Plan> {
        serde_json::from_str(&std::env::var(PLAN_ENV).ok()?).ok()
    }
}

#[derive(Clone)]
pub struct ChaosLayer {
    plan: Plan,
    writes: Arc<AtomicU32>,
}

impl ChaosLayer {
    pub fn new(plan: Plan) -> Self {
        Self {
            plan,
            writes: Arc::default(),
        }
    }
}

impl<S> tower::Layer<S> for ChaosLayer {
    type Service = ChaosService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ChaosService {
            inner,
            plan: self.plan,
            writes: self.writes.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ChaosService<S> {
    inner: S,
    plan: Plan,
    writes: Arc<AtomicU32>,
}

type Body = kube::client::Body;
type DynBody = kube::client::DynBody;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn crash(when: &str, write: u32) -> ! {
    eprintln!("{{\"chaos\":\"crash {when} write {write}\"}}");
    std::process::exit(86)
}

fn status_response(code: u16, reason: &str) -> Response<Box<DynBody>> {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("chaos: injected {reason}"), "reason": reason, "code": code});
    let full = http_body_util::Full::new(Bytes::from(body.to_string()))
        .map_err(|never| -> BoxError { match never {} });
    let mut response = Response::new(Box::new(full) as Box<DynBody>);
    *response.status_mut() =
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
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
        let write =
            request.method() != http::Method::GET && !request.uri().path().contains("/leases");
        let n = if write {
            self.writes.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        let hit = write && n == self.plan.write;
        if hit && self.plan.fault == Fault::CrashBefore {
            crash("before", n);
        }
        if hit && self.plan.fault != Fault::CrashAfter {
            let fault = self.plan.fault;
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
            let response = call.await;
            if hit {
                crash("after", n);
            }
            response
        })
    }
}

/// A client with the plan's fault layer, when `FERRY_CHAOS_PLAN` holds one.
pub fn client(config: kube::Config) -> kube::Result<kube::Client> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(match Plan::from_env() {
        Some(plan) => {
            eprintln!("{{\"chaos\":\"plan {plan:?}\"}}");
            builder.with_layer(&ChaosLayer::new(plan)).build()
        }
        None => builder.build(),
    })
}
