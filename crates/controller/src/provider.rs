//! Providers: connect, and report in status whether the endpoint answers, what it is, and how it was trusted.

use std::sync::Arc;
use std::time::Duration;

use ferry_api::{Provider, ProviderStatus};
use ferry_kube::conditions::{ConditionUpdate, set_condition};
use ferry_kube::status::apply_guarded;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};

use crate::children::MANAGER;
use crate::context::Context;
use crate::error::{Failure, Result};

const RECHECK: Duration = Duration::from_secs(300);

pub async fn reconcile(provider: Arc<Provider>, ctx: Arc<Context>) -> Result<Action> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let before = provider.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let generation = provider.metadata.generation;
    let connected = ctx.session(&provider).await;
    if connected.is_err() {
        ctx.forget_session(&provider);
    }
    let (ready, reason, message) = match &connected {
        Ok(session) => {
            let about = session.about();
            status.api_type = Some(about.api_type.clone());
            status.api_version = Some(about.api_version.clone());
            status.observed_thumbprint = session.presented_thumbprint();
            (
                true,
                "Connected".to_string(),
                format!("{} ({})", about.full_name, about.api_type),
            )
        }
        Err(e) => (false, e.reason.to_string(), e.message.clone()),
    };
    set_condition(
        &mut status.conditions,
        ConditionUpdate {
            type_: "Ready",
            status: ready,
            reason: &reason,
            message,
            observed_generation: generation,
        },
        &now,
    );
    let insecure = provider.spec.tls.insecure_skip_verify == Some(true);
    set_condition(
        &mut status.conditions,
        ConditionUpdate {
            type_: "InsecureTLS",
            status: insecure,
            reason: if insecure {
                "CertificateNotVerified"
            } else {
                "CertificateVerified"
            },
            message: if insecure {
                "insecureSkipVerify is set: anyone on the path can read the credentials; pin the thumbprint instead".into()
            } else {
                "the endpoint's certificate is verified".into()
            },
            observed_generation: generation,
        },
        &now,
    );
    status.observed_generation = generation;
    if status != before {
        write(&ctx, &provider, &status).await?;
    }
    ctx.succeeded(&backoff_key(&provider));
    Ok(Action::requeue(if ready {
        RECHECK
    } else {
        Duration::from_secs(30)
    }))
}

async fn write(ctx: &Context, provider: &Provider, status: &ProviderStatus) -> Result<(), Failure> {
    let api: Api<Provider> = Api::namespaced(
        ctx.client.clone(),
        &provider.namespace().unwrap_or_default(),
    );
    apply_guarded(&api, provider, status, MANAGER).await?;
    Ok(())
}

/// A failed reconcile (a refused status write, the API server busy) is tried again after 1 s, doubling to a
/// minute, as migrations are: a flat 15 s left the Provider's status stale, and wrote it long after the
/// migrations it served had ended (the chaos suite's "quiet after the end" oracle caught it).
pub fn error_policy(provider: Arc<Provider>, error: &Failure, ctx: Arc<Context>) -> Action {
    tracing::warn!(class = ?error.class, reason = %error.reason, "provider: {error}");
    Action::requeue(ctx.failed(&backoff_key(&provider)))
}

/// Its own key in the error backoff, apart from any migration's.
fn backoff_key(provider: &Provider) -> String {
    format!(
        "provider {}/{}",
        provider.namespace().unwrap_or_default(),
        provider.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_failed_provider_reconcile_is_retried_in_a_second_then_backs_off() {
        // A client that is never used: building it opens no connection.
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("a URL"),
        ))
        .expect("a client");
        let ctx = Arc::new(Context::new(client, Default::default(), Default::default()));
        let provider: Arc<Provider> = Arc::new(
            serde_json::from_value(json!({
                "apiVersion": ferry_api::API_VERSION, "kind": "Provider",
                "metadata": {"name": "vc", "namespace": "ns"},
                "spec": {"type": "vsphere", "url": "https://vc/sdk", "secretRef": {"name": "s"},
                    "tls": {"insecureSkipVerify": true}},
            }))
            .expect("a Provider"),
        );
        let failure = Failure::transient(ferry_api::Reason::APIServerBusy, "injected");
        let waits: Vec<Action> = (0..3)
            .map(|_| error_policy(provider.clone(), &failure, ctx.clone()))
            .collect();
        assert_eq!(
            waits,
            [1, 2, 4].map(|s| Action::requeue(Duration::from_secs(s)))
        );
        ctx.succeeded(&backoff_key(&provider));
        assert_eq!(
            error_policy(provider, &failure, ctx),
            Action::requeue(Duration::from_secs(1))
        );
    }
}
