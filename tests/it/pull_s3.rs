//! `ingot pull` into an S3 lake on moto ([`crate::s3`]) at a real size: a loopback vendor
//! ([`crate::api_server`]) serves 150,000 wide records over several hundred offset pages, so the
//! pull's kept gzip file is well over S3's 5 MiB multipart part and goes up in parts
//! ([`ingot::table::upload::LakeUpload`]). The kept object reads back as exactly the records
//! served, bronze equals the same pull into a local lake row for row, an unchanged re-pull writes
//! no file under bronze/ but its two empty Delta commits, three corrected records are three
//! updates, and an undo then gc takes that run's kept file and bronze file and only those.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::api_server::{Reply, Request, Server};
use crate::s3::{Moto, runtime, s3_lake};
use crate::util::{Rng, TestLake, assert_ok, id_names, normalize_rows, stdout};

const RECORDS: usize = 150_000;
const PAGE: usize = 400;
const KEY: &str = "pull-s3-key-4b0e7a51";
/// The records the vendor corrects between the second and third pull.
const CHANGED: [usize; 3] = [17, 74_999, 149_998];
/// S3's smallest part of a multipart upload (all but the last).
const PART: u64 = 5 << 20;

type Row = BTreeMap<String, Value>;

/// Record `i` as the vendor writes it (white space between tokens, escapes in a string), the
/// same on every call; `corrected` changes its status and amount.
fn record(i: usize, corrected: bool) -> String {
    let mut rng = Rng(0x51ed_2701_a3c4_9e37 ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut blob = String::with_capacity(96);
    for _ in 0..6 {
        blob.push_str(&format!("{:016x}", rng.next()));
    }
    let cents = rng.below(10_000_000) + u64::from(corrected);
    let status = ["open", "shipped", "cancelled"][rng.below(3) as usize];
    let status = if corrected { " Returned " } else { status };
    format!(
        r#"{{"id": {}, "grp": {}, "amount": "{}.{:02}", "item_status": "{status}", "updated_at": "2026-11-{:02}T{:02}:{:02}:00Z", "note": "caf\u00e9, \"n{i}\"  a\tb", "blob": "{blob}"}}"#,
        9_000_000_000_000 + i as u64,
        rng.below(100),
        cents / 100,
        cents % 100,
        1 + i % 28,
        i % 24,
        i % 60,
    )
}

fn records(corrected: &[usize]) -> Vec<String> {
    (0..RECORDS).map(|i| record(i, corrected.contains(&i))).collect()
}

/// A record's JSON text without the white space between its tokens (what a pull keeps).
fn minified(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in raw.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}

/// An offset-paginated vendor over `data` (shared, so the test can correct records between
/// pulls), the total of records in each page's `meta`.
fn vendor(data: Arc<Mutex<Vec<String>>>) -> impl FnMut(&Request) -> Reply + Send {
    move |req: &Request| {
        if req.header("x-api-key") != Some(KEY) {
            return Reply::status(401, r#"{"error": "bad key"}"#);
        }
        let param = |name: &str| req.param(name).and_then(|v| v.parse::<usize>().ok());
        let (Some(offset), Some(limit)) = (param("offset"), param("limit")) else {
            return Reply::status(404, r#"{"error": "offset and limit, please"}"#);
        };
        let recs = data.lock().unwrap();
        let page = &recs[offset.min(recs.len())..(offset + limit).min(recs.len())];
        Reply::json(format!(
            "{{\n  \"data\": [\n    {}\n  ],\n  \"meta\": {{\"total\": {}}}\n}}\n",
            page.join(",\n    "),
            recs.len()
        ))
    }
}

fn contract(url: &str) -> String {
    format!(
        r#"source: items
version: 1
format: api
api:
  base_url: {url}/v1
  path: /items
  auth: {{type: api_key, name: X-Api-Key, key_env: ITEMS_KEY}}
  records: "$.data[*]"
  pagination: {{type: offset, limit: {PAGE}, stop: total, total_path: "$.meta.total"}}
  max_pages: 1000
  retry: {{max_attempts: 3, backoff: 10ms, max_backoff: 50ms}}
  timeout: 30s
fields:
  - {{name: id, type: int64, required: true}}
  - {{name: grp, type: int32}}
  - {{name: amount, type: "decimal(12,2)"}}
  - {{name: item_status, type: string, normalize: [trim, lower]}}
  - {{name: updated_at, type: timestamp}}
  - {{name: note, type: string}}
  - {{name: blob, type: string}}
natural_key:
  version: 1
  fields: [id]
"#
    )
}

fn with_contract(mut t: TestLake, server: &Server) -> TestLake {
    std::fs::write(t.contracts().join("items.yaml"), contract(&server.url())).unwrap();
    t.envs.push(("ITEMS_KEY".into(), KEY.into()));
    t
}

fn pull(t: &TestLake) -> Value {
    let out = t.run(&["pull", "items", "--json"]);
    assert_ok(&out);
    serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap()
}

fn counts(run: &Value) -> [Option<i64>; 4] {
    ["rows_seen", "rows_inserted", "rows_updated", "rows_unchanged"].map(|k| run[k].as_i64())
}

/// What `ingot sql --format json` prints: one row a line (read line by line, the rows of a large
/// table are not all held as maps at once).
fn sql_json(t: &TestLake, sql: &str) -> String {
    let out = t.run(&["sql", sql, "--format", "json"]);
    assert_ok(&out);
    stdout(&out)
}

/// The rows of `sql` are the same on both lakes, whole rows in order (run ids by start order,
/// clocks hidden); returns how many.
fn assert_same_rows_on_both(s3: &TestLake, local: &TestLake, sql: &str) -> usize {
    let (got, want) = (sql_json(s3, sql), sql_json(local, sql));
    let names = (id_names(s3), id_names(local));
    let row = |line: &str, names: &BTreeMap<String, String>| -> Row {
        normalize_rows(vec![serde_json::from_str(line).unwrap()], names)
            .pop()
            .unwrap()
    };
    let (mut got, mut want) = (got.lines(), want.lines());
    let mut n = 0;
    loop {
        match (got.next(), want.next()) {
            (None, None) => return n,
            (a, b) => {
                let a = a.map(|l| row(l, &names.0));
                let b = b.map(|l| row(l, &names.1));
                assert_eq!(a, b, "{sql}: row {n} (S3 lake, local lake)");
                n += 1;
            }
        }
    }
}

/// The `file_bytes` the run log records for `run` (the size of the pull's file).
fn file_bytes(t: &TestLake, run: &Value) -> u64 {
    let rows = t.query(&format!(
        "SELECT file_bytes FROM audit.ingestion_run_log WHERE run_id = '{}'",
        run["run_id"].as_str().unwrap()
    ));
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows[0]["file_bytes"].as_u64().unwrap()
}

/// The kept pull file of `run`, relative to the lake.
fn kept(run: &Value) -> String {
    ingot::ingest::pull::layout_pull_file("items", run["run_id"].as_str().unwrap())
}

/// A gzip file's text.
fn gunzip(bytes: &[u8]) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes).read_to_string(&mut text).unwrap();
    text
}

/// The records of a kept file are the records served, minified, in the order served.
fn assert_records(text: &str, served: &[String], context: &str) {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), served.len(), "{context}: records kept");
    for (i, (line, rec)) in lines.iter().zip(served).enumerate() {
        assert_eq!(*line, minified(rec), "{context}: record {i}");
    }
}

#[test]
fn a_pull_of_150k_records_into_an_s3_lake_keeps_a_multipart_file_and_loads_as_into_a_local_lake() {
    let data = Arc::new(Mutex::new(records(&[])));
    let served = data.lock().unwrap().clone();
    // the test's own minification keeps every record's meaning (escapes, spaces in strings)
    for rec in [&served[0], &served[RECORDS - 1]] {
        let (a, b): (Value, Value) = (
            serde_json::from_str(rec).unwrap(),
            serde_json::from_str(&minified(rec)).unwrap(),
        );
        assert_eq!(a, b);
        assert!(minified(rec).contains(r#""note":"caf\u00e9, \"n"#), "{rec}");
    }
    let server = Server::start(vendor(data.clone()));
    let moto = Moto::start();
    let s3 = with_contract(s3_lake(&moto, "pulls"), &server);
    let local = with_contract(TestLake::new(), &server);
    let lake = ingot::table::lake::Lake::open_with("s3://pulls/lake", &moto.options()).unwrap();
    let rt = runtime();
    // every object under a prefix of the S3 lake: path relative to the lake, size, ETag
    let objects = |prefix: &str| -> Vec<(String, u64, Option<String>)> {
        rt.block_on(lake.list(prefix))
            .unwrap()
            .into_iter()
            .map(|m| (lake.relative(&m.location).unwrap(), m.size, m.e_tag))
            .collect()
    };

    // the first pull, into each lake
    let first = pull(&s3);
    assert_eq!(first["status"], "succeeded", "{first}");
    let n = RECORDS as i64;
    assert_eq!(counts(&first), [Some(n), Some(n), Some(0), Some(0)], "{first}");
    let pages = RECORDS.div_ceil(PAGE) as i64;
    assert_eq!(first["pull"]["pages"], pages, "{first}");
    assert_eq!(first["pull"]["requests"], pages, "{first}");
    assert_eq!(server.requests().len() as i64, pages);
    server.clear();
    let local_first = pull(&local);
    server.clear();
    assert_eq!(local_first["file_hash"], first["file_hash"]);
    assert_eq!(file_bytes(&local, &local_first), file_bytes(&s3, &first));

    // the kept file is one object over 5 MiB, completed from parts of 5 MiB (a multipart ETag
    // ends in -<parts>), its size the run's file_bytes
    let rel = kept(&first);
    let listed = objects(&format!("bronze/items/run_id={}", first["run_id"].as_str().unwrap()));
    let (_, size, etag) = listed
        .iter()
        .find(|(p, _, _)| *p == rel)
        .unwrap_or_else(|| panic!("{rel} not in {listed:?}"))
        .clone();
    assert!(size > PART, "kept file: {size} bytes");
    assert_eq!(file_bytes(&s3, &first), size);
    let parts = etag
        .as_deref()
        .and_then(|e| e.trim_matches('"').rsplit_once('-'))
        .and_then(|(_, n)| n.parse::<u64>().ok());
    assert_eq!(parts, Some(size.div_ceil(PART)), "kept file's ETag {etag:?}");
    // the run's bronze data beside it is several MiB too
    let bronze: u64 = listed.iter().filter(|(p, _, _)| *p != rel).map(|(_, s, _)| s).sum();
    assert!(
        bronze > 4 << 20,
        "bronze data of the first pull: {bronze} bytes: {listed:?}"
    );
    eprintln!(
        "kept pull file: {size} bytes in {} parts; bronze data: {bronze} bytes",
        parts.unwrap()
    );
    // no upload was left incomplete
    let pending = moto.http("GET", "/pulls?uploads").unwrap_or_default();
    assert!(!pending.contains("<Upload>"), "{pending}");

    // its bytes read back from S3 are the records served, whole and in order, and the very
    // bytes the local lake kept
    let bytes = rt.block_on(lake.get(&rel)).unwrap().unwrap();
    assert_eq!(bytes.len() as u64, size);
    assert_records(&gunzip(&bytes), &served, "the S3 lake's kept file");
    let local_kept = std::fs::read(local.lake().join(kept(&local_first))).unwrap();
    assert!(local_kept == bytes, "the S3 and local kept files differ");

    // bronze (hashes, row numbers and all) and the run log equal the local lake's
    let rows = assert_same_rows_on_both(
        &s3,
        &local,
        "SELECT * FROM bronze.items ORDER BY ingested_at, source_row_number",
    );
    assert_eq!(rows, RECORDS);
    let current = assert_same_rows_on_both(&s3, &local, "SELECT * FROM bronze.items_current ORDER BY id");
    assert_eq!(current, RECORDS);
    let log = "SELECT * FROM audit.ingestion_run_log ORDER BY started_at";
    assert_eq!(assert_same_rows_on_both(&s3, &local, log), 1);

    // the vendor sends the same records again: skipped, no data file or kept file written
    let before = objects("bronze");
    let again = pull(&s3);
    assert_eq!(again["status"], "skipped_duplicate_file", "{again}");
    assert_eq!(again["file_hash"], first["file_hash"]);
    // (each commit of the source is one Delta commit of bronze/items and of its _current, an
    // empty one here: only its `txn` names the run's slot)
    let after = objects("bronze");
    let added: Vec<_> = after.iter().filter(|o| !before.contains(o)).collect();
    assert!(before.iter().all(|o| after.contains(o)), "{before:?}\n{after:?}");
    assert_eq!(added.len(), 2, "{added:?}");
    for (p, _, _) in added {
        assert!(p.contains("/_delta_log/") && p.ends_with(".json"), "{p}");
        let commit = String::from_utf8(rt.block_on(lake.get(p)).unwrap().unwrap().to_vec()).unwrap();
        let actions: Vec<String> = commit
            .lines()
            .map(|l| {
                let action: serde_json::Map<String, Value> = serde_json::from_str(l).unwrap();
                action.keys().next().unwrap().clone()
            })
            .collect();
        assert_eq!(actions, ["commitInfo", "txn"], "{p}: {commit}");
    }
    assert!(
        !after
            .iter()
            .any(|(p, _, _)| p.contains(&format!("run_id={}", again["run_id"].as_str().unwrap()))),
        "{after:?}"
    );
    assert_eq!(server.requests().len() as i64, pages);
    assert_eq!(pull(&local)["status"], "skipped_duplicate_file");
    server.clear();

    // three records corrected: three updates, in both lakes the same rows
    let original = |t: &TestLake| {
        let ids: Vec<String> = CHANGED.iter().map(|i| (9_000_000_000_000 + i).to_string()).collect();
        t.query(&format!(
            "SELECT * FROM bronze.items_current WHERE id IN ({}) ORDER BY id",
            ids.join(", ")
        ))
    };
    let unchanged = original(&s3);
    *data.lock().unwrap() = records(&CHANGED);
    let fixed = pull(&s3);
    assert_eq!(fixed["status"], "succeeded", "{fixed}");
    assert_eq!(counts(&fixed), [Some(n), Some(0), Some(3), Some(n - 3)], "{fixed}");
    let local_fixed = pull(&local);
    assert_eq!(counts(&local_fixed), counts(&fixed));
    assert_eq!(local_fixed["file_hash"], fixed["file_hash"]);
    let run = |r: &Value| r["run_id"].as_str().unwrap().to_string();
    let changed_rows = |r: &Value| {
        format!(
            "SELECT * FROM bronze.items WHERE ingestion_run_id = '{}' ORDER BY id",
            run(r)
        )
    };
    let written = s3.query(&changed_rows(&fixed));
    let local_written = local.query(&changed_rows(&local_fixed));
    assert_eq!(
        normalize_rows(written.clone(), &id_names(&s3)),
        normalize_rows(local_written, &id_names(&local)),
        "the three updates, S3 lake vs local lake"
    );
    let ids: Vec<i64> = written.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, CHANGED.map(|i| 9_000_000_000_000 + i as i64));
    for (r, was) in written.iter().zip(&unchanged) {
        assert_eq!(r["item_status"], " Returned ", "{r:?}");
        assert_ne!(r["amount"], was["amount"]);
        assert_ne!(r["row_hash"], was["row_hash"]);
        assert_eq!(r["natural_key_fingerprint"], was["natural_key_fingerprint"]);
        for k in ["grp", "updated_at", "note", "blob"] {
            assert_eq!(r[k], was[k], "{k}");
        }
    }
    assert_eq!(written.len(), 3);
    let current = assert_same_rows_on_both(&s3, &local, "SELECT * FROM bronze.items_current ORDER BY id");
    assert_eq!(current, RECORDS);
    assert_eq!(assert_same_rows_on_both(&s3, &local, log), 3);
    // the corrected pull kept its own file, in parts too, of the corrected records
    let fixed_rel = kept(&fixed);
    let fixed_bytes = rt.block_on(lake.get(&fixed_rel)).unwrap().unwrap();
    assert_eq!(fixed_bytes.len() as u64, file_bytes(&s3, &fixed));
    assert!(fixed_bytes.len() as u64 > PART);
    assert_records(
        &gunzip(&fixed_bytes),
        &data.lock().unwrap(),
        "the corrected pull's kept file",
    );

    // undo the corrected pull, then gc: its kept file (and bronze file) go, the rest stay
    let all = objects("bronze");
    let fixed_prefix = format!("bronze/items/run_id={}/", run(&fixed));
    assert!(all.iter().any(|(p, _, _)| *p == fixed_rel), "{all:?}");
    assert_ok(&s3.run(&["undo", &run(&fixed)]));
    assert_eq!(original(&s3), unchanged, "the undo gave the three records back");
    let gc = s3.run(&["gc", "--grace", "0s"]);
    assert_ok(&gc);
    let said = stdout(&gc);
    assert!(
        said.contains(&format!("removed {fixed_rel} (")) && said.contains("gc: removed 2 files ("),
        "{said}"
    );
    let left = objects("bronze");
    // the undone pull's files are gone; every other data file, the first pull's kept file among
    // them, is there as it was; the Delta logs only grew (the undo's and gc's commits)
    let files = |v: &[(String, u64, Option<String>)], log: bool| -> Vec<(String, u64, Option<String>)> {
        v.iter()
            .filter(|(p, _, _)| p.contains("/_delta_log/") == log)
            .cloned()
            .collect()
    };
    let others: Vec<_> = files(&all, false)
        .into_iter()
        .filter(|(p, _, _)| !p.starts_with(&fixed_prefix))
        .collect();
    assert_eq!(others.len(), files(&all, false).len() - 2, "{all:?}");
    assert_eq!(files(&left, false), others, "gc: {said}");
    assert!(others.iter().any(|(p, s, _)| *p == rel && *s == size), "{others:?}");
    let logs = files(&left, true);
    assert!(files(&all, true).iter().all(|o| logs.contains(o)), "{logs:?}");
    let doctor = s3.run(&["doctor", "--verify"]);
    assert_ok(&doctor);
    assert!(stdout(&doctor).contains(" 0 violations"), "{}", stdout(&doctor));
}
