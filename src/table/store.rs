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
    let store = builder.with_bucket_name(bucket).build().map_err(|e| {
        Error::Invalid(format!(
            "cannot configure S3 for \"{location}\": {e}. S3 is configured by the environment variables \
                 AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ALLOW_HTTP"
        ))
    })?;
    let path = Path::from_url_path(url.path())
        .map_err(|e| Error::Invalid(format!("\"{location}\": invalid object path: {e}")))?;
    let store_url = Url::parse(&format!("s3://{bucket}"))
        .map_err(|e| Error::Invalid(format!("\"{location}\": invalid bucket name \"{bucket}\": {e}")))?;
    Ok(Opened {
        store: Arc::new(store),
        store_url,
        path,
    })
}

#[cfg(not(feature = "s3"))]
fn open_s3(location: &str, _url: &Url, _options: &[(String, String)]) -> Result<Opened> {
    Err(Error::Invalid(format!(
        "\"{location}\": this ingot was built without S3 support; rebuild with `cargo build --features s3` \
         (make build enables it), or use a local path or file:// URL"
    )))
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
