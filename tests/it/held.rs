//! Held runs: a suspicious delivery writes its files but publishes nothing until `ingot publish`
//! (or `ingot discard`). A truncated full snapshot (more than `hold.max_delete_fraction` of the
//! records deleted), a run far below the recent row counts (`hold.row_count`) and a full delivery
//! with a rejected record whose key cannot be read are held; a malformed line whose key can be
//! read is delivered, never deleted; publish applies exactly the held run, discard leaves the lake
//! as if it never ran; undo, gc, doctor and the nightly job know the state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::util::{TestLake, assert_ok, id_names, normalize_rows, stderr, stdout};

type Row = BTreeMap<String, Value>;

fn contract(delivery: &str, hold: &str) -> String {
    format!(
        "source: accounts
version: 1
description: Accounts, a test source.
format: csv
delivery: {delivery}
{hold}fields:
  - name: id
    type: int64
    required: true
  - name: name
    type: string
  - name: balance
    type: int64
natural_key:
  version: 1
  fields: [id]
"
    )
}

fn lake(delivery: &str, hold: &str) -> TestLake {
    lake_in(TestLake::new(), delivery, hold)
}

fn lake_in(t: TestLake, delivery: &str, hold: &str) -> TestLake {
    std::fs::write(t.contracts().join("accounts.yaml"), contract(delivery, hold)).unwrap();
    std::fs::create_dir_all(t.dir.path().join("rules")).unwrap();
    t
}

/// A landing file `name` under `<dir>/landing/accounts/` with a header and `lines`.
fn file(t: &TestLake, name: &str, lines: &[String]) -> PathBuf {
    let dir = t.dir.path().join("landing/accounts");
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from("id,name,balance\n");
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Records `ids` as CSV lines.
fn records(ids: std::ops::RangeInclusive<i64>) -> Vec<String> {
    ids.map(|i| format!("{i},name {i},{}", i * 10)).collect()
}

fn ingot(t: &TestLake, args: &[&str]) -> Output {
    t.command()
        .arg("--rules")
        .arg(t.dir.path().join("rules"))
        .arg("--landing")
        .arg(t.dir.path().join("landing"))
        .args(args)
        .output()
        .unwrap()
}

fn ingest(t: &TestLake, path: &Path, extra: &[&str]) -> Output {
    let p = path.to_str().unwrap();
    let mut args = vec!["ingest", "accounts", p];
    args.extend_from_slice(extra);
    ingot(t, &args)
}

fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

/// The run id at the end of an ingest line (`[run <id>]`).
fn run_id(out: &Output) -> String {
    let text = stdout(out);
    let start = text.rfind("[run ").expect("a run id") + 5;
    text[start..].trim_end().trim_end_matches(']').to_string()
}

/// Whole rows of a table in a stable order, ids and times named.
fn rows(t: &TestLake, table: &str) -> Vec<Row> {
    normalize_rows(
        t.query(&format!("SELECT * FROM {table} ORDER BY id, ingested_at, is_deleted")),
        &id_names(t),
    )
}

fn runs(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id")
}

fn failures(t: &TestLake) -> Vec<Row> {
    normalize_rows(
        t.query("SELECT * FROM audit.row_failure_log ORDER BY run_id, source_row_number"),
        &id_names(t),
    )
}

fn doctor_ok(t: &TestLake) -> String {
    let out = ingot(t, &["doctor"]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.contains(" 0 violations"), "{text}");
    text
}

/// Does `dir` hold any file?
fn has_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

fn truncated() -> Vec<String> {
    // the first 10 of 100 records, record 3 changed
    let mut lines = records(1..=10);
    lines[2] = "3,name 3 changed,31".into();
    lines
}

#[test]
fn a_truncated_snapshot_is_held_and_publish_applies_exactly_its_deletions() {
    let t = lake("full", "");
    assert_ok(&ingest(&t, &file(&t, "d1.csv", &records(1..=100)), &[]));
    let (current, all) = (rows(&t, "bronze.accounts_current"), rows(&t, "bronze.accounts"));
    assert_eq!(current.len(), 100);

    let out = ingest(&t, &file(&t, "d2.csv", &truncated()), &[]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    let held = run_id(&out);
    assert!(
        stdout(&out).contains("HELD for review, nothing published"),
        "{}",
        said(&out)
    );
    // nothing of it is visible: whole rows of bronze, current and all versions
    assert_eq!(rows(&t, "bronze.accounts_current"), current);
    assert_eq!(rows(&t, "bronze.accounts"), all);
    let log = runs(&t);
    assert_eq!(log.len(), 2);
    let r = &log[1];
    assert_eq!(r["run_id"], json!(held));
    assert_eq!(r["status"], json!("held"));
    assert_eq!(
        (
            &r["rows_seen"],
            &r["rows_inserted"],
            &r["rows_updated"],
            &r["rows_unchanged"],
            &r["rows_deleted"]
        ),
        (&json!(10), &json!(0), &json!(1), &json!(9), &json!(90))
    );
    assert_eq!(
        r["held_reason"],
        json!("it would delete 90 of the 100 current records (90.0%), more than hold.max_delete_fraction 0.5")
    );
    let listed = stdout(&ingot(&t, &["runs", "--format", "csv"]));
    assert!(listed.contains(&format!("{held},accounts,held,")), "{listed}");
    assert!(listed.contains("more than hold.max_delete_fraction 0.5"), "{listed}");
    // doctor: a notice, not a violation
    let doc = doctor_ok(&t);
    assert!(doc.contains(&format!("held: run {held} of accounts")), "{doc}");

    // publish: the run takes effect, exactly as the same deliveries without the gate would
    let out = ingot(&t, &["publish", &held]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains(&format!("published run {held}")),
        "{}",
        said(&out)
    );
    let want = lake("full", "hold:\n  max_delete_fraction: off\n");
    assert_ok(&ingest(&want, &file(&want, "d1.csv", &records(1..=100)), &[]));
    assert_ok(&ingest(&want, &file(&want, "d2.csv", &truncated()), &[]));
    assert_eq!(
        rows(&t, "bronze.accounts_current"),
        rows(&want, "bronze.accounts_current")
    );
    assert_eq!(rows(&t, "bronze.accounts"), rows(&want, "bronze.accounts"));
    // exactly the deletions: records 11..=100 went, record 3 is the new version
    let ids: Vec<i64> = rows(&t, "bronze.accounts_current")
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());
    let after = runs(&t);
    assert_eq!(after.len(), 2, "the publish copy supersedes the held record");
    assert_eq!(after[1]["status"], json!("succeeded"));
    assert_eq!(after[1]["held_reason"], r["held_reason"]);
    assert!(after[1]["decided_at"].is_string(), "{:?}", after[1]);
    let mut a = after[1].clone();
    let mut b = runs(&want)[1].clone();
    for k in [
        "run_id",
        "started_at",
        "finished_at",
        "held_reason",
        "decided_at",
        "file_path",
        // the publish took the source's next slot
        "commit_seq",
        // the files hold their run ids and clocks
        "data_file_crc32",
        "failure_file_crc32",
    ] {
        a.remove(k);
        b.remove(k);
    }
    assert_eq!(a, b);
    // publishing twice does nothing and says so
    let out = ingot(&t, &["publish", &held]);
    assert_ok(&out);
    assert!(stdout(&out).contains("already published"), "{}", said(&out));
    doctor_ok(&t);
}

#[test]
fn discard_leaves_the_lake_as_if_the_run_never_ran_and_gc_then_removes_its_files() {
    let t = lake("full", "");
    assert_ok(&ingest(&t, &file(&t, "d1.csv", &records(1..=100)), &[]));
    let (current, all, failed) = (
        rows(&t, "bronze.accounts_current"),
        rows(&t, "bronze.accounts"),
        failures(&t),
    );
    let mut lines = truncated();
    lines.push("7,duplicate,1".into()); // a conflict: failure rows written, but not published
    let out = ingest(&t, &file(&t, "d2.csv", &lines), &[]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    let held = run_id(&out);
    let data = t.lake().join(format!("bronze/accounts/run_id={held}"));
    let fails = t.lake().join(format!("audit/row_failure_log/run_id={held}"));
    assert!(has_files(&data) && has_files(&fails), "a held run writes its files");
    assert_eq!(failures(&t), failed, "its failure rows are not published");

    // gc keeps a held run's files whatever their age
    assert_ok(&ingot(&t, &["gc", "--grace", "0s"]));
    assert!(has_files(&data) && has_files(&fails), "gc removed a held run's files");
    // undo of a held run is refused, pointing to discard
    let out = ingot(&t, &["undo", &held]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains(&format!("`ingot discard {held}` drops it")),
        "{}",
        said(&out)
    );

    let out = ingot(&t, &["discard", &held]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains(&format!("discarded run {held}")),
        "{}",
        said(&out)
    );
    assert_eq!(rows(&t, "bronze.accounts_current"), current);
    assert_eq!(rows(&t, "bronze.accounts"), all);
    assert_eq!(failures(&t), failed);
    assert_eq!(runs(&t)[1]["status"], json!("discarded"));
    // a discarded run cannot be published
    let out = ingot(&t, &["publish", &held]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("was discarded and cannot be published"),
        "{}",
        said(&out)
    );
    // gc removes its files once past the grace period; the first run's stay
    assert_ok(&ingot(&t, &["gc", "--grace", "0s"]));
    assert!(
        !has_files(&data) && !has_files(&fails),
        "gc kept a discarded run's files"
    );
    assert_eq!(rows(&t, "bronze.accounts"), all);
    doctor_ok(&t);
}

#[test]
fn publishing_is_refused_once_a_later_run_changed_the_source() {
    let t = lake("full", "");
    assert_ok(&ingest(&t, &file(&t, "d1.csv", &records(1..=100)), &[]));
    let out = ingest(&t, &file(&t, "d2.csv", &truncated()), &[]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    let held = run_id(&out);
    // a complete snapshot, one record changed, loaded after the held run
    let mut lines = records(1..=100);
    lines[49] = "50,name 50 changed,501".into();
    let later = ingest(&t, &file(&t, "d3.csv", &lines), &[]);
    assert_ok(&later);
    let later = run_id(&later);
    let before = rows(&t, "bronze.accounts_current");
    let out = ingot(&t, &["publish", &held]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains(&format!(
            "cannot publish run {held} of accounts: run {later} (succeeded"
        )),
        "{}",
        said(&out)
    );
    assert_eq!(rows(&t, "bronze.accounts_current"), before);
    // undoing the later run brings back the state the held run was checked against
    assert_ok(&ingot(&t, &["undo", &later]));
    assert_ok(&ingot(&t, &["publish", &held]));
    assert_eq!(
        t.query("SELECT count(*) AS n FROM bronze.accounts_current")[0]["n"],
        json!(10)
    );
    doctor_ok(&t);
}

#[test]
fn a_malformed_line_with_a_readable_key_is_delivered_not_deleted() {
    let t = lake("full", "");
    assert_ok(&ingest(&t, &file(&t, "d1.csv", &records(1..=5)), &[]));
    let current = rows(&t, "bronze.accounts_current");
    let mut lines = records(1..=5);
    lines[3] = "4,Smith, John,40".into(); // an unquoted comma: 4 fields, 3 expected
    let out = ingest(&t, &file(&t, "d2.csv", &lines), &[]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("5 rows seen: 0 inserted, 0 updated, 4 unchanged, 1 failed ("),
        "{}",
        said(&out)
    );
    assert_eq!(rows(&t, "bronze.accounts_current"), current, "record 4 was deleted");
    let r = &runs(&t)[1];
    assert_eq!(
        (&r["status"], &r["rows_deleted"]),
        (&json!("succeeded_with_failures"), &json!(0))
    );
    // logged as a failure, with the fingerprint of the record it delivered
    let fp4 = t.query("SELECT natural_key_fingerprint FROM bronze.accounts_current WHERE id = 4")[0]
        ["natural_key_fingerprint"]
        .clone();
    let f = failures(&t);
    assert_eq!(f.len(), 1);
    assert_eq!(
        (
            &f[0]["rule"],
            &f[0]["raw_payload"],
            &f[0]["natural_key_fingerprint"],
            &f[0]["source_row_number"]
        ),
        (&json!("malformed_record"), &json!("4,Smith, John,40"), &fp4, &json!(4))
    );
    assert_eq!(f[0]["reason"], json!("line 5: expected 3 fields, found 4"));
    doctor_ok(&t);
}

#[test]
fn a_rejected_line_whose_key_cannot_be_read_holds_a_deleting_full_delivery() {
    let t = lake("full", "");
    assert_ok(&ingest(&t, &file(&t, "d1.csv", &records(1..=5)), &[]));
    let (current, all) = (rows(&t, "bronze.accounts_current"), rows(&t, "bronze.accounts"));
    let mut lines = records(1..=5);
    lines[3] = "4x;Smith;40".into(); // one field: no reading of the key types
    let out = ingest(&t, &file(&t, "d2.csv", &lines), &[]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    assert_eq!(rows(&t, "bronze.accounts_current"), current);
    assert_eq!(rows(&t, "bronze.accounts"), all);
    let r = &runs(&t)[1];
    assert_eq!(r["status"], json!("held"));
    assert_eq!(
        r["held_reason"],
        json!(
            "1 rejected record of this full delivery has no readable natural key, so the run cannot tell which \
             records it holds and would delete 1 (first: record 4, malformed_record: line 5: expected 3 fields, found 1)"
        )
    );
    // the same line in a delivery that deletes nothing is not held: no record can be lost
    let t = lake("full", "");
    assert_ok(&ingest(&t, &file(&t, "d1.csv", &records(1..=5)), &[]));
    lines.push("4,name 4,40".into());
    let out = ingest(&t, &file(&t, "d2.csv", &lines), &[]);
    assert_ok(&out);
    assert_eq!(runs(&t)[1]["status"], json!("succeeded_with_failures"));
}

#[test]
fn the_row_count_gate_holds_a_run_far_below_the_median_of_recent_runs() {
    let t = lake(
        "incremental",
        "hold:\n  row_count: {min_ratio_of_median: 0.5, window: 3}\n",
    );
    for (i, start) in [1, 101, 201, 301].iter().enumerate() {
        // 10, 10, 10 and 20 rows: the median of the last three is 10
        let n = if i == 3 { 20 } else { 10 };
        assert_ok(&ingest(
            &t,
            &file(&t, &format!("d{i}.csv"), &records(*start..=start + n - 1)),
            &[],
        ));
    }
    // 5 rows: not fewer than 0.5 x 10
    assert_ok(&ingest(&t, &file(&t, "d4.csv", &records(401..=405)), &[]));
    let current = rows(&t, "bronze.accounts_current");
    // last three: 10, 20, 5 -> median 10; 4 rows is fewer than 5
    let out = ingest(&t, &file(&t, "d5.csv", &records(501..=504)), &[]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    assert_eq!(rows(&t, "bronze.accounts_current"), current);
    assert_eq!(
        runs(&t)[5]["held_reason"],
        json!(
            "it has 4 rows, fewer than hold.row_count.min_ratio_of_median 0.5 x the median 10 of the last 3 \
             committed runs of accounts"
        )
    );
    // --no-hold publishes at once
    let out = ingest(&t, &file(&t, "d6.csv", &records(601..=603)), &["--no-hold"]);
    assert_ok(&out);
    assert_eq!(runs(&t)[6]["status"], json!("succeeded"));
    assert_eq!(
        t.query("SELECT count(*) AS n FROM bronze.accounts_current")[0]["n"],
        json!(current.len() + 3)
    );
}

#[test]
fn bad_hold_values_are_located_errors_naming_what_is_valid() {
    let t = lake(
        "incremental",
        "hold:\n  max_delete_fraction: 0.2\n  row_count: {window: 0}\n",
    );
    std::fs::write(
        t.contracts().join("ledger.yaml"),
        contract(
            "full",
            "hold:\n  max_delete_fraction: 1.5\n  row_count: {min_ratio_of_median: 0, when: 1}\n",
        )
        .replace("source: accounts", "source: ledger"),
    )
    .unwrap();
    let out = ingot(&t, &["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let text = said(&out);
    for want in [
        "accounts.yaml:7:24: hold.max_delete_fraction applies to delivery: full only",
        "accounts.yaml:8:14: hold.row_count is missing \"min_ratio_of_median\"",
        "accounts.yaml:8:23: hold.row_count.window must be an integer >= 1, found \"0\"",
        "ledger.yaml:7:24: hold.max_delete_fraction must be a number between 0 and 1, or off; found \"1.5\"",
        "ledger.yaml:8:36: hold.row_count.min_ratio_of_median must be a number greater than 0 and at most 1; found \"0\"",
        "ledger.yaml:8:39: unknown key \"when\" in hold.row_count; valid keys are: min_ratio_of_median, window",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn the_nightly_job_reports_a_held_run_holds_back_its_source_and_exits_4() {
    let t = lake("full", "");
    file(&t, "2026-01-01.csv", &records(1..=100));
    assert_ok(&ingot(&t, &["run"]));
    file(&t, "2026-01-02.csv", &truncated());
    let out = ingot(&t, &["run"]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    let held = runs(&t)[1]["run_id"].as_str().unwrap().to_string();
    let text = stdout(&out);
    assert!(text.contains("; 1 run held for review\n"), "{text}");
    assert!(
        text.contains(&format!(
            "HELD run {held} of accounts ({}): it would delete 90 of the 100 current records",
            t.dir.path().join("landing/accounts/2026-01-02.csv").display()
        )),
        "{text}"
    );
    // the next night: the held file is not ingested again, the new file waits, still exit 4
    let mut complete = records(1..=100);
    complete[49] = "50,name 50 changed,501".into();
    file(&t, "2026-01-03.csv", &complete);
    let out = ingot(&t, &["run"]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    let text = stdout(&out);
    assert!(text.contains("nightly job: 0 runs (0 skipped"), "{text}");
    assert!(text.contains(&format!("HELD run {held} of accounts")), "{text}");
    assert!(
        text.contains(&format!(
            "waiting: {}: not loaded while run {held} of its source is held",
            t.dir.path().join("landing/accounts/2026-01-03.csv").display()
        )),
        "{text}"
    );
    assert_eq!(runs(&t).len(), 2);
    // discarded: the waiting file loads, the discarded one is not picked up again
    assert_ok(&ingot(&t, &["discard", &held]));
    let out = ingot(&t, &["run"]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("nightly job: 1 run (0 skipped as duplicates, 0 failed)"),
        "{text}"
    );
    assert!(!text.contains("HELD"), "{text}");
    let log = runs(&t);
    assert_eq!(log.len(), 3);
    assert!(log[2]["file_path"].as_str().unwrap().ends_with("2026-01-03.csv"));
    assert_eq!(
        (&log[2]["status"], &log[2]["rows_updated"]),
        (&json!("succeeded"), &json!(1))
    );
    doctor_ok(&t);
}

#[test]
fn partitioned_change_detection_holds_and_delivers_the_same_way() {
    let t = lake_in(TestLake::partitioned(), "full", "");
    assert_ok(&ingest(&t, &file(&t, "d1.csv", &records(1..=100)), &[]));
    let current = rows(&t, "bronze.accounts_current");
    let out = ingest(&t, &file(&t, "d2.csv", &truncated()), &[]);
    assert_eq!(out.status.code(), Some(4), "{}", said(&out));
    assert!(stderr(&out).contains("change detection runs in"), "{}", said(&out));
    assert_eq!(rows(&t, "bronze.accounts_current"), current);
    assert_eq!(
        runs(&t)[1]["held_reason"],
        json!("it would delete 90 of the 100 current records (90.0%), more than hold.max_delete_fraction 0.5")
    );
    assert_ok(&ingot(&t, &["discard", &run_id(&out)]));
    // a malformed line whose key reads is delivered here too
    let mut lines = records(1..=100);
    lines[3] = "4,Smith, John,40".into();
    let out = ingest(&t, &file(&t, "d3.csv", &lines), &[]);
    assert_ok(&out);
    assert_eq!(rows(&t, "bronze.accounts_current"), current);
    assert_eq!(runs(&t)[2]["rows_deleted"], json!(0));
}
