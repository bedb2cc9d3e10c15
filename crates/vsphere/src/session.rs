//! A logged-in session: service content first, then `Login`; the session cookie rides on every later request.
//! An expired session (`NotAuthenticated`) is logged in again once. A long job keeps the session alive with
//! [`Session::keep_alive_every`], as govmomi's `session/keepalive` does.
//!
//! One HTTP client serves SOAP and disk streams, so its only client-wide limits are the connect timeout and the
//! idle timeout ([`TransferPolicy`]); each SOAP request carries its own total deadline (`ConnectConfig::timeout`).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::soap::{self, Fault, MoRef, Response};
use crate::tls::{self, Pin, SeenThumbprint, TlsMode};
use crate::transfer::TransferPolicy;
use crate::xml::{Element, escape};

/// Where and how to connect. The password is never printed.
#[derive(Clone)]
pub struct ConnectConfig {
    /// The SDK URL, for example `https://vcenter.example.com/sdk`.
    pub url: String,
    pub username: String,
    pub password: String,
    pub tls: TlsMode,
    /// The total deadline of each SOAP call (disk streams have none: see [`TransferPolicy`]).
    pub timeout: Duration,
}

impl fmt::Debug for ConnectConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectConfig")
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("tls", &self.tls)
            .finish()
    }
}

/// What the endpoint says it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct About {
    /// `VirtualCenter` or `HostAgent`.
    pub api_type: String,
    pub api_version: String,
    pub full_name: String,
    pub instance_uuid: Option<String>,
}

/// Managed objects every session needs, read from `RetrieveServiceContent`.
#[derive(Clone, Debug)]
pub struct ServiceContent {
    pub root_folder: MoRef,
    pub property_collector: MoRef,
    pub view_manager: Option<MoRef>,
    pub session_manager: MoRef,
    pub search_index: MoRef,
    pub about: About,
}

#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("url", &self.inner.config.url)
            .field("about", &self.inner.content.about)
            .finish()
    }
}

struct Inner {
    http: reqwest::Client,
    config: ConnectConfig,
    content: ServiceContent,
    cookie: Mutex<Option<String>>,
    seen: SeenThumbprint,
    transfer: TransferPolicy,
    /// Serializes logins, so that downloads refused at once renew the session once.
    login: tokio::sync::Mutex<()>,
}

impl Session {
    pub async fn connect(config: ConnectConfig) -> Result<Self> {
        Self::connect_with(config, TransferPolicy::default()).await
    }

    /// Connects with downloads tuned by `transfer`.
    pub async fn connect_with(config: ConnectConfig, transfer: TransferPolicy) -> Result<Self> {
        let (tls_config, seen) = tls::client_config(&config.tls)?;
        // No client-wide total timeout: reqwest would apply it until a body ends, cutting every disk stream.
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls_config)
            .connect_timeout(config.timeout.min(Duration::from_secs(30)))
            .read_timeout(transfer.idle_timeout)
            .build()
            .map_err(|e| Error::TlsConfig(e.to_string()))?;
        let instance = MoRef::new("ServiceInstance", "ServiceInstance");
        let response = post(
            &http,
            &config,
            &seen,
            None,
            "RetrieveServiceContent",
            &instance,
            "",
            "urn:vim25",
        )
        .await?;
        let content = match response.0 {
            Response::Ok(element) => parse_service_content(&element)?,
            Response::Fault(fault) => return Err(fault_error("RetrieveServiceContent", fault)),
        };
        let session = Self {
            inner: Arc::new(Inner {
                http,
                config,
                content,
                cookie: Mutex::new(None),
                seen,
                transfer,
                login: tokio::sync::Mutex::new(()),
            }),
        };
        session.login().await?;
        Ok(session)
    }

    pub fn content(&self) -> &ServiceContent {
        &self.inner.content
    }

    pub fn about(&self) -> &About {
        &self.inner.content.about
    }

    pub fn url(&self) -> &str {
        &self.inner.config.url
    }

    /// The thumbprint the endpoint presented, for users who want to pin it.
    pub fn presented_thumbprint(&self) -> Option<String> {
        self.inner
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|p| p.sha256.clone())
    }

    /// `https://host:port`, for `/folder` URLs.
    pub fn base_url(&self) -> String {
        let url = &self.inner.config.url;
        let after_scheme = url.find("://").map_or(0, |i| i + 3);
        let end = url[after_scheme..]
            .find('/')
            .map_or(url.len(), |i| after_scheme + i);
        url[..end].to_string()
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    pub(crate) fn cookie(&self) -> Option<String> {
        self.inner
            .cookie
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn transfer(&self) -> &TransferPolicy {
        &self.inner.transfer
    }

    pub(crate) async fn relogin(&self) -> Result<()> {
        self.login().await
    }

    /// Logs in again, unless another task already did since `stale` (the cookie a refused request carried).
    pub(crate) async fn relogin_unless_renewed(&self, stale: Option<&str>) -> Result<()> {
        let _one_at_a_time = self.inner.login.lock().await;
        if self.cookie().as_deref() != stale {
            return Ok(());
        }
        self.login().await
    }

    async fn login(&self) -> Result<()> {
        let cfg = &self.inner.config;
        let args = format!(
            "<userName>{}</userName><password>{}</password>",
            escape(&cfg.username),
            escape(&cfg.password)
        );
        // Without the old cookie: a server that still knows that session refuses a second Login on it (vcsim
        // answers InvalidLogin), and a fresh session is what is wanted anyway.
        let action = format!("urn:vim25/{}", self.inner.content.about.api_version);
        let (response, cookie) = post(
            &self.inner.http,
            &self.inner.config,
            &self.inner.seen,
            None,
            "Login",
            &self.inner.content.session_manager.clone(),
            &args,
            &action,
        )
        .await?;
        match response {
            Response::Ok(_) => {
                let cookie = cookie.ok_or_else(|| Error::InvalidResponse {
                    method: "Login".into(),
                    detail: "no vmware_soap_session cookie".into(),
                })?;
                *self.inner.cookie.lock().unwrap_or_else(|p| p.into_inner()) = Some(cookie);
                Ok(())
            }
            Response::Fault(fault) if fault.type_ == "InvalidLogin" => Err(Error::LoginFailed {
                url: cfg.url.clone(),
                user: cfg.username.clone(),
            }),
            Response::Fault(fault) => Err(fault_error("Login", fault)),
        }
    }

    /// Calls `method` on `this`; returns the `<MethodResponse>` element.
    pub async fn call(&self, method: &str, this: &MoRef, args: &str) -> Result<Element> {
        match self.post(method, this, args).await?.0 {
            Response::Ok(element) => Ok(element),
            Response::Fault(fault) if fault.type_ == "NotAuthenticated" => {
                tracing::info!(url = %self.url(), "vSphere session expired; logging in again");
                self.login().await?;
                match self.post(method, this, args).await?.0 {
                    Response::Ok(element) => Ok(element),
                    Response::Fault(fault) => Err(fault_error(method, fault)),
                }
            }
            Response::Fault(fault) => Err(fault_error(method, fault)),
        }
    }

    async fn post(
        &self,
        method: &str,
        this: &MoRef,
        args: &str,
    ) -> Result<(Response, Option<String>)> {
        let action = format!("urn:vim25/{}", self.inner.content.about.api_version);
        let cookie = self.cookie();
        post(
            &self.inner.http,
            &self.inner.config,
            &self.inner.seen,
            cookie.as_deref(),
            method,
            this,
            args,
            &action,
        )
        .await
    }

    /// One keepalive: `CurrentTime`, as govmomi's keepalive sends, which resets the session's idle timer.
    /// An expired session is logged in again (`call`).
    pub async fn keep_alive(&self) -> Result<()> {
        let instance = MoRef::new("ServiceInstance", "ServiceInstance");
        self.call("CurrentTime", &instance, "").await.map(|_| ())
    }

    /// Keeps the session alive every `interval` until the returned guard is dropped. vCenter ends a session
    /// idle for about 30 minutes, and a long disk stream (`/folder`) may not count as activity.
    pub fn keep_alive_every(&self, interval: Duration) -> KeepAlive {
        let session = self.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                match session.keep_alive().await {
                    Ok(()) => tracing::debug!(url = %session.url(), "vSphere session kept alive"),
                    // The next tick tries again; a download refused meanwhile logs in by itself.
                    Err(e) => {
                        tracing::warn!(url = %session.url(), "keeping the vSphere session alive: {e}")
                    }
                }
            }
        });
        KeepAlive { task }
    }

    /// Ends the session on the server. Dropping a session without it leaves the server to expire it.
    pub async fn logout(&self) {
        if self.cookie().is_some() {
            let manager = self.inner.content.session_manager.clone();
            if let Err(e) = self.post("Logout", &manager, "").await {
                tracing::debug!("logout from {}: {e}", self.url());
            }
            *self.inner.cookie.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// A running keepalive; dropping it stops it.
pub struct KeepAlive {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Log out in the background when the last handle goes, if a runtime is there to run it.
        let Some(cookie) = self.cookie.lock().ok().and_then(|mut c| c.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (http, config, seen) = (self.http.clone(), self.config.clone(), self.seen.clone());
        let manager = self.content.session_manager.clone();
        let action = format!("urn:vim25/{}", self.content.about.api_version);
        runtime.spawn(async move {
            let _ = post(
                &http,
                &config,
                &seen,
                Some(&cookie),
                "Logout",
                &manager,
                "",
                &action,
            )
            .await;
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn post(
    http: &reqwest::Client,
    config: &ConnectConfig,
    seen: &SeenThumbprint,
    cookie: Option<&str>,
    method: &str,
    this: &MoRef,
    args: &str,
    action: &str,
) -> Result<(Response, Option<String>)> {
    #[cfg(feature = "chaos")]
    if let Some(injected) = crate::chaos::before_call(method) {
        return match injected {
            crate::chaos::Injected::Unreachable => Err(Error::Unreachable {
                url: config.url.clone(),
                detail: format!("chaos: injected connection failure in {method}"),
            }),
            crate::chaos::Injected::Fault(fault) => Ok((
                Response::Fault(Fault {
                    message: format!("chaos: injected {fault} in {method}"),
                    type_: fault,
                    detail: None,
                }),
                None,
            )),
        };
    }
    let mut request = http
        .post(&config.url)
        .timeout(config.timeout)
        .header("Content-Type", "text/xml; charset=utf-8")
        .header("SOAPAction", action)
        .body(soap::envelope(method, this, args));
    if let Some(cookie) = cookie {
        request = request.header("Cookie", cookie);
    }
    let response = request
        .send()
        .await
        .map_err(|e| transport_error(config, seen, &e))?;
    let status = response.status();
    let cookie = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("vmware_soap_session="))
        .map(|v| v.split(';').next().unwrap_or(v).to_string());
    let body = bounded_text(response, method, config, seen).await?;
    // Faults come with HTTP 500 and a SOAP body; other errors have no SOAP body.
    match soap::parse_response(method, &body) {
        Ok(parsed) => Ok((parsed, cookie)),
        Err(_) if !status.is_success() => Err(Error::Http {
            url: config.url.clone(),
            what: method.to_string(),
            status: status.as_u16(),
        }),
        Err(e) => Err(Error::InvalidResponse {
            method: method.to_string(),
            detail: e.to_string(),
        }),
    }
}

/// No vSphere answer comes near this (a page of 500 VMs' properties is a few MiB): a hostile endpoint's endless
/// body stops here instead of filling the controller's memory.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// The response body, read to its end but never past [`MAX_BODY_BYTES`].
async fn bounded_text(
    mut response: reqwest::Response,
    method: &str,
    config: &ConnectConfig,
    seen: &SeenThumbprint,
) -> Result<String> {
    let too_big = || Error::InvalidResponse {
        method: method.to_string(),
        detail: format!(
            "the answer is larger than {} MiB; no vSphere endpoint sends that much",
            MAX_BODY_BYTES >> 20
        ),
    };
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY_BYTES as u64)
    {
        return Err(too_big());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| transport_error(config, seen, &e))?
    {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8(body)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

fn transport_error(config: &ConnectConfig, seen: &SeenThumbprint, error: &reqwest::Error) -> Error {
    let url = config.url.clone();
    if error.is_timeout() {
        return Error::Timeout {
            url,
            seconds: config.timeout.as_secs(),
        };
    }
    let presented = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let (TlsMode::Thumbprint(expected), Some(presented)) = (&config.tls, &presented) {
        match Pin::parse(expected) {
            Some(Pin::Sha1(given)) => {
                return Error::Sha1Thumbprint {
                    url,
                    matches: given == presented.sha1,
                    given,
                    presented_sha256: presented.sha256.clone(),
                };
            }
            Some(Pin::Sha256(expected)) if expected != presented.sha256 => {
                return Error::ThumbprintMismatch {
                    url,
                    expected,
                    presented: presented.sha256.clone(),
                };
            }
            _ => {}
        }
    }
    let chain = error_chain(error);
    if chain.contains("certificate")
        || chain.contains("InvalidCertificate")
        || chain.contains("UnknownIssuer")
    {
        return Error::Tls { url, detail: chain };
    }
    Error::Unreachable { url, detail: chain }
}

/// The whole cause chain as text, including causes that `io::Error` keeps inside itself.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut next = error.source();
    while let Some(cause) = next {
        parts.push(cause.to_string());
        if let Some(inner) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            parts.push(format!("{inner:?}"));
        }
        next = cause.source();
    }
    parts.dedup();
    parts.join(": ")
}

pub(crate) fn fault_error(method: &str, fault: Fault) -> Error {
    Error::Fault {
        method: method.to_string(),
        fault: fault.type_,
        message: fault.message,
    }
}

fn parse_service_content(response: &Element) -> Result<ServiceContent> {
    let invalid = |what: &str| Error::InvalidResponse {
        method: "RetrieveServiceContent".into(),
        detail: format!("no {what}"),
    };
    let rv = response
        .child("returnval")
        .ok_or_else(|| invalid("returnval"))?;
    let moref = |name: &str| rv.child(name).and_then(MoRef::from_element);
    let about = rv.child("about").ok_or_else(|| invalid("about"))?;
    Ok(ServiceContent {
        root_folder: moref("rootFolder").ok_or_else(|| invalid("rootFolder"))?,
        property_collector: moref("propertyCollector")
            .ok_or_else(|| invalid("propertyCollector"))?,
        view_manager: moref("viewManager"),
        session_manager: moref("sessionManager").ok_or_else(|| invalid("sessionManager"))?,
        search_index: moref("searchIndex").ok_or_else(|| invalid("searchIndex"))?,
        about: About {
            api_type: about.text_at(&["apiType"]).unwrap_or_default().to_string(),
            api_version: about.text_at(&["apiVersion"]).unwrap_or("8.0").to_string(),
            full_name: about.text_at(&["fullName"]).unwrap_or_default().to_string(),
            instance_uuid: about.text_at(&["instanceUuid"]).map(String::from),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_content_of_vcenter_and_esxi() {
        for (file, api_type, collector) in [
            (
                "service-content-vcenter.xml",
                "VirtualCenter",
                "propertyCollector",
            ),
            (
                "service-content-esx.xml",
                "HostAgent",
                "ha-property-collector",
            ),
        ] {
            let body = std::fs::read_to_string(format!(
                "{}/tests/fixtures/{file}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap();
            let Response::Ok(element) =
                soap::parse_response("RetrieveServiceContent", &body).unwrap()
            else {
                panic!("{file} is a fault");
            };
            let content = parse_service_content(&element).unwrap();
            assert_eq!(content.about.api_type, api_type);
            assert_eq!(content.property_collector.value, collector);
        }
    }

    #[test]
    fn the_password_is_never_printed() {
        let config = ConnectConfig {
            url: "https://vc/sdk".into(),
            username: "u".into(),
            password: "canary-secret".into(),
            tls: TlsMode::InsecureSkipVerify,
            timeout: Duration::from_secs(1),
        };
        assert!(!format!("{config:?}").contains("canary-secret"));
    }
}
