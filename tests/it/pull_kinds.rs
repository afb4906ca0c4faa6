//! `ingot pull` of the API shapes tests/it/pull.rs leaves out, each against a loopback server
//! ([`crate::api_server`]) that checks what it receives: a POST body, numbered pages (`stop:
//! empty` and `stop: total`), next URLs, `Link` headers, basic, api_key and OAuth2
//! client-credentials auth, and records paths with a filter. Each test compares the whole bronze
//! rows with an NDJSON file of exactly the records the pull should have taken, and the request
//! log with what ingot should have sent; the failing ones check the run's class and message and
//! that no secret was printed.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::api_server::{Reply, Request, Server};
use crate::util::{TestLake, assert_ok, stderr, stdout};

/// A key with characters a URL must encode.
const KEY: &str = "kinds+key/5b0e2d71=never-shown";
const USER: &str = "svc-orders";
const CLIENT_ID: &str = "client-4411-orders";
const CLIENT_SECRET: &str = "cs-9a0c17e2-never-shown";

const FIELDS: &str = r#"fields:
  - {name: order_id, type: int64, required: true}
  - {name: kind, type: string}
  - {name: amount, type: "decimal(12,2)"}
natural_key:
  version: 1
  fields: [order_id]
"#;

/// Record `i` of the vendor, of kind `kind`.
fn rec(i: usize, kind: &str) -> String {
    format!(
        r#"{{"order_id": {}, "kind": "{kind}", "amount": "{}.25"}}"#,
        1000 + i,
        10 + i
    )
}

fn orders(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| rec(i, "order")).collect()
}

/// `{"data": [..]` then `extra` (`, "meta": ..`) and `}`.
fn page(records: &[String], extra: &str) -> String {
    format!("{{\"data\": [{}]{extra}}}", records.join(", "))
}

/// A lake whose source `orders` is pulled from `server` with the `api:` lines given (after
/// `base_url`), the secrets of every test in its environment.
fn lake(server: &Server, api: &str) -> TestLake {
    let mut t = TestLake::new();
    write_contract(&t, server, api);
    for (k, v) in [
        ("KINDS_KEY", KEY),
        ("KINDS_USER", USER),
        ("KINDS_PASS", KEY),
        ("KINDS_CLIENT_ID", CLIENT_ID),
        ("KINDS_CLIENT_SECRET", CLIENT_SECRET),
    ] {
        t.envs.push((k.into(), v.into()));
    }
    t
}

fn write_contract(t: &TestLake, server: &Server, api: &str) {
    let text = format!(
        "source: orders\nversion: 1\nformat: api\napi:\n  base_url: {}/v2\n{api}  retry: {{max_attempts: 2, backoff: \
         10ms, max_backoff: 20ms}}\n  timeout: 5s\n{FIELDS}",
        server.url()
    );
    std::fs::write(t.contracts().join("orders.yaml"), text).unwrap();
}

fn pull(t: &TestLake) -> Value {
    let out = t.run(&["pull", "orders", "--json"]);
    assert_ok(&out);
    let r: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(r["status"], "succeeded", "{r}");
    r
}

/// A pull that fails: exit 1, one failed run, nothing in bronze, no run folder; the run's log row
/// and everything printed (stdout, stderr and `ingot runs`), which must hold no secret.
fn pull_fails(t: &TestLake) -> (BTreeMap<String, Value>, String) {
    let out = t.run(&["pull", "orders"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("FAILED, nothing loaded"), "{}", stdout(&out));
    let log = t.query("SELECT * FROM audit.ingestion_run_log");
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["status"], "failed");
    assert_eq!(t.query("SELECT count(*) AS n FROM bronze.orders")[0]["n"], 0);
    assert!(!t.lake().join("bronze/orders").exists() || no_run_folder(t));
    let printed = format!("{}{}{}", stdout(&out), stderr(&out), runs_json(t));
    assert_no_secret(&printed);
    (log[0].clone(), printed)
}

fn no_run_folder(t: &TestLake) -> bool {
    std::fs::read_dir(t.lake().join("bronze/orders"))
        .unwrap()
        .all(|e| !e.unwrap().file_name().to_string_lossy().starts_with("run_id="))
}

/// `ingot runs --format json`, as printed.
fn runs_json(t: &TestLake) -> String {
    let out = t.run(&["runs", "--format", "json"]);
    assert_ok(&out);
    stdout(&out)
}

fn assert_no_secret(text: &str) {
    let encoded: String = url::form_urlencoded::byte_serialize(KEY.as_bytes()).collect();
    for s in [
        KEY,
        encoded.as_str(),
        CLIENT_ID,
        CLIENT_SECRET,
        &basic(USER, KEY),
        &basic(CLIENT_ID, CLIENT_SECRET),
    ] {
        assert!(!text.contains(s), "printed a secret ({s}): {text}");
    }
    assert!(!text.contains("tok-"), "printed an access token: {text}");
}

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
}

const COLS: &str = "order_id, kind, CAST(amount AS VARCHAR) AS amount, row_hash, natural_key_fingerprint, \
                    natural_key_version, source_row_number, is_deleted";

fn bronze(t: &TestLake) -> Vec<BTreeMap<String, Value>> {
    t.query(&format!("SELECT {COLS} FROM bronze.orders ORDER BY source_row_number"))
}

/// Bronze of the pull `r` holds exactly `want`, in that order, as an NDJSON file of them loads
/// (values, hashes, row numbers); the pull kept them as sent, white space removed.
fn assert_loaded(t: &TestLake, r: &Value, want: &[String]) {
    let file_lake = TestLake::new();
    std::fs::write(
        file_lake.contracts().join("orders.yaml"),
        format!("source: orders\nversion: 1\nformat: ndjson\n{FIELDS}"),
    )
    .unwrap();
    let file = file_lake.dir.path().join("orders.ndjson");
    std::fs::write(&file, want.join("\n") + "\n").unwrap();
    file_lake.ingest_ok("orders", &file);
    let got = bronze(t);
    assert_eq!(got.len(), want.len());
    assert_eq!(got, bronze(&file_lake));
    let ids: Vec<i64> = got.iter().map(|r| r["order_id"].as_i64().unwrap()).collect();
    let want_ids: Vec<i64> = want
        .iter()
        .map(|r| serde_json::from_str::<Value>(r).unwrap()["order_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, want_ids);
    assert_eq!(r["rows_inserted"].as_u64(), Some(want.len() as u64), "{r}");
    let kept = t.lake().join(format!(
        "bronze/orders/run_id={}/pull.ndjson.gz",
        r["run_id"].as_str().unwrap()
    ));
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(kept).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let minified: Vec<String> = want.iter().map(|r| r.replace(": ", ":").replace(", ", ",")).collect();
    assert_eq!(text.lines().collect::<Vec<_>>(), minified);
}

/// The query of each request, in order.
fn queries(server: &Server) -> Vec<Vec<(String, String)>> {
    server.requests().into_iter().map(|r| r.query).collect()
}

fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// `http://` + the Host the request was sent to: the server's own origin.
fn origin(req: &Request) -> String {
    format!("http://{}", req.header("host").unwrap())
}

#[test]
fn a_post_pull_sends_its_body_as_json_with_the_page_number_in_it_and_loads_every_page() {
    let data = orders(0..5);
    let server = Server::start(move |req: &Request| {
        if req.method != "POST" || req.header("content-type") != Some("application/json") {
            return Reply::status(415, r#"{"error":"POST a JSON body"}"#);
        }
        let Ok(body) = serde_json::from_str::<Value>(&req.body) else {
            return Reply::status(400, r#"{"error":"the body is not JSON"}"#);
        };
        let Some(n) = body["page"].as_u64() else {
            return Reply::status(422, r#"{"error":"page must be a number"}"#);
        };
        let chunk: Vec<String> = data.iter().skip((n as usize - 1) * 2).take(2).cloned().collect();
        Reply::json(page(&chunk, ""))
    });
    let t = lake(
        &server,
        r#"  path: /orders/search
  method: POST
  body: {status: [open, paid], region: eu, page_size: 2, exact: true, note: "500"}
  params: {tenant: acme}
  headers: {X-Client: ingot-test}
  records: "$.data[*]"
  pagination: {type: page_number}
"#,
    );
    let r = pull(&t);
    assert_loaded(&t, &r, &orders(0..5));
    assert_eq!(
        (r["pull"]["pages"].as_i64(), r["pull"]["requests"].as_i64()),
        (Some(4), Some(4))
    );
    let sent = server.requests();
    let bodies: Vec<Value> = sent.iter().map(|r| serde_json::from_str(&r.body).unwrap()).collect();
    let want: Vec<Value> = (1..=4)
        .map(|n| json!({"status": ["open", "paid"], "region": "eu", "page_size": 2, "exact": true, "note": "500", "page": n}))
        .collect();
    assert_eq!(
        bodies, want,
        "the body as the contract writes it, the page number in it"
    );
    for req in &sent {
        assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", "/v2/orders/search"));
        assert_eq!(
            req.query,
            q(&[("tenant", "acme")]),
            "params stay in the query; the page is in the body"
        );
        assert_eq!(req.header("content-type"), Some("application/json"));
        assert_eq!(req.header("accept"), Some("application/json"));
        assert_eq!(req.header("x-client"), Some("ingot-test"));
        assert_eq!(req.header("content-length"), Some(req.body.len().to_string().as_str()));
    }
}

#[test]
fn numbered_pages_count_up_from_start_and_end_on_an_empty_page_or_at_the_total() {
    // stop: empty, from page 0: pages 0, 1, 2 hold records, page 3 is empty and ends the pull
    let data = orders(0..5);
    let d = data.clone();
    let server = Server::start(move |req: &Request| {
        let n: usize = req.param("p").unwrap().parse().unwrap();
        let chunk: Vec<String> = d.iter().skip(n * 2).take(2).cloned().collect();
        Reply::json(page(&chunk, ""))
    });
    let t = lake(
        &server,
        "  path: /orders\n  params: {per_page: 2}\n  records: \"$.data[*]\"\n  pagination: {type: page_number, param: p, \
         start: 0, stop: empty}\n",
    );
    let r = pull(&t);
    assert_loaded(&t, &r, &data);
    let want: Vec<_> = ["0", "1", "2", "3"]
        .iter()
        .map(|p| q(&[("per_page", "2"), ("p", p)]))
        .collect();
    assert_eq!(queries(&server), want);
    assert_eq!(r["pull"]["pages"], 4);

    // stop: total: the first page says there are 3 pages; no 4th request
    let d = data.clone();
    let server = Server::start(move |req: &Request| {
        let n: usize = req.param("page").unwrap().parse().unwrap();
        let chunk: Vec<String> = d.iter().skip((n - 1) * 2).take(2).cloned().collect();
        Reply::json(page(&chunk, r#", "meta": {"total_pages": 3, "page": "ignored"}"#))
    });
    let api = "  path: /orders\n  records: \"$.data[*]\"\n  pagination: {type: page_number, stop: total, total_path: \
               \"$.meta.total_pages\"}\n";
    let t = lake(&server, api);
    let r = pull(&t);
    assert_loaded(&t, &r, &data);
    let want: Vec<_> = ["1", "2", "3"].iter().map(|p| q(&[("page", p)])).collect();
    assert_eq!(queries(&server), want);
    assert_eq!(
        (r["pull"]["pages"].as_i64(), r["pull"]["requests"].as_i64()),
        (Some(3), Some(3))
    );
}

#[test]
fn a_numbered_page_that_repeats_the_one_before_or_a_total_that_is_not_there_fails_the_pull() {
    // the server ignores the page parameter: page 2 is page 1 again
    let server = Server::start(|_: &Request| Reply::json(page(&orders(0..2), r#", "meta": {"total_pages": 5}"#)));
    let api = "  path: /orders\n  records: \"$.data[*]\"\n  pagination: {type: page_number, stop: total, total_path: \
               \"$.meta.total_pages\"}\n";
    let t = lake(&server, api);
    let (run, _) = pull_fails(&t);
    assert_eq!(run["failure_class"], "transient");
    let error = run["error"].as_str().unwrap();
    assert!(
        error.contains("the page repeats the one before it (does the server ignore the pagination parameter?)"),
        "{error}"
    );
    assert_eq!(queries(&server), [q(&[("page", "1")]), q(&[("page", "2")])]);

    // stop: total, but the response has no such total: the contract's setting fails, named
    let server = Server::start(|req: &Request| {
        let n: usize = req.param("page").unwrap().parse().unwrap();
        // past the end the server repeats its last page, as many do
        Reply::json(page(
            &orders((n.min(2) - 1) * 2..n.min(2) * 2),
            r#", "meta": {"pages": 2}"#,
        ))
    });
    let t = lake(&server, api);
    let (run, _) = pull_fails(&t);
    assert_eq!(run["failure_class"], "content");
    let error = run["error"].as_str().unwrap();
    assert!(
        error.contains(
            "api.pagination.total_path \"$.meta.total_pages\" names no number in the response (stop: total needs \
             the number of pages there)"
        ),
        "{error}"
    );
    assert_eq!(queries(&server), [q(&[("page", "1")])]);
}

/// A vendor whose pages (2 records each, 9 in all) name the next one by `$.links.next`, written
/// each time another way: relative query, relative path, absolute path, absolute URL.
fn next_url_vendor() -> impl FnMut(&Request) -> Reply + Send {
    let data = orders(0..9);
    move |req: &Request| {
        if req.param("api_key") != Some(KEY) {
            return Reply::status(401, r#"{"error":"bad key"}"#);
        }
        let after: usize = req.param("after").map_or(0, |a| a.parse().unwrap());
        let next = match after {
            0 => "\"?after=2&size=2\"".to_string(),
            2 => "\"orders?after=4&size=2\"".to_string(),
            4 => "\"/v2/orders?after=6&size=2\"".to_string(),
            6 => format!("\"{}/v2/orders?after=8&size=2\"", origin(req)),
            _ => "null".to_string(),
        };
        let chunk: Vec<String> = data.iter().skip(after).take(2).cloned().collect();
        Reply::json(page(&chunk, &format!(r#", "links": {{"next": {next}}}"#)))
    }
}

const NEXT_URL_API: &str = r#"  path: /orders
  params: {size: 2}
  auth: {type: api_key, in: query, name: api_key, key_env: KINDS_KEY}
  records: "$.data[*]"
  pagination: {type: next_url, path: "$.links.next"}
"#;

#[test]
fn next_urls_relative_or_absolute_on_the_same_origin_are_followed_as_given() {
    let server = Server::start(next_url_vendor());
    let t = lake(&server, NEXT_URL_API);
    let r = pull(&t);
    assert_loaded(&t, &r, &orders(0..9));
    assert_eq!(r["pull"]["pages"], 5);
    // each next URL's own query, the key added; nothing of the first page's parameters kept
    let want = vec![
        q(&[("size", "2"), ("api_key", KEY)]),
        q(&[("after", "2"), ("size", "2"), ("api_key", KEY)]),
        q(&[("after", "4"), ("size", "2"), ("api_key", KEY)]),
        q(&[("after", "6"), ("size", "2"), ("api_key", KEY)]),
        q(&[("after", "8"), ("size", "2"), ("api_key", KEY)]),
    ];
    assert_eq!(queries(&server), want);
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.method == "GET" && r.path == "/v2/orders")
    );
    let log = t.query("SELECT file_path FROM audit.ingestion_run_log");
    assert_eq!(
        log[0]["file_path"],
        Value::from(format!("{}/v2/orders?size=2", server.url()))
    );
    assert_no_secret(&runs_json(&t));
}

#[test]
fn a_next_url_on_another_origin_or_named_twice_fails_the_pull_and_nothing_goes_there() {
    let elsewhere = Server::start(next_url_vendor());
    let to = format!("{}/v2/orders?after=2&size=2", elsewhere.url());
    let to_json = to.clone();
    let server = Server::start(move |_: &Request| {
        Reply::json(page(&orders(0..2), &format!(r#", "links": {{"next": "{to_json}"}}"#)))
    });
    let t = lake(&server, NEXT_URL_API);
    let (run, printed) = pull_fails(&t);
    assert_eq!(run["failure_class"], "content");
    let error = run["error"].as_str().unwrap();
    let says = format!(
        "orders: {}/v2/orders?size=2&api_key=***: the next page is on another origin ({to}); ingot sends \
         credentials only to {}",
        server.url(),
        server.url()
    );
    assert!(error.contains(&says), "{error}");
    assert!(printed.contains(&says), "{printed}");
    assert!(elsewhere.requests().is_empty(), "a request went to another origin");
    assert_eq!(server.requests().len(), 1);

    // a next URL the server already named: the pull would loop
    let server =
        Server::start(|_: &Request| Reply::json(page(&orders(0..2), r#", "links": {"next": "?after=2&size=2"}"#)));
    let t = lake(&server, NEXT_URL_API);
    let (run, _) = pull_fails(&t);
    assert_eq!(run["failure_class"], "transient");
    let error = run["error"].as_str().unwrap();
    assert!(
        error.contains(&format!(
            "the server named the next page {}/v2/orders?after=2&size=2 a second time; the pull would loop",
            server.url()
        )),
        "{error}"
    );
    assert_eq!(server.requests().len(), 2);
}

#[test]
fn link_header_pages_follow_rel_next_and_end_when_there_is_none() {
    let data = orders(0..5);
    let server = Server::start(move |req: &Request| {
        let n: usize = req.param("page").map_or(1, |p| p.parse().unwrap());
        let chunk: Vec<String> = data.iter().skip((n - 1) * 2).take(2).cloned().collect();
        let at = |p: usize| format!("{}/v2/orders?page={p}&per_page=2", origin(req));
        let reply = Reply::json(page(&chunk, ""));
        match n {
            // absolute, quoted, beside rel="last"
            1 => reply.header("Link", &format!(r#"<{}>; rel="next", <{}>; rel="last""#, at(2), at(3))),
            // two header lines, relative, rel unquoted and in capitals
            2 => reply
                .header("Link", r#"</v2/orders?page=1&per_page=2>; rel="prev""#)
                .header("Link", "</v2/orders?page=3&per_page=2>; REL=Next"),
            // the last page: links, but none of them next
            _ => reply.header("Link", &format!(r#"<{}>; rel="first", <{}>; rel="prev""#, at(1), at(2))),
        }
    });
    let t = lake(
        &server,
        "  path: /orders\n  params: {per_page: 2}\n  records: \"$.data[*]\"\n  pagination: {type: link_header}\n",
    );
    let r = pull(&t);
    assert_loaded(&t, &r, &orders(0..5));
    let want = vec![
        q(&[("per_page", "2")]),
        q(&[("page", "2"), ("per_page", "2")]),
        q(&[("page", "3"), ("per_page", "2")]),
    ];
    assert_eq!(queries(&server), want);
    assert_eq!(
        (r["pull"]["pages"].as_i64(), r["pull"]["requests"].as_i64()),
        (Some(3), Some(3))
    );
}

/// How each auth type's credential reaches the server: the `auth` line, and what a request must
/// carry (header or query parameter, exactly) and must not.
struct AuthCase {
    name: &'static str,
    auth: &'static str,
    check: fn(&Request) -> Result<(), String>,
    /// What a server that echoes the credential it got would echo, and that echo as ingot shows it.
    echo: fn(&Request) -> String,
    echo_shown: &'static str,
}

fn auth_cases() -> Vec<AuthCase> {
    vec![
        AuthCase {
            name: "basic",
            auth: "{type: basic, username_env: KINDS_USER, password_env: KINDS_PASS}",
            check: |r| {
                let want = basic(USER, KEY);
                match (r.header("authorization"), r.header("x-api-key"), r.param("key")) {
                    (Some(a), None, None) if a == want => Ok(()),
                    other => Err(format!("{other:?}, not {want}")),
                }
            },
            echo: |r| r.header("authorization").unwrap_or("").to_string(),
            echo_shown: "Basic ***",
        },
        AuthCase {
            name: "api_key in header",
            auth: "{type: api_key, name: X-Api-Key, key_env: KINDS_KEY}",
            check: |r| match (r.header("x-api-key"), r.header("authorization"), r.param("key")) {
                (Some(k), None, None) if k == KEY => Ok(()),
                other => Err(format!("{other:?}")),
            },
            echo: |r| r.header("x-api-key").unwrap_or("").to_string(),
            echo_shown: "***",
        },
        AuthCase {
            name: "api_key in query",
            auth: "{type: api_key, in: query, name: key, key_env: KINDS_KEY}",
            check: |r| match (r.param("key"), r.header("x-api-key"), r.header("authorization")) {
                (Some(k), None, None) if k == KEY => Ok(()),
                other => Err(format!("{other:?}")),
            },
            echo: |r| r.param("key").unwrap_or("").to_string(),
            echo_shown: "***",
        },
    ]
}

#[test]
fn basic_and_api_key_credentials_go_exactly_where_the_contract_says_and_are_printed_nowhere() {
    for case in auth_cases() {
        let name = case.name;
        let deny = Arc::new(Mutex::new(false));
        let d = deny.clone();
        let data = orders(0..5);
        let server = Server::start(move |req: &Request| {
            if let Err(why) = (case.check)(req) {
                return Reply::status(401, &format!("{{\"error\": {}}}", json!(why)));
            }
            if *d.lock().unwrap() {
                // a vendor that shows the credential it refused
                return Reply::status(403, &format!("{{\"error\": \"not allowed for {}\"}}", (case.echo)(req)));
            }
            let n: usize = req.param("page").unwrap().parse().unwrap();
            Reply::json(page(
                &data.iter().skip((n - 1) * 2).take(2).cloned().collect::<Vec<_>>(),
                "",
            ))
        });
        let api = format!(
            "  path: /orders\n  params: {{region: eu}}\n  auth: {}\n  records: \"$.data[*]\"\n  pagination: {{type: \
             page_number}}\n",
            case.auth
        );
        let t = lake(&server, &api);
        let r = pull(&t);
        assert_loaded(&t, &r, &orders(0..5));
        let sent = server.requests();
        assert_eq!(sent.len(), 4, "{name}");
        for (i, req) in sent.iter().enumerate() {
            assert_eq!(
                (req.param("region"), req.param("page")),
                (Some("eu"), Some((i + 1).to_string().as_str())),
                "{name}"
            );
        }
        let log = t.query("SELECT file_path FROM audit.ingestion_run_log");
        assert_eq!(
            log[0]["file_path"],
            Value::from(format!("{}/v2/orders?region=eu", server.url())),
            "{name}"
        );
        assert_no_secret(&runs_json(&t));

        // refused: the message says so, and holds neither the secret nor the vendor's echo of it
        *deny.lock().unwrap() = true;
        let t = lake(&server, &api);
        let (run, printed) = pull_fails(&t);
        assert_eq!(run["failure_class"], "content", "{name}");
        let error = run["error"].as_str().unwrap();
        assert!(
            error.contains("HTTP 403 Forbidden (forbidden: the credentials are valid but may not read this"),
            "{name}: {error}"
        );
        let echoed = format!("{{\"error\": \"not allowed for {}\"}}", case.echo_shown);
        assert!(error.contains(&echoed), "{name}: {error}");
        if name == "api_key in query" {
            assert!(error.contains("/v2/orders?region=eu&page=1&key=***"), "{name}: {error}");
        }
        assert!(printed.contains(error), "{name}: {printed}");
    }
}

/// How the OAuth2 vendor misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
enum OAuth {
    /// The first token is refused (expired early) after one page; later ones last.
    FirstTokenExpires,
    /// Every token is refused by the data endpoint.
    RefusesEveryToken,
    /// The token endpoint refuses the client.
    RefusesTheClient,
}

/// A token endpoint at /oauth/token (client credentials, HTTP Basic client auth, scope
/// `orders:read`) issuing `tok-1`, `tok-2`, …, and numbered data pages that need the newest token.
fn oauth_vendor(how: OAuth) -> impl FnMut(&Request) -> Reply + Send {
    let data = orders(0..5);
    let (mut issued, mut used) = (0, 0);
    move |req: &Request| {
        if req.path == "/oauth/token" {
            let form: Vec<(String, String)> = url::form_urlencoded::parse(req.body.as_bytes()).into_owned().collect();
            let ok = req.method == "POST"
                && req.header("content-type") == Some("application/x-www-form-urlencoded")
                && req.header("authorization") == Some(basic(CLIENT_ID, CLIENT_SECRET).as_str())
                && form == q(&[("grant_type", "client_credentials"), ("scope", "orders:read")]);
            if !ok {
                return Reply::status(400, r#"{"error":"invalid_request"}"#);
            }
            if how == OAuth::RefusesTheClient {
                return Reply::status(401, &format!(r#"{{"error":"invalid_client {CLIENT_ID}"}}"#));
            }
            issued += 1;
            used = 0;
            return Reply::json(format!(
                r#"{{"access_token": "tok-{issued}-never-shown", "token_type": "Bearer", "expires_in": 3600}}"#
            ));
        }
        let want = format!("Bearer tok-{issued}-never-shown");
        if req.header("authorization") != Some(want.as_str()) {
            return Reply::status(401, r#"{"error":"invalid_token"}"#);
        }
        used += 1;
        if how == OAuth::RefusesEveryToken || (how == OAuth::FirstTokenExpires && issued == 1 && used > 1) {
            // the vendor expired the token early; it says which
            return Reply::status(401, &format!(r#"{{"error":"token {} expired"}}"#, &want[7..]));
        }
        let n: usize = req.param("page").unwrap().parse().unwrap();
        Reply::json(page(
            &data.iter().skip((n - 1) * 2).take(2).cloned().collect::<Vec<_>>(),
            "",
        ))
    }
}

fn oauth_lake(server: &Server) -> TestLake {
    let api = format!(
        "  path: /orders\n  auth: {{type: oauth2_client_credentials, token_url: {}/oauth/token, client_id_env: \
         KINDS_CLIENT_ID, client_secret_env: KINDS_CLIENT_SECRET, scope: \"orders:read\"}}\n  records: \
         \"$.data[*]\"\n  pagination: {{type: page_number}}\n",
        server.url()
    );
    lake(server, &api)
}

/// Each request as (method, path, page, Authorization with the token's number only).
fn exchanges(server: &Server) -> Vec<(String, String, Option<String>, Option<String>)> {
    server
        .requests()
        .into_iter()
        .map(|r| {
            let auth = r.header("authorization").map(|a| {
                if a == basic(CLIENT_ID, CLIENT_SECRET) {
                    "client".to_string()
                } else {
                    a.trim_end_matches("-never-shown").to_string()
                }
            });
            (
                r.method.clone(),
                r.path.clone(),
                r.param("page").map(str::to_string),
                auth,
            )
        })
        .collect()
}

fn ex(method: &str, path: &str, page: Option<&str>, auth: &str) -> (String, String, Option<String>, Option<String>) {
    (method.into(), path.into(), page.map(str::to_string), Some(auth.into()))
}

#[test]
fn an_oauth2_pull_fetches_a_token_once_uses_it_on_every_page_and_refreshes_it_once_after_a_401() {
    // the token is good for one page only: the second page's 401 fetches a new one, once
    let server = Server::start(oauth_vendor(OAuth::FirstTokenExpires));
    let t = oauth_lake(&server);
    let out = t.run(&["pull", "orders", "--json"]);
    assert_ok(&out);
    let r: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_loaded(&t, &r, &orders(0..5));
    let (token, data) = ("/oauth/token", "/v2/orders");
    assert_eq!(
        exchanges(&server),
        vec![
            ex("POST", token, None, "client"),
            ex("GET", data, Some("1"), "Bearer tok-1"),
            ex("GET", data, Some("2"), "Bearer tok-1"),
            ex("POST", token, None, "client"),
            ex("GET", data, Some("2"), "Bearer tok-2"),
            ex("GET", data, Some("3"), "Bearer tok-2"),
            ex("GET", data, Some("4"), "Bearer tok-2"),
        ],
        "{}",
        stderr(&out)
    );
    assert_eq!(
        (r["pull"]["requests"].as_i64(), r["pull"]["retries"].as_i64()),
        (Some(7), Some(0))
    );
    let err = stderr(&out);
    assert!(
        err.contains("HTTP 401 Unauthorized (unauthorized: check the credentials")
            && err.contains("token *** expired")
            && err.contains("; fetching a new access token"),
        "{err}"
    );
    assert_no_secret(&format!("{}{err}{}", stdout(&out), runs_json(&t)));
}

#[test]
fn an_oauth2_pull_whose_new_token_is_refused_too_or_whose_client_is_refused_fails_naming_what_to_check() {
    let (token, data) = ("/oauth/token", "/v2/orders");
    let cases = [
        (
            OAuth::RefusesEveryToken,
            "HTTP 401 Unauthorized (unauthorized: check the credentials api.auth names, and that they are current)",
            vec![
                ex("POST", token, None, "client"),
                ex("GET", data, Some("1"), "Bearer tok-1"),
                ex("POST", token, None, "client"),
                ex("GET", data, Some("1"), "Bearer tok-2"),
            ],
        ),
        (
            OAuth::RefusesTheClient,
            "/oauth/token: HTTP 401 Unauthorized fetching an access token (check api.auth.token_url, the client id \
             and secret it names, and api.auth.scope); nothing was published",
            vec![ex("POST", token, None, "client")],
        ),
    ];
    for (how, says, sent) in cases {
        let server = Server::start(oauth_vendor(how));
        let t = oauth_lake(&server);
        let (run, printed) = pull_fails(&t);
        assert_eq!(run["failure_class"], "content", "{how:?}");
        let error = run["error"].as_str().unwrap();
        assert!(error.contains(says), "{how:?}: {error}");
        assert!(printed.contains(says), "{how:?}: {printed}");
        assert_eq!(exchanges(&server), sent, "{how:?}");
    }
}

/// A page of records of several kinds: `kinds[i]` is record `from + i`'s.
fn mixed(from: usize, kinds: &[&str]) -> Vec<String> {
    kinds.iter().enumerate().map(|(i, k)| rec(from + i, k)).collect()
}

#[test]
fn a_records_path_with_a_filter_or_nested_wildcards_takes_exactly_the_records_it_selects() {
    let kinds = ["order", "refund", "order", "note", "order", "refund"];
    let all = mixed(0, &kinds);
    let body = page(&all, r#", "meta": {"kind": "order"}"#);
    let nested = format!(
        r#"{{"groups": [{{"orders": [{}, {}]}}, {{"orders": []}}, {{"name": "none"}}, {{"orders": [{}]}}], "data": [{}]}}"#,
        all[0], all[1], all[2], all[3]
    );
    let cases = [
        (
            "$.data[?@.kind=='order']",
            body.clone(),
            vec![all[0].clone(), all[2].clone(), all[4].clone()],
        ),
        (
            "$.data[?@.kind != 'order' && @.order_id > 1002]",
            body.clone(),
            vec![all[3].clone(), all[5].clone()],
        ),
        ("$.data[1:4]", body, all[1..4].to_vec()),
        ("$.groups[*].orders[*]", nested, all[..3].to_vec()),
    ];
    for (path, body, want) in cases {
        let server = Server::start(move |_: &Request| Reply::json(body.clone()));
        let t = lake(&server, &format!("  path: /orders\n  records: \"{path}\"\n"));
        let r = pull(&t);
        assert_eq!(r["rows_seen"].as_u64(), Some(want.len() as u64), "{path}: {r}");
        assert_loaded(&t, &r, &want);
        assert_eq!(server.requests().len(), 1, "{path}");
    }
}

#[test]
fn pages_of_a_filtered_records_path_advance_by_what_the_server_sent_not_by_what_the_filter_kept() {
    // 12 records, 3 a page: the second page holds no order at all
    let kinds = [
        "order", "refund", "order", "refund", "refund", "note", "order", "order", "refund", "order", "refund", "order",
    ];
    let all = mixed(0, &kinds);
    let want: Vec<String> = all.iter().filter(|r| r.contains("\"order\"")).cloned().collect();
    let a = all.clone();
    let offsets = Server::start(move |req: &Request| {
        let from: usize = req.param("offset").unwrap().parse().unwrap();
        let limit: usize = req.param("limit").unwrap().parse().unwrap();
        Reply::json(page(&a.iter().skip(from).take(limit).cloned().collect::<Vec<_>>(), ""))
    });
    let t = lake(
        &offsets,
        "  path: /orders\n  records: \"$.data[?@.kind=='order']\"\n  pagination: {type: offset, limit: 3}\n",
    );
    let r = pull(&t);
    assert_loaded(&t, &r, &want);
    let sent: Vec<String> = offsets
        .requests()
        .iter()
        .map(|r| r.param("offset").unwrap().to_string())
        .collect();
    assert_eq!(sent, ["0", "3", "6", "9", "12"]);

    let a = all.clone();
    let numbers = Server::start(move |req: &Request| {
        let n: usize = req.param("page").unwrap().parse().unwrap();
        Reply::json(page(
            &a.iter().skip((n - 1) * 3).take(3).cloned().collect::<Vec<_>>(),
            "",
        ))
    });
    let t = lake(
        &numbers,
        "  path: /orders\n  records: \"$.data[?@.kind=='order']\"\n  pagination: {type: page_number}\n",
    );
    let r = pull(&t);
    assert_loaded(&t, &r, &want);
    let sent: Vec<String> = numbers
        .requests()
        .iter()
        .map(|r| r.param("page").unwrap().to_string())
        .collect();
    assert_eq!(sent, ["1", "2", "3", "4", "5"]);
}
