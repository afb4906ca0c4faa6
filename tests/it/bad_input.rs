//! Bad input: every case gets a clear error or a failure-log row, never a panic, and nothing
//! already committed is lost.

use crate::util::{TestLake, bad, landing, stderr, stdout};

fn committed(t: &TestLake) -> crate::util::LakeSnapshot {
    t.snapshot(&["bookings"])
}

/// Ingest day one, then `file`; return the process output. Checks that the committed day-one
/// state survived whatever happened.
fn after_day_one(file: &str) -> (TestLake, std::process::Output) {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    let before = committed(&t);
    let out = t.ingest("bookings", &bad(file));
    assert!(
        out.status.code().is_some(),
        "{file}: killed by a signal: {}",
        stderr(&out)
    );
    assert_ne!(out.status.code(), Some(101), "{file}: panicked: {}", stderr(&out));
    let after = committed(&t);
    assert_eq!(
        before.tables["bronze.bookings"],
        after.tables["bronze.bookings"][..before.tables["bronze.bookings"].len()].to_vec(),
        "{file}: committed rows changed"
    );
    (t, out)
}

fn last_run(t: &TestLake) -> std::collections::BTreeMap<String, serde_json::Value> {
    t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at DESC, run_id DESC LIMIT 1")
        .remove(0)
}

#[test]
fn empty_file_fails_the_run_with_a_clear_message() {
    let (t, out) = after_day_one("empty.csv");
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("FAILED, nothing loaded") && text.contains("the file is empty: expected a header line"),
        "{text}"
    );
    let run = last_run(&t);
    assert_eq!(run["status"], "failed");
    assert!(run["error"].as_str().unwrap().contains("empty.csv"));
    assert_eq!(run["rows_seen"], 0);
}

#[test]
fn header_only_file_is_a_run_with_no_rows() {
    let (t, out) = after_day_one("header_only.csv");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run = last_run(&t);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["rows_seen"], 0);
}

#[test]
fn bom_and_crlf_are_transparent() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &bad("bom_crlf.csv"));
    let rows = t.query("SELECT booking_ref, notes FROM bronze.bookings ORDER BY source_row_number");
    assert_eq!(rows.len(), 3);
    // the BOM is not part of the first header name (else booking_ref would be missing) nor of
    // any value, and CRLF leaves no \r behind
    assert_eq!(rows[0]["booking_ref"], "BX900001");
    for r in &rows {
        let text = serde_json::to_string(r).unwrap();
        assert!(!text.contains('\u{feff}') && !text.contains("\\r"), "{text}");
    }
}

#[test]
fn invalid_utf8_rejects_only_that_row() {
    let (t, out) = after_day_one("invalid_utf8.csv");
    assert_eq!(out.status.code(), Some(0));
    let f = t.query("SELECT source_row_number, rule, reason FROM audit.row_failure_log WHERE run_id = (SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at DESC LIMIT 1)");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["source_row_number"], 2);
    assert_eq!(f[0]["rule"], "type:guest_email");
    assert!(f[0]["reason"].as_str().unwrap().contains("not valid UTF-8"));
}

#[test]
fn ragged_rows_are_rejected_as_malformed_records() {
    let (t, _) = after_day_one("ragged.csv");
    let f = t.query("SELECT source_row_number, rule, reason FROM audit.row_failure_log WHERE rule = 'malformed_record' ORDER BY source_row_number");
    let rows: Vec<i64> = f.iter().map(|r| r["source_row_number"].as_i64().unwrap()).collect();
    assert_eq!(rows, vec![2, 4]);
    assert!(
        f[0]["reason"].as_str().unwrap().contains("expected 12 fields, found"),
        "{f:?}"
    );
}

#[test]
fn missing_required_column_fails_and_writes_nothing() {
    let (t, out) = after_day_one("missing_required_column.csv");
    assert_eq!(out.status.code(), Some(1));
    let run = last_run(&t);
    assert_eq!(run["status"], "failed");
    let err = run["error"].as_str().unwrap();
    assert!(err.contains("header: required column \"booking_ref\" missing"), "{err}");
    let n = t.query(&format!(
        "SELECT count(*) AS n FROM bronze.bookings WHERE ingestion_run_id = '{}'",
        run["run_id"].as_str().unwrap()
    ));
    assert_eq!(n[0]["n"], 0);
}

#[test]
fn unknown_column_fails_under_reject_and_is_ignored_under_ignore() {
    let (t, out) = after_day_one("unknown_column.csv");
    assert_eq!(out.status.code(), Some(1));
    let err = last_run(&t)["error"].as_str().unwrap().to_string();
    assert!(
        err.contains("\"promo_code\"") && err.contains("unknown_fields: ignore"),
        "{err}"
    );

    let contract = std::fs::read_to_string(t.contracts().join("bookings.yaml")).unwrap();
    std::fs::write(
        t.contracts().join("bookings.yaml"),
        contract.replace("unknown_fields: reject", "unknown_fields: ignore"),
    )
    .unwrap();
    let out = t.ingest("bookings", &bad("unknown_column.csv"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run = last_run(&t);
    assert_eq!(run["ignored_columns"], "promo_code");
    assert!(stdout(&out).contains("ignored columns: promo_code"));
}

#[test]
fn invocation_errors_exit_2_with_a_message() {
    let t = TestLake::new();
    let out = t.ingest("bookings", std::path::Path::new("/no/such/file.csv"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no such file: /no/such/file.csv"),
        "{}",
        stderr(&out)
    );

    let out = t.ingest("bookingz", &landing("bookings/2026-11-01_bookings.csv"));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("no contract for source \"bookingz\"")
            && err.contains("known sources: bookings, hotels, marketing_spend, site_traffic, web_sessions"),
        "{err}"
    );

    let contract = std::fs::read_to_string(t.contracts().join("bookings.yaml")).unwrap();
    std::fs::write(
        t.contracts().join("bookings.yaml"),
        contract.replace("type: decimal(12,2)", "type: decimal(12,2"),
    )
    .unwrap();
    let out = t.ingest("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("bookings.yaml:") && err.contains("unknown type \"decimal(12,2\""),
        "{err}"
    );
    // nothing was recorded for an invocation error
    assert_eq!(t.query("SELECT * FROM audit.ingestion_run_log").len(), 0);
}

#[test]
fn a_second_ingest_of_the_same_source_waits_as_long_as_wait_says_while_the_lock_is_held() {
    let t = TestLake::new();
    // A live lock held by this test process (pid alive, fresh heartbeat).
    std::fs::create_dir_all(t.lake().join("_locks")).unwrap();
    let lock = serde_json::json!({
        "run_id": "0000-test", "host": ingot::table::lock::hostname(), "pid": std::process::id(),
        "acquired_at": "now", "heartbeat_ms": chrono::Utc::now().timestamp_millis(), "ttl_ms": 60000
    });
    std::fs::write(t.lake().join("_locks/bookings.lock"), lock.to_string()).unwrap();
    let file = landing("bookings/2026-11-01_bookings.csv");
    // --wait 0: refused at once, naming the holder and the flag that would have waited
    let out = t
        .command()
        .args(["ingest", "bookings", "--wait", "0"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = stderr(&out);
    assert!(said.contains("is being ingested by run 0000-test"), "{said}");
    assert!(said.contains("wait for it with --wait"), "{said}");
    assert!(!said.contains("waiting for"), "{said}");
    // --wait 1s: says once what it waits for, waits, then fails naming the wait
    let started = std::time::Instant::now();
    let out = t
        .command()
        .args(["ingest", "bookings", "--wait", "1s"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    assert_eq!(out.status.code(), Some(1));
    let said = stderr(&out);
    assert_eq!(
        said.matches("ingot: waiting for source \"bookings\" is being ingested by run 0000-test")
            .count(),
        1,
        "{said}"
    );
    assert!(said.contains("up to 1s in all (--wait)"), "{said}");
    assert!(said.contains("Waited 1s for it (--wait)"), "{said}");
    // a bad --wait is an invocation error
    let out = t
        .command()
        .args(["ingest", "bookings", "--wait", "soon"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--wait: invalid duration \"soon\""),
        "{}",
        stderr(&out)
    );
    assert_eq!(t.query("SELECT * FROM audit.ingestion_run_log").len(), 0);
    // another source is not blocked
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    // an expired lock is taken over
    let stale = serde_json::json!({
        "run_id": "0000-old", "host": "elsewhere", "pid": 1,
        "acquired_at": "then", "heartbeat_ms": chrono::Utc::now().timestamp_millis() - 120_000, "ttl_ms": 60000
    });
    std::fs::write(t.lake().join("_locks/bookings.lock"), stale.to_string()).unwrap();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    assert!(
        !t.lake().join("_locks/bookings.lock").exists(),
        "lock released after the run"
    );
}

fn tiny_contract(t: &TestLake) {
    std::fs::write(
        t.contracts().join("tiny.yaml"),
        r#"source: tiny
version: 1
fields:
  - {name: k, type: string, required: true, normalize: [trim]}
  - {name: n, type: int32}
natural_key: {version: 1, fields: [k]}
"#,
    )
    .unwrap();
}

#[test]
fn odd_csv_shapes_get_located_answers() {
    let t = TestLake::new();
    tiny_contract(&t);
    // lone \r line ends: line numbers still count
    let cr = t.dir.path().join("cr [1].csv");
    std::fs::write(&cr, "k,n\ra,1\rb,x\r   ,3\r").unwrap();
    // a name with glob characters is taken literally when the file exists
    t.ingest_ok("tiny", &cr);
    let f = t.query("SELECT source_row_number, rule, reason FROM audit.row_failure_log ORDER BY source_row_number");
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!(f[0]["rule"], "type:n");
    assert!(f[0]["reason"].as_str().unwrap().starts_with("line 3: "), "{f:?}");
    // a required key that is only blanks is missing once normalized
    assert_eq!(f[1]["rule"], "required:k");
    assert!(f[1]["reason"].as_str().unwrap().starts_with("line 4: "), "{f:?}");

    let trailing = t.dir.path().join("trailing.csv");
    std::fs::write(&trailing, "\nk,n,\na,1,\n").unwrap();
    let out = t.ingest("tiny", &trailing);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("trailing.csv:2: header: column 3 has no name (a trailing delimiter?)"),
        "{text}"
    );
}

/// Line numbers in rejection reasons are physical lines, also with CRLF line ends (csv-core ends
/// a record at the `\r`, so the `\n` starts the next record's bytes and must not count again)
/// and a quoted field spanning lines.
#[test]
fn line_numbers_of_rejections_count_crlf_once() {
    let t = TestLake::new();
    let text = std::fs::read_to_string(bad("bom_crlf.csv")).unwrap();
    let lines = text.matches('\n').count();
    let file = t.dir.path().join("crlf_ragged.csv");
    std::fs::write(&file, format!("{text}BX900009,AMS01\r\n")).unwrap();
    t.ingest_ok("bookings", &file);
    let f = t.query("SELECT source_row_number, reason FROM audit.row_failure_log");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["source_row_number"], 4);
    let want = format!("line {}:", lines + 1);
    assert!(f[0]["reason"].as_str().unwrap().starts_with(&want), "{want} {f:?}");
}

/// An upstream rename (`amount` -> `amt`) under `unknown_fields: ignore` fails the run instead
/// of loading every record with a null amount: nothing is published, the run log and the message
/// name the missing field and the undeclared column. A field that says `missing: null` may be
/// absent.
#[test]
fn a_declared_column_missing_from_a_file_fails_the_run() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("spend.yaml"),
        r#"source: spend
version: 1
unknown_fields: ignore
fields:
  - {name: id, type: string, required: true}
  - {name: amount, type: "decimal(10,2)"}
  - {name: note, type: string, missing: null}
natural_key: {version: 1, fields: [id]}
"#,
    )
    .unwrap();
    let day1 = t.dir.path().join("day1.csv");
    std::fs::write(&day1, "id,amount,note,extra\na,1.50,x,?\nb,2.00,y,?\n").unwrap();
    t.ingest_ok("spend", &day1);
    let current = || t.query("SELECT * FROM bronze.spend_current ORDER BY id");
    let before = current();

    let renamed = t.dir.path().join("renamed.csv");
    std::fs::write(&renamed, "id,amt,note\na,9.99,x\nc,3.00,z\n").unwrap();
    let out = t.ingest("spend", &renamed);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let want = format!(
        "{}:1: header: declared column \"amount\" missing, so it would be null in every record; the \
         columns are: id, amt, note; the file has column the contract does not declare: \"amt\" \
         (renamed upstream? then give the field `source_name: <its new name>`, or rename the field in the \
         contract and add `renamed_from: amount` to it, so the runs loaded before read under the new name). \
         A field that files may lack \
         says `missing: null` in {}",
        renamed.display(),
        t.contracts().join("spend.yaml").display()
    );
    assert!(stdout(&out).contains(&want), "{}\nwant: {want}", stdout(&out));
    assert_eq!(current(), before, "a failed run publishes nothing");
    let runs =
        t.query("SELECT status, rows_seen, rows_inserted, error FROM audit.ingestion_run_log ORDER BY started_at");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["status"], "failed");
    assert_eq!(runs[1]["rows_inserted"], 0);
    assert_eq!(runs[1]["error"].as_str().unwrap(), want);

    // `note` may be missing: its records load with a null note
    let no_note = t.dir.path().join("no_note.csv");
    std::fs::write(&no_note, "id,amount\nc,3.00\n").unwrap();
    t.ingest_ok("spend", &no_note);
    let rows = t.query("SELECT id, CAST(amount AS VARCHAR) AS amount, coalesce(note, '<null>') AS note FROM bronze.spend_current ORDER BY id");
    let got: Vec<String> = rows.iter().map(|r| serde_json::to_string(r).unwrap()).collect();
    assert_eq!(
        got,
        [
            r#"{"amount":"1.50","id":"a","note":"x"}"#,
            r#"{"amount":"2.00","id":"b","note":"y"}"#,
            r#"{"amount":"3.00","id":"c","note":"<null>"}"#,
        ]
    );

    // the rename itself, read through `source_name` (a header with a space too)
    let contract = std::fs::read_to_string(t.contracts().join("spend.yaml")).unwrap();
    std::fs::write(
        t.contracts().join("spend.yaml"),
        contract
            .replace(
                "{name: amount, type: \"decimal(10,2)\"}",
                "{name: amount, type: \"decimal(10,2)\", source_name: amt}",
            )
            .replace(
                "{name: id, type: string, required: true}",
                "{name: id, type: string, required: true, source_name: Spend Id}",
            ),
    )
    .unwrap();
    let respelled = t.dir.path().join("respelled.csv");
    std::fs::write(&respelled, "Spend Id,amt,note\na,9.99,x\n").unwrap();
    let out = t.ingest_ok("spend", &respelled);
    assert!(out.contains("1 rows seen: 0 inserted, 1 updated"), "{out}");
    let rows = t.query("SELECT id, CAST(amount AS VARCHAR) AS amount FROM bronze.spend_current WHERE id = 'a'");
    assert_eq!(
        serde_json::to_string(&rows[0]).unwrap(),
        r#"{"amount":"9.99","id":"a"}"#
    );
    // the old header names are no longer the fields' names in the input
    let old_names = t.dir.path().join("old_names.csv");
    std::fs::write(&old_names, "id,amount,note\nd,4.00,w\n").unwrap();
    let out = t.ingest("spend", &old_names);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("required column \"Spend Id\" missing"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn missing_takes_fail_or_null_and_never_on_a_required_field() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("spend.yaml"),
        r#"source: spend
version: 1
fields:
  - {name: id, type: string, required: true, missing: "null"}
  - {name: amount, type: "decimal(10,2)", missing: maybe}
natural_key: {version: 1, fields: [id]}
"#,
    )
    .unwrap();
    let out = t.run(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    let f = t.contracts().join("spend.yaml").display().to_string();
    let err = stderr(&out);
    for want in [
        format!("{f}:4:55: field \"id\" is required, so it cannot be missing: null"),
        format!("{f}:5:52: missing: \"maybe\" for field \"amount\"; valid values are: fail, null"),
    ] {
        assert!(err.contains(&want), "{err}\nwant: {want}");
    }
}

/// NDJSON: a declared field whose key no record of the file has fails the run like a missing CSV
/// column (an upstream rename would otherwise null it in every record); a key absent from some
/// lines only is a null there, and a field that says `missing: null` may be absent throughout.
#[test]
fn a_declared_key_no_ndjson_record_has_fails_the_run() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("events.yaml"),
        r#"source: events
version: 1
format: ndjson
unknown_fields: ignore
fields:
  - {name: id, type: string, required: true}
  - {name: amount, type: int32}
  - {name: note, type: string, missing: null}
natural_key: {version: 1, fields: [id]}
"#,
    )
    .unwrap();
    let sparse = t.dir.path().join("sparse.ndjson");
    std::fs::write(&sparse, "{\"id\":\"a\",\"amount\":1}\n{\"id\":\"b\"}\n").unwrap();
    let out = t.ingest_ok("events", &sparse);
    assert!(out.contains("2 rows seen: 2 inserted"), "{out}");

    let renamed = t.dir.path().join("renamed.ndjson");
    std::fs::write(&renamed, "{\"id\":\"a\",\"amt\":5}\n{\"id\":\"c\",\"amt\":6}\n").unwrap();
    let out = t.ingest("events", &renamed);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let want = format!(
        "{}: no record has the declared key \"amount\", so it would be null in every record; the records have \
         keys the contract does not declare: \"amt\" (renamed upstream? then give the field `source_name: <its new \
         key>`, or rename the field and add `renamed_from: amount` to it). A field that records may lack says \
         `missing: null` in {}",
        renamed.display(),
        t.contracts().join("events.yaml").display()
    );
    assert!(stdout(&out).contains(&want), "{}\nwant: {want}", stdout(&out));
    let current = t.query("SELECT id, amount FROM bronze.events_current ORDER BY id");
    assert_eq!(current.len(), 2);
    assert_eq!(current[0]["amount"], 1, "a failed run publishes nothing");
    let failed = t.query("SELECT status, error FROM audit.ingestion_run_log WHERE status = 'failed'");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["error"], serde_json::Value::from(want));

    // the first fix the message offers: the field reads the new key, under its own name
    let contract = std::fs::read_to_string(t.contracts().join("events.yaml")).unwrap();
    std::fs::write(
        t.contracts().join("events.yaml"),
        contract.replace(
            "{name: amount, type: int32}",
            "{name: amount, type: int32, source_name: amt}",
        ),
    )
    .unwrap();
    let out = t.ingest_ok("events", &renamed);
    assert!(
        out.contains("2 rows seen: 1 inserted, 1 updated, 0 unchanged, 0 failed"),
        "{out}"
    );
    assert_eq!(
        t.query("SELECT id, amount FROM bronze.events_current ORDER BY id"),
        t.query("SELECT * FROM (VALUES ('a', 5), ('b', NULL), ('c', 6)) AS v(id, amount)")
    );
}
