//! The dashboard's HTTP server: each page whole, its changing part as a stream of Server-Sent Events, and the
//! stylesheet and script, all from this binary. Read-only: it answers GET (and HEAD) only.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use ferry_ui::Route;

use super::cache::{Cache, SAMPLE_EVERY};

/// Changes that come together (a status write, then its Event) are sent once, this long after the first.
const SETTLE: Duration = Duration::from_millis(300);

pub fn router(cache: Arc<Cache>, allow_remote: bool) -> Router {
    Router::new()
        .route(
            "/assets/ui.css",
            get(|| asset("text/css; charset=utf-8", ferry_ui::assets::CSS)),
        )
        .route(
            "/assets/live.js",
            get(|| asset("text/javascript; charset=utf-8", ferry_ui::assets::JS)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/live/{*path}", get(live))
        .fallback(page)
        .layer(middleware::from_fn(secure))
        .layer(middleware::from_fn_with_state(allow_remote, addressed_here))
        .with_state(cache)
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn page(State(cache): State<Arc<Cache>>, method: Method, uri: Uri) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, HEAD")],
            "read-only",
        )
            .into_response();
    }
    let route = Route::parse(uri.path());
    let rendered = ferry_ui::page(route.as_ref(), &cache.world());
    let status = StatusCode::from_u16(rendered.status).unwrap_or(StatusCode::OK);
    (status, Html(rendered.html)).into_response()
}

/// The page's changing part, sent when it first connects and then whenever it differs: after a watched change,
/// or at each sample (throughput, ages and the clock move on their own).
async fn live(State(cache): State<Arc<Cache>>, Path(path): Path<String>) -> Response {
    let Some(route) = Route::parse(&format!("/{path}")) else {
        return (StatusCode::NOT_FOUND, "no such page").into_response();
    };
    let changes = cache.changes();
    let state = (cache, route, changes, None::<String>, true);
    let stream = futures::stream::unfold(
        state,
        |(cache, route, mut changes, mut last, first)| async move {
            if !first {
                // The next change, or the next sample; then a moment for what comes with it.
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { tokio::time::sleep(SAMPLE_EVERY).await },
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                }
                tokio::time::sleep(SETTLE).await;
            }
            loop {
                let html = ferry_ui::fragment(&route, &cache.world());
                if last.as_deref() != Some(html.as_str()) {
                    let event = Event::default().event("fragment").data(&html);
                    last = Some(html);
                    return Some((
                        Ok::<_, Infallible>(event),
                        (cache, route, changes, last, false),
                    ));
                }
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                }
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Headers for a page that holds cluster data: nothing from elsewhere may load, frame it or cache it.
async fn secure(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let policy = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; \
                  base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(policy),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// On loopback, only requests addressed to this machine by name or address: a web page elsewhere that
/// rebinds its own name to 127.0.0.1 cannot read the dashboard through the browser.
async fn addressed_here(
    State(allow_remote): State<bool>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    if allow_remote || host.is_some_and(is_loopback_host) {
        return next.run(request).await;
    }
    (
        StatusCode::MISDIRECTED_REQUEST,
        "ferry ui answers requests addressed to localhost, 127.0.0.1 or [::1] only",
    )
        .into_response()
}

/// `localhost`, a loopback address, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_this_machine_are_loopback_hosts() {
        for host in [
            "localhost",
            "localhost:8787",
            "127.0.0.1:8787",
            "127.1.2.3",
            "[::1]:8787",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:8787",
            "192.0.2.1:8787",
            "[2001:db8::1]:80",
            "localhost.evil.example",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
