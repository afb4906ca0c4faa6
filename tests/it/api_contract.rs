//! `format: api` contracts: `ingot check` validates the whole `api` section with located problems
//! and never reads a secret; files of an API source are refused (`ingot pull` pulls it: tests/it/pull.rs).

use std::path::Path;
use std::time::Duration;

use ingot::spec::contract::api::{Auth, KeyAt, Lookback, Method, PageStop, Pagination, SecretFrom, Step};
use ingot::spec::contract::{Contract, Format};
use ingot::spec::yaml::Problems;

use crate::util::{TestLake, files_under, repo, stderr, stdout};

const SECRET: &str = "tok-3f9a77c1-never-printed";

const VALID: &str = r#"source: orders
version: 1
format: api
api:
  base_url: https://vendor.example/v2
  path: /orders
  method: POST
  body: {status: [open, paid], page_size: 500, exact: true, note: "500"}
  params: {region: eu, limit: 500}
  headers: {X-Client: ingot}
  auth: {type: api_key, in: header, name: X-Api-Key, key_env: VENDOR_KEY}
  records: "$.data[*]"
  pagination: {type: cursor, cursor_path: "$.meta['next cursor']", param: cursor}
  max_pages: 200
  incremental: {cursor_field: updated_at, param: updated_since, initial: "2026-01-01T00:00:00Z", lookback: 1h}
  retry: {max_attempts: 3, backoff: 500ms, max_backoff: 2m}
  rate_limit: {requests_per_second: 2.5}
  timeout: 45s
  conditional: false
fields:
  - name: order_id
    type: int64
    required: true
  - name: order_status
    type: string
  - name: amount
    type: decimal(12,2)
  - name: updated_at
    type: timestamp
natural_key:
  version: 1
  fields: [order_id]
"#;

fn contract(name: &str, text: &str) -> Result<Contract, Vec<String>> {
    let mut problems = Problems::default();
    let c = Contract::from_str(Path::new(name), text, &mut problems);
    match c {
        Some(c) if problems.is_empty() => Ok(c),
        _ => Err(problems.items.iter().map(|p| p.to_string()).collect()),
    }
}

#[test]
fn a_full_api_section_is_read_with_its_defaults() {
    let c = contract("contracts/orders.yaml", VALID).unwrap_or_else(|p| panic!("{}", p.join("\n")));
    assert_eq!(c.format, Format::Api);
    let api = c.api.as_deref().expect("api section");
    assert_eq!(api.base_url.as_str(), "https://vendor.example/v2");
    assert_eq!(api.path, "/orders");
    assert_eq!(
        api.method,
        Method::Post {
            body: r#"{"status":["open","paid"],"page_size":500,"exact":true,"note":"500"}"#.into()
        }
    );
    assert_eq!(
        api.params,
        vec![("region".into(), "eu".into()), ("limit".into(), "500".into())]
    );
    assert_eq!(
        api.headers,
        vec![
            ("X-Client".into(), "ingot".into()),
            ("Accept".into(), "application/json".into())
        ]
    );
    let Auth::ApiKey { at, name, key } = &api.auth else {
        panic!("{:?}", api.auth)
    };
    assert_eq!((*at, name.as_str()), (KeyAt::Header, "X-Api-Key"));
    assert_eq!(key.from, SecretFrom::Env("VENDOR_KEY".into()));
    assert_eq!(key.key, "api.auth.key_env");
    assert_eq!(api.records.text, "$.data[*]");
    assert_eq!(api.records.simple, Some(vec![Step::Name("data".into())]));
    let Pagination::Cursor { cursor_path, param } = &api.pagination else {
        panic!("{:?}", api.pagination)
    };
    assert_eq!(
        cursor_path.steps,
        vec![Step::Name("meta".into()), Step::Name("next cursor".into())]
    );
    assert_eq!(param, "cursor");
    assert_eq!(api.max_pages, 200);
    let inc = api.incremental.as_ref().unwrap();
    assert_eq!(c.fields[inc.field].name, "updated_at");
    assert_eq!(inc.param, "updated_since");
    assert_eq!(inc.initial.as_deref(), Some("2026-01-01T00:00:00Z"));
    assert_eq!(inc.lookback, Some(Lookback::Time(Duration::from_secs(3600))));
    assert_eq!(
        (api.retry.max_attempts, api.retry.backoff, api.retry.max_backoff),
        (3, Duration::from_millis(500), Duration::from_secs(120))
    );
    assert_eq!(api.rate_limit.unwrap().requests_per_second, 2.5);
    assert_eq!(api.timeout, Duration::from_secs(45));
    assert!(!api.conditional);

    // the smallest section: every default
    let small = VALID.replace(
        &VALID[VALID.find("  method:").unwrap()..VALID.find("fields:").unwrap()],
        "  records: \"$.items[?@.kind == 'order']\"\n",
    );
    let c = contract("contracts/orders.yaml", &small).unwrap_or_else(|p| panic!("{}", p.join("\n")));
    let api = c.api.as_deref().unwrap();
    assert_eq!(api.method, Method::Get);
    assert_eq!(api.auth, Auth::None);
    assert_eq!(api.pagination, Pagination::None);
    assert_eq!(api.records.simple, None);
    assert_eq!(
        (api.max_pages, api.timeout, api.retry.max_attempts, api.conditional),
        (10_000, Duration::from_secs(30), 5, false)
    );
    assert!(api.incremental.is_none() && api.rate_limit.is_none());
    assert_eq!(api.headers, vec![("Accept".into(), "application/json".into())]);

    // a secret file is taken from the contract's folder; page_number with stop: total
    let files = VALID
        .replace(
            "{type: api_key, in: header, name: X-Api-Key, key_env: VENDOR_KEY}",
            "{type: basic, username_env: VENDOR_USER, password_file: secrets/vendor_password}",
        )
        .replace(
            "{type: cursor, cursor_path: \"$.meta['next cursor']\", param: cursor}",
            "{type: page_number, start: 0, stop: total, total_path: \"$.meta.pages\"}",
        );
    let c = contract("contracts/orders.yaml", &files).unwrap_or_else(|p| panic!("{}", p.join("\n")));
    let api = c.api.as_deref().unwrap();
    let Auth::Basic { password, .. } = &api.auth else {
        panic!("{:?}", api.auth)
    };
    assert_eq!(
        password.from,
        SecretFrom::File("contracts/secrets/vendor_password".into())
    );
    let Pagination::PageNumber {
        param,
        start,
        stop: PageStop::Total(total),
    } = &api.pagination
    else {
        panic!("{:?}", api.pagination)
    };
    assert_eq!(
        (param.as_str(), *start, total.text.as_str()),
        ("page", 0, "$.meta.pages")
    );
}

#[test]
fn check_passes_a_valid_api_contract_and_never_reads_its_secrets() {
    let mut t = TestLake::new();
    t.envs.push(("VENDOR_KEY".into(), SECRET.into()));
    std::fs::write(t.contracts().join("orders.yaml"), VALID).unwrap();
    let out = t.run(&["check"]);
    crate::util::assert_ok(&out);
    assert_eq!(
        stdout(&out).lines().next().unwrap_or(""),
        format!(
            "ok: 6 contracts in {} (bookings, hotels, marketing_spend, orders, site_traffic, web_sessions)",
            t.contracts().display()
        )
    );
    assert!(!stdout(&out).contains(SECRET) && !stderr(&out).contains(SECRET));

    // a failing check names the secret's variable and file, never their contents
    std::fs::write(t.contracts().join("vendor_token.txt"), SECRET).unwrap();
    let leaky = VALID
        .replace("https://vendor.example/v2", "http://vendor.example/v2")
        .replace(
            "{type: api_key, in: header, name: X-Api-Key, key_env: VENDOR_KEY}",
            "{type: bearer, token_file: vendor_token.txt}",
        );
    std::fs::write(t.contracts().join("orders.yaml"), leaky).unwrap();
    let out = t.run(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("orders.yaml:5:13: api.base_url uses http:// with auth type bearer"),
        "{}",
        stderr(&out)
    );
    assert!(!stdout(&out).contains(SECRET) && !stderr(&out).contains(SECRET));
}

const BAD: &str = r#"source: orders
version: 1
format: api
delivery: full
api:
  base_url: http://vendor.example/v2?x=1
  path: orders?status=all
  method: PUT
  body: [1]
  params: {cursor: x, nested: {a: 1}}
  headers: {X Key: a, Authorization: "Bearer abc", Accept: text/csv}
  auth: {type: bearer, token_env: vendor token, key_env: VENDOR_KEY}
  records: "$.data[*"
  recods: x
  pagination: {type: cursor, cursor_path: "$.meta[*]", limit: 5, param: cursor}
  max_pages: 0
  incremental: {cursor_field: amount, lookback: 1h}
  retry: {max_attempts: 0, backoff: 2m, max_backoff: 60s}
  rate_limit: {requests_per_second: 0}
  timeout: 30 s
  conditional: yes
fields:
  - name: order_id
    type: int64
  - name: amount
    type: float64
natural_key:
  version: 1
  fields: [order_id]
"#;

#[test]
fn every_api_problem_is_reported_with_location_and_choices() {
    let got = contract("contracts/orders.yaml", BAD).unwrap_err();
    let f = "contracts/orders.yaml";
    let expected: Vec<String> = [
        "14:3: unknown key \"recods\" in api; valid keys are: base_url, path, method, body, params, headers, auth, records, pagination, max_pages, incremental, retry, rate_limit, timeout, conditional",
        "6:13: api.base_url must not hold a query string, a fragment or credentials: put query parameters in api.params and secrets in api.auth",
        "7:9: api.path must start with \"/\", found \"orders?status=all\"",
        "8:11: api.method must be one of: GET, POST; found \"PUT\"",
        "9:9: api.body must be a mapping (a JSON object), found a list",
        "10:31: api.params.nested must be a text or number value, found a mapping",
        "11:13: api.headers: \"X Key\" is not a header name (letters, digits and !#$%&'*+-.^_`|~)",
        "11:23: api.headers.Authorization: credentials go in api.auth (bearer, api_key, basic, oauth2_client_credentials), never as text in the contract",
        "12:58: api.auth: \"key_env\" does not apply to type bearer; bearer takes: token_env or token_file",
        "12:35: api.auth.token_env: \"vendor token\" is not an environment variable name (letters, digits and _, not starting with a digit)",
        "13:20: api.records: \"$.data[*\" is not an RFC 9535 JSONPath: at position 8, in long-hand segment, expected closing ']'",
        "15:63: api.pagination: \"limit\" does not apply to type cursor; cursor takes: cursor_path, param",
        "15:43: api.pagination.cursor_path must name one value (names and indexes only, e.g. \"$.meta.next\"); found \"$.meta[*]\"",
        "16:14: api.max_pages must be an integer >= 1, found \"0\"",
        "17:16: api.incremental with delivery: full: an incremental pull returns only changed records, so every other record would be deleted; use delivery: incremental",
        "17:31: api.incremental.cursor_field \"amount\" is float64; a cursor is an int32, int64, decimal, date, timestamp or string field",
        "17:16: api.incremental is missing \"param\" (the query parameter that takes the cursor, e.g. updated_since)",
        "18:25: api.retry.max_attempts must be an integer >= 1, found \"0\"",
        "18:37: api.retry.backoff (2m) is longer than api.retry.max_backoff (60s)",
        "19:37: api.rate_limit.requests_per_second must be a number > 0 and <= 1000; found \"0\"",
        "20:12: api.timeout \"30 s\" is not a duration: use a number with ms, s, m, h or d (e.g. 500ms, 30s, 5m)",
        "21:16: api.conditional must be true or false, found \"yes\"",
    ]
    .iter()
    .map(|m| format!("{f}:{m}"))
    .collect();
    assert_eq!(got, expected, "\n{}", got.join("\n"));
}

/// A valid api contract but for the parts given.
fn typed(base_url: &str, path: &str, auth: &str, pagination: &str, incremental: &str, extra: &str) -> String {
    format!(
        r#"source: orders
version: 1
format: api
api:
  base_url: {base_url}
  path: {path}
  auth: {auth}
  records: "$.data[*]"
  pagination: {pagination}
  incremental: {incremental}
{extra}fields:
  - name: code
    type: string
  - name: seq
    type: int64
  - name: updated_at
    type: timestamp
natural_key:
  version: 1
  fields: [code]
"#
    )
}

#[test]
fn checks_across_keys_see_the_valid_values_of_each() {
    let text = typed(
        "http://vendor.example",
        "/orders",
        "{type: api_key, name: X-Api-Key, key_env: VENDOR_KEY}",
        "{type: offset, limit: 100}",
        "{cursor_field: updated_at, param: updated_since}",
        "  headers: {x-api-key: abc}\n  params: {updated_since: x, offset: 0, region: eu}\n  conditional: true\n",
    );
    let got = contract("contracts/orders.yaml", &text).unwrap_err();
    let expected: Vec<String> = [
        "5:13: api.base_url uses http:// with auth type api_key: the secret would cross the network in clear text; use https:// (http:// is accepted for 127.0.0.1, ::1 and localhost)",
        "11:13: api.headers.x-api-key: credentials go in api.auth (bearer, api_key, basic, oauth2_client_credentials), never as text in the contract",
        "13:16: api.conditional: a 304 Not Modified for the first page says nothing of the others; conditional requests need pagination: none",
        "12:12: api.params.updated_since: \"updated_since\" is also the parameter of api.incremental; ingot sets it on every pull",
        "12:30: api.params.offset: \"offset\" is also the parameter of api.pagination; ingot sets it on every page",
    ]
    .iter()
    .map(|m| format!("contracts/orders.yaml:{m}"))
    .collect();
    assert_eq!(got, expected, "\n{}", got.join("\n"));
    // the same over http:// to a loopback host passes
    let local = typed(
        "http://127.0.0.1:8080/v2",
        "/orders",
        "{type: bearer, token_file: token.txt}",
        "{type: link_header}",
        "{cursor_field: seq, param: after, lookback: 100}",
        "",
    );
    contract("contracts/orders.yaml", &local).unwrap_or_else(|p| panic!("{}", p.join("\n")));
}

#[test]
fn each_type_checks_its_own_keys() {
    let ok_auth = "{type: none}";
    let ok_pages = "{type: none}";
    let ok_inc = "{cursor_field: updated_at, param: since}";
    let (base, path) = ("https://vendor.example", "/orders");
    let cases = [
        (
            typed(
                base,
                path,
                "{type: api_key, in: cookie, key_env: K, key_file: k.txt}",
                ok_pages,
                ok_inc,
                "",
            ),
            vec![
                "7:29: api.auth.in must be one of: header, query; found \"cookie\"",
                "7:9: api.auth (api_key) is missing \"name\" (the header or query parameter that carries the key)",
                "7:59: api.auth: give key_env or key_file, not both",
            ],
        ),
        (
            typed(base, path, "{type: bearer}", ok_pages, ok_inc, ""),
            vec!["7:9: api.auth (bearer) needs token_env or token_file: the token itself never goes in the contract"],
        ),
        (
            typed(base, path, "{type: oauth}", ok_pages, ok_inc, ""),
            vec![
                "7:16: unknown api.auth type \"oauth\"; types are: none, bearer, api_key, basic, oauth2_client_credentials",
            ],
        ),
        (
            typed(base, path, "{token_env: T}", ok_pages, ok_inc, ""),
            vec![
                "7:9: api.auth is missing \"type\"; types are: none, bearer, api_key, basic, oauth2_client_credentials",
            ],
        ),
        (
            typed(
                base,
                path,
                "{type: oauth2_client_credentials, token_url: \"http://auth.example/token\", client_id_env: ID, client_secret_file: s}",
                ok_pages,
                ok_inc,
                "",
            ),
            vec![
                "7:54: api.auth.token_url uses http://: the client secret would cross the network in clear text; use https:// (http:// is accepted for 127.0.0.1, ::1 and localhost)",
            ],
        ),
        (
            typed(base, path, ok_auth, "{type: page_number, stop: total}", ok_inc, ""),
            vec![
                "9:41: api.pagination.stop: total needs total_path (the JSONPath of the total, e.g. \"$.meta.total_pages\")",
            ],
        ),
        (
            typed(base, path, ok_auth, "{type: cursorr}", ok_inc, ""),
            vec![
                "9:22: unknown api.pagination type \"cursorr\"; types are: none, page_number, offset, cursor, next_url, link_header",
            ],
        ),
        (
            typed(base, path, ok_auth, "{type: page_number, stop: never}", ok_inc, ""),
            vec!["9:41: api.pagination.stop must be one of: empty, total; found \"never\""],
        ),
        (
            typed(
                base,
                path,
                ok_auth,
                "{type: offset, limit: 2000000, total_path: \"$.total\"}",
                ok_inc,
                "",
            ),
            vec![
                "9:37: api.pagination.limit must be at most 1000000, found \"2000000\"",
                "9:58: api.pagination.total_path is read only with stop: total",
            ],
        ),
        (
            typed(base, path, ok_auth, "{type: next_url}", ok_inc, ""),
            vec![
                "9:15: api.pagination (next_url) is missing \"path\" (the JSONPath of the next page's URL in a response, e.g. \"$.links.next\")",
            ],
        ),
        (
            typed(
                base,
                path,
                ok_auth,
                ok_pages,
                "{cursor_field: updatedat, param: since, initial: \"2026-13-01T00:00:00Z\"}",
                "",
            ),
            vec![
                "10:31: api.incremental.cursor_field names unknown field \"updatedat\"; fields are: code, seq, updated_at",
            ],
        ),
        (
            typed(
                base,
                path,
                ok_auth,
                ok_pages,
                "{cursor_field: updated_at, param: since, initial: \"2026-13-01T00:00:00Z\"}",
                "",
            ),
            vec![
                "10:66: api.incremental.initial \"2026-13-01T00:00:00Z\" is not a valid timestamp value for field \"updated_at\"",
            ],
        ),
        (
            typed(
                base,
                path,
                ok_auth,
                ok_pages,
                "{cursor_field: code, param: since, lookback: 5}",
                "",
            ),
            vec![
                "10:61: api.incremental.lookback applies to a date, timestamp or numeric cursor; \"code\" is a string field",
            ],
        ),
        (
            typed(
                base,
                path,
                ok_auth,
                ok_pages,
                "{cursor_field: seq, param: since, lookback: 1h}",
                "",
            ),
            vec!["10:60: api.incremental.lookback for int64 field \"seq\" must be an integer >= 0, found \"1h\""],
        ),
        (
            typed(
                base,
                path,
                ok_auth,
                ok_pages,
                "{cursor_field: updated_at, param: since, lookback: 0.5h}",
                "",
            ),
            vec![
                "10:67: api.incremental.lookback \"0.5h\" is not a duration: use a number with ms, s, m, h or d (e.g. 500ms, 30s, 5m)",
            ],
        ),
        (
            typed(base, "/orders?status=all", ok_auth, ok_pages, ok_inc, ""),
            vec!["6:9: api.path must not hold a query string: put status=all in api.params"],
        ),
        (
            typed("vendor.example/v2", path, ok_auth, ok_pages, ok_inc, "  timeout: 0s\n"),
            vec![
                "5:13: api.base_url \"vendor.example/v2\" is not an absolute http:// or https:// URL (relative URL without a base)",
                "11:12: api.timeout must be a duration > 0",
            ],
        ),
        (
            typed(
                "ftp://vendor.example",
                path,
                ok_auth,
                ok_pages,
                ok_inc,
                "  rate_limit: {}\n",
            ),
            vec![
                "5:13: api.base_url \"ftp://vendor.example\" is not an absolute http:// or https:// URL (scheme ftp)",
                "11:15: api.rate_limit is missing \"requests_per_second\" (a number > 0 and <= 1000, e.g. 10)",
            ],
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = contract("contracts/orders.yaml", text).err().unwrap_or_default();
        let want: Vec<String> = want.iter().map(|m| format!("contracts/orders.yaml:{m}")).collect();
        if got != want {
            wrong.push(format!("case {i}:\n{}", got.join("\n")));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn format_and_section_must_go_together() {
    let no_section = VALID.replace(
        &VALID[VALID.find("api:\n").unwrap()..VALID.find("fields:").unwrap()],
        "",
    );
    assert_eq!(
        contract("contracts/orders.yaml", &no_section).unwrap_err(),
        vec![
            "contracts/orders.yaml:3:9: format: api needs an \"api\" section (base_url, path and records at least; see \
             docs/guide.md#api-sources)"
        ]
    );
    let csv = VALID.replace("format: api", "format: csv");
    assert_eq!(
        contract("contracts/orders.yaml", &csv).unwrap_err(),
        vec!["contracts/orders.yaml:4:1: api is only valid with format: api (this contract says format: csv)"]
    );
}

#[test]
fn files_of_an_api_source_are_refused_or_passed_over_and_nothing_is_written() {
    let t = TestLake::new();
    std::fs::write(t.contracts().join("orders.yaml"), VALID).unwrap();
    let file = t.dir.path().join("orders.ndjson");
    std::fs::write(&file, "{\"order_id\": 1, \"order_status\": \"open\"}\n").unwrap();
    let refusal = "source \"orders\" is format: api: it is pulled with `ingot pull orders`, not ingested from files; \
                   nothing was loaded";

    let out = t.ingest("orders", &file);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(refusal), "{}", stderr(&out));

    // the nightly job passes over a landing file of the source, saying why, and goes on
    let landing = t.dir.path().join("landing");
    std::fs::create_dir_all(landing.join("orders")).unwrap();
    std::fs::copy(&file, landing.join("orders/2026-12-01_orders.ndjson")).unwrap();
    let out = t
        .command()
        .arg("--landing")
        .arg(&landing)
        .arg("--rules")
        .arg(repo().join("rules"))
        .args(["run", "--no-pull"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stdout(&out) + &stderr(&out);
    assert!(
        said.contains("2026-12-01_orders.ndjson")
            && said.contains(
                "source \"orders\" is format: api: it is pulled (`ingot pull orders`), not read from the landing folder"
            ),
        "{said}"
    );

    let written = if t.lake().exists() {
        files_under(&t.lake())
    } else {
        Vec::new()
    };
    assert!(
        !written.iter().any(|p| p.to_string_lossy().contains("orders")),
        "{written:?}"
    );
}
