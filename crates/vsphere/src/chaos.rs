//! Fault injection (feature `chaos`, for `ferry lab chaos` only): one process-wide hook consulted before every
//! SOAP call, which may answer the call itself with an injected failure instead of sending it.

use std::sync::OnceLock;

/// What the hook makes a call return instead of the endpoint's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Injected {
    /// The connection failed before an answer (transient).
    Unreachable,
    /// The endpoint answered with this vSphere fault type (for example `NoPermission`).
    Fault(String),
}

type Hook = Box<dyn Fn(&str) -> Option<Injected> + Send + Sync>;

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Installs the hook, called with each SOAP method name; the first installation wins.
pub fn install(hook: impl Fn(&str) -> Option<Injected> + Send + Sync + 'static) {
    let _ = HOOK.set(Box::new(hook));
}

pub(crate) fn before_call(method: &str) -> Option<Injected> {
    HOOK.get().and_then(|hook| hook(method))
}
