//! What the CDI stand-in's importer reads: an `http` or `s3` source, with the Secret and CA bundle it names, and
//! an S3 refusal told as CDI's importer tells it.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use kube::{Api, Client, ResourceExt};
pub(super) type ByteStream = futures::stream::BoxStream<'static, anyhow::Result<bytes::Bytes>>;

/// The source's bytes and length: `http` (Basic auth from `secretRef`: accessKeyId/secretKey, CA from
/// `certConfigMap`) or `s3` (`url` = endpoint/bucket/key, keys from `secretRef`). With `wrong_key`, the secret
/// key presented is not the Secret's (the lab's `refuse-imports`).
pub(super) async fn open_source(
    client: &Client,
    dv: &DynamicObject,
    wrong_key: bool,
) -> anyhow::Result<(ByteStream, Option<u64>)> {
    let source = &dv.data["spec"]["source"];
    let ns = dv.namespace().unwrap_or_default();
    let secret_value = |secret: Option<Secret>, key: &str| {
        if wrong_key && key == "secretKey" {
            return Some("not-the-secret-key".to_string());
        }
        secret.and_then(|s| s.data).and_then(|d| {
            d.get(key)
                .map(|v| String::from_utf8_lossy(&v.0).to_string())
        })
    };
    let secret = match source["http"]["secretRef"]
        .as_str()
        .or(source["s3"]["secretRef"].as_str())
    {
        Some(name) => Some(
            Api::<Secret>::namespaced(client.clone(), &ns)
                .get(name)
                .await?,
        ),
        None => None,
    };
    if let Some(url) = source["s3"]["url"].as_str() {
        use object_store::ObjectStoreExt;
        let parsed = reqwest::Url::parse(url)?;
        let endpoint = format!(
            "{}://{}",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default()
        ) + &parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
        let path = parsed.path().trim_start_matches('/');
        let (bucket, key) = path
            .split_once('/')
            .ok_or_else(|| anyhow::anyhow!("s3 url {url} has no bucket and key"))?;
        // As CDI's importer: a disk's download has no deadline, only a stall does.
        let mut options = object_store::ClientOptions::new()
            .with_timeout_disabled()
            .with_read_timeout(Duration::from_secs(60));
        for pem in trusted_pems(client, &ns, &source["s3"]).await? {
            for cert in object_store::Certificate::from_pem_bundle(pem.as_bytes())? {
                options = options.with_root_certificate(cert);
            }
        }
        let store = object_store::aws::AmazonS3Builder::new()
            // First: it replaces the client options `with_allow_http` sets.
            .with_client_options(options)
            .with_endpoint(&endpoint)
            .with_allow_http(endpoint.starts_with("http://"))
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_virtual_hosted_style_request(false)
            .with_access_key_id(secret_value(secret.clone(), "accessKeyId").unwrap_or_default())
            .with_secret_access_key(secret_value(secret, "secretKey").unwrap_or_default())
            .build()?;
        let found = store
            .get(&object_store::path::Path::from(key))
            .await
            .map_err(|e| anyhow::anyhow!(s3_refusal(bucket, key, &format!("{e:#}"))))?;
        let size = found.meta.size;
        return Ok((
            found.into_stream().map(|c| c.map_err(Into::into)).boxed(),
            Some(size),
        ));
    }
    let http = &source["http"];
    let url = http["url"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the lab's CDI supports the http and s3 sources"))?;
    let mut builder = reqwest::Client::builder();
    for pem in trusted_pems(client, &ns, http).await? {
        for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())? {
            builder = builder.add_root_certificate(cert);
        }
    }
    let mut request = builder.build()?.get(url);
    if secret.is_some() {
        request = request.basic_auth(
            secret_value(secret.clone(), "accessKeyId").unwrap_or_default(),
            secret_value(secret, "secretKey"),
        );
    }
    let response = request.send().await?.error_for_status()?;
    let total = response.content_length();
    Ok((
        response
            .bytes_stream()
            .map(|c| c.map_err(Into::into))
            .boxed(),
        total,
    ))
}

/// The PEM files of the source's `certConfigMap`: CDI mounts the whole ConfigMap into the importer and trusts
/// every file in it. A ConfigMap not there (yet) fails the import, as the importer pod cannot start without it.
async fn trusted_pems(
    client: &Client,
    ns: &str,
    source: &serde_json::Value,
) -> anyhow::Result<Vec<String>> {
    let Some(name) = source["certConfigMap"].as_str() else {
        return Ok(vec![]);
    };
    let config = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await?;
    Ok(config.data.unwrap_or_default().into_values().collect())
}

/// What CDI's importer says when S3 refuses its GET (the AWS SDK's request failure, whose lines the termination
/// message joins): `Unable to connect to s3 data source: could not get s3 object: "bucket/key": Code: Message
/// \tstatus code: N, request id: R, host id: H`. `error` is the client's, with the response's XML body in it;
/// without one, it is told as it is.
pub(super) fn s3_refusal(bucket: &str, key: &str, error: &str) -> String {
    let field = |tag: &str| {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        let start = error.find(&open)? + open.len();
        let end = start + error[start..].find(&close)?;
        Some(error[start..end].to_string())
    };
    let status = error
        .split("status code: ")
        .nth(1)
        .and_then(|rest| rest.get(..3))
        .unwrap_or("");
    let cause = match (field("Code"), field("Message")) {
        (Some(code), Some(message)) => format!(
            "{code}: {message} \tstatus code: {status}, request id: {}, host id: {}",
            field("RequestId").unwrap_or_default(),
            field("HostId").unwrap_or_default()
        ),
        _ => error.to_string(),
    };
    format!(
        "Unable to connect to s3 data source: could not get s3 object: \"{bucket}/{key}\": {cause}"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_s3_refusal_reads_as_cdis_importer_tells_it() {
        let error = "Error performing GET https://10.88.0.1:1/b/k in 2ms - Server returned non-2xx status code: \
            403 Forbidden: <?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code>\
            <Message>The request signature we calculated does not match.</Message><Key>k</Key>\
            <RequestId>18EE9</RequestId><HostId>c9c6</HostId></Error>";
        assert_eq!(
            super::s3_refusal("b", "k", error),
            "Unable to connect to s3 data source: could not get s3 object: \"b/k\": SignatureDoesNotMatch: The \
             request signature we calculated does not match. \tstatus code: 403, request id: 18EE9, host id: c9c6"
        );
        assert!(
            super::s3_refusal("b", "k", "connection refused")
                .ends_with("\"b/k\": connection refused")
        );
    }
}
