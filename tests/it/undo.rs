//! `ingot undo`: a rolled-back run leaves exactly the lake of the runs that remain (whole tables
//! compared), later versions stay current, the next silver build follows, a build undo brings
//! back the previous snapshot byte for byte, and a crash at every undo failpoint followed by the
//! same command equals one clean undo.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::util::{
    LakeSnapshot, TestLake, assert_ok, assert_same_tables, id_names, landing, normalize_rows, repo, stderr, stdout,
};

type Row = BTreeMap<String, Value>;

const DAY_ONE: &str = "bookings/2026-11-01_bookings.csv";
const DAY_THREE: &str = "bookings/2026-11-03_bookings.csv";
const CORRECTED: &str = "bookings/2026-11-04_bookings_corrected.csv";

fn run_ids(t: &TestLake) -> Vec<String> {
    t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at, run_id")
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect()
}

fn undo(t: &TestLake, id: &str) -> String {
    let out = t.run(&["undo", id]);
    assert_ok(&out);
    stdout(&out)
}

/// The snapshot's tables other than the run log, which an undo changes on purpose.
fn data_tables(s: &LakeSnapshot) -> BTreeMap<String, Vec<Row>> {
    s.tables
        .iter()
        .filter(|(k, _)| k.as_str() != "audit.ingestion_run_log")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[test]
fn undoing_the_last_run_gives_exactly_the_lake_before_it() {
    // Reference: only day one and day three.
    let want = TestLake::new();
    want.ingest_ok("bookings", &landing(DAY_ONE));
    want.ingest_ok("bookings", &landing(DAY_THREE));
    let want_runs = want.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id");

    let t = TestLake::new();
    t.ingest_ok("bookings", &landing(DAY_ONE));
    t.ingest_ok("bookings", &landing(DAY_THREE));
    t.ingest_ok("bookings", &landing(CORRECTED));
    let before = t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id");
    let corrected = before[2]["run_id"].as_str().unwrap().to_string();
    assert!(
        before[2]["rows_updated"].as_i64().unwrap() > 0,
        "the correction updates records"
    );

    let said = undo(&t, &corrected);
    assert!(
        said.contains(&format!("rolled back run {corrected} of bookings")),
        "{said}"
    );
    // bronze, _current and the failure log are exactly those of the two remaining runs
    assert_same_tables(
        &data_tables(&t.snapshot(&["bookings"])),
        &data_tables(&want.snapshot(&["bookings"])),
        "undo of the correction",
    );
    // the run log keeps the run, marked rolled_back, every other column as it was
    let after = t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id");
    assert_eq!(after.len(), 3);
    assert_eq!(after[..2], before[..2]);
    let mut marked = after[2].clone();
    assert_eq!(marked.remove("status"), Some(Value::from("rolled_back")));
    assert!(
        marked.remove("rolled_back_at").unwrap().is_string(),
        "rolled_back_at is set"
    );
    let mut original = before[2].clone();
    original.remove("status");
    assert!(original.remove("rolled_back_at").is_none_or(|v| v.is_null()));
    // the undo's copy took the source's next slot
    let (now, then) = (marked.remove("commit_seq"), original.remove("commit_seq"));
    assert!(
        now.as_ref().and_then(Value::as_i64) > then.as_ref().and_then(Value::as_i64),
        "{now:?} {then:?}"
    );
    assert_eq!(marked, original);
    assert_eq!(want_runs.len(), 2);

    // undoing again is a no-op that says so
    let again = undo(&t, &corrected);
    assert!(again.contains("already rolled back: nothing to do"), "{again}");
    assert_eq!(
        t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id"),
        after
    );

    // the file of a rolled-back run is loaded again by an explicit ingest (not skipped) and the
    // lake is then that of all three runs
    let full = TestLake::new();
    for f in [DAY_ONE, DAY_THREE, CORRECTED] {
        full.ingest_ok("bookings", &landing(f));
    }
    let said = t.ingest_ok("bookings", &landing(CORRECTED));
    assert!(!said.contains("skipped"), "{said}");
    let got = t.snapshot(&["bookings"]);
    let full = full.snapshot(&["bookings"]);
    for table in ["bronze.bookings_current", "audit.row_failure_log"] {
        let strip = |rows: &Vec<Row>| -> Vec<Row> {
            rows.iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.remove("ingestion_run_id");
                    r.remove("run_id");
                    r
                })
                .collect()
        };
        assert_eq!(
            strip(&got.tables[table]),
            strip(&full.tables[table]),
            "{table} after re-ingest"
        );
    }
}

#[test]
fn undoing_an_earlier_run_keeps_the_versions_a_later_run_wrote() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing(DAY_ONE));
    t.ingest_ok("bookings", &landing(CORRECTED));
    let ids = run_ids(&t);
    undo(&t, &ids[0]);
    // every current record is now one the correction wrote, and every row it wrote is current
    let current = t.query("SELECT * FROM bronze.bookings_current ORDER BY natural_key_fingerprint");
    let written = t.query(&format!(
        "SELECT * FROM bronze.bookings WHERE ingestion_run_id = '{}' ORDER BY natural_key_fingerprint",
        ids[1]
    ));
    assert!(!written.is_empty());
    assert_eq!(current, written);
    assert_eq!(
        t.query(&format!(
            "SELECT count(*) AS n FROM audit.row_failure_log WHERE run_id = '{}'",
            ids[0]
        ))[0]["n"],
        0
    );
}

#[test]
fn undo_of_an_unknown_id_or_a_run_that_loaded_nothing() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing(DAY_ONE));
    let out = t.run(&["undo", "no-such-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no committed run, build or conflict decision has the id \"no-such-run\""));
    t.ingest_ok("bookings", &landing(DAY_ONE)); // skipped duplicate
    let ids = run_ids(&t);
    let said = undo(&t, &ids[1]);
    assert!(said.contains("skipped_duplicate_file: it loaded nothing"), "{said}");
}

// ---- silver ----------------------------------------------------------------------------------

fn rules() -> PathBuf {
    repo().join("rules")
}

fn build(t: &TestLake, args: &[&str]) {
    let out = t
        .command()
        .arg("--rules")
        .arg(rules())
        .arg("build")
        .arg("bookings")
        .args(args)
        .output()
        .unwrap();
    assert_ok(&out);
}

fn silver(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM silver.bookings ORDER BY natural_key_fingerprint")
}

/// Silver rows with run ids named and `silver_build_id` left out.
fn silver_rows(t: &TestLake) -> Vec<Row> {
    normalize_rows(silver(t), &id_names(t))
        .into_iter()
        .map(|mut r| {
            r.remove("silver_build_id");
            r
        })
        .collect()
}

fn seed(t: &TestLake) {
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing(DAY_ONE));
}

#[test]
fn after_undoing_a_run_the_next_incremental_build_equals_a_full_build_without_it() {
    let want = TestLake::new();
    seed(&want);
    build(&want, &["--full"]);
    let want = silver_rows(&want);

    let t = TestLake::new();
    seed(&t);
    build(&t, &[]);
    t.ingest_ok("bookings", &landing(CORRECTED));
    build(&t, &[]);
    let with_correction = silver_rows(&t);
    assert_ne!(with_correction, want, "the correction changes silver");
    let ids = run_ids(&t);
    undo(&t, ids.last().unwrap());
    build(&t, &[]);
    assert_eq!(silver_rows(&t), want);
}

#[test]
fn undoing_a_build_restores_the_previous_snapshot_exactly() {
    let t = TestLake::new();
    seed(&t);
    build(&t, &[]);
    let first = silver(&t);
    t.ingest_ok("bookings", &landing(CORRECTED));
    build(&t, &[]);
    assert_ne!(silver(&t), first);
    let log = t.query("SELECT build_id, status FROM audit.silver_build_log ORDER BY started_at");
    let (b1, b2) = (
        log[0]["build_id"].as_str().unwrap(),
        log[1]["build_id"].as_str().unwrap(),
    );
    // only the latest build can be undone
    let out = t.command().args(["undo", b1]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!("build {b2} came after it")),
        "{}",
        stderr(&out)
    );

    let said = undo(&t, b2);
    assert!(said.contains(&format!("is the snapshot of build {b1} again")), "{said}");
    assert_eq!(silver(&t), first, "byte for byte, silver_build_id included");
    let log = t.query("SELECT build_id, status FROM audit.silver_build_log ORDER BY started_at");
    assert_eq!(log.len(), 2);
    assert_eq!(log[1]["status"], "rolled_back");
    // the next incremental build starts from the restored snapshot and equals a full build
    build(&t, &[]);
    let incremental = silver_rows(&t);
    build(&t, &["--full"]);
    assert_eq!(incremental, silver_rows(&t));
}

// ---- crashes ---------------------------------------------------------------------------------

#[test]
fn every_undo_failpoint_crash_then_rerun_equals_one_clean_undo() {
    let prepare = || {
        let t = TestLake::new();
        seed(&t);
        build(&t, &[]);
        t.ingest_ok("bookings", &landing(CORRECTED));
        build(&t, &[]);
        t
    };
    let last_run = |t: &TestLake| run_ids(t).last().unwrap().clone();
    let last_build = |t: &TestLake| {
        t.query("SELECT build_id FROM audit.silver_build_log ORDER BY started_at DESC LIMIT 1")[0]["build_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    type Pick = fn(&TestLake) -> String;
    // the whole lake (bronze, _current, both logs, failures, silver), ids named by start order
    let state = |t: &TestLake| {
        let names = id_names(t);
        let mut s = BTreeMap::new();
        for (name, sql) in [
            (
                "bronze",
                "SELECT * FROM bronze.bookings ORDER BY ingested_at, source_row_number",
            ),
            (
                "current",
                "SELECT * FROM bronze.bookings_current ORDER BY natural_key_fingerprint",
            ),
            (
                "runs",
                "SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id",
            ),
            (
                "builds",
                "SELECT * FROM audit.silver_build_log ORDER BY started_at, build_id",
            ),
            (
                "failures",
                "SELECT * FROM audit.row_failure_log ORDER BY layer, source, failed_at, source_row_number, rule",
            ),
            (
                "silver",
                "SELECT * FROM silver.bookings ORDER BY natural_key_fingerprint",
            ),
        ] {
            let rows = normalize_rows(t.query(sql), &names)
                .into_iter()
                .map(|mut r| {
                    r.remove("rolled_back_at");
                    r
                })
                .collect();
            s.insert(name.to_string(), rows);
        }
        s
    };
    for (what, pick) in [("run", last_run as Pick), ("build", last_build as Pick)] {
        let clean = prepare();
        undo(&clean, &pick(&clean));
        let clean = state(&clean);
        for point in ingot::table::failpoint::UNDO {
            let t = prepare();
            let id = pick(&t);
            let before = state(&t);
            let out = t
                .command()
                .env("INGOT_FAILPOINT", point)
                .args(["undo", &id])
                .output()
                .unwrap();
            assert!(!out.status.success(), "{what} {point}: the process should have crashed");
            assert!(
                stderr(&out).contains(&format!("failpoint {point} reached")),
                "{what} {point}: {}",
                stderr(&out)
            );
            if *point != "undo.after_commit" {
                assert_same_tables(&state(&t), &before, &format!("{what} {point}: nothing visible"));
            }
            undo(&t, &id);
            assert_same_tables(&state(&t), &clean, &format!("{what} {point}: crash + re-run"));
        }
    }
}

// ---- silver as of a moment ---------------------------------------------------------------------

#[test]
fn sql_as_of_shows_silver_as_it_was_then_including_a_build_later_rolled_back() {
    let t = TestLake::new();
    seed(&t);
    build(&t, &[]);
    let first = silver(&t);
    t.ingest_ok("bookings", &landing(CORRECTED));
    build(&t, &[]);
    let second = silver(&t);
    assert_ne!(first, second);
    let log =
        t.query("SELECT build_id, CAST(finished_at AS VARCHAR) AS at FROM audit.silver_build_log ORDER BY started_at");
    let (b1, b2) = (
        log[0]["build_id"].as_str().unwrap(),
        log[1]["build_id"].as_str().unwrap(),
    );
    let as_of = |when: &str| -> Vec<Row> {
        let out = t
            .command()
            .args([
                "sql",
                "SELECT * FROM silver.bookings ORDER BY natural_key_fingerprint",
                "--format",
                "json",
                "--as-of",
                when,
            ])
            .output()
            .unwrap();
        assert_ok(&out);
        stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    assert_eq!(as_of(b1), first, "as of the first build");
    assert_eq!(as_of(b2), second, "as of the second build");
    assert_eq!(as_of("2000-01-01"), Vec::<Row>::new(), "before any build: empty");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let before_undo = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    std::thread::sleep(std::time::Duration::from_millis(20));
    undo(&t, b2);
    assert_eq!(silver(&t), first, "now: the first build again");
    assert_eq!(
        as_of(&before_undo),
        second,
        "before the undo the second build was current"
    );
    let out = t
        .command()
        .args(["sql", "SELECT 1", "--as-of", "last tuesday"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not a build id of audit.silver_build_log nor a UTC time"),
        "{}",
        stderr(&out)
    );
}
