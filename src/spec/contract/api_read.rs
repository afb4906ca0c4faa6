//! The reader of the contract section `api:` ([`super::api`]): every key, its defaults, and the
//! checks across keys (a parameter set twice, a secret sent over http://, a conditional pull of
//! many pages). Each problem is located and names what would be valid; no secret is ever read.

use super::api::{Api, Auth, Incremental, KeyAt, Method, Pagination, Retry};
use super::read::ContractReader;
use super::{Delivery, Field, Format};
use crate::spec::yaml::{Kind, MapNode, Node, Pos, scalar_bool, scalar_int, scalar_str};

const API_KEYS: &[&str] = &[
    "base_url",
    "path",
    "method",
    "body",
    "params",
    "headers",
    "auth",
    "records",
    "pagination",
    "max_pages",
    "incremental",
    "retry",
    "rate_limit",
    "timeout",
    "conditional",
];
pub(super) const LOOPBACK_NOTE: &str = "use https:// (http:// is accepted for 127.0.0.1, ::1 and localhost)";

/// Headers that carry credentials: those go in `api.auth`.
const CREDENTIAL_HEADERS: &[&str] = &["authorization", "proxy-authorization", "cookie"];

impl ContractReader<'_> {
    /// `api`, given the format and the fields (`None` when those keys were invalid). `Some(None)`:
    /// no section and none needed.
    pub(super) fn read_api(
        &mut self,
        node: Option<(&Node, Pos)>,
        format_pos: Pos,
        format: Option<Format>,
        fields: Option<&[Field]>,
        delivery: Option<Delivery>,
    ) -> Option<Option<Box<Api>>> {
        let Some((node, key_pos)) = node else {
            if format == Some(Format::Api) {
                self.err(
                    format_pos,
                    "format: api needs an \"api\" section (base_url, path and records at least; see \
                     docs/guide.md#api-sources)",
                );
                return None;
            }
            return Some(None);
        };
        if let Some(f) = format.filter(|f| *f != Format::Api) {
            self.err(
                key_pos,
                format!(
                    "api is only valid with format: api (this contract says format: {})",
                    f.name()
                ),
            );
            return None;
        }
        let before = self.problems.items.len();
        let api = self.read_api_section(node, fields, delivery);
        if self.problems.items.len() != before || format.is_none() {
            return None;
        }
        Some(Some(Box::new(api?)))
    }

    fn read_api_section(&mut self, node: &Node, fields: Option<&[Field]>, delivery: Option<Delivery>) -> Option<Api> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "api", API_KEYS, self.problems)?;
        let base_url = match map.get("base_url") {
            None => self.missing(
                map.pos,
                "api",
                "base_url",
                "an http:// or https:// URL, e.g. https://vendor.example/v2",
            ),
            Some(n) => self.read_url(n, "api.base_url"),
        };
        let path = match map.get("path") {
            None => self.missing(map.pos, "api", "path", "e.g. /orders"),
            Some(n) => self.read_path(n),
        };
        let method = self.read_method(map.get("method"), map.get("body"));
        let params = map.get("params").map_or(Some(Vec::new()), |n| self.read_params(n));
        let headers = map.get("headers").map_or(Some(Vec::new()), |n| self.read_headers(n));
        let auth = map.get("auth").map_or(Some(Auth::None), |n| self.read_auth(n));
        let records = match map.get("records") {
            None => self.missing(
                map.pos,
                "api",
                "records",
                "an RFC 9535 JSONPath to the records of one response, e.g. \"$.data[*]\"",
            ),
            Some(n) => self.read_records(n),
        };
        let pagination = map
            .get("pagination")
            .map_or(Some(Pagination::None), |n| self.read_pagination(n));
        let max_pages = match map.get("max_pages") {
            None => Some(Api::DEFAULT_MAX_PAGES),
            Some(n) => scalar_int(&file, n, "api.max_pages", 1, self.problems).map(|v| v.min(u32::MAX as i64) as u32),
        };
        let incremental = match map.get("incremental") {
            None => Some(None),
            Some(n) => {
                if delivery == Some(Delivery::Full) {
                    self.err(
                        n.pos,
                        "api.incremental with delivery: full: an incremental pull returns only changed records, \
                         so every other record would be deleted; use delivery: incremental",
                    );
                }
                self.read_incremental(n, fields).map(Some)
            }
        };
        let retry = map.get("retry").map_or(Some(Retry::default()), |n| self.read_retry(n));
        let rate_limit = match map.get("rate_limit") {
            None => Some(None),
            Some(n) => self.read_rate_limit(n).map(Some),
        };
        let timeout = match map.get("timeout") {
            None => Some(Api::DEFAULT_TIMEOUT),
            Some(n) => self.positive_duration(n, "api.timeout"),
        };
        let conditional = match map.get("conditional") {
            None => Some(false),
            Some(n) => scalar_bool(&file, n, "api.conditional", self.problems),
        };

        self.check_across(
            &map,
            base_url.as_ref(),
            auth.as_ref(),
            pagination.as_ref(),
            incremental.as_ref(),
            conditional,
        );
        let mut headers = headers?;
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("accept")) {
            headers.push(("Accept".into(), "application/json".into()));
        }
        Some(Api {
            base_url: base_url?,
            path: path?,
            method: method?,
            params: params?,
            headers,
            auth: auth?,
            records: records?,
            pagination: pagination?,
            max_pages: max_pages?,
            incremental: incremental?,
            retry: retry?,
            rate_limit: rate_limit?,
            timeout: timeout?,
            conditional: conditional?,
            pos: node.pos,
        })
    }

    /// The checks across keys, each where both sides are valid: a secret over http://, a
    /// credential header, a conditional pull of many pages, a parameter ingot sets itself.
    fn check_across(
        &mut self,
        map: &MapNode<'_>,
        base_url: Option<&url::Url>,
        auth: Option<&Auth>,
        pagination: Option<&Pagination>,
        incremental: Option<&Option<Incremental>>,
        conditional: Option<bool>,
    ) {
        if let (Some(url), Some(auth), Some(n)) = (base_url, auth, map.get("base_url"))
            && *auth != Auth::None
            && !is_safe(url)
        {
            self.err(
                n.pos,
                format!(
                    "api.base_url uses http:// with auth type {}: the secret would cross the network in clear \
                     text; {LOOPBACK_NOTE}",
                    auth.type_name()
                ),
            );
        }
        if let (
            Some(Auth::ApiKey {
                at: KeyAt::Header,
                name,
                ..
            }),
            Some(n),
        ) = (auth, map.get("headers"))
        {
            for (k, _) in map_entries(n) {
                if k.as_str().is_some_and(|k| k.eq_ignore_ascii_case(name)) {
                    self.credentials_in_headers(k);
                }
            }
        }
        if conditional == Some(true)
            && pagination.is_some_and(|p| *p != Pagination::None)
            && let Some(n) = map.get("conditional")
        {
            self.err(
                n.pos,
                "api.conditional: a 304 Not Modified for the first page says nothing of the others; conditional \
                 requests need pagination: none",
            );
        }
        if let Some(n) = map.get("params") {
            let mut taken: Vec<(&str, &str, &str)> = Vec::new();
            match pagination {
                Some(Pagination::PageNumber { param, .. }) | Some(Pagination::Cursor { param, .. }) => {
                    taken.push((param, "api.pagination", "on every page"))
                }
                Some(Pagination::Offset { param, limit_param, .. }) => {
                    taken.push((param, "api.pagination", "on every page"));
                    taken.push((limit_param, "api.pagination", "on every page"));
                }
                _ => {}
            }
            if let Some(Some(inc)) = incremental {
                taken.push((&inc.param, "api.incremental", "on every pull"));
            }
            if let Some(Auth::ApiKey {
                at: KeyAt::Query, name, ..
            }) = &auth
            {
                taken.push((name, "api.auth", "on every request"));
            }
            for (k, _) in map_entries(n) {
                let Some(key) = k.as_str() else { continue };
                if let Some((_, owner, when)) = taken.iter().find(|(p, _, _)| *p == key) {
                    self.err(
                        k.pos,
                        format!("api.params.{key}: \"{key}\" is also the parameter of {owner}; ingot sets it {when}"),
                    );
                }
            }
        }
    }

    /// `{what} is missing "{key}" ({hint})`, always `None`.
    pub(super) fn missing<T>(&mut self, pos: Pos, what: &str, key: &str, hint: &str) -> Option<T> {
        self.err(pos, format!("{what} is missing \"{key}\" ({hint})"));
        None
    }

    pub(super) fn read_url(&mut self, n: &Node, what: &str) -> Option<url::Url> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, what, self.problems)?;
        let url = match url::Url::parse(s) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => u,
            Ok(u) => {
                let why = format!("scheme {}", u.scheme());
                self.err(
                    n.pos,
                    format!("{what} \"{s}\" is not an absolute http:// or https:// URL ({why})"),
                );
                return None;
            }
            Err(e) => {
                self.err(
                    n.pos,
                    format!("{what} \"{s}\" is not an absolute http:// or https:// URL ({e})"),
                );
                return None;
            }
        };
        if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
            self.err(
                n.pos,
                format!(
                    "{what} must not hold a query string, a fragment or credentials: put query parameters in \
                     api.params and secrets in api.auth"
                ),
            );
            return None;
        }
        Some(url)
    }

    fn read_path(&mut self, n: &Node) -> Option<String> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, "api.path", self.problems)?;
        if !s.starts_with('/') {
            self.err(n.pos, format!("api.path must start with \"/\", found \"{s}\""));
            None
        } else if let Some((_, query)) = s.split_once('?') {
            self.err(
                n.pos,
                format!("api.path must not hold a query string: put {query} in api.params"),
            );
            None
        } else if s.contains('#') {
            self.err(n.pos, format!("api.path must not hold a fragment, found \"{s}\""));
            None
        } else {
            Some(s.to_string())
        }
    }

    fn read_method(&mut self, method: Option<&Node>, body: Option<&Node>) -> Option<Method> {
        let file = self.doc.file.clone();
        let post = match method {
            None => Some(false),
            Some(n) => scalar_str(&file, n, "api.method", self.problems).and_then(|s| {
                if s.eq_ignore_ascii_case("get") {
                    Some(false)
                } else if s.eq_ignore_ascii_case("post") {
                    Some(true)
                } else {
                    self.err(n.pos, format!("api.method must be one of: GET, POST; found \"{s}\""));
                    None
                }
            }),
        };
        let body = match body {
            None => Some("{}".to_string()),
            Some(n) if post == Some(false) => {
                self.err(n.pos, "api.body is only valid with method: POST");
                None
            }
            Some(n) if !matches!(n.kind, Kind::Map(_)) => {
                self.err(
                    n.pos,
                    format!("api.body must be a mapping (a JSON object), found {}", n.kind_name()),
                );
                None
            }
            Some(n) => self.json_text(n, "api.body"),
        };
        if post? {
            Some(Method::Post { body: body? })
        } else {
            Some(Method::Get)
        }
    }

    /// A YAML node as JSON text: plain scalars that read as numbers, booleans or null are those.
    fn json_text(&mut self, n: &Node, what: &str) -> Option<String> {
        fn value(n: &Node, ok: &mut Vec<Pos>) -> serde_json::Value {
            use serde_json::Value;
            match &n.kind {
                Kind::Scalar { text, quoted: true } => Value::String(text.clone()),
                Kind::Scalar { .. } if n.is_null() => Value::Null,
                Kind::Scalar { text, .. } => match text.as_str() {
                    "true" => Value::Bool(true),
                    "false" => Value::Bool(false),
                    t => t
                        .parse::<i64>()
                        .ok()
                        .map(Value::from)
                        .or_else(|| {
                            t.parse::<f64>()
                                .ok()
                                .and_then(serde_json::Number::from_f64)
                                .map(Value::Number)
                        })
                        .unwrap_or_else(|| Value::String(t.to_string())),
                },
                Kind::Seq(items) => Value::Array(items.iter().map(|i| value(i, ok)).collect()),
                Kind::Map(entries) => Value::Object(
                    entries
                        .iter()
                        .filter_map(|(k, v)| match k.as_str() {
                            Some(k) => Some((k.to_string(), value(v, ok))),
                            None => {
                                ok.push(k.pos);
                                None
                            }
                        })
                        .collect(),
                ),
            }
        }
        let mut bad = Vec::new();
        let text = value(n, &mut bad).to_string();
        for pos in &bad {
            self.err(*pos, format!("{what}: keys must be plain names"));
        }
        bad.is_empty().then_some(text)
    }

    /// A mapping of names to text or number values (`api.params`, `api.headers`).
    fn free_map(&mut self, n: &Node, what: &str) -> Option<Vec<(String, String, Pos)>> {
        let Kind::Map(entries) = &n.kind else {
            self.err(n.pos, format!("{what} must be a mapping, found {}", n.kind_name()));
            return None;
        };
        let before = self.problems.items.len();
        let mut out: Vec<(String, String, Pos)> = Vec::new();
        for (k, v) in entries {
            let Some(key) = k.as_str() else {
                self.err(k.pos, format!("{what}: keys must be plain names"));
                continue;
            };
            if out.iter().any(|(o, _, _)| o == key) {
                self.err(k.pos, format!("duplicate key \"{key}\" in {what}"));
                continue;
            }
            match &v.kind {
                Kind::Scalar { text, .. } if !v.is_null() => out.push((key.to_string(), text.clone(), k.pos)),
                _ => {
                    self.err(
                        v.pos,
                        format!("{what}.{key} must be a text or number value, found {}", v.kind_name()),
                    );
                }
            }
        }
        (self.problems.items.len() == before).then_some(out)
    }

    fn read_params(&mut self, n: &Node) -> Option<Vec<(String, String)>> {
        let params = self.free_map(n, "api.params")?;
        Some(params.into_iter().map(|(k, v, _)| (k, v)).collect())
    }

    fn read_headers(&mut self, n: &Node) -> Option<Vec<(String, String)>> {
        let headers = self.free_map(n, "api.headers");
        let mut ok = headers.is_some();
        for (k, _) in map_entries(n) {
            let Some(name) = k.as_str() else { continue };
            if !is_header_name(name) {
                self.err(
                    k.pos,
                    format!("api.headers: \"{name}\" is not a header name (letters, digits and !#$%&'*+-.^_`|~)"),
                );
                ok = false;
            } else if CREDENTIAL_HEADERS.iter().any(|c| c.eq_ignore_ascii_case(name)) {
                self.credentials_in_headers(k);
                ok = false;
            }
        }
        let headers = headers?;
        ok.then(|| headers.into_iter().map(|(k, v, _)| (k, v)).collect())
    }

    pub(super) fn credentials_in_headers(&mut self, key: &Node) {
        let name = key.as_str().unwrap_or("");
        self.err(
            key.pos,
            format!(
                "api.headers.{name}: credentials go in api.auth (bearer, api_key, basic, oauth2_client_credentials), \
                 never as text in the contract"
            ),
        );
    }
}

/// The entries of a mapping node (none for another kind).
fn map_entries(n: &Node) -> impl Iterator<Item = &(Node, Node)> {
    match &n.kind {
        Kind::Map(entries) => entries.iter(),
        _ => [].iter(),
    }
}

/// https://, or http:// to a loopback host.
pub(super) fn is_safe(url: &url::Url) -> bool {
    url.scheme() == "https"
        || match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        }
}

/// An HTTP token (RFC 9110 `tchar`s).
pub(super) fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
pub(super) fn is_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && !b[0].is_ascii_digit() && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

#[cfg(test)]
mod tests {
    use super::{is_env_name, is_header_name};

    #[test]
    fn header_and_env_names() {
        assert!(is_header_name("X-Api-Key"));
        assert!(!is_header_name("X Key"));
        assert!(!is_header_name(""));
        assert!(is_env_name("VENDOR_TOKEN"));
        assert!(is_env_name("_x1"));
        assert!(!is_env_name("vendor token"));
        assert!(!is_env_name("1TOKEN"));
    }
}
