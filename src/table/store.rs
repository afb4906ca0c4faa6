//! Object stores for URLs: the lake's (`--lake s3://bucket/prefix`) and those of landing files
//! given as URLs (`ingot ingest bookings s3://bucket/landing/x.csv`, `--landing s3://...`).
//!
//! S3 needs the cargo feature `s3` (object_store's `aws` support); a build without it refuses
//! `s3://` with a message saying so. The S3 client is configured from the usual environment
//! variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ALLOW_HTTP`, ... as read by `AmazonS3Builder::from_env`). Conditional puts stay at
//! object_store's default (`If-None-Match` / `If-Match` on the ETag), which the commit protocol of
//! [`crate::table::lake`] depends on.
//!
//! [`Uploads`] lists (one signed request object_store has no call for) and aborts a bucket's
//! incomplete multipart uploads, for gc.
//!
//! Hazard: an S3-compatible store that ignores `If-None-Match: *` silently breaks the
//! one-commit-per-slot guarantee (docs/guide.md#s3-lakes lists which stores honour it).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;
use url::Url;

use crate::error::{Error, Result};

/// URL schemes ingot can read and write, for messages.
pub const SUPPORTED: &str = "a local path, file:// or s3://bucket/prefix";

/// An object store opened for a URL: the store, the URL of the store itself (for DataFusion's
/// object-store registry, e.g. `s3://bucket`) and the URL's path inside the store.
pub struct Opened {
    pub store: Arc<dyn ObjectStore>,
    pub store_url: Url,
    pub path: Path,
    /// The store's incomplete multipart uploads (S3 only).
    pub uploads: Option<Arc<Uploads>>,
}

/// Does `location` carry a URL scheme (`scheme://...`) other than `file://`?
pub fn is_remote(location: &str) -> bool {
    location
        .split_once("://")
        .is_some_and(|(scheme, _)| scheme != "file" && !scheme.is_empty() && !scheme.contains('/'))
}

/// Open the object store of a remote URL (`s3://bucket/key`), configured from the environment.
pub fn open(location: &str) -> Result<Opened> {
    open_with(location, &[])
}

/// [`open`] with configuration on top of the environment's: object_store's keys such as
/// `aws_endpoint`, `aws_access_key_id`, `aws_region`, `aws_allow_http` (for embedding ingot and
/// for tests, which should not change their process environment).
pub fn open_with(location: &str, options: &[(String, String)]) -> Result<Opened> {
    install_crypto();
    let url = Url::parse(location)
        .map_err(|e| Error::Invalid(format!("\"{location}\" is not a valid URL ({e}); use {SUPPORTED}")))?;
    match url.scheme() {
        "s3" | "s3a" => open_s3(location, &url, options),
        other => Err(Error::Invalid(format!(
            "\"{location}\": the URL scheme \"{other}://\" is not supported; use {SUPPORTED}"
        ))),
    }
}

#[cfg(feature = "s3")]
fn open_s3(location: &str, url: &Url, options: &[(String, String)]) -> Result<Opened> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

    let bucket = url
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| Error::Invalid(format!("\"{location}\" names no bucket: use s3://<bucket>/<prefix>")))?;
    let mut builder = AmazonS3Builder::from_env();
    for (key, value) in options {
        let key: AmazonS3ConfigKey = key
            .parse()
            .map_err(|e| Error::Invalid(format!("S3 option \"{key}\" for \"{location}\": {e}")))?;
        builder = builder.with_config(key, value);
    }
    let builder = builder.with_bucket_name(bucket);
    let store = builder.clone().build().map_err(|e| {
        Error::Invalid(format!(
            "cannot configure S3 for \"{location}\": {e}. S3 is configured by the environment variables \
                 AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ALLOW_HTTP"
        ))
    })?;
    let path = Path::from_url_path(url.path())
        .map_err(|e| Error::Invalid(format!("\"{location}\": invalid object path: {e}")))?;
    let store_url = Url::parse(&format!("s3://{bucket}"))
        .map_err(|e| Error::Invalid(format!("\"{location}\": invalid bucket name \"{bucket}\": {e}")))?;
    let store = Arc::new(store);
    let uploads = Uploads::new(&builder, store.clone(), bucket)?;
    Ok(Opened {
        store,
        store_url,
        path,
        uploads: Some(Arc::new(uploads)),
    })
}

#[cfg(not(feature = "s3"))]
fn open_s3(location: &str, _url: &Url, _options: &[(String, String)]) -> Result<Opened> {
    Err(Error::Invalid(format!(
        "\"{location}\": this ingot was built without S3 support; rebuild with `cargo build --features s3` \
         (make build enables it), or use a local path or file:// URL"
    )))
}

/// The incomplete multipart uploads of an S3 lake, which object_store 0.13 can abort but not list:
/// listing is one signed `ListMultipartUploads` request (SigV4 by object_store's
/// [`object_store::aws::AwsAuthorizer`], sent through its HTTP client), aborting is
/// [`object_store::multipart::MultipartStore::abort_multipart`].
#[derive(Debug)]
pub struct Uploads {
    #[cfg(feature = "s3")]
    s3: Arc<object_store::aws::AmazonS3>,
    /// The bucket's URL: `<endpoint>/<bucket>`, or the endpoint itself for virtual-hosted requests.
    #[cfg(feature = "s3")]
    bucket_url: String,
    #[cfg(feature = "s3")]
    region: String,
    #[cfg(feature = "s3")]
    client: object_store::client::HttpClient,
}

/// One incomplete multipart upload: its object key (in the bucket), id and start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub key: String,
    pub id: String,
    pub initiated: chrono::DateTime<chrono::Utc>,
}

#[cfg(feature = "s3")]
impl Uploads {
    fn new(
        builder: &object_store::aws::AmazonS3Builder,
        s3: Arc<object_store::aws::AmazonS3>,
        bucket: &str,
    ) -> Result<Uploads> {
        use object_store::ClientConfigKey;
        use object_store::aws::AmazonS3ConfigKey as K;
        use object_store::client::HttpConnector;

        let get = |k: K| builder.get_config_value(&k).filter(|v| !v.is_empty());
        let region = get(K::Region).unwrap_or_else(|| "us-east-1".to_string());
        let virtual_hosted = get(K::VirtualHostedStyleRequest).is_some_and(|v| v == "true");
        let bucket_url = match (get(K::Endpoint), virtual_hosted) {
            (Some(e), true) => e.trim_end_matches('/').to_string(),
            (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let allow_http = get(K::Client(ClientConfigKey::AllowHttp)).is_some_and(|v| v == "true");
        let options = object_store::ClientOptions::new().with_allow_http(allow_http);
        let client = object_store::client::ReqwestConnector::default()
            .connect(&options)
            .map_err(|e| Error::Invalid(format!("S3 client for {bucket_url}: {e}")))?;
        Ok(Uploads {
            s3,
            bucket_url,
            region,
            client,
        })
    }

    /// Every incomplete multipart upload whose key starts with `prefix`.
    pub async fn list(&self, prefix: &str) -> Result<Vec<Upload>> {
        let mut out = Vec::new();
        let mut markers: Option<(String, String)> = None;
        loop {
            let mut url = url::Url::parse(&self.bucket_url)
                .map_err(|e| Error::Invalid(format!("S3 bucket URL {}: {e}", self.bucket_url)))?;
            {
                let mut q = url.query_pairs_mut();
                q.append_pair("uploads", "").append_pair("prefix", prefix);
                if let Some((key, id)) = &markers {
                    q.append_pair("key-marker", key).append_pair("upload-id-marker", id);
                }
            }
            let body = self.get(&url).await?;
            for block in elements(&body, "Upload") {
                let (Some(key), Some(id), Some(at)) = (
                    element(block, "Key"),
                    element(block, "UploadId"),
                    element(block, "Initiated"),
                ) else {
                    continue;
                };
                let Ok(initiated) = chrono::DateTime::parse_from_rfc3339(&at) else {
                    continue;
                };
                out.push(Upload {
                    key,
                    id,
                    initiated: initiated.with_timezone(&chrono::Utc),
                });
            }
            match (
                element(&body, "IsTruncated").as_deref(),
                element(&body, "NextKeyMarker"),
                element(&body, "NextUploadIdMarker"),
            ) {
                (Some("true"), Some(key), Some(id)) if markers.as_ref() != Some(&(key.clone(), id.clone())) => {
                    markers = Some((key, id))
                }
                _ => return Ok(out),
            }
        }
    }

    /// One signed GET; the response body, or an error naming the URL and the status.
    async fn get(&self, url: &url::Url) -> Result<String> {
        use object_store::client::{HttpRequest, HttpRequestBody};

        let credential = self
            .s3
            .credentials()
            .get_credential()
            .await
            .map_err(|e| explain(url.as_str(), e))?;
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.uri_mut() = url
            .as_str()
            .parse()
            .map_err(|e| Error::Invalid(format!("S3 request URL {url}: {e}")))?;
        object_store::aws::AwsAuthorizer::new(&credential, "s3", &self.region).authorize(&mut request, None);
        let fail = |e: &dyn std::fmt::Display| Error::Invalid(format!("listing incomplete uploads, {url}: {e}"));
        let response = self.client.execute(request).await.map_err(|e| fail(&e))?;
        let status = response.status();
        let body = response.into_body().bytes().await.map_err(|e| fail(&e))?;
        let text = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Err(fail(&format!("HTTP {status}: {text}")));
        }
        Ok(text)
    }

    /// Abort the upload `id` of `key`.
    pub async fn abort(&self, key: &str, id: &str) -> Result<()> {
        use object_store::multipart::MultipartStore;
        let path = Path::parse(key).map_err(|e| Error::Invalid(format!("S3 key \"{key}\": {e}")))?;
        self.s3
            .abort_multipart(&path, &id.to_string())
            .await
            .map_err(|e| explain(&format!("{}/{key}", self.bucket_url), e))
    }
}

#[cfg(not(feature = "s3"))]
impl Uploads {
    /// Without S3 support no lake has uploads.
    pub async fn list(&self, _prefix: &str) -> Result<Vec<Upload>> {
        Ok(Vec::new())
    }

    pub async fn abort(&self, _key: &str, _id: &str) -> Result<()> {
        Ok(())
    }
}

/// The contents of every `<tag>…</tag>` in `xml`.
#[cfg(feature = "s3")]
fn elements<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

/// The text of the first `<tag>…</tag>` in `xml`, unescaped.
#[cfg(feature = "s3")]
fn element(xml: &str, tag: &str) -> Option<String> {
    let raw = elements(xml, tag).into_iter().next()?;
    Some(
        raw.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

/// Explain a storage error of `url` for people: a missing bucket, missing or refused credentials
/// and plain-HTTP endpoints get a message that says what to set; everything else keeps the
/// object store's own message, prefixed with the URL.
pub fn explain(url: &str, e: object_store::Error) -> Error {
    let text = chain(&e);
    let bucket_hint =
        "create the bucket first (e.g. `aws s3 mb s3://<bucket>`) or check AWS_ENDPOINT_URL and AWS_REGION";
    let creds_hint = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary \
                      credentials), or run where an instance or container role provides them";
    if text.contains("NoSuchBucket") {
        return Error::Invalid(format!("{url}: the bucket does not exist: {bucket_hint}"));
    }
    match &e {
        object_store::Error::Unauthenticated { .. } | object_store::Error::PermissionDenied { .. } => {
            return Error::Invalid(format!(
                "{url}: access refused by the object store ({text}): {creds_hint}"
            ));
        }
        _ => {}
    }
    if text.contains("InvalidAccessKeyId") || text.contains("SignatureDoesNotMatch") || text.contains("AccessDenied") {
        return Error::Invalid(format!(
            "{url}: access refused by the object store ({text}): {creds_hint}"
        ));
    }
    // No keys in the environment: object_store asks the instance metadata service, which is
    // absent (or refused) off EC2.
    if text.to_ascii_lowercase().contains("credential")
        || text.contains("/latest/api/token")
        || text.contains("/latest/meta-data/")
    {
        return Error::Invalid(format!(
            "{url}: no S3 credentials: none in the environment and none from an instance role ({text}): {creds_hint}"
        ));
    }
    if text.contains("HTTP") && text.contains("not allowed") || text.contains("URL scheme is not allowed") {
        return Error::Invalid(format!(
            "{url}: the endpoint is plain http: set AWS_ALLOW_HTTP=true to allow it ({text})"
        ));
    }
    Error::Storage {
        url: url.to_string(),
        source: e,
    }
}

/// An error and its causes on one line.
fn chain(e: &object_store::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        source = s.source();
    }
    out
}

/// Make ring rustls's process-wide crypto provider (once; later calls change nothing). Both ring
/// (tonic, object_store's HTTPS client) and aws-lc-rs (the Delta kernel's) are linked, so rustls
/// cannot pick one by itself and would panic at the first TLS handshake.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
