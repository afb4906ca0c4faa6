//! The reader of the `api` keys with types of their own: `auth` (secrets by name only),
//! `pagination`, `incremental`, `retry`, `rate_limit`, and the JSONPath of `records` and of
//! the pagination values. Each problem is located and names what would be valid.

use std::time::Duration;

use super::api::{
    Auth, Incremental, KeyAt, Lookback, PageStop, Pagination, RateLimit, RecordsPath, Retry, SecretFrom, SecretRef,
    ValuePath, parse_value_path,
};
use super::api_read::{LOOPBACK_NOTE, is_env_name, is_header_name, is_safe};
use super::read::ContractReader;
use super::{Field, FieldType};
use crate::spec::yaml::{Kind, MapNode, Node, Pos, scalar_duration, scalar_int, scalar_str, show_duration};

const AUTH_KEYS: &[&str] = &[
    "type",
    "token_env",
    "token_file",
    "in",
    "name",
    "key_env",
    "key_file",
    "username_env",
    "username_file",
    "password_env",
    "password_file",
    "token_url",
    "client_id_env",
    "client_id_file",
    "client_secret_env",
    "client_secret_file",
    "scope",
];
const PAGINATION_KEYS: &[&str] = &[
    "type",
    "param",
    "start",
    "stop",
    "total_path",
    "limit_param",
    "limit",
    "cursor_path",
    "path",
];
const INCREMENTAL_KEYS: &[&str] = &["cursor_field", "param", "initial", "lookback"];
const RETRY_KEYS: &[&str] = &["max_attempts", "backoff", "max_backoff"];
const RATE_LIMIT_KEYS: &[&str] = &["requests_per_second"];
const MAX_OFFSET_LIMIT: i64 = 1_000_000;
/// The secrets an auth type takes: (name, its `_env` key, its `_file` key).
const SECRETS: &[(&str, &str, &str)] = &[
    ("token", "api.auth.token_env", "api.auth.token_file"),
    ("key", "api.auth.key_env", "api.auth.key_file"),
    ("username", "api.auth.username_env", "api.auth.username_file"),
    ("password", "api.auth.password_env", "api.auth.password_file"),
    ("client_id", "api.auth.client_id_env", "api.auth.client_id_file"),
    (
        "client_secret",
        "api.auth.client_secret_env",
        "api.auth.client_secret_file",
    ),
];

impl ContractReader<'_> {
    /// Report each key of `map` (the section `what`, whose keys are `all`) that belongs to another
    /// type than `ty`, which takes `takes` (`described` for people); `true` when there is none.
    fn only_keys_of(
        &mut self,
        map: &MapNode<'_>,
        what: &str,
        all: &[&str],
        ty: &str,
        takes: &[&str],
        described: &str,
    ) -> bool {
        let mut ok = true;
        for key in all.iter().filter(|k| **k != "type" && !takes.contains(k)) {
            if let Some(n) = map.get(key) {
                self.err(
                    n.pos,
                    format!("{what}: \"{key}\" does not apply to type {ty}; {ty} takes: {described}"),
                );
                ok = false;
            }
        }
        ok
    }

    pub(super) fn read_auth(&mut self, node: &Node) -> Option<Auth> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "api.auth", AUTH_KEYS, self.problems)?;
        let types = Auth::TYPES.join(", ");
        let ty = match map.get("type") {
            None => {
                self.err(map.pos, format!("api.auth is missing \"type\"; types are: {types}"));
                return None;
            }
            Some(n) => {
                let s = scalar_str(&file, n, "api.auth.type", self.problems)?;
                if !Auth::TYPES.contains(&s) {
                    self.err(n.pos, format!("unknown api.auth type \"{s}\"; types are: {types}"));
                    return None;
                }
                s
            }
        };
        let (takes, described): (&[&str], &str) = match ty {
            "none" => (&[], "nothing else"),
            "bearer" => (&["token_env", "token_file"], "token_env or token_file"),
            "api_key" => (&["in", "name", "key_env", "key_file"], "in, name, key_env or key_file"),
            "basic" => (
                &["username_env", "username_file", "password_env", "password_file"],
                "username_env or username_file, password_env or password_file",
            ),
            _ => (
                &[
                    "token_url",
                    "client_id_env",
                    "client_id_file",
                    "client_secret_env",
                    "client_secret_file",
                    "scope",
                ],
                "token_url, client_id_env or client_id_file, client_secret_env or client_secret_file, scope",
            ),
        };
        let ok = self.only_keys_of(&map, "api.auth", AUTH_KEYS, ty, takes, described);
        let auth = match ty {
            "none" => Some(Auth::None),
            "bearer" => self.secret(&map, ty, 0).map(|token| Auth::Bearer { token }),
            "api_key" => {
                let at = match map.get("in") {
                    None => Some(KeyAt::Header),
                    Some(n) => scalar_str(&file, n, "api.auth.in", self.problems).and_then(|s| match s {
                        "header" => Some(KeyAt::Header),
                        "query" => Some(KeyAt::Query),
                        _ => {
                            self.err(
                                n.pos,
                                format!("api.auth.in must be one of: header, query; found \"{s}\""),
                            );
                            None
                        }
                    }),
                };
                let name = match map.get("name") {
                    None => self.missing(
                        map.pos,
                        "api.auth (api_key)",
                        "name",
                        "the header or query parameter that carries the key",
                    ),
                    Some(n) => scalar_str(&file, n, "api.auth.name", self.problems).and_then(|s| {
                        if at == Some(KeyAt::Header) && !is_header_name(s) {
                            self.err(
                                n.pos,
                                format!(
                                    "api.auth.name: \"{s}\" is not a header name (letters, digits and \
                                     !#$%&'*+-.^_`|~)"
                                ),
                            );
                            return None;
                        }
                        Some(s.to_string())
                    }),
                };
                let key = self.secret(&map, ty, 1);
                Some(Auth::ApiKey {
                    at: at?,
                    name: name?,
                    key: key?,
                })
            }
            "basic" => {
                let username = self.secret(&map, ty, 2);
                let password = self.secret(&map, ty, 3);
                Some(Auth::Basic {
                    username: username?,
                    password: password?,
                })
            }
            _ => {
                let token_url = match map.get("token_url") {
                    None => self.missing(
                        map.pos,
                        "api.auth (oauth2_client_credentials)",
                        "token_url",
                        "the https:// URL that issues tokens",
                    ),
                    Some(n) => self.read_url(n, "api.auth.token_url").and_then(|u| {
                        if is_safe(&u) {
                            return Some(u);
                        }
                        self.err(
                            n.pos,
                            format!(
                                "api.auth.token_url uses http://: the client secret would cross the network in \
                                 clear text; {LOOPBACK_NOTE}"
                            ),
                        );
                        None
                    }),
                };
                let client_id = self.secret(&map, ty, 4);
                let client_secret = self.secret(&map, ty, 5);
                let scope = match map.get("scope") {
                    None => Some(None),
                    Some(n) => scalar_str(&file, n, "api.auth.scope", self.problems).map(|s| Some(s.to_string())),
                };
                Some(Auth::OAuth2ClientCredentials {
                    token_url: token_url?,
                    client_id: client_id?,
                    client_secret: client_secret?,
                    scope: scope?,
                })
            }
        };
        if ok { auth } else { None }
    }

    /// The secret `SECRETS[which]` of auth type `ty`: its `_env` or its `_file` key, not both.
    fn secret(&mut self, map: &MapNode<'_>, ty: &str, which: usize) -> Option<SecretRef> {
        let file = self.doc.file.clone();
        let (name, env_key, file_key) = SECRETS[which];
        let env_short = &env_key["api.auth.".len()..];
        let file_short = &file_key["api.auth.".len()..];
        match (map.get(env_short), map.get(file_short)) {
            (None, None) => {
                self.err(
                    map.pos,
                    format!(
                        "api.auth ({ty}) needs {env_short} or {file_short}: the {} itself never goes in the contract",
                        name.replace('_', " ")
                    ),
                );
                None
            }
            (Some(_), Some(f)) => {
                self.err(f.pos, format!("api.auth: give {env_short} or {file_short}, not both"));
                None
            }
            (Some(n), None) => {
                let s = scalar_str(&file, n, env_key, self.problems)?;
                if !is_env_name(s) {
                    self.err(
                        n.pos,
                        format!(
                            "{env_key}: \"{s}\" is not an environment variable name (letters, digits and _, not \
                             starting with a digit)"
                        ),
                    );
                    return None;
                }
                Some(SecretRef {
                    from: SecretFrom::Env(s.to_string()),
                    key: env_key,
                    pos: n.pos,
                })
            }
            (None, Some(n)) => {
                let s = scalar_str(&file, n, file_key, self.problems)?;
                let dir = file.parent().unwrap_or(std::path::Path::new("."));
                Some(SecretRef {
                    from: SecretFrom::File(dir.join(s)),
                    key: file_key,
                    pos: n.pos,
                })
            }
        }
    }

    /// A full RFC 9535 query; a parse error is located at its own character.
    fn jsonpath(&mut self, n: &Node, what: &str) -> Option<(String, serde_json_path::JsonPath)> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, what, self.problems)?;
        match serde_json_path::JsonPath::parse(s) {
            Ok(q) => Some((s.to_string(), q)),
            Err(e) => {
                let quoted = matches!(n.kind, Kind::Scalar { quoted: true, .. }) as usize;
                let at = Pos {
                    line: n.pos.line,
                    column: n.pos.column + quoted + e.position().max(1) - 1,
                };
                self.err(
                    at,
                    format!(
                        "{what}: \"{s}\" is not an RFC 9535 JSONPath: at position {}, {}",
                        e.position(),
                        e.message()
                    ),
                );
                None
            }
        }
    }

    pub(super) fn read_records(&mut self, n: &Node) -> Option<RecordsPath> {
        let (text, query) = self.jsonpath(n, "api.records")?;
        Some(RecordsPath {
            simple: RecordsPath::simple_steps(&text),
            text,
            query,
            pos: n.pos,
        })
    }

    fn value_path(&mut self, n: &Node, what: &str) -> Option<ValuePath> {
        let (text, _) = self.jsonpath(n, what)?;
        match parse_value_path(&text) {
            Some(steps) => Some(ValuePath { text, steps }),
            None => {
                self.err(
                    n.pos,
                    format!(
                        "{what} must name one value (names and indexes only, e.g. \"$.meta.next\"); found \"{text}\""
                    ),
                );
                None
            }
        }
    }

    /// A non-empty parameter name.
    fn param(&mut self, n: Option<&Node>, what: &str, default: &str) -> Option<String> {
        let file = self.doc.file.clone();
        let Some(n) = n else { return Some(default.to_string()) };
        let s = scalar_str(&file, n, what, self.problems)?;
        if s.trim().is_empty() {
            self.err(n.pos, format!("{what} must not be empty"));
            return None;
        }
        Some(s.to_string())
    }
}

impl ContractReader<'_> {
    pub(super) fn read_pagination(&mut self, node: &Node) -> Option<Pagination> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "api.pagination", PAGINATION_KEYS, self.problems)?;
        let types = Pagination::TYPES.join(", ");
        let ty = match map.get("type") {
            None => {
                self.err(
                    map.pos,
                    format!("api.pagination is missing \"type\"; types are: {types}"),
                );
                return None;
            }
            Some(n) => {
                let s = scalar_str(&file, n, "api.pagination.type", self.problems)?;
                if !Pagination::TYPES.contains(&s) {
                    self.err(
                        n.pos,
                        format!("unknown api.pagination type \"{s}\"; types are: {types}"),
                    );
                    return None;
                }
                s
            }
        };
        let takes: &[&str] = match ty {
            "page_number" => &["param", "start", "stop", "total_path"],
            "offset" => &["param", "limit_param", "limit", "stop", "total_path"],
            "cursor" => &["cursor_path", "param"],
            "next_url" => &["path"],
            _ => &[],
        };
        let described = if takes.is_empty() {
            "nothing else".to_string()
        } else {
            takes.join(", ")
        };
        let ok = self.only_keys_of(&map, "api.pagination", PAGINATION_KEYS, ty, takes, &described);
        let pagination = match ty {
            "none" => Some(Pagination::None),
            "link_header" => Some(Pagination::LinkHeader),
            "page_number" => {
                let param = self.param(map.get("param"), "api.pagination.param", "page");
                let start = match map.get("start") {
                    None => Some(1),
                    Some(n) => scalar_int(&file, n, "api.pagination.start", 0, self.problems),
                };
                let stop = self.read_stop(&map);
                Some(Pagination::PageNumber {
                    param: param?,
                    start: start?,
                    stop: stop?,
                })
            }
            "offset" => {
                let param = self.param(map.get("param"), "api.pagination.param", "offset");
                let limit_param = self.param(map.get("limit_param"), "api.pagination.limit_param", "limit");
                let limit = match map.get("limit") {
                    None => self.missing(
                        map.pos,
                        "api.pagination (offset)",
                        "limit",
                        "the page size to ask for, e.g. 500",
                    ),
                    Some(n) => scalar_int(&file, n, "api.pagination.limit", 1, self.problems).and_then(|v| {
                        if v > MAX_OFFSET_LIMIT {
                            self.err(
                                n.pos,
                                format!("api.pagination.limit must be at most {MAX_OFFSET_LIMIT}, found \"{v}\""),
                            );
                            return None;
                        }
                        Some(v as u32)
                    }),
                };
                let stop = self.read_stop(&map);
                Some(Pagination::Offset {
                    param: param?,
                    limit_param: limit_param?,
                    limit: limit?,
                    stop: stop?,
                })
            }
            "cursor" => {
                let cursor_path = match map.get("cursor_path") {
                    None => self.missing(
                        map.pos,
                        "api.pagination (cursor)",
                        "cursor_path",
                        "the JSONPath of the next cursor in a response, e.g. \"$.meta.next\"",
                    ),
                    Some(n) => self.value_path(n, "api.pagination.cursor_path"),
                };
                let param = match map.get("param") {
                    None => self.missing(
                        map.pos,
                        "api.pagination (cursor)",
                        "param",
                        "the query parameter that takes the cursor",
                    ),
                    Some(n) => self.param(Some(n), "api.pagination.param", ""),
                };
                Some(Pagination::Cursor {
                    cursor_path: cursor_path?,
                    param: param?,
                })
            }
            _ => {
                let path = match map.get("path") {
                    None => self.missing(
                        map.pos,
                        "api.pagination (next_url)",
                        "path",
                        "the JSONPath of the next page's URL in a response, e.g. \"$.links.next\"",
                    ),
                    Some(n) => self.value_path(n, "api.pagination.path"),
                };
                Some(Pagination::NextUrl { path: path? })
            }
        };
        if ok { pagination } else { None }
    }

    /// `stop` and `total_path` of page_number and offset pagination.
    fn read_stop(&mut self, map: &MapNode<'_>) -> Option<PageStop> {
        let file = self.doc.file.clone();
        let total = match map.get("stop") {
            None => Some(false),
            Some(n) => scalar_str(&file, n, "api.pagination.stop", self.problems).and_then(|s| match s {
                "empty" => Some(false),
                "total" => Some(true),
                _ => {
                    self.err(
                        n.pos,
                        format!("api.pagination.stop must be one of: empty, total; found \"{s}\""),
                    );
                    None
                }
            }),
        };
        match (total?, map.get("total_path")) {
            (false, None) => Some(PageStop::Empty),
            (false, Some(n)) => {
                self.err(n.pos, "api.pagination.total_path is read only with stop: total");
                None
            }
            (true, None) => {
                let at = map.get("stop").map_or(map.pos, |n| n.pos);
                self.err(
                    at,
                    "api.pagination.stop: total needs total_path (the JSONPath of the total, e.g. \"$.meta.total_pages\")",
                );
                None
            }
            (true, Some(n)) => self.value_path(n, "api.pagination.total_path").map(PageStop::Total),
        }
    }

    pub(super) fn read_incremental(&mut self, node: &Node, fields: Option<&[Field]>) -> Option<Incremental> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "api.incremental", INCREMENTAL_KEYS, self.problems)?;
        let names = self.names.clone();
        let field = match map.get("cursor_field") {
            None => self.missing(
                map.pos,
                "api.incremental",
                "cursor_field",
                "the field whose largest loaded value the next pull asks from, e.g. updated_at",
            ),
            Some(n) => scalar_str(&file, n, "api.incremental.cursor_field", self.problems).and_then(|s| {
                let Some(i) = names.iter().position(|f| f == s) else {
                    self.err(
                        n.pos,
                        format!(
                            "api.incremental.cursor_field names unknown field \"{s}\"; fields are: {}",
                            names.join(", ")
                        ),
                    );
                    return None;
                };
                let f = fields?.get(i)?;
                if matches!(f.ty, FieldType::Float64 | FieldType::Boolean) {
                    self.err(
                        n.pos,
                        format!(
                            "api.incremental.cursor_field \"{s}\" is {}; a cursor is an int32, int64, decimal, date, \
                             timestamp or string field",
                            f.ty.name()
                        ),
                    );
                    return None;
                }
                Some((i, f))
            }),
        };
        let param = match map.get("param") {
            None => self.missing(
                map.pos,
                "api.incremental",
                "param",
                "the query parameter that takes the cursor, e.g. updated_since",
            ),
            Some(n) => self.param(Some(n), "api.incremental.param", ""),
        };
        let initial = match (map.get("initial"), field) {
            (None, _) => Some(None),
            (Some(n), f) => scalar_str(&file, n, "api.incremental.initial", self.problems).and_then(|s| {
                let (_, f) = f?;
                if crate::spec::types::parse_value(f, s).is_err() {
                    self.err(
                        n.pos,
                        format!(
                            "api.incremental.initial \"{s}\" is not a valid {} value for field \"{}\"",
                            f.ty.name(),
                            f.name
                        ),
                    );
                    return None;
                }
                Some(Some(s.to_string()))
            }),
        };
        let lookback = match (map.get("lookback"), field) {
            (None, _) => Some(None),
            (Some(_), None) => None,
            (Some(n), Some((_, f))) => self.read_lookback(n, f).map(Some),
        };
        Some(Incremental {
            field: field?.0,
            param: param?,
            initial: initial?,
            lookback: lookback?,
        })
    }

    fn read_lookback(&mut self, n: &Node, f: &Field) -> Option<Lookback> {
        let file = self.doc.file.clone();
        match f.ty {
            FieldType::Date | FieldType::Timestamp => {
                scalar_duration(&file, n, "api.incremental.lookback", self.problems).map(Lookback::Time)
            }
            FieldType::Int32 | FieldType::Int64 | FieldType::Decimal { .. } => {
                let s = scalar_str(&file, n, "api.incremental.lookback", self.problems)?;
                let v = match f.ty {
                    FieldType::Decimal { scale, .. } => crate::spec::types::parse_decimal(s.trim().as_bytes(), scale),
                    _ => s.trim().parse::<i64>().ok().map(i128::from),
                };
                match v {
                    Some(v) if v >= 0 => Some(Lookback::Number(v)),
                    _ => {
                        let kind = if matches!(f.ty, FieldType::Decimal { .. }) {
                            "a number"
                        } else {
                            "an integer"
                        };
                        self.err(
                            n.pos,
                            format!(
                                "api.incremental.lookback for {} field \"{}\" must be {kind} >= 0, found \"{s}\"",
                                f.ty.name(),
                                f.name
                            ),
                        );
                        None
                    }
                }
            }
            _ => {
                self.err(
                    n.pos,
                    format!(
                        "api.incremental.lookback applies to a date, timestamp or numeric cursor; \"{}\" is a {} field",
                        f.name,
                        f.ty.name()
                    ),
                );
                None
            }
        }
    }

    pub(super) fn read_retry(&mut self, node: &Node) -> Option<Retry> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "api.retry", RETRY_KEYS, self.problems)?;
        let d = Retry::default();
        let max_attempts = match map.get("max_attempts") {
            None => Some(d.max_attempts),
            Some(n) => scalar_int(&file, n, "api.retry.max_attempts", 1, self.problems).map(|v| v.min(1000) as u32),
        };
        let backoff = match map.get("backoff") {
            None => Some(d.backoff),
            Some(n) => scalar_duration(&file, n, "api.retry.backoff", self.problems),
        };
        let max_backoff = match map.get("max_backoff") {
            None => Some(d.max_backoff),
            Some(n) => self.positive_duration(n, "api.retry.max_backoff"),
        };
        if let (Some(b), Some(m)) = (backoff, max_backoff)
            && b > m
        {
            let at = map.get("backoff").or(map.get("max_backoff")).map_or(map.pos, |n| n.pos);
            let shown = |key: &str, d: Duration| {
                map.get(key)
                    .and_then(Node::as_str)
                    .map_or_else(|| show_duration(d), str::to_string)
            };
            let (b, m) = (shown("backoff", b), shown("max_backoff", m));
            self.err(
                at,
                format!("api.retry.backoff ({b}) is longer than api.retry.max_backoff ({m})"),
            );
            return None;
        }
        Some(Retry {
            max_attempts: max_attempts?,
            backoff: backoff?,
            max_backoff: max_backoff?,
        })
    }

    pub(super) fn read_rate_limit(&mut self, node: &Node) -> Option<RateLimit> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "api.rate_limit", RATE_LIMIT_KEYS, self.problems)?;
        let Some(n) = map.get("requests_per_second") else {
            return self.missing(
                map.pos,
                "api.rate_limit",
                "requests_per_second",
                "a number > 0 and <= 1000, e.g. 10",
            );
        };
        let s = scalar_str(&file, n, "api.rate_limit.requests_per_second", self.problems)?;
        match s.trim().parse::<f64>() {
            Ok(v) if v > 0.0 && v <= 1000.0 => Some(RateLimit { requests_per_second: v }),
            _ => {
                self.err(
                    n.pos,
                    format!("api.rate_limit.requests_per_second must be a number > 0 and <= 1000; found \"{s}\""),
                );
                None
            }
        }
    }

    pub(super) fn positive_duration(&mut self, n: &Node, what: &str) -> Option<Duration> {
        let file = self.doc.file.clone();
        let d = scalar_duration(&file, n, what, self.problems)?;
        if d.is_zero() {
            self.err(n.pos, format!("{what} must be a duration > 0"));
            return None;
        }
        Some(d)
    }
}
