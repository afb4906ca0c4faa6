//! One HTTP exchange of a pull, sent again while it fails for a passing cause.
//!
//! A 429, a 5xx, a timeout (`api.timeout` bounds the whole exchange, body included), a refused
//! or broken connection, or a body cut short is retried up to `retry.max_attempts` sends in all,
//! waiting `backoff` doubled each time up to `max_backoff`, or what `Retry-After` asks (at most
//! [`MAX_RETRY_AFTER`]). Any other 4xx fails the run at once for its content, saying which URL
//! (secrets redacted) and what to check. Requests are paced to `rate_limit`; every wait, send
//! and byte is counted in [`Counters`] for the run log.

use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::error::{Error, Result};
use crate::ingest::pull::secrets::{Credentials, Redactor, Secret};
use crate::spec::contract::api::{Api, Method};

/// The longest `Retry-After` honoured; a server asking for more fails the pull (transient).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// The largest response body taken (a page); larger fails the pull for its content.
pub const MAX_BODY: usize = 512 << 20;

/// What the exchanges of a pull cost (the run log's `pull_*` columns).
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub requests: i64,
    pub retries: i64,
    pub bytes: i64,
    pub waited: Duration,
}

/// A response with a 2xx or 304 status, body read whole.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The HTTP side of one pull: the client, the credentials and what was spent.
pub struct Client {
    http: reqwest::Client,
    source: String,
    creds: Credentials,
    pub redact: Redactor,
    pub counters: Counters,
    retry: crate::spec::contract::api::Retry,
    pace: Option<Duration>,
    timeout: Duration,
    last_send: Option<Instant>,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// An OAuth2 access token and when it stops being used.
    token: Option<(Secret, Option<Instant>)>,
}

/// Why one send did not give a usable response.
enum Failed {
    /// Worth another send; the server may say when.
    Retry { why: String, after: Option<Duration> },
    /// The run fails now.
    Stop(Error),
}

impl Client {
    pub fn new(source: &str, api: &Api, creds: Credentials) -> Result<Client> {
        crate::table::store::install_crypto();
        let http = reqwest::Client::builder()
            .user_agent(concat!("ingot/", env!("CARGO_PKG_VERSION")))
            // at most 5 redirects, all on the first request's origin: a key header or query
            // parameter must never follow a redirect to another host
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let same = attempt
                    .previous()
                    .first()
                    .is_none_or(|f| f.origin() == attempt.url().origin());
                if !same {
                    let to = attempt.url().origin().ascii_serialization();
                    attempt.error(format!("a redirect to another origin ({to}) is not followed"))
                } else if attempt.previous().len() > 5 {
                    attempt.error("more than 5 redirects")
                } else {
                    attempt.follow()
                }
            }))
            .connect_timeout(api.timeout.min(Duration::from_secs(30)))
            .build()
            .map_err(|e| Error::Internal(format!("cannot build the HTTP client: {e}")))?;
        let mut headers = Vec::new();
        for (name, value) in &api.headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::RunFailed(format!("{source}: api.headers: \"{name}\" is not a header name")))?;
            let v = HeaderValue::from_str(value).map_err(|_| {
                Error::RunFailed(format!("{source}: api.headers.{name}: the value is not a header value"))
            })?;
            headers.push((n, v));
        }
        if !headers.iter().any(|(n, _)| n == reqwest::header::ACCEPT) {
            headers.push((reqwest::header::ACCEPT, HeaderValue::from_static("application/json")));
        }
        Ok(Client {
            http,
            source: source.to_string(),
            redact: Redactor::new(&creds),
            creds,
            counters: Counters::default(),
            retry: api.retry,
            pace: api
                .rate_limit
                .map(|r| Duration::from_secs_f64(1.0 / r.requests_per_second)),
            timeout: api.timeout,
            last_send: None,
            headers,
            token: None,
        })
    }

    /// `url` with the credentials' query parameter added (an `api_key` with `in: query`).
    pub fn with_key(&self, url: &url::Url) -> url::Url {
        let mut u = url.clone();
        if let Credentials::ApiKeyQuery { name, key } = &self.creds
            && !u.query_pairs().any(|(k, _)| k == name.as_str())
        {
            u.query_pairs_mut().append_pair(name, key.expose());
        }
        u
    }

    /// Send one request (retried as the module says) and return its 2xx or 304 response.
    pub async fn send(
        &mut self,
        method: &Method,
        url: &url::Url,
        body: Option<&serde_json::Value>,
        extra: &HeaderMap,
    ) -> Result<Response> {
        let url = self.with_key(url);
        let shown = format!("{} {}", method_name(method), self.redact.url(&url));
        let mut refreshed = false;
        let mut attempt = 1u32;
        loop {
            match self.once(method, &url, body, extra, &shown).await {
                Ok(r) => return Ok(r),
                Err(Failed::Stop(Error::Invalid(why)))
                    if !refreshed && matches!(self.creds, Credentials::OAuth2 { .. }) =>
                {
                    // a 401 with an OAuth2 token: fetch a new token once and send again
                    crate::tell!("{}: {why}; fetching a new access token", self.source);
                    self.token = None;
                    refreshed = true;
                }
                Err(Failed::Stop(Error::Invalid(why))) => return Err(Error::RunFailed(why)),
                Err(Failed::Stop(e)) => return Err(e),
                Err(Failed::Retry { why, after }) => {
                    if attempt >= self.retry.max_attempts {
                        return Err(Error::RunInterrupted(format!(
                            "{}: {shown}: {why}; gave up after {attempt} attempt{} (api.retry.max_attempts); nothing \
                             was published, the next `ingot pull` or `ingot run` tries again",
                            self.source,
                            if attempt == 1 { "" } else { "s" }
                        )));
                    }
                    let backoff = self
                        .retry
                        .backoff
                        .saturating_mul(1u32 << (attempt - 1).min(20))
                        .min(self.retry.max_backoff);
                    let wait = match after {
                        Some(a) if a > MAX_RETRY_AFTER => {
                            return Err(Error::RunInterrupted(format!(
                                "{}: {shown}: {why}; the server asks to wait {}s, more than ingot waits ({}s); \
                                 nothing was published, pull again later",
                                self.source,
                                a.as_secs(),
                                MAX_RETRY_AFTER.as_secs()
                            )));
                        }
                        Some(a) => a,
                        None => backoff,
                    };
                    crate::tell!(
                        "{}: {shown}: {why}; attempt {} of {} in {}",
                        self.source,
                        attempt + 1,
                        self.retry.max_attempts,
                        crate::spec::yaml::show_duration(wait)
                    );
                    self.counters.retries += 1;
                    self.counters.waited += wait;
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
    }

    async fn once(
        &mut self,
        method: &Method,
        url: &url::Url,
        body: Option<&serde_json::Value>,
        extra: &HeaderMap,
        shown: &str,
    ) -> std::result::Result<Response, Failed> {
        let auth = self.auth_header().await.map_err(Failed::Stop)?;
        self.pace().await;
        let mut req = match method {
            Method::Get => self.http.get(url.clone()),
            Method::Post { .. } => self.http.post(url.clone()),
        };
        req = req.timeout(self.timeout);
        for (n, v) in &self.headers {
            req = req.header(n, v);
        }
        for (n, v) in extra {
            req = req.header(n, v);
        }
        if let Some((n, v)) = auth {
            req = req.header(n, v);
        }
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        self.counters.requests += 1;
        self.last_send = Some(Instant::now());
        let mut resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                return Err(Failed::Retry {
                    why: self.describe(&e),
                    after: None,
                });
            }
        };
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut body = Vec::new();
        let read = loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    self.counters.bytes += c.len() as i64;
                    if body.len() + c.len() > MAX_BODY {
                        return Err(Failed::Stop(Error::RunFailed(format!(
                            "{}: {shown}: the response is larger than {} MiB; is `records` one page of a paginated \
                             API? nothing was published",
                            self.source,
                            MAX_BODY >> 20
                        ))));
                    }
                    body.extend_from_slice(&c);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        if status.is_success() || status == StatusCode::NOT_MODIFIED {
            if let Err(e) = read {
                let why = format!(
                    "the connection broke after {} bytes of the body ({})",
                    body.len(),
                    self.describe(&e)
                );
                return Err(Failed::Retry { why, after: None });
            }
            return Ok(Response {
                status,
                headers,
                body: body.into(),
            });
        }
        let snippet = self.snippet(&body);
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Err(Failed::Retry {
                why: format!("HTTP {status}{snippet}"),
                after: retry_after(&headers),
            });
        }
        let hint = match status.as_u16() {
            401 => " (unauthorized: check the credentials api.auth names, and that they are current)",
            403 => " (forbidden: the credentials are valid but may not read this; check their scope or role)",
            404 => " (not found: check api.base_url and api.path)",
            400 | 422 => " (the server refused the request: check api.params, api.body and the pagination parameters)",
            _ => "",
        };
        let why = format!(
            "{}: {shown}: HTTP {status}{hint}{snippet}; nothing was published",
            self.source
        );
        Err(Failed::Stop(if status == StatusCode::UNAUTHORIZED {
            Error::Invalid(why)
        } else {
            Error::RunFailed(why)
        }))
    }

    /// The start of an error body, redacted, for a message.
    fn snippet(&self, body: &[u8]) -> String {
        if body.is_empty() {
            return String::new();
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
        let text: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        format!(": {}", self.redact.text(text.trim()))
    }

    /// A transport error as a sentence, redacted (reqwest's text can include the URL).
    fn describe(&self, e: &reqwest::Error) -> String {
        let kind = if e.is_timeout() {
            format!(
                "no complete response within {} (api.timeout)",
                crate::spec::yaml::show_duration(self.timeout)
            )
        } else if e.is_connect() {
            "the connection failed".to_string()
        } else {
            "the exchange failed".to_string()
        };
        let mut causes = String::new();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            causes.push_str(": ");
            causes.push_str(&s.to_string());
            source = s.source();
        }
        self.redact.text(&format!("{kind}{causes}"))
    }

    /// Wait until the rate limit lets the next request go.
    async fn pace(&mut self) {
        if let (Some(gap), Some(last)) = (self.pace, self.last_send) {
            let due = last + gap;
            let now = Instant::now();
            if due > now {
                self.counters.waited += due - now;
                tokio::time::sleep_until(due.into()).await;
            }
        }
    }

    /// The `Authorization` (or key) header of the next request; an OAuth2 token is fetched when
    /// there is none or it is about to expire.
    async fn auth_header(&mut self) -> Result<Option<(HeaderName, HeaderValue)>> {
        let value = match &self.creds {
            Credentials::None | Credentials::ApiKeyQuery { .. } => return Ok(None),
            Credentials::Bearer(t) => format!("Bearer {}", t.expose()),
            Credentials::ApiKeyHeader { name, key } => {
                let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    Error::RunFailed(format!(
                        "{}: api.auth.name \"{name}\" is not a header name",
                        self.source
                    ))
                })?;
                return Ok(Some((n, secret_header(&self.source, key.expose())?)));
            }
            Credentials::Basic { username, password } => basic(username.expose(), password.expose()),
            Credentials::OAuth2 { .. } => {
                let fresh = matches!(&self.token, Some((_, until)) if until.is_none_or(|u| Instant::now() < u));
                if !fresh {
                    self.token = Some(self.fetch_token().await?);
                }
                match &self.token {
                    Some((t, _)) => format!("Bearer {}", t.expose()),
                    None => return Ok(None),
                }
            }
        };
        Ok(Some((
            reqwest::header::AUTHORIZATION,
            secret_header(&self.source, &value)?,
        )))
    }

    /// An OAuth2 client-credentials token (RFC 6749 §4.4: the client authenticates with HTTP
    /// Basic), retried as any request is.
    async fn fetch_token(&mut self) -> Result<(Secret, Option<Instant>)> {
        let Credentials::OAuth2 {
            token_url,
            client_id,
            client_secret,
            scope,
        } = &self.creds
        else {
            return Err(Error::Internal("not an OAuth2 source".into()));
        };
        let (token_url, auth) = (token_url.clone(), basic(client_id.expose(), client_secret.expose()));
        let mut form = vec![("grant_type", "client_credentials".to_string())];
        if let Some(s) = scope {
            form.push(("scope", s.clone()));
        }
        let shown = format!("POST {}", self.redact.url(&token_url));
        let mut attempt = 1;
        loop {
            self.pace().await;
            self.counters.requests += 1;
            self.last_send = Some(Instant::now());
            let sent = self
                .http
                .post(token_url.clone())
                .timeout(self.timeout)
                .header(reqwest::header::AUTHORIZATION, secret_header(&self.source, &auth)?)
                .header(reqwest::header::ACCEPT, "application/json")
                .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(
                    url::form_urlencoded::Serializer::new(String::new())
                        .extend_pairs(form.iter())
                        .finish(),
                )
                .send()
                .await;
            let outcome = match sent {
                Ok(r) if r.status().is_success() => match r.bytes().await {
                    Ok(b) => {
                        self.counters.bytes += b.len() as i64;
                        return self.parse_token(&b, &shown);
                    }
                    Err(e) => self.describe(&e),
                },
                Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS || r.status().is_server_error() => {
                    format!("HTTP {}", r.status())
                }
                Ok(r) => {
                    return Err(Error::RunFailed(format!(
                        "{}: {shown}: HTTP {} fetching an access token (check api.auth.token_url, the client id \
                         and secret it names, and api.auth.scope); nothing was published",
                        self.source,
                        r.status()
                    )));
                }
                Err(e) => self.describe(&e),
            };
            if attempt >= self.retry.max_attempts {
                return Err(Error::RunInterrupted(format!(
                    "{}: {shown}: {outcome}; gave up after {attempt} attempts fetching an access token",
                    self.source
                )));
            }
            let wait = self
                .retry
                .backoff
                .saturating_mul(1 << (attempt - 1).min(20))
                .min(self.retry.max_backoff);
            self.counters.retries += 1;
            self.counters.waited += wait;
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    fn parse_token(&mut self, body: &[u8], shown: &str) -> Result<(Secret, Option<Instant>)> {
        #[derive(serde::Deserialize)]
        struct Token {
            access_token: String,
            expires_in: Option<u64>,
        }
        let t: Token = serde_json::from_slice(body).map_err(|_| {
            Error::RunFailed(format!(
                "{}: {shown}: the token response is not a JSON object with an access_token",
                self.source
            ))
        })?;
        self.redact.add(&t.access_token);
        // used until 30 s before it expires
        let until = t
            .expires_in
            .map(|s| Instant::now() + Duration::from_secs(s.saturating_sub(30)));
        Ok((secret_from(t.access_token), until))
    }
}

fn secret_from(s: String) -> Secret {
    Secret::from_token(s)
}

fn method_name(m: &Method) -> &'static str {
    match m {
        Method::Get => "GET",
        Method::Post { .. } => "POST",
    }
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair.as_bytes())
    )
}

/// A header value holding a secret, marked sensitive (kept out of debug output).
fn secret_header(source: &str, value: &str) -> Result<HeaderValue> {
    let mut v = HeaderValue::from_str(value)
        .map_err(|_| Error::RunFailed(format!("{source}: a secret of api.auth cannot be sent in a header")))?;
    v.set_sensitive(true);
    Ok(v)
}

/// `Retry-After` as seconds or an HTTP date (RFC 9110 §10.2.3).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_rfc_7617s() {
        assert_eq!(basic("Aladdin", "open sesame"), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let mut h = HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(
            reqwest::header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO), "a date in the past: at once");
        h.insert(reqwest::header::RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }
}
