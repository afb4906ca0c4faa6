//! `ingot pull` against a real HTTP server on loopback ([`crate::api_server`]): every page
//! loaded once, an unchanged re-pull skipped, a correction one update, faults retried or failing
//! the run with nothing published, secrets nowhere, and a crash then the same command equal to
//! one clean run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::api_server::{Reply, Request, Server};
use crate::util::{LakeSnapshot, TestLake, assert_ok, files_under, sha256_hex, stderr, stdout};

pub(crate) const SECRET: &str = "pull-secret-7d1c9e20-never-shown";

/// The vendor's data: `n` orders, revision `rev` changing status and amount of orders 3, 7, 11.
pub(crate) fn records(n: usize, rev: u32) -> Vec<String> {
    (0..n)
        .map(|i| {
            let changed = rev > 0 && [3, 7, 11].contains(&i);
            format!(
                r#"{{"order_id": {}, "order_status": "{}", "amount": "{}.{:02}", "updated_at": "2026-11-{:02}T{:02}:00:00Z", "fetched_at": "{}"}}"#,
                9007199254740990u64 + i as u64,
                if changed { " Shipped " } else { "open" },
                10 + i,
                if changed { 99 } else { 50 },
                if changed { 20 } else { 1 + i / 24 },
                i % 24,
                // volatile: differs on every request
                chrono_like(rev, i)
            )
        })
        .collect()
}

fn chrono_like(rev: u32, i: usize) -> String {
    format!("2026-12-0{}T0{}:00:0{}Z", 1 + rev % 8, i % 10, rev % 10)
}

pub(crate) fn contract(url: &str, extra: &str) -> String {
    format!(
        r#"source: orders
version: 1
format: api
api:
  base_url: {url}/v2
  path: /orders
  auth: {{type: api_key, in: query, name: api_key, key_env: ORDERS_KEY}}
  records: "$.data[*]"
  pagination: {{type: cursor, cursor_path: "$.meta.next", param: cursor}}
  retry: {{max_attempts: 3, backoff: 10ms, max_backoff: 50ms}}
  timeout: 2s
{extra}fields:
  - {{name: order_id, type: int64, required: true}}
  - {{name: order_status, type: string, normalize: [trim, lower]}}
  - {{name: amount, type: "decimal(12,2)"}}
  - {{name: updated_at, type: timestamp}}
  - {{name: fetched_at, type: timestamp, volatile: true}}
natural_key:
  version: 1
  fields: [order_id]
"#
    )
}

/// A cursor-paginated vendor over `data` (shared, so a test can change it between pulls),
/// `page` records a page, the records of each page in reverse order on odd revisions.
pub(crate) fn vendor(data: Arc<Mutex<(Vec<String>, u32)>>, page: usize) -> impl FnMut(&Request) -> Reply + Send {
    move |req: &Request| {
        if req.param("api_key") != Some(SECRET) {
            return Reply::status(401, r#"{"error":"bad key"}"#);
        }
        let (recs, rev) = data.lock().unwrap().clone();
        let from: usize = req
            .param("cursor")
            .and_then(|c| c.strip_prefix("c").map(|n| n.parse().unwrap()))
            .unwrap_or(0);
        let mut chunk: Vec<String> = recs.iter().skip(from).take(page).cloned().collect();
        if rev % 2 == 1 {
            chunk.reverse();
        }
        let next = if from + page < recs.len() {
            format!("\"c{}\"", from + page)
        } else {
            "null".into()
        };
        Reply::json(format!(
            "{{\"data\": [\n  {}\n], \"meta\": {{\"next\": {next}}}}}",
            chunk.join(",\n  ")
        ))
    }
}

pub(crate) fn lake_with(server: &Server, extra: &str) -> TestLake {
    let mut t = TestLake::new();
    std::fs::write(t.contracts().join("orders.yaml"), contract(&server.url(), extra)).unwrap();
    t.envs.push(("ORDERS_KEY".into(), SECRET.into()));
    t
}

pub(crate) fn pull(t: &TestLake) -> Value {
    let out = t.run(&["pull", "orders", "--json"]);
    assert_ok(&out);
    serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap()
}

pub(crate) fn runs(t: &TestLake) -> Vec<BTreeMap<String, Value>> {
    t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at")
}

/// No file of the lake, and nothing the commands printed, holds the secret.
fn assert_secret_nowhere(t: &TestLake, printed: &[String]) {
    for f in files_under(&t.lake()) {
        let bytes = std::fs::read(&f).unwrap();
        let mut raw = bytes.clone();
        if f.extension().is_some_and(|e| e == "gz") {
            use std::io::Read;
            raw.clear();
            flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut raw).unwrap();
        }
        assert!(
            !raw.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "{} holds the secret",
            f.display()
        );
    }
    for p in printed {
        assert!(!p.contains(SECRET), "printed the secret: {p}");
    }
}

#[test]
fn a_pull_loads_every_page_once_an_unchanged_re_pull_is_skipped_and_a_correction_is_three_updates() {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let server = Server::start(vendor(data.clone(), 10));
    let t = lake_with(&server, "");
    let first = pull(&t);
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(
        (first["rows_seen"].as_i64(), first["rows_inserted"].as_i64()),
        (Some(25), Some(25))
    );
    assert_eq!(first["pull"]["pages"], 3);
    assert_eq!(first["pull"]["requests"], 3);
    // the key went in the query, and only there; the pages followed the cursor
    let sent = server.requests();
    let cursors: Vec<Option<&str>> = sent.iter().map(|r| r.param("cursor")).collect();
    assert_eq!(cursors, [None, Some("c10"), Some("c20")]);
    assert!(sent.iter().all(|r| r.header("accept") == Some("application/json")));
    assert!(
        sent.iter()
            .all(|r| r.method == "GET" && r.path == "/v2/orders" && r.body.is_empty())
    );

    // bronze holds the records exactly as an NDJSON file of them would load: same rows, hashes
    let file_lake = TestLake::new();
    let api = contract(&server.url(), "");
    let ndjson = format!(
        "source: orders\nversion: 1\nformat: ndjson\n{}",
        &api[api.find("fields:").unwrap()..]
    );
    std::fs::write(file_lake.contracts().join("orders.yaml"), ndjson).unwrap();
    let file = file_lake.dir.path().join("orders.ndjson");
    std::fs::write(&file, data.lock().unwrap().0.join("\n") + "\n").unwrap();
    file_lake.ingest_ok("orders", &file);
    let cols = "order_id, order_status, amount, updated_at, row_hash, natural_key_fingerprint, natural_key_version, source_row_number, is_deleted";
    let q = format!("SELECT {cols} FROM bronze.orders ORDER BY order_id");
    assert_eq!(t.query(&q), file_lake.query(&q));

    // the file hash is the normalised response: recomputed here from the rows' own hashes
    let rows = t.query("SELECT natural_key_fingerprint, row_hash FROM bronze.orders");
    let mut lines: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}|{}",
                r["natural_key_fingerprint"].as_str().unwrap(),
                r["row_hash"].as_str().unwrap()
            )
        })
        .collect();
    lines.sort();
    let message = format!("ingot-pull 1\n{}\n", lines.join("\n"));
    assert_eq!(first["file_hash"].as_str().unwrap(), sha256_hex(message.as_bytes()));

    // the pull's records are kept beside its bronze file, as the response had them minus white space
    let run_id = first["run_id"].as_str().unwrap();
    let kept = t.lake().join(format!("bronze/orders/run_id={run_id}/pull.ndjson.gz"));
    let mut text = String::new();
    use std::io::Read;
    flate2::read::GzDecoder::new(std::fs::File::open(&kept).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let want: Vec<String> = data
        .lock()
        .unwrap()
        .0
        .iter()
        .map(|r| r.replace(": ", ":").replace(", ", ","))
        .collect();
    assert_eq!(text.lines().collect::<Vec<_>>(), want);

    // the vendor sends the same records in another order with new fetched_at: skipped
    data.lock().unwrap().0 = records(25, 0)
        .into_iter()
        .map(|r| r.replace("2026-12-01", "2026-12-05"))
        .collect();
    data.lock().unwrap().1 = 1;
    let again = pull(&t);
    assert_eq!(again["status"], "skipped_duplicate_file", "{again}");
    assert_eq!(again["file_hash"], first["file_hash"]);
    assert!(
        !t.lake()
            .join(format!("bronze/orders/run_id={}", again["run_id"].as_str().unwrap()))
            .exists()
    );

    // three corrected records: three updates, nothing else written
    *data.lock().unwrap() = (records(25, 2), 2);
    let fixed = pull(&t);
    assert_eq!(
        (
            fixed["rows_updated"].as_i64(),
            fixed["rows_unchanged"].as_i64(),
            fixed["rows_inserted"].as_i64()
        ),
        (Some(3), Some(22), Some(0)),
        "{fixed}"
    );
    let current = t
        .query("SELECT order_id, order_status, amount FROM bronze.orders_current WHERE order_status <> 'open' ORDER BY order_id");
    let ids: Vec<i64> = current.iter().map(|r| r["order_id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [9007199254740993, 9007199254740997, 9007199254741001]);
    let log = runs(&t);
    assert_eq!(log.len(), 3);
    assert_eq!(log[0]["pull_pages"], 3);
    assert_eq!(log[0]["pull_requests"], 3);
    assert!(log[0]["pull_bytes"].as_i64().unwrap() > 25 * 100);
    assert_eq!(log[0]["pull_retries"], 0);
    assert!(
        log[0]["file_path"].as_str().unwrap().ends_with("/v2/orders"),
        "{}",
        log[0]["file_path"]
    );
    assert_secret_nowhere(&t, &[]);
}

#[test]
fn transient_faults_are_retried_and_counted_and_the_pull_loads_as_if_none_happened() {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let mut inner = vendor(data.clone(), 10);
    let mut n = 0;
    let server = Server::start(move |req: &Request| {
        n += 1;
        match n {
            1 => Reply::status(429, r#"{"error":"slow down"}"#).header("Retry-After", "1"),
            2 => Reply::status(500, "oops"),
            4 => Reply {
                cut_after: Some(20),
                ..inner(req)
            },
            _ => inner(req),
        }
    });
    let t = lake_with(&server, "");
    let out = t.run(&["pull", "orders", "--json"]);
    assert_ok(&out);
    let r: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(
        (r["status"].as_str(), r["rows_inserted"].as_i64()),
        (Some("succeeded"), Some(25)),
        "{r}"
    );
    assert_eq!(r["pull"]["retries"], 3);
    assert_eq!(r["pull"]["requests"], 6);
    assert!(
        r["pull"]["wait_ms"].as_i64().unwrap() >= 1000,
        "Retry-After honoured: {r}"
    );
    let err = stderr(&out);
    assert!(
        err.contains("HTTP 429") && err.contains("HTTP 500") && err.contains("the connection broke"),
        "{err}"
    );
    assert!(err.contains("api_key=***") && !err.contains(SECRET), "{err}");
    assert_secret_nowhere(&t, &[err, stdout(&out)]);
}

/// Each broken vendor fails the pull: exit 1, a failed run of the class given, nothing in bronze.
#[test]
fn a_pull_that_cannot_finish_fails_with_its_class_and_publishes_nothing() {
    type Case = (
        &'static str,
        &'static str,
        Box<dyn FnMut(&Request) -> Reply + Send>,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "slower than timeout",
            "",
            Box::new(|_: &Request| Reply {
                delay: Duration::from_secs(3),
                ..Reply::json("{}")
            }),
            "transient",
            "api.timeout",
        ),
        (
            "not JSON",
            "",
            Box::new(|_: &Request| Reply::json("<html>busy</html>")),
            "transient",
            "not JSON",
        ),
        (
            "repeated cursor",
            "",
            Box::new(|_: &Request| Reply::json(r#"{"data":[{"order_id":1}],"meta":{"next":"same"}}"#)),
            "transient",
            "a second time",
        ),
        (
            "max_pages",
            "  max_pages: 2\n",
            Box::new({
                let mut i = 0;
                move |_: &Request| {
                    i += 1;
                    Reply::json(format!(r#"{{"data":[{{"order_id":{i}}}],"meta":{{"next":"c{i}"}}}}"#))
                }
            }),
            "transient",
            "api.max_pages (2) reached",
        ),
        (
            "always 503",
            "",
            Box::new(|_: &Request| Reply::status(503, "")),
            "transient",
            "gave up after 3 attempts",
        ),
        (
            "404",
            "",
            Box::new(|_: &Request| Reply::status(404, r#"{"error":"no such thing"}"#)),
            "content",
            "check api.base_url and api.path",
        ),
        (
            "401",
            "",
            Box::new(|_: &Request| Reply::status(401, "")),
            "content",
            "check the credentials",
        ),
    ];
    for (name, extra, handler, class, says) in cases {
        let server = Server::start(handler);
        let t = lake_with(&server, extra);
        let out = t.run(&["pull", "orders"]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        let log = runs(&t);
        assert_eq!(log.len(), 1, "{name}");
        assert_eq!(log[0]["status"], "failed", "{name}");
        assert_eq!(log[0]["failure_class"], class, "{name}: {}", log[0]["error"]);
        let error = log[0]["error"].as_str().unwrap();
        assert!(error.contains(says), "{name}: {error}");
        assert!(stdout(&out).contains("FAILED, nothing loaded"), "{name}");
        assert_eq!(t.query("SELECT count(*) AS n FROM bronze.orders")[0]["n"], 0, "{name}");
        let kept: Vec<_> = files_under(&t.lake())
            .into_iter()
            .filter(|f| f.to_string_lossy().contains("run_id="))
            .collect();
        assert!(kept.is_empty(), "{name}: {kept:?}");
        assert_secret_nowhere(&t, &[stdout(&out), stderr(&out)]);
    }
}

#[test]
fn a_missing_secret_fails_naming_the_variable_and_files_of_an_api_source_are_not_ingested_by_pull_of_a_file_source() {
    let server = Server::start(|_: &Request| Reply::json(r#"{"data":[]}"#));
    let mut t = lake_with(&server, "");
    t.envs.clear();
    let out = t
        .command()
        .env_remove("ORDERS_KEY")
        .args(["pull", "orders"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("ORDERS_KEY, which is not set"),
        "{}",
        stdout(&out)
    );
    assert!(server.requests().is_empty(), "nothing sent without the secret");
    let out = t.run(&["pull", "bookings"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not api: `ingot ingest bookings <file>`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn offset_pages_follow_the_records_received_when_the_server_caps_the_page_size() {
    let data = records(23, 0);
    let server = Server::start(move |req: &Request| {
        let offset: usize = req.param("offset").unwrap().parse().unwrap();
        // asked for 10, the server sends at most 7, then an empty page
        let limit = req.param("limit").unwrap().parse::<usize>().unwrap().min(7);
        let chunk: Vec<String> = data.iter().skip(offset).take(limit).cloned().collect();
        Reply::json(format!("{{\"data\": [{}]}}", chunk.join(",")))
    });
    let t = lake_with(&server, "");
    let c = contract(&server.url(), "").replace(
        r#"pagination: {type: cursor, cursor_path: "$.meta.next", param: cursor}"#,
        "pagination: {type: offset, limit: 10}",
    );
    std::fs::write(t.contracts().join("orders.yaml"), c).unwrap();
    let r = pull(&t);
    assert_eq!(r["rows_inserted"], 23, "{r}");
    assert_eq!(r["pull"]["pages"], 5);
    let offsets: Vec<String> = server
        .requests()
        .iter()
        .map(|q| q.param("offset").unwrap().to_string())
        .collect();
    assert_eq!(offsets, ["0", "7", "14", "21", "23"]);
}

#[test]
fn the_incremental_cursor_moves_only_with_a_loaded_pull() {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let mut inner = vendor(data.clone(), 10);
    let fail = Arc::new(Mutex::new(false));
    let f = fail.clone();
    let server = Server::start(move |req: &Request| {
        if *f.lock().unwrap() {
            return Reply::status(400, r#"{"error":"nope"}"#);
        }
        inner(req)
    });
    let t = lake_with(
        &server,
        "  incremental: {cursor_field: updated_at, param: updated_since, initial: \"2026-10-01T00:00:00Z\", lookback: 1h}\n",
    );
    std::fs::write(
        t.contracts().join("orders.yaml"),
        std::fs::read_to_string(t.contracts().join("orders.yaml"))
            .unwrap()
            .replace("natural_key:", "delivery: incremental\nnatural_key:"),
    )
    .unwrap();
    let since = |s: &Server| s.requests().last().unwrap().param("updated_since").map(str::to_string);
    let first = pull(&t);
    assert_eq!(since(&server).as_deref(), Some("2026-09-30T23:00:00Z"));
    // the largest updated_at loaded: order 24's
    assert_eq!(first["pull"]["cursor"], "2026-11-02T00:00:00Z");
    server.clear();
    *fail.lock().unwrap() = true;
    let out = t.run(&["pull", "orders"]);
    assert_eq!(out.status.code(), Some(1));
    *fail.lock().unwrap() = false;
    *data.lock().unwrap() = (records(25, 2), 2);
    let third = pull(&t);
    // the failed pull did not move it: sent from the first pull's cursor minus the lookback
    assert_eq!(since(&server).as_deref(), Some("2026-11-01T23:00:00Z"));
    assert_eq!(third["pull"]["cursor"], "2026-11-20T11:00:00Z");
    // an undone pull gives its cursor back
    let out = t.run(&["undo", third["run_id"].as_str().unwrap()]);
    assert_ok(&out);
    server.clear();
    pull(&t);
    assert_eq!(since(&server).as_deref(), Some("2026-11-01T23:00:00Z"));
}

fn clean_two_pulls(server: &Server, data: &Mutex<(Vec<String>, u32)>) -> LakeSnapshot {
    *data.lock().unwrap() = (records(25, 0), 0);
    let t = lake_with(server, "");
    pull(&t);
    *data.lock().unwrap() = (records(25, 2), 2);
    pull(&t);
    t.snapshot(&["orders"])
}

#[test]
fn a_crash_at_any_point_of_a_pull_then_the_same_command_equals_one_clean_pull() {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let server = Server::start(vendor(data.clone(), 10));
    let want = clean_two_pulls(&server, &data);
    let points: Vec<&str> = ingot::table::failpoint::PULL
        .iter()
        .chain(
            ingot::table::failpoint::INGEST
                .iter()
                .filter(|p| !["ingest.after_lock", "ingest.after_hash"].contains(*p)),
        )
        .copied()
        .collect();
    for point in points {
        *data.lock().unwrap() = (records(25, 0), 0);
        let t = lake_with(&server, "");
        pull(&t);
        *data.lock().unwrap() = (records(25, 2), 2);
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .args(["pull", "orders"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{point}: should have crashed");
        assert!(
            stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: {}",
            stderr(&out)
        );
        let out = t.run(&["pull", "orders"]);
        assert_ok(&out);
        let got = t.snapshot(&["orders"]);
        if point == "ingest.after_commit" {
            // the crash came after the commit: the re-run is a skipped duplicate on top
            assert_eq!(got.tables["audit.ingestion_run_log"].len(), 3, "{point}");
            continue;
        }
        got.assert_same(&want, point);
    }
}

#[test]
fn a_pull_killed_mid_fetch_then_run_again_loads_once() {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let mut inner = vendor(data.clone(), 10);
    let slow = Arc::new(Mutex::new(true));
    let s = slow.clone();
    let server = Server::start(move |req: &Request| {
        let mut r = inner(req);
        if req.param("cursor") == Some("c10") && *s.lock().unwrap() {
            r.delay = Duration::from_secs(20);
        }
        r
    });
    let t = lake_with(&server, "");
    let mut child = t.command().args(["pull", "orders"]).spawn().unwrap();
    for _ in 0..400 {
        if server.requests().len() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(server.requests().len(), 2, "the pull reached its second page");
    child.kill().unwrap();
    child.wait().unwrap();
    *slow.lock().unwrap() = false;
    let r = pull(&t);
    assert_eq!(
        (r["rows_inserted"].as_i64(), r["status"].as_str()),
        (Some(25), Some("succeeded")),
        "{r}"
    );
    let log = runs(&t);
    assert_eq!(log.len(), 1, "the killed pull left no record");
    assert_eq!(t.query("SELECT count(*) AS n FROM bronze.orders")[0]["n"], 25);
}

#[test]
fn the_nightly_job_pulls_each_api_source_once_and_an_unchanged_pull_is_a_skipped_run() {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let server = Server::start(vendor(data.clone(), 10));
    let t = lake_with(&server, "");
    let landing = t.dir.path().join("landing");
    std::fs::create_dir_all(&landing).unwrap();
    // only the API source: the demo contracts' rules would build tables of empty sources
    for e in std::fs::read_dir(t.contracts()).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap() != "orders.yaml" {
            std::fs::remove_file(p).unwrap();
        }
    }
    let rules = t.dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    let job = |args: &[&str]| {
        t.command()
            .arg("--landing")
            .arg(&landing)
            .arg("--rules")
            .arg(&rules)
            .arg("run")
            .args(args)
            .output()
            .unwrap()
    };
    let out = job(&[]);
    assert_ok(&out);
    assert!(stdout(&out).contains("pull orders"), "{}", stdout(&out));
    assert_eq!(t.query("SELECT count(*) AS n FROM bronze.orders_current")[0]["n"], 25);
    let out = job(&[]);
    assert_ok(&out);
    let log = runs(&t);
    assert_eq!(log.len(), 2);
    assert_eq!(log[1]["status"], "skipped_duplicate_file");
    assert_eq!(log[1]["file_hash"], log[0]["file_hash"]);
    server.clear();
    let out = job(&["--no-pull"]);
    assert_ok(&out);
    assert!(server.requests().is_empty(), "--no-pull sends nothing");
    assert_eq!(runs(&t).len(), 2);
}

#[test]
fn a_conditional_pull_sends_the_last_etag_and_a_304_is_a_skipped_run() {
    let data = Arc::new(Mutex::new((records(5, 0), 0)));
    let d = data.clone();
    let server = Server::start(move |req: &Request| {
        let (recs, rev) = d.lock().unwrap().clone();
        let etag = format!("\"v{rev}\"");
        if req.header("if-none-match") == Some(etag.as_str()) {
            return Reply::status(304, "").header("ETag", &etag);
        }
        Reply::json(format!("{{\"data\": [{}]}}", recs.join(","))).header("ETag", &etag)
    });
    let t = lake_with(&server, "  conditional: true\n");
    let c = std::fs::read_to_string(t.contracts().join("orders.yaml"))
        .unwrap()
        .replace(
            r#"  pagination: {type: cursor, cursor_path: "$.meta.next", param: cursor}"#,
            "",
        );
    std::fs::write(t.contracts().join("orders.yaml"), c).unwrap();
    let first = pull(&t);
    assert_eq!(first["rows_inserted"], 5, "{first}");
    assert_eq!(server.requests()[0].header("if-none-match"), None);
    let again = pull(&t);
    assert_eq!(again["status"], "skipped_duplicate_file", "{again}");
    assert_eq!(again["file_hash"], first["file_hash"]);
    assert_eq!(server.requests()[1].header("if-none-match"), Some("\"v0\""));
    *data.lock().unwrap() = (records(5, 2), 2);
    let changed = pull(&t);
    assert_eq!(
        (changed["rows_updated"].as_i64(), changed["rows_unchanged"].as_i64()),
        (Some(1), Some(4)),
        "{changed}"
    );
    let log = runs(&t);
    assert_eq!(log[2]["pull_etag"], "\"v2\"");
    // the 304 carried the etag it was asked with: the next pull still sends the loaded one
    assert_eq!(log[1]["pull_etag"], "\"v0\"");
}

#[test]
fn the_kept_pull_file_goes_with_its_run_when_gc_removes_an_undone_pull() {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let server = Server::start(vendor(data.clone(), 10));
    let t = lake_with(&server, "");
    let first = pull(&t);
    let run_id = first["run_id"].as_str().unwrap();
    let kept = t.lake().join(format!("bronze/orders/run_id={run_id}/pull.ndjson.gz"));
    assert!(kept.exists());
    let out = t.run(&["doctor"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("0 violations, 0 orphan files"),
        "{}",
        stdout(&out)
    );
    assert_ok(&t.run(&["undo", run_id]));
    assert_ok(&t.run(&["gc", "--grace", "0s"]));
    assert!(!kept.exists(), "gc removed the undone pull's records");
    // the next pull loads them again, as the first did
    let again = pull(&t);
    assert_eq!(
        (again["rows_inserted"].as_i64(), again["file_hash"].as_str()),
        (Some(25), first["file_hash"].as_str())
    );
}

#[test]
fn the_nightly_job_pulls_api_sources_at_once_up_to_pull_jobs_and_each_loads_as_alone() {
    let data = Arc::new(Mutex::new((records(30, 0), 0)));
    let mut vendor = vendor(data.clone(), 10);
    // every page takes a while, so pulls at once interleave their requests
    let server = Server::start(move |req: &Request| Reply {
        delay: Duration::from_millis(150),
        ..vendor(req)
    });
    let t = lake_with(&server, "");
    for e in std::fs::read_dir(t.contracts()).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap() != "orders.yaml" {
            std::fs::remove_file(p).unwrap();
        }
    }
    let refunds = contract(&server.url(), "")
        .replace("source: orders", "source: refunds")
        .replace("path: /orders", "path: /refunds");
    std::fs::write(t.contracts().join("refunds.yaml"), refunds).unwrap();
    let landing = t.dir.path().join("landing");
    let rules = t.dir.path().join("rules");
    std::fs::create_dir_all(&landing).unwrap();
    std::fs::create_dir_all(&rules).unwrap();
    let job = |args: &[&str]| {
        let out = t
            .command()
            .arg("--landing")
            .arg(&landing)
            .arg("--rules")
            .arg(&rules)
            .arg("run")
            .args(args)
            .output()
            .unwrap();
        assert_ok(&out);
        out
    };
    // the order in which the two sources' requests arrived: "o" or "r" per request
    let arrivals = || -> String {
        server
            .requests()
            .iter()
            .map(|r| if r.path.ends_with("/orders") { 'o' } else { 'r' })
            .collect()
    };
    let out = job(&[]);
    let summary = stdout(&out);
    assert!(summary.contains("pull orders, refunds"), "{summary}");
    let seen = arrivals();
    assert_eq!((seen.matches('o').count(), seen.matches('r').count()), (3, 3), "{seen}");
    assert!(
        seen != "ooorrr" && seen != "rrrooo",
        "two API sources were pulled one after the other: {seen}"
    );
    // each source loads exactly as when it is pulled alone
    let bronze = |source: &str| {
        t.query(&format!(
            "SELECT order_id, order_status, amount, updated_at, fetched_at, row_hash, natural_key_fingerprint, \
             source_row_number FROM bronze.{source} ORDER BY order_id"
        ))
    };
    let alone = {
        let a = lake_with(&server, "");
        pull(&a);
        a.query(
            "SELECT order_id, order_status, amount, updated_at, fetched_at, row_hash, natural_key_fingerprint, \
             source_row_number FROM bronze.orders ORDER BY order_id",
        )
    };
    assert_eq!(bronze("orders").len(), 30);
    assert_eq!(bronze("orders"), alone);
    assert_eq!(bronze("refunds"), alone);
    let log = runs(&t);
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|r| r["status"] == "succeeded"), "{log:?}");
    // one at a time when told so: every request of one source before the other's
    server.clear();
    job(&["--pull-jobs", "1"]);
    let seen = arrivals();
    assert!(
        seen == "ooorrr" || seen == "rrrooo",
        "--pull-jobs 1 pulled at once: {seen}"
    );
    let log = runs(&t);
    assert_eq!(log.len(), 4);
    assert!(
        log[2..].iter().all(|r| r["status"] == "skipped_duplicate_file"),
        "{log:?}"
    );
    let out = t.command().args(["run", "--pull-jobs", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--pull-jobs"), "{}", stderr(&out));
}

#[test]
fn a_pulls_failed_records_are_replayed_alone_after_a_contract_fix_and_a_re_pull_then_changes_nothing() {
    // revision 2: orders 3, 7 and 11 have a status the contract does not allow yet
    let data = Arc::new(Mutex::new((records(25, 2), 2)));
    let server = Server::start(vendor(data.clone(), 10));
    let strict = |t: &TestLake, allowed: &str| {
        let c = contract(&server.url(), "").replace(
            "normalize: [trim, lower]}",
            &format!("normalize: [trim, lower], allowed: [{allowed}]}}"),
        );
        std::fs::write(t.contracts().join("orders.yaml"), c).unwrap();
    };
    let t = lake_with(&server, "");
    strict(&t, "open");
    let first = pull(&t);
    assert_eq!(first["rows_failed"], 3, "{first}");
    let original = first["run_id"].as_str().unwrap().to_string();
    let failed = t.query(&format!(
        "SELECT source_row_number, rule FROM audit.row_failure_log WHERE run_id = '{original}' ORDER BY 1"
    ));
    assert_eq!(
        failed
            .iter()
            .map(|r| (r["source_row_number"].as_i64().unwrap(), r["rule"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        vec![
            (4, "allowed:order_status"),
            (8, "allowed:order_status"),
            (12, "allowed:order_status")
        ]
    );
    // the fix: the vendor's new status is allowed; only the 3 failed records go through it
    strict(&t, "open, shipped");
    server.clear();
    let out = t.run(&["replay", &original]);
    assert_ok(&out);
    assert!(server.requests().is_empty(), "a replay sends no request");
    let log = runs(&t);
    assert_eq!(log.len(), 2);
    assert_eq!(log[1]["replay_of"], Value::from(original.as_str()));
    assert_eq!(log[1]["rows_inserted"], 3);
    assert_eq!(log[1]["rows_failed"], 0);
    assert!(
        log[1]["file_path"].as_str().unwrap().ends_with("/v2/orders (replay)"),
        "{:?}",
        log[1]
    );
    assert!(
        log[1].get("pull_requests").is_none_or(Value::is_null),
        "a replay is not a pull: {:?}",
        log[1]
    );
    // the source now equals one clean pull under the fixed contract
    let cols = "order_id, order_status, amount, updated_at, fetched_at, row_hash, natural_key_fingerprint, \
                source_row_number, file_hash IS NOT NULL AS has_hash";
    let clean = lake_with(&server, "");
    strict(&clean, "open, shipped");
    assert_eq!(pull(&clean)["rows_failed"], 0);
    let current = |t: &TestLake| t.query(&format!("SELECT {cols} FROM bronze.orders_current ORDER BY order_id"));
    assert_eq!(current(&t), current(&clean));
    // replaying again adds nothing; a failed or skipped run has nothing to replay
    let out = t.run(&["replay", &original]);
    assert_ok(&out);
    assert!(stdout(&out).contains("no failed rows left"), "{}", stdout(&out));
    assert_eq!(runs(&t).len(), 2);
    // the same response pulled again: every record is already there
    let again = pull(&t);
    assert_eq!(again["status"], "succeeded", "{again}");
    assert_eq!(
        (again["rows_inserted"].as_i64(), again["rows_updated"].as_i64()),
        (Some(0), Some(0))
    );
    assert_eq!(again["rows_unchanged"], 25);
    let out = t.run(&["pull", "orders", "--json"]);
    let skipped: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(skipped["status"], "skipped_duplicate_file");
    let out = t.run(&["replay", skipped["run_id"].as_str().unwrap()]);
    assert!(
        stdout(&out).contains("is skipped_duplicate_file: it has no failed rows to replay (a failed run is retried by pulling orders again)"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// `scripts/api_server.py` serving on a free port (its port file read), killed when dropped.
struct DemoServer {
    child: std::process::Child,
    port: u16,
}

impl Drop for DemoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl DemoServer {
    fn start(dir: &std::path::Path) -> DemoServer {
        let port_file = dir.join("port");
        let child = std::process::Command::new("python3")
            .arg(crate::util::repo().join("scripts/api_server.py"))
            .args([
                "--port",
                "0",
                "--records",
                "2000",
                "--page-size",
                "500",
                "--token",
                "demo-token",
            ])
            .arg("--port-file")
            .arg(&port_file)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut server = DemoServer { child, port: 0 };
        for _ in 0..300 {
            if let Ok(p) = std::fs::read_to_string(&port_file)
                && let Ok(p) = p.trim().parse()
            {
                server.port = p;
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("scripts/api_server.py did not write its port file");
    }

    fn revision(&self, k: u32) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        let body = format!("{{\"revision\": {k}}}");
        write!(
            s,
            "POST /_control/revision HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 204") || reply.starts_with("HTTP/1.0 204"),
            "{reply}"
        );
    }
}

/// The demo's API story (`make demo` step 17) with examples/api/orders.yaml against
/// scripts/api_server.py: what the demo says happens does.
#[test]
fn the_demo_api_source_loads_skips_and_takes_the_vendors_corrections_as_the_demo_says() {
    let mut t = TestLake::new();
    let server = DemoServer::start(t.dir.path());
    let contract = std::fs::read_to_string(crate::util::repo().join("examples/api/orders.yaml"))
        .unwrap()
        .replace(
            "http://127.0.0.1:8765/v2",
            &format!("http://127.0.0.1:{}/v2", server.port),
        );
    std::fs::write(t.contracts().join("orders.yaml"), contract).unwrap();
    assert_ok(&t.run(&["check"]));
    t.envs.push(("DEMO_VENDOR_TOKEN".into(), "demo-token".into()));
    let base = || {
        t.query(
            "SELECT order_id, customer, order_status, amount, currency, updated_at FROM bronze.orders_current \
             WHERE order_id IN (100007, 100011, 100013) ORDER BY order_id",
        )
    };
    pull(&t);
    let before = base();
    assert_eq!(t.run(&["pull", "orders"]).status.code(), Some(0));
    server.revision(1);
    pull(&t);
    server.revision(2);
    pull(&t);
    let log = t.query(
        "SELECT status, rows_seen, rows_inserted, rows_updated, rows_unchanged, pull_pages, pull_cursor \
         FROM audit.ingestion_run_log ORDER BY started_at",
    );
    let got: Vec<String> = log
        .iter()
        .map(|r| {
            [
                "status",
                "rows_seen",
                "rows_inserted",
                "rows_updated",
                "rows_unchanged",
                "pull_pages",
                "pull_cursor",
            ]
            .iter()
            .map(|c| r[*c].to_string().trim_matches('"').to_string())
            .collect::<Vec<_>>()
            .join(" ")
        })
        .collect();
    assert_eq!(
        got,
        [
            "succeeded 2000 2000 0 0 4 2026-11-01T00:33:19Z",
            "skipped_duplicate_file 0 0 0 0 4 2026-11-01T00:33:19Z",
            "succeeded 2000 0 3 1997 4 2026-12-01T00:00:13Z",
            "succeeded 5 2 0 3 1 2026-12-01T00:33:21Z",
        ]
    );
    // each correction: the next status, amount + 10.01, updated_at moved to 2026-12-01 (the
    // server's documented revision 1), every other field as before
    let statuses = ["open", "shipped", "cancelled", "returned"];
    let want: Vec<BTreeMap<String, Value>> = before
        .iter()
        .map(|r| {
            let mut r = r.clone();
            let i = r["order_id"].as_i64().unwrap() - 100000;
            let s = statuses
                .iter()
                .position(|s| *s == r["order_status"].as_str().unwrap())
                .unwrap();
            r.insert("order_status".into(), statuses[(s + 1) % 4].into());
            let amount = r["amount"].to_string();
            let cents = (amount.trim_matches('"').parse::<f64>().unwrap() * 100.0).round() as i64 + 1001;
            let text = format!("{}.{:02}", cents / 100, cents % 100);
            // decimals come back as JSON numbers or text: keep the query's own form
            r.insert(
                "amount".into(),
                serde_json::from_str(&amount.replace(amount.trim_matches('"'), &text)).unwrap(),
            );
            r.insert("updated_at".into(), format!("2026-12-01T00:00:{i:02}Z").into());
            r
        })
        .collect();
    assert_eq!(base(), want);
    assert_eq!(
        t.query("SELECT order_id FROM bronze.orders_current WHERE order_id >= 102000 ORDER BY 1"),
        t.query("SELECT * FROM (VALUES (102000), (102001)) AS v(order_id)")
    );
}

/// A vendor's own key names (camelCase, and `status`, which ingot reserves for itself) are read, as sent
/// into the contract's fields with `source_name`; `ingot check` refuses two fields reading one key.
#[test]
fn vendor_keys_in_camel_case_or_reserved_are_read_through_source_name() {
    let server = Server::start(|_: &Request| {
        Reply::json(
            r#"{"items": [
              {"orderId": 1, "status": "OPEN", "totalAmount": "10.50", "updatedAt": "2026-11-01T10:00:00Z"},
              {"orderId": 2, "status": "shipped", "totalAmount": "7.25", "updatedAt": "2026-11-02T10:00:00Z"},
              {"orderId": 3, "status": "open", "totalAmount": "0.99", "updatedAt": "2026-11-03T10:00:00Z"}
            ]}"#,
        )
    });
    let mut t = TestLake::new();
    let contract = |extra: &str| {
        format!(
            r#"source: vendor_orders
version: 1
format: api
api:
  base_url: {}/v1
  path: /orders
  records: "$.items[*]"
fields:
  - {{name: order_id, type: int64, required: true, source_name: orderId}}
  - {{name: order_status, type: string, normalize: [lower], source_name: status}}
  - {{name: amount, type: "decimal(8,2)", source_name: totalAmount}}
  - {{name: updated_at, type: timestamp, source_name: updatedAt}}
{extra}natural_key:
  version: 1
  fields: [order_id]
"#,
            server.url()
        )
    };
    let path = t.contracts().join("vendor_orders.yaml");
    std::fs::write(
        &path,
        contract("  - {name: also_status, type: string, source_name: status}\n"),
    )
    .unwrap();
    let out = t.run(&["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(
            "fields \"order_status\" and \"also_status\" both read the input's \"status\"; give one of them another \
             source_name"
        ),
        "{}",
        stderr(&out)
    );
    std::fs::write(&path, contract("")).unwrap();
    assert_ok(&t.run(&["check"]));
    t.envs.clear();
    let out = t.run(&["pull", "vendor_orders", "--json"]);
    assert_ok(&out);
    assert_eq!(
        t.query(
            "SELECT order_id, order_status, CAST(amount AS VARCHAR) AS amount, CAST(updated_at AS VARCHAR) AS updated_at \
             FROM bronze.vendor_orders ORDER BY order_id"
        ),
        t.query(
            "SELECT * FROM (VALUES (1, 'OPEN', '10.50', '2026-11-01T10:00:00Z'), (2, 'shipped', '7.25', \
             '2026-11-02T10:00:00Z'), (3, 'open', '0.99', '2026-11-03T10:00:00Z')) AS v(order_id, order_status, amount, updated_at)"
        )
    );
}
