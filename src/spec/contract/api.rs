//! The contract section `api:` of a `format: api` source: how a later `ingot pull` would fetch
//! it (docs/guide.md#api-sources). Nothing here fetches (`ingest::pull` does): only the types
//! and the JSONPath helpers that `ingot check` and the pull need.
//!
//! Secrets appear only as names (an environment variable or a file); their values are never
//! read here. A `ValuePath` is a singular RFC 9535 query (`$` then names and indexes), parsed
//! by hand; the records path is a full RFC 9535 query, parsed by `serde_json_path`.

use std::path::PathBuf;
use std::time::Duration;

use crate::spec::yaml::Pos;

/// `format: api`: where and how the source's records are fetched.
#[derive(Debug, Clone)]
pub struct Api {
    /// http(s), without query, fragment or credentials.
    pub base_url: url::Url,
    /// Starts with `/`; appended to `base_url`'s path (not RFC 3986 resolution).
    pub path: String,
    pub method: Method,
    /// Query parameters in file order, values as written.
    pub params: Vec<(String, String)>,
    /// In file order; `Accept: application/json` is added when absent.
    pub headers: Vec<(String, String)>,
    pub auth: Auth,
    pub records: RecordsPath,
    pub pagination: Pagination,
    pub max_pages: u32,
    pub incremental: Option<Incremental>,
    pub retry: Retry,
    pub rate_limit: Option<RateLimit>,
    /// The whole request, body included.
    pub timeout: Duration,
    /// Send the last ETag / Last-Modified (pagination `none` only).
    pub conditional: bool,
    /// Of the `api` node, for run-time messages.
    pub pos: Pos,
}

impl Api {
    pub const DEFAULT_MAX_PAGES: u32 = 10_000;
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Get,
    /// `body`: the JSON object text (default `{}`).
    Post {
        body: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Auth {
    None,
    Bearer {
        token: SecretRef,
    },
    ApiKey {
        at: KeyAt,
        name: String,
        key: SecretRef,
    },
    Basic {
        username: SecretRef,
        password: SecretRef,
    },
    OAuth2ClientCredentials {
        token_url: url::Url,
        client_id: SecretRef,
        client_secret: SecretRef,
        scope: Option<String>,
    },
}

impl Auth {
    pub const TYPES: &[&str] = &["none", "bearer", "api_key", "basic", "oauth2_client_credentials"];

    pub fn type_name(&self) -> &'static str {
        match self {
            Auth::None => "none",
            Auth::Bearer { .. } => "bearer",
            Auth::ApiKey { .. } => "api_key",
            Auth::Basic { .. } => "basic",
            Auth::OAuth2ClientCredentials { .. } => "oauth2_client_credentials",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAt {
    Header,
    Query,
}

/// Where a secret comes from; its value is read by a pull only, never by `ingot check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub from: SecretFrom,
    /// The contract key that names it, e.g. `api.auth.token_env`.
    pub key: &'static str,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretFrom {
    Env(String),
    /// A relative path is taken from the contract file's folder (already joined here).
    File(PathBuf),
}

/// A JSONPath naming one value: `$` then names and indexes only (an RFC 9535 singular query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValuePath {
    pub text: String,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Name(String),
    Index(usize),
}

/// `api.records`: the records of one response.
#[derive(Debug, Clone)]
pub struct RecordsPath {
    pub text: String,
    pub query: serde_json_path::JsonPath,
    /// `$` + names/indexes + a final `[*]` or `.*`: the steps to the array (or object) whose
    /// members are the records, for a walk of raw JSON without the general query.
    pub simple: Option<Vec<Step>>,
    pub pos: Pos,
}

impl RecordsPath {
    /// The steps of a simple records path (see [`RecordsPath::simple`]).
    pub fn simple_steps(text: &str) -> Option<Vec<Step>> {
        let head = text.strip_suffix("[*]").or_else(|| text.strip_suffix(".*"))?;
        parse_value_path(head)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pagination {
    None,
    PageNumber {
        param: String,
        start: i64,
        stop: PageStop,
    },
    Offset {
        param: String,
        limit_param: String,
        limit: u32,
        stop: PageStop,
    },
    Cursor {
        cursor_path: ValuePath,
        param: String,
    },
    NextUrl {
        path: ValuePath,
    },
    LinkHeader,
}

impl Pagination {
    pub const TYPES: &[&str] = &["none", "page_number", "offset", "cursor", "next_url", "link_header"];
}

/// `stop: empty` (default): the first page without records ends the pull. `stop: total` with
/// `total_path`: page_number reads the total of pages, offset the total of records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageStop {
    Empty,
    Total(ValuePath),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incremental {
    /// Index into `Contract::fields` (int32, int64, decimal, date, timestamp or string).
    pub field: usize,
    /// The query parameter (a body key under POST) that takes the cursor.
    pub param: String,
    /// The first pull's value, as written (checked against the field's type); `None`: the first
    /// pull sends none.
    pub initial: Option<String>,
    pub lookback: Option<Lookback>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookback {
    /// Date and timestamp cursors.
    Time(Duration),
    /// Integer cursors; decimals unscaled at the field's scale.
    Number(i128),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub max_attempts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            max_attempts: 5,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub requests_per_second: f64,
}

/// The steps of a singular query: `$`, then `.name`, `['name']`, `["name"]` or `[digits]`;
/// `None` for anything else (wildcards, slices, filters, descendants, negative indexes).
pub fn parse_value_path(text: &str) -> Option<Vec<Step>> {
    let mut rest = text.strip_prefix('$')?;
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r
                .char_indices()
                .find(|&(i, c)| !(c == '_' || c.is_alphabetic() || (i > 0 && c.is_ascii_digit()) || !c.is_ascii()))
                .map_or(r.len(), |(i, _)| i);
            if end == 0 {
                return None;
            }
            steps.push(Step::Name(r[..end].to_string()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let (step, after) = bracket(r)?;
            steps.push(step);
            rest = after;
        } else {
            return None;
        }
    }
    Some(steps)
}

/// One bracketed selector after its `[`: a quoted name or a non-negative index, then `]`.
fn bracket(r: &str) -> Option<(Step, &str)> {
    let q = r.chars().next()?;
    if q == '\'' || q == '"' {
        let mut name = String::new();
        let mut chars = r[1..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next()?.1 {
                    c @ ('\\' | '\'' | '"' | '/') => name.push(c),
                    'b' => name.push('\u{8}'),
                    'f' => name.push('\u{c}'),
                    'n' => name.push('\n'),
                    'r' => name.push('\r'),
                    't' => name.push('\t'),
                    _ => return None,
                },
                c if c == q => {
                    let after = r[1 + i + 1..].strip_prefix(']')?;
                    return Some((Step::Name(name), after));
                }
                c if (c as u32) < 0x20 => return None,
                c => name.push(c),
            }
        }
        None
    } else {
        let end = r.find(']')?;
        let digits = &r[..end];
        let ok = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if !ok {
            return None;
        }
        Some((Step::Index(digits.parse().ok()?), &r[end + 1..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Step {
        Step::Name(s.into())
    }

    #[test]
    fn value_paths_take_names_and_indexes_only() {
        assert_eq!(parse_value_path("$"), Some(vec![]));
        assert_eq!(parse_value_path("$.meta.next"), Some(vec![name("meta"), name("next")]));
        assert_eq!(
            parse_value_path("$['meta'][\"next page\"][0]"),
            Some(vec![name("meta"), name("next page"), Step::Index(0)])
        );
        assert_eq!(parse_value_path("$.a_1[12]"), Some(vec![name("a_1"), Step::Index(12)]));
        assert_eq!(parse_value_path("$['it\\'s']"), Some(vec![name("it's")]));
        for bad in [
            "", "meta", "$.", "$..a", "$.a[*]", "$.*", "$[-1]", "$[01]", "$[1:2]", "$[?@.a]", "$.1a", "$['a'", "$[0",
        ] {
            assert_eq!(parse_value_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn simple_records_paths_end_in_a_wildcard() {
        assert_eq!(RecordsPath::simple_steps("$.data[*]"), Some(vec![name("data")]));
        assert_eq!(RecordsPath::simple_steps("$[*]"), Some(vec![]));
        assert_eq!(
            RecordsPath::simple_steps("$.a[2].*"),
            Some(vec![name("a"), Step::Index(2)])
        );
        assert_eq!(RecordsPath::simple_steps("$.data"), None);
        assert_eq!(RecordsPath::simple_steps("$.data[?@.ok][*]"), None);
        assert_eq!(RecordsPath::simple_steps("$..data[*]"), None);
    }

    #[test]
    fn records_paths_are_full_rfc_9535_queries() {
        for ok in [
            "$.data[*]",
            "$..items[*]",
            "$.data[?@.status == 'open']",
            "$.data[?length(@.tags) > 1]",
            "$.data[?match(@.code, '[A-Z]{3}')]",
            "$['data'][0:10:2]",
        ] {
            assert!(serde_json_path::JsonPath::parse(ok).is_ok(), "{ok}");
        }
        // the position is 1-based: the reader locates the message at that character
        let e = serde_json_path::JsonPath::parse("$.data[*").unwrap_err();
        assert_eq!(e.position(), 8);
        assert_eq!(e.message(), "in long-hand segment, expected closing ']'");
        for bad in ["data[*]", "$.data[?@.x ==]", "$.data[?nofunc(@)]", "$.a b"] {
            assert!(serde_json_path::JsonPath::parse(bad).is_err(), "{bad}");
        }
    }
}
