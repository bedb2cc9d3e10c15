//! A mock API server for the reconcile tier: one reconcile against a script of the exact requests it must make,
//! in order, each answered with a canned response. A request that differs from the script, one more than the
//! script, or one the script has and the reconcile never made fails the test, with the request in the message.
//!
//! The client is `kube::Client` over a `tower_test` mock service, so everything above the HTTP request (kube's
//! request building, the Event recorder, error parsing) is the production code; nothing here knows how the
//! reconciler is structured inside, only [`crate::reconcile::reconcile`] and [`Context`].

use std::sync::Arc;
use std::time::Duration;

use ferry_api::VirtualMachineMigration;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::context::Context;
use crate::error::Failure;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Check = Box<dyn FnOnce(&Value) + Send>;
type Respond = Box<dyn FnOnce(&Value) -> (StatusCode, Value) + Send>;

/// A reconcile that made no request at all, or whose answers were all given, returns well within this; it only
/// bounds a test that would otherwise hang on a bug.
const RECONCILE_LIMIT: Duration = Duration::from_secs(5);

/// One request the reconcile must make next, and the answer it gets.
pub struct Exchange {
    method: Method,
    /// Path and query, exactly as kube sends them.
    uri: String,
    content_type: Option<&'static str>,
    check: Check,
    respond: Respond,
}

impl Exchange {
    pub fn new(method: Method, uri: impl Into<String>) -> Self {
        Self {
            method,
            uri: uri.into(),
            content_type: None,
            check: Box::new(|_| {}),
            respond: Box::new(|_| (StatusCode::OK, json!({}))),
        }
    }

    pub fn get(uri: impl Into<String>) -> Self {
        Self::new(Method::GET, uri)
    }

    /// The request's body, parsed as JSON (`null` when it has none), must pass `check` (which asserts).
    pub fn check(mut self, check: impl FnOnce(&Value) + Send + 'static) -> Self {
        self.check = Box::new(check);
        self
    }

    pub fn content_type(mut self, content_type: &'static str) -> Self {
        self.content_type = Some(content_type);
        self
    }

    /// Answers 200 with `body`.
    pub fn reply(self, body: Value) -> Self {
        self.reply_with(move |_| body)
    }

    /// Answers 200 with what `make` builds from the request's body.
    pub fn reply_with(mut self, make: impl FnOnce(&Value) -> Value + Send + 'static) -> Self {
        self.respond = Box::new(move |request| (StatusCode::OK, make(request)));
        self
    }

    /// Answers 404 with the API server's `Status`.
    pub fn not_found(mut self, resource: &str, name: &str) -> Self {
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{resource} \"{name}\" not found"), "reason": "NotFound",
            "details": {"name": name, "kind": resource}, "code": 404,
        });
        self.respond = Box::new(move |_| (StatusCode::NOT_FOUND, status));
        self
    }

    /// The Event kube's `Recorder` creates (events.k8s.io/v1) about `vmm`, of `type_` and `reason`, its note
    /// checked by `note`; answered with the Event itself, as the API server does.
    pub fn event(
        vmm: &VirtualMachineMigration,
        type_: &'static str,
        reason: &'static str,
        note: impl FnOnce(&str) + Send + 'static,
    ) -> Self {
        let ns = vmm.namespace().unwrap_or_default();
        let regarding = serde_json::to_value(vmm.object_ref(&())).expect("a reference");
        Self::new(
            Method::POST,
            format!("/apis/events.k8s.io/v1/namespaces/{ns}/events?"),
        )
        .content_type("application/json")
        .check(move |event| {
            assert_eq!(event["type"], type_, "Event type in {event:#}");
            assert_eq!(event["reason"], reason, "Event reason in {event:#}");
            assert_eq!(event["action"], "Reconcile", "Event action in {event:#}");
            assert_eq!(
                event["reportingController"], "ferry-controller",
                "{event:#}"
            );
            assert_eq!(
                event["regarding"], regarding,
                "Event regarding in {event:#}"
            );
            note(event["note"].as_str().unwrap_or_default());
        })
        .reply_with(|event| event.clone())
    }

    /// The one status write of a reconcile: server-side apply of the status subresource by ferry-controller,
    /// forced, carrying the resourceVersion read. `check` sees the written status; the answer is `vmm` with that
    /// status at resourceVersion `written`.
    pub fn status_write(
        vmm: &VirtualMachineMigration,
        written: &str,
        check: impl FnOnce(&Value) + Send + 'static,
    ) -> Self {
        let read = vmm.resource_version();
        let name = vmm.name_any();
        let stored = stored(vmm, written);
        Self::new(
            Method::PATCH,
            format!(
                "{}/status?&force=true&fieldManager=ferry-controller",
                object_path(vmm)
            ),
        )
        .content_type("application/apply-patch+yaml")
        .check(move |patch| {
            assert_eq!(
                patch["apiVersion"], "migration.platform.example/v1alpha1",
                "{patch:#}"
            );
            assert_eq!(patch["kind"], "VirtualMachineMigration", "{patch:#}");
            assert_eq!(patch["metadata"]["name"], name.as_str(), "{patch:#}");
            assert_eq!(
                patch["metadata"]["resourceVersion"].as_str(),
                read.as_deref(),
                "the status write must carry the resourceVersion read: {patch:#}"
            );
            assert_eq!(
                patch.as_object().map(|o| o.len()),
                Some(4),
                "apiVersion, kind, metadata and status only: {patch:#}"
            );
            check(&patch["status"]);
        })
        .reply_with(move |patch| {
            let mut stored = stored;
            stored["status"] = patch["status"].clone();
            stored
        })
    }

    /// A JSON merge patch of the migration itself (its finalizers), with no field manager and no force;
    /// `check` sees the whole patch. The answer is `vmm` with the patched finalizers at resourceVersion `written`.
    pub fn merge_patch(
        vmm: &VirtualMachineMigration,
        written: &str,
        check: impl FnOnce(&Value) + Send + 'static,
    ) -> Self {
        let stored = stored(vmm, written);
        Self::new(Method::PATCH, format!("{}?", object_path(vmm)))
            .content_type("application/merge-patch+json")
            .check(check)
            .reply_with(move |patch| {
                let mut stored = stored;
                stored["metadata"]["finalizers"] = patch["metadata"]["finalizers"].clone();
                stored
            })
    }
}

/// `/apis/migration.platform.example/v1alpha1/namespaces/NS/virtualmachinemigrations/NAME`.
pub fn object_path(vmm: &VirtualMachineMigration) -> String {
    format!(
        "/apis/migration.platform.example/v1alpha1/namespaces/{}/virtualmachinemigrations/{}",
        vmm.namespace().unwrap_or_default(),
        vmm.name_any()
    )
}

/// `vmm` as the API server would store it after a write: at resourceVersion `written`.
fn stored(vmm: &VirtualMachineMigration, written: &str) -> Value {
    let mut stored = serde_json::to_value(vmm).expect("a migration serializes");
    stored["metadata"]["resourceVersion"] = json!(written);
    stored
}

/// A [`Context`] whose client talks to the script instead of an API server.
pub struct ApiServer {
    pub ctx: Arc<Context>,
    handle: Handle,
}

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiServer {
    pub fn new() -> Self {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let ctx = Context::new(client, Default::default(), Default::default());
        Self {
            ctx: Arc::new(ctx),
            handle,
        }
    }

    /// Runs one reconcile of `vmm` against `script`, and returns what it returned. Panics (failing the test) when
    /// a request differs from the script, comes beyond it, or the script is not used up when the reconcile returns.
    pub async fn reconcile(
        self,
        vmm: VirtualMachineMigration,
        script: Vec<Exchange>,
    ) -> Result<Action, Failure> {
        let (returned, done) = oneshot::channel();
        let verifier = tokio::spawn(serve(self.handle, script, done));
        let result = tokio::time::timeout(
            RECONCILE_LIMIT,
            crate::reconcile::reconcile(Arc::new(vmm), self.ctx.clone()),
        )
        .await;
        let _ = returned.send(());
        // The script's verdict first: a wrong request also makes the reconcile fail, less legibly.
        if let Err(e) = verifier.await {
            std::panic::resume_unwind(e.into_panic());
        }
        result.expect("the reconcile did not return within 5 s")
    }
}

/// Answers the script in order, then refuses anything more until the reconcile returned.
async fn serve(mut handle: Handle, script: Vec<Exchange>, mut returned: oneshot::Receiver<()>) {
    let total = script.len();
    for (i, expected) in script.into_iter().enumerate() {
        let n = i + 1;
        let (request, reply) = tokio::select! {
            biased;
            next = handle.next_request() => next.expect("the client is gone"),
            _ = &mut returned => panic!(
                "request {n} of {total} never came: the reconcile returned without {} {}",
                expected.method, expected.uri
            ),
        };
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.expect("a request body");
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "request {n} ({} {}) has a body that is not JSON: {e}",
                    parts.method, parts.uri
                )
            })
        };
        let got = format!(
            "{} {}",
            parts.method,
            parts.uri.path_and_query().map_or("", |p| p.as_str())
        );
        assert_eq!(
            got,
            format!("{} {}", expected.method, expected.uri),
            "request {n} of {total} (body {body:#})"
        );
        if let Some(wanted) = expected.content_type {
            let content_type = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            assert_eq!(
                content_type,
                Some(wanted),
                "request {n} ({got}): content type"
            );
        }
        (expected.check)(&body);
        let (status, answer) = (expected.respond)(&body);
        let response = Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&answer).expect("JSON")))
            .expect("a response");
        reply.send_response(response);
    }
    tokio::select! {
        biased;
        next = handle.next_request() => {
            if let Some((request, _)) = next {
                panic!(
                    "unexpected request after the {total} of the script: {} {}",
                    request.method(),
                    request.uri()
                );
            }
        }
        _ = returned => {}
    }
}
