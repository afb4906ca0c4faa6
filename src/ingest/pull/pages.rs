//! The pages of a pull: each response's records taken out as their raw JSON text (white space
//! between tokens removed, nothing re-spelled: `9007199254740993` and `12.50` stay as sent),
//! one per line, and the next page found by the contract's pagination.
//!
//! A pull never stops early without saying so: a repeated cursor or next URL, a page that
//! repeats the one before, a body that is not JSON, or `max_pages` reached with a next page to
//! fetch fails the run (transient: nothing is published, the next pull starts over).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use reqwest::header::HeaderMap;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::ingest::pull::http::Client;
use crate::spec::contract::api::{Api, Method, PageStop, Pagination, RecordsPath, Step, ValuePath, parse_value_path};

/// What [`fetch`] got.
#[derive(Debug, Default)]
pub struct Fetched {
    pub pages: i64,
    pub records: u64,
    /// The first response was a 304 (`conditional: true`): nothing changed.
    pub not_modified: bool,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
}

/// The members of a JSON object in order, values raw.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The value one step below `raw`, if there is one (`None`: absent, or `raw` is not an object
/// or array as the step needs).
fn child<'a>(raw: &'a RawValue, step: &Step) -> Option<&'a RawValue> {
    match step {
        Step::Name(name) => {
            let m: Members<'a> = serde_json::from_str(raw.get()).ok()?;
            m.0.into_iter().rev().find(|(k, _)| k == name).map(|(_, v)| v)
        }
        Step::Index(i) => {
            let a: Vec<&'a RawValue> = serde_json::from_str(raw.get()).ok()?;
            a.get(*i).copied()
        }
    }
}

fn walk<'a>(root: &'a RawValue, steps: &[Step]) -> Option<&'a RawValue> {
    steps.iter().try_fold(root, |at, s| child(at, s))
}

/// A value a [`ValuePath`] names, as text: a string's value, a number as written; `None` when
/// absent, null, `""` or another kind.
pub fn value_text(root: &RawValue, path: &ValuePath) -> Option<String> {
    let v = walk(root, &path.steps)?;
    let t = v.get();
    match t.as_bytes().first()? {
        b'"' => serde_json::from_str::<String>(t).ok().filter(|s| !s.is_empty()),
        b'-' | b'0'..=b'9' => Some(t.to_string()),
        _ => None,
    }
}

/// Append `raw` to `out` without the white space between its tokens.
pub fn minify(raw: &str, out: &mut Vec<u8>) {
    let (mut in_string, mut escaped) = (false, false);
    for &b in raw.as_bytes() {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            if b == b'"' {
                in_string = true;
            }
            out.push(b);
        }
    }
}

/// The members of an array, or of an object; `None` for another value.
fn members(v: &RawValue) -> Option<std::result::Result<Vec<&RawValue>, serde_json::Error>> {
    match v.get().as_bytes().first() {
        Some(b'[') => Some(serde_json::from_str(v.get())),
        Some(b'{') => {
            Some(serde_json::from_str::<Members<'_>>(v.get()).map(|m| m.0.into_iter().map(|(_, v)| v).collect()))
        }
        _ => None,
    }
}

/// For a records path that filters or slices one array (`$.data[?@.kind == 'order']`,
/// `$.data[1:]`): the steps to that array, whose members are what the server sent as the page.
fn filtered_array(text: &str) -> Option<Vec<Step>> {
    if parse_value_path(text).is_some() {
        return None;
    }
    text.char_indices().filter(|&(_, c)| c == '[').find_map(|(i, _)| {
        let steps = parse_value_path(&text[..i])?;
        one_selection(&text[i..]).then_some(steps)
    })
}

/// `rest` is one bracketed selection: its `[` closes at its very end (quotes skipped).
fn one_selection(rest: &str) -> bool {
    let (mut depth, mut quote, mut escaped) = (0usize, None, false);
    for (i, c) in rest.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '[' | '(' => depth += 1,
            ']' | ')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1 == rest.len();
                }
            }
            _ => {}
        }
    }
    false
}

/// The records of one response, each minified and followed by `\n`, appended to `out`: their
/// count, and the page's size as the server sent it, which pagination goes by (a filter such as
/// `$.data[?@.kind == 'order']` keeps fewer records than the page holds: the page's size is then
/// the array's). `Err`: the body is not JSON (the reason).
pub fn records(body: &[u8], path: &RecordsPath, out: &mut Vec<u8>) -> std::result::Result<(usize, usize), String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8 ({e})"))?;
    let root: &RawValue = serde_json::from_str(text).map_err(|e| format!("the body is not JSON ({e})"))?;
    let mut n = 0;
    let mut push = |v: &RawValue, out: &mut Vec<u8>| {
        minify(v.get(), out);
        out.push(b'\n');
        n += 1;
    };
    if let Some(steps) = &path.simple {
        // `$.a.b[*]`: the members of the array (or object) the steps name; absent or null: none
        let Some(at) = walk(root, steps) else { return Ok((0, 0)) };
        if let Some(m) = members(at) {
            m.map_err(|e| e.to_string())?.into_iter().for_each(|v| push(v, out));
        }
        return Ok((n, n));
    }
    // any other query: evaluated on the parsed body, each match then read raw at its location
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("the body is not JSON ({e})"))?;
    for loc in path.query.query_located(&value).locations() {
        let steps: Vec<Step> = loc
            .iter()
            .map(|e| match e {
                serde_json_path::PathElement::Name(s) => Step::Name(s.to_string()),
                serde_json_path::PathElement::Index(i) => Step::Index(*i),
            })
            .collect();
        if let Some(v) = walk(root, &steps) {
            push(v, out);
        }
    }
    let sent = match filtered_array(&path.text)
        .and_then(|steps| walk(root, &steps))
        .and_then(members)
    {
        Some(m) => m.map_err(|e| e.to_string())?.len(),
        None => n,
    };
    Ok((n, sent.max(n)))
}

/// The URL of the first page: `base_url` and `path` joined, then `params` in file order.
pub fn first_url(api: &Api) -> Result<url::Url> {
    let base = api.base_url.as_str().trim_end_matches('/');
    let mut u = url::Url::parse(&format!("{base}{}", api.path))
        .map_err(|e| Error::RunFailed(format!("api.base_url with api.path is not a URL ({e})")))?;
    if !api.params.is_empty() {
        u.query_pairs_mut().extend_pairs(api.params.iter());
    }
    Ok(u)
}

/// One request's varying parameters: query parameters under GET, body keys under POST.
fn request(api: &Api, url: &url::Url, set: &[(String, String)]) -> (url::Url, Option<serde_json::Value>) {
    match &api.method {
        Method::Get => {
            let mut u = url.clone();
            if !set.is_empty() {
                let kept: Vec<(String, String)> = u
                    .query_pairs()
                    .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(kept).extend_pairs(set.iter());
            }
            (u, None)
        }
        Method::Post { body } => {
            // the pagination's own numbers (page, offset, limit) are JSON numbers; a cursor is text
            let number = |k: &str| match &api.pagination {
                Pagination::PageNumber { param, .. } => k == param,
                Pagination::Offset { param, limit_param, .. } => k == param || k == limit_param,
                _ => false,
            };
            let mut v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| serde_json::json!({}));
            if let Some(o) = v.as_object_mut() {
                for (k, val) in set {
                    let val = match val.parse::<i64>() {
                        Ok(n) if number(k) => serde_json::Value::from(n),
                        _ => serde_json::Value::String(val.clone()),
                    };
                    o.insert(k.clone(), val);
                }
            }
            (url.clone(), Some(v))
        }
    }
}

/// `Link: <url>; rel="next"` (RFC 8288), resolved against the request's URL.
fn link_next(headers: &HeaderMap, base: &url::Url) -> Option<url::Url> {
    for v in headers.get_all(reqwest::header::LINK) {
        let v = v.to_str().ok()?;
        for part in v.split(',') {
            let (target, params) = part.split_once(';').unwrap_or((part, ""));
            let Some(target) = target.trim().strip_prefix('<').and_then(|t| t.strip_suffix('>')) else {
                continue;
            };
            let next = params.split(';').any(|p| {
                let p = p.trim().to_ascii_lowercase();
                p.strip_prefix("rel=")
                    .is_some_and(|r| r.trim_matches('"').split_whitespace().any(|r| r == "next"))
            });
            if next {
                return base.join(target).ok();
            }
        }
    }
    None
}

/// Fetch every page, sending each page's record lines to `sink` as they come.
pub async fn fetch(
    client: &mut Client,
    api: &Api,
    source: &str,
    incremental: Option<(String, String)>,
    validators: (Option<String>, Option<String>),
    sink: &tokio::sync::mpsc::Sender<Vec<u8>>,
) -> Result<Fetched> {
    let first = first_url(api)?;
    let mut url = first.clone();
    let mut w = Walk {
        first,
        fixed: incremental.into_iter().collect(),
        set: Vec::new(),
        seen: HashSet::new(),
        page_no: 0,
        offset: 0,
        total: None,
    };
    let mut out = Fetched::default();
    let mut previous_page: Option<[u8; 32]> = None;
    let mut extra = HeaderMap::new();
    if api.conditional {
        if let Some(e) = validators.0.as_deref().and_then(|v| v.parse().ok()) {
            extra.insert(reqwest::header::IF_NONE_MATCH, e);
        }
        if let Some(m) = validators.1.as_deref().and_then(|v| v.parse().ok()) {
            extra.insert(reqwest::header::IF_MODIFIED_SINCE, m);
        }
    }
    match &api.pagination {
        Pagination::PageNumber { param, start, .. } => {
            w.page_no = *start;
            w.fixed.push((param.clone(), start.to_string()));
        }
        Pagination::Offset {
            param,
            limit_param,
            limit,
            ..
        } => {
            w.fixed.push((param.clone(), "0".into()));
            w.fixed.push((limit_param.clone(), limit.to_string()));
        }
        _ => {}
    }
    w.set = w.fixed.clone();
    loop {
        let (u, body) = request(api, &url, &w.set);
        let shown = client.redact.url(&client.with_key(&u));
        let resp = client.send(&api.method, &u, body.as_ref(), &extra).await?;
        extra.clear();
        if resp.status == reqwest::StatusCode::NOT_MODIFIED {
            if out.pages == 0 && api.conditional {
                out.not_modified = true;
                out.etag = validators.0;
                out.last_modified = validators.1;
                return Ok(out);
            }
            return Err(Error::RunInterrupted(format!(
                "{source}: {shown}: HTTP 304 to a request that sent no validator"
            )));
        }
        if out.pages == 0 {
            let header = |h| {
                resp.headers
                    .get(h)
                    .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
                    .map(str::to_string)
            };
            out.etag = header(reqwest::header::ETAG);
            out.last_modified = header(reqwest::header::LAST_MODIFIED);
        }
        let mut lines = Vec::with_capacity(resp.body.len());
        let (count, sent) = records(&resp.body, &api.records, &mut lines).map_err(|why| {
            Error::RunInterrupted(format!(
                "{source}: {shown}: {why}; nothing was published, the next pull starts over"
            ))
        })?;
        let digest: [u8; 32] = Sha256::digest(&lines).into();
        if count > 0
            && previous_page == Some(digest)
            && matches!(
                api.pagination,
                Pagination::PageNumber { .. } | Pagination::Offset { .. }
            )
        {
            return Err(Error::RunInterrupted(format!(
                "{source}: {shown}: the page repeats the one before it (does the server ignore the pagination \
                 parameter?); nothing was published"
            )));
        }
        previous_page = Some(digest);
        out.pages += 1;
        out.records += count as u64;
        // waits (without blocking the thread) while the file's writer is behind
        sink.send(lines)
            .await
            .map_err(|_| Error::Internal("the pull file's writer stopped".into()))?;
        let root: Option<&RawValue> = std::str::from_utf8(&resp.body)
            .ok()
            .and_then(|t| serde_json::from_str(t).ok());
        // the next request, or the end
        let next = next_request(&mut w, api, client, source, &shown, &u, &url, &resp.headers, root, sent)?;
        let Some(next) = next else { return Ok(out) };
        if matches!(api.pagination, Pagination::NextUrl { .. } | Pagination::LinkHeader) {
            // a next URL is taken as given: its own query carries the state
            w.set = Vec::new();
        }
        if out.pages >= api.max_pages as i64 {
            return Err(Error::RunInterrupted(format!(
                "{source}: api.max_pages ({}) reached with a next page still to fetch; nothing was published \
                 (raise api.max_pages if the source is that large)",
                api.max_pages
            )));
        }
        url = next;
    }
}

/// A next URL, checked: same origin as the first page (credentials go nowhere else), not seen.
fn next_url(
    client: &Client,
    source: &str,
    shown: &str,
    at: &url::Url,
    first: &url::Url,
    next: &str,
    seen: &mut HashSet<String>,
) -> Result<url::Url> {
    let u = at
        .join(next)
        .map_err(|e| Error::RunInterrupted(format!("{source}: {shown}: the next page's URL is not a URL ({e})")))?;
    if u.origin() != first.origin() {
        return Err(Error::RunFailed(format!(
            "{source}: {shown}: the next page is on another origin ({}); ingot sends credentials only to {}",
            client.redact.url(&u),
            first.origin().ascii_serialization()
        )));
    }
    if !seen.insert(u.to_string()) {
        return Err(Error::RunInterrupted(format!(
            "{source}: {shown}: the server named the next page {} a second time; the pull would loop, nothing \
             was published",
            client.redact.url(&u)
        )));
    }
    Ok(u)
}

/// `stop: total`: the total of `what` (pages or records) the first page gives at `path`. A page
/// with records and no such number fails the pull: the contract's path is wrong (or the vendor
/// moved it), and ending on an empty page instead could end it short or never.
fn read_total(
    root: Option<&RawValue>,
    path: &ValuePath,
    count: usize,
    what: &str,
    source: &str,
    shown: &str,
) -> Result<Option<u64>> {
    let total = root.and_then(|r| value_text(r, path)).and_then(|t| t.parse().ok());
    if total.is_none() && count > 0 {
        return Err(Error::RunFailed(format!(
            "{source}: {shown}: api.pagination.total_path \"{}\" names no number in the response (stop: total \
             needs the number of {what} there); give the path of that number, or use stop: empty; nothing was \
             published",
            path.text
        )));
    }
    Ok(total)
}

/// The state of a pull's walk over its pages.
struct Walk {
    first: url::Url,
    /// Parameters every request sends (the incremental cursor, the pagination's start).
    fixed: Vec<(String, String)>,
    /// The next request's varying parameters.
    set: Vec<(String, String)>,
    seen: HashSet<String>,
    page_no: i64,
    offset: u64,
    total: Option<u64>,
}

/// The next page's URL (its parameters in `w.set`), or `None` at the end.
#[allow(clippy::too_many_arguments)]
fn next_request(
    w: &mut Walk,
    api: &Api,
    client: &Client,
    source: &str,
    shown: &str,
    u: &url::Url,
    url: &url::Url,
    headers: &HeaderMap,
    root: Option<&RawValue>,
    count: usize,
) -> Result<Option<url::Url>> {
    Ok(match &api.pagination {
        Pagination::None => None,
        Pagination::PageNumber { param, start, stop } => {
            if let (PageStop::Total(p), None) = (stop, w.total) {
                w.total = read_total(root, p, count, "pages", source, shown)?;
            }
            let last = match (stop, w.total) {
                (PageStop::Total(_), Some(t)) => w.page_no >= start + t as i64 - 1,
                _ => count == 0,
            };
            if last || count == 0 {
                None
            } else {
                w.page_no += 1;
                w.set = w.fixed.clone();
                w.set.retain(|(k, _)| k != param);
                w.set.push((param.clone(), w.page_no.to_string()));
                Some(url.clone())
            }
        }
        Pagination::Offset { param, stop, .. } => {
            if let (PageStop::Total(p), None) = (stop, w.total) {
                w.total = read_total(root, p, count, "records", source, shown)?;
            }
            // by the records received, so a server that caps the page size skips nothing
            w.offset += count as u64;
            let last = count == 0 || matches!((stop, w.total), (PageStop::Total(_), Some(t)) if w.offset >= t);
            if last {
                None
            } else {
                w.set = w.fixed.clone();
                w.set.retain(|(k, _)| k != param);
                w.set.push((param.clone(), w.offset.to_string()));
                Some(url.clone())
            }
        }
        Pagination::Cursor { cursor_path, param } => match root.and_then(|r| value_text(r, cursor_path)) {
            None => None,
            Some(c) => {
                if !w.seen.insert(c.clone()) {
                    return Err(Error::RunInterrupted(format!(
                        "{source}: {shown}: the server gave the cursor \"{}\" a second time (at {}); the pull \
                         would loop, nothing was published",
                        client.redact.text(&c),
                        cursor_path.text
                    )));
                }
                w.set = w.fixed.clone();
                w.set.push((param.clone(), c));
                Some(url.clone())
            }
        },
        Pagination::NextUrl { path } => match root.and_then(|r| value_text(r, path)) {
            None => None,
            Some(n) => Some(next_url(client, source, shown, u, &w.first, &n, &mut w.seen)?),
        },
        Pagination::LinkHeader => match link_next(headers, u) {
            None => None,
            Some(n) => Some(next_url(client, source, shown, u, &w.first, n.as_str(), &mut w.seen)?),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> RecordsPath {
        RecordsPath {
            text: text.into(),
            query: serde_json_path::JsonPath::parse(text).unwrap(),
            simple: RecordsPath::simple_steps(text),
            pos: Default::default(),
        }
    }

    #[test]
    fn records_keep_their_text_without_the_white_space_between_tokens() {
        let body = br#"{"data": [ {"id": 9007199254740993, "s": "a b\" , c", "n": 12.50},
            {"id":2} ], "meta": {"next": null}}"#;
        for p in ["$.data[*]", "$.data[?@.id]", "$..data[*]"] {
            let mut out = Vec::new();
            assert_eq!(records(body, &path(p), &mut out), Ok((2, 2)), "{p}");
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "{\"id\":9007199254740993,\"s\":\"a b\\\" , c\",\"n\":12.50}\n{\"id\":2}\n",
                "{p}"
            );
        }
        let mut out = Vec::new();
        assert_eq!(records(br#"{"meta":{}}"#, &path("$.data[*]"), &mut out), Ok((0, 0)));
        assert!(
            records(b"{\"data\": [", &path("$.data[*]"), &mut out)
                .unwrap_err()
                .contains("not JSON")
        );
        assert!(records(b"<html>", &path("$.data[*]"), &mut out).is_err());
    }

    #[test]
    fn a_filtered_page_counts_what_the_server_sent() {
        let body = br#"{"data": [{"k": "a"}, {"k": "b"}, {"k": "a"}], "g": [{"o": [1, 2]}, {"o": [3]}]}"#;
        for (p, want) in [
            ("$.data[?@.k == 'a']", (2, 3)),
            ("$.data[?@.k == 'c']", (0, 3)),
            ("$.data[1:]", (2, 3)),
            ("$['data'][?(@.k == 'b' || @.k == ']')]", (1, 3)),
            ("$.g[*].o[*]", (3, 3)),
            ("$..o[*]", (3, 3)),
            ("$.data[0]", (1, 1)),
            ("$.nope[?@.k]", (0, 0)),
        ] {
            assert_eq!(records(body, &path(p), &mut Vec::new()), Ok(want), "{p}");
        }
        assert_eq!(filtered_array("$.a['x[?y]'][?@.z]"), parse_value_path("$.a['x[?y]']"));
        assert_eq!(filtered_array("$.a[?@.z].b"), None);
        assert_eq!(filtered_array("$.a[?@.z][0]"), None);
    }

    #[test]
    fn values_are_read_raw_and_links_parsed() {
        let root: &RawValue = serde_json::from_str(r#"{"meta":{"next":"c2","n":12,"z":"","x":null}}"#).unwrap();
        let vp = |t: &str| ValuePath {
            text: t.into(),
            steps: crate::spec::contract::api::parse_value_path(t).unwrap(),
        };
        assert_eq!(value_text(root, &vp("$.meta.next")).as_deref(), Some("c2"));
        assert_eq!(value_text(root, &vp("$.meta.n")).as_deref(), Some("12"));
        assert_eq!(value_text(root, &vp("$.meta.z")), None);
        assert_eq!(value_text(root, &vp("$.meta.x")), None);
        assert_eq!(value_text(root, &vp("$.nope")), None);
        let mut h = HeaderMap::new();
        h.insert(
            reqwest::header::LINK,
            r#"<https://v.example/o?page=1>; rel="prev", </o?page=3>; rel="next last""#
                .parse()
                .unwrap(),
        );
        let base = url::Url::parse("https://v.example/o?page=2").unwrap();
        assert_eq!(
            link_next(&h, &base).map(|u| u.to_string()).as_deref(),
            Some("https://v.example/o?page=3")
        );
    }
}
