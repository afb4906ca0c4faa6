//! `ingot gc` beside running writers: with no grace period at all, gc run while an undo, a build
//! or an ingest is paused before its commit removes nothing they commit or restore (they hold
//! their locks; gc keeps what the locks name and leaves a locked table's snapshots alone), and a
//! build or an undo whose files vanish right before its commit fails and publishes nothing.
//! Writers of one source or table wait their turn (`--wait`): two ingests of one source started
//! at once both load, and the nightly job waits for a manual ingest of the same source.

use std::path::PathBuf;
use std::process::{Child, Output, Stdio};

use crate::util::{TestLake, assert_ok, id_names, landing, normalize_rows, repo, stderr, stdout, wait_for_marker};

type Row = std::collections::BTreeMap<String, serde_json::Value>;

// --wait 0: gc keeps a table being built for now instead of waiting for its build
const GC_NOW: &[&str] = &["gc", "--grace", "0s", "--retain", "0s", "--wait", "0"];

fn ingot(t: &TestLake, args: &[&str]) -> Output {
    t.command()
        .arg("--rules")
        .arg(repo().join("rules"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(t: &TestLake, args: &[&str]) -> String {
    let out = ingot(t, args);
    assert_ok(&out);
    stdout(&out)
}

/// `ingot <args>` started with the failpoint `point` in sleep mode; returns once it is paused.
fn paused(t: &TestLake, point: &str, args: &[&str]) -> Child {
    let marker: PathBuf = t.dir.path().join(format!("reached-{point}"));
    let child = t
        .command()
        .env("INGOT_FAILPOINT", format!("{point}:sleep:8000"))
        .env("INGOT_FAILPOINT_MARKER", &marker)
        .arg("--rules")
        .arg(repo().join("rules"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_marker(&marker, point);
    child
}

fn silver(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM silver.bookings ORDER BY natural_key_fingerprint")
}

fn builds(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM audit.silver_build_log ORDER BY started_at, build_id")
}

fn build_ids(t: &TestLake) -> Vec<String> {
    builds(t)
        .iter()
        .map(|b| b["build_id"].as_str().unwrap().to_string())
        .collect()
}

/// `sql`, `runs` and `doctor` all work, and doctor finds nothing wrong.
fn assert_healthy(t: &TestLake, context: &str) {
    for args in [vec!["sql", "select 1"], vec!["runs"]] {
        let out = ingot(t, &args);
        assert!(out.status.success(), "{context}: {args:?}: {}", stderr(&out));
    }
    let out = ingot(t, &["doctor"]);
    assert!(
        out.status.success() && stdout(&out).contains("0 violations"),
        "{context}: doctor:\n{}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// Two builds of silver.bookings, the second a full one (so its snapshot names none of the
/// first's files); returns the rows each published.
fn two_builds(t: &TestLake) -> (Vec<Row>, Vec<Row>) {
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    ok(t, &["build", "bookings"]);
    let first = silver(t);
    t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    ok(t, &["build", "bookings", "--full"]);
    let second = silver(t);
    assert_ne!(first, second);
    (first, second)
}

/// The case: gc with no grace and no retention while an undo of the latest build is
/// paused. The snapshot the undo returns to is past retention and not the latest, so gc alone
/// would remove it; the undo holds the table's lock, gc leaves the table for now, and after
/// both the restored table is whole.
#[test]
fn gc_during_an_undo_keeps_the_snapshot_the_undo_restores() {
    let t = TestLake::new();
    let (first, _) = two_builds(&t);
    let before = builds(&t);
    let ids = build_ids(&t);
    let undo = paused(&t, "undo.after_lock", &["undo", &ids[1]]);
    let gc = ingot(&t, GC_NOW);
    let undone = undo.wait_with_output().unwrap();
    assert_ok(&gc);
    assert_ok(&undone);
    // the undo's lock names the build it restores: gc keeps that snapshot
    assert!(stdout(&gc).contains("in use by running writers"), "{}", stdout(&gc));
    assert!(
        !stdout(&gc).contains(&format!("build_id={}/", ids[0])),
        "{}",
        stdout(&gc)
    );
    assert_healthy(&t, "after gc during the undo");
    assert_eq!(
        silver(&t),
        first,
        "silver.bookings is the first build's snapshot again, whole"
    );
    let after = builds(&t);
    assert_eq!(after[0], before[0], "the restored build's record is untouched");
    let mut want = before[1].clone();
    want.insert("status".into(), "rolled_back".into());
    want.insert("rolled_back_at".into(), after[1]["rolled_back_at"].clone());
    // the undo's copy of the record took the table's next slot
    assert!(
        after[1]["commit_seq"].as_i64() > before[1]["commit_seq"].as_i64(),
        "{:?}",
        after[1]
    );
    want.insert("commit_seq".into(), after[1]["commit_seq"].clone());
    assert_eq!(after[1], want, "the undone build's record");
    assert_eq!(after.len(), 2);

    // the undo done, gc removes the undone build's snapshot and keeps the restored one
    let said = ok(&t, GC_NOW);
    assert!(
        said.contains(&format!("silver/bookings/build_id={}/", ids[1])),
        "{said}"
    );
    assert!(!said.contains(&format!("build_id={}/", ids[0])), "{said}");
    assert_healthy(&t, "after gc once the undo finished");
    assert_eq!(silver(&t), first);
}

/// Everything a reader sees of the lake, with ids and times replaced by stable names.
fn visible(t: &TestLake) -> Vec<(String, Vec<Row>)> {
    let names = id_names(t);
    [
        "SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id",
        "SELECT * FROM audit.silver_build_log ORDER BY started_at, build_id",
        "SELECT * FROM audit.row_failure_log ORDER BY run_id, source_row_number, rule, natural_key_fingerprint",
        "SELECT * FROM bronze.bookings ORDER BY ingestion_run_id, source_row_number",
        "SELECT * FROM bronze.marketing_spend ORDER BY ingestion_run_id, source_row_number",
        "SELECT * FROM silver.bookings ORDER BY natural_key_fingerprint",
    ]
    .iter()
    .map(|q| (q.to_string(), normalize_rows(t.query(q), &names)))
    .collect()
}

/// gc with no grace period or retention while a build and an ingest (of another source) are
/// both paused before their commits: it removes a crashed ingest's leftovers, keeps every file
/// the two writers hold, leaves the table being built alone (an older snapshot included, with a
/// line saying so), both commit, and the lake equals one where gc never ran.
#[test]
fn gc_during_a_build_and_an_ingest_removes_none_of_their_files() {
    let setup = |t: &TestLake| {
        t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
        t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
        let crashed = t
            .command()
            .env("INGOT_FAILPOINT", "ingest.after_failures")
            .args(["ingest", "bookings"])
            .arg(landing("bookings/2026-11-03_bookings.csv"))
            .output()
            .unwrap();
        assert!(!crashed.status.success());
        ok(t, &["build", "bookings"]);
        ok(t, &["build", "bookings", "--full"]);
        t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    };
    let spend = landing("marketing_spend/2026-10-13_marketing_spend.csv");
    let clean = TestLake::new();
    setup(&clean);
    ok(&clean, &["build", "bookings"]);
    clean.ingest_ok("marketing_spend", &spend);

    let t = TestLake::new();
    setup(&t);
    let build = paused(&t, "build.before_commit", &["build", "bookings"]);
    let spend_arg = spend.to_string_lossy().into_owned();
    let ingest = paused(&t, "ingest.before_commit", &["ingest", "marketing_spend", &spend_arg]);
    let gc = ingot(&t, GC_NOW);
    let (built, ingested) = (build.wait_with_output().unwrap(), ingest.wait_with_output().unwrap());
    assert_ok(&gc);
    assert_ok(&built);
    assert_ok(&ingested);
    let said = stdout(&gc);
    assert!(
        said.contains("uncommitted run"),
        "the crashed ingest's files go: {said}"
    );
    assert!(
        !said.contains("removed silver/") && !said.contains("removed bronze/marketing_spend"),
        "{said}"
    );
    assert!(said.contains("in use by running writers"), "{said}");
    assert!(
        said.contains("silver.bookings kept for now: silver table \"bookings\" is being built or undone by"),
        "{said}"
    );
    assert_healthy(&t, "after gc during a build and an ingest");
    for ((query, got), (_, want)) in visible(&t).iter().zip(visible(&clean)) {
        crate::util::assert_same_rows(got, &want, query);
    }
}

/// A build whose manifest names a file (here one it keeps from the previous build's folder)
/// that vanishes right before its commit fails, naming the file, and publishes nothing.
#[test]
fn a_build_whose_files_vanish_before_its_commit_publishes_nothing() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    ok(&t, &["build", "bookings"]);
    let before = silver(&t);
    let first = build_ids(&t).remove(0);
    // nothing changed: the next build's manifest names the first build's files
    let build = paused(&t, "build.after_data", &["build", "bookings"]);
    let rel = format!("silver/bookings/build_id={first}/part-00000.parquet");
    let file = t.lake().join(&rel);
    let saved = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    let out = build.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("was not published"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&rel),
        "the message names the file: {}",
        stderr(&out)
    );
    std::fs::write(&file, saved).unwrap();
    let log = builds(&t);
    let succeeded: Vec<&Row> = log.iter().filter(|b| b["status"] == "succeeded").collect();
    assert_eq!(succeeded.len(), 1, "{log:?}");
    assert_eq!(succeeded[0]["build_id"], first.as_str());
    assert!(
        log.iter()
            .filter(|b| b["build_id"] != first.as_str())
            .all(|b| b["status"] == "failed" && b["error"].as_str().unwrap().contains(&rel)),
        "{log:?}"
    );
    assert_eq!(silver(&t), before);
    assert_healthy(&t, "after the failed build");
}

/// An undo whose snapshot to return to vanishes right before its commit fails, naming the file,
/// and undoes nothing.
#[test]
fn an_undo_whose_snapshot_vanishes_before_its_commit_undoes_nothing() {
    let t = TestLake::new();
    let (_, second) = two_builds(&t);
    let before = builds(&t);
    let ids = build_ids(&t);
    let undo = paused(&t, "undo.after_lock", &["undo", &ids[1]]);
    let rel = format!("silver/bookings/build_id={}/part-00000.parquet", ids[0]);
    std::fs::remove_file(t.lake().join(&rel)).unwrap();
    let out = undo.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!("the snapshot of build {} it would return to is gone", ids[0])),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains(&rel), "{}", stderr(&out));
    assert_eq!(builds(&t), before, "nothing was undone");
    assert_eq!(silver(&t), second);
}

/// The lake's visible state of bookings and its logs, without run ids (a waiting job's skipped
/// run takes an id and a slot a lake of the same commands in turn does not), in file order.
fn bookings_state(t: &TestLake) -> Vec<(String, Vec<Row>)> {
    let names = id_names(t);
    [
        "SELECT * EXCLUDE (run_id, commit_seq) FROM audit.ingestion_run_log \
         WHERE status <> 'skipped_duplicate_file' ORDER BY file_path",
        "SELECT f.* EXCLUDE (run_id), r.file_path FROM audit.row_failure_log f \
         JOIN audit.ingestion_run_log r USING (run_id) ORDER BY r.file_path, source_row_number, rule",
        "SELECT b.* EXCLUDE (ingestion_run_id), r.file_path FROM bronze.bookings b \
         JOIN audit.ingestion_run_log r ON r.run_id = b.ingestion_run_id ORDER BY r.file_path, source_row_number",
        "SELECT * EXCLUDE (ingestion_run_id) FROM bronze.bookings_current ORDER BY natural_key_fingerprint",
    ]
    .iter()
    .map(|q| (q.to_string(), normalize_rows(t.query(q), &names)))
    .collect()
}

/// Two ingests of one source started at once: the second waits for the first's lock (saying so
/// once), then loads; the lake equals one where the two ran one after the other.
#[test]
fn two_ingests_of_one_source_started_at_once_both_load() {
    let (first, second) = (
        landing("bookings/2026-11-01_bookings.csv"),
        landing("bookings/2026-11-03_bookings.csv"),
    );
    let clean = TestLake::new();
    clean.ingest_ok("bookings", &first);
    clean.ingest_ok("bookings", &second);

    let t = TestLake::new();
    let first_arg = first.to_string_lossy().into_owned();
    let held = paused(&t, "ingest.before_commit", &["ingest", "bookings", &first_arg]);
    let waiting = t.command().args(["ingest", "bookings"]).arg(&second).output().unwrap();
    let held = held.wait_with_output().unwrap();
    assert_ok(&held);
    assert_ok(&waiting);
    let said = stderr(&waiting);
    assert_eq!(
        said.matches("ingot: waiting for source \"bookings\" is being ingested by run")
            .count(),
        1,
        "{said}"
    );
    assert_healthy(&t, "after two ingests at once");
    for ((query, got), (_, want)) in bookings_state(&t).iter().zip(bookings_state(&clean)) {
        crate::util::assert_same_rows(got, &want, query);
    }
}

/// The nightly job started while a manual ingest of one of its sources is paused before its
/// commit waits for it, then loads the rest: the manual run's file is found loaded (skipped),
/// nothing fails, and the lake equals the manual ingest followed by the job.
#[test]
fn the_nightly_job_waits_for_a_manual_ingest_of_the_same_source() {
    let manual = landing("bookings/2026-11-01_bookings.csv");
    let clean = TestLake::new();
    clean.ingest_ok("bookings", &manual);
    let job = |t: &TestLake| {
        t.command()
            .arg("--rules")
            .arg(repo().join("rules"))
            .arg("--landing")
            .arg(repo().join("data/landing"))
            .arg("run")
            .output()
            .unwrap()
    };
    let done = job(&clean);
    assert_ok(&done);

    let t = TestLake::new();
    let manual_arg = manual.to_string_lossy().into_owned();
    let held = paused(&t, "ingest.before_commit", &["ingest", "bookings", &manual_arg]);
    let nightly = job(&t);
    let held = held.wait_with_output().unwrap();
    assert_ok(&held);
    assert_ok(&nightly);
    assert!(
        stderr(&nightly).contains("ingot: waiting for source \"bookings\""),
        "{}",
        stderr(&nightly)
    );
    // the job had taken the manual run's file for new before it waited: it finds it loaded
    let skipped = |t: &TestLake| {
        t.query("SELECT file_path FROM audit.ingestion_run_log WHERE status = 'skipped_duplicate_file' ORDER BY 1")
    };
    let mut want = skipped(&clean);
    want.push([("file_path".to_string(), serde_json::json!(manual.display().to_string()))].into());
    want.sort_by_key(|r| r["file_path"].to_string());
    assert_eq!(skipped(&t), want);
    assert_healthy(&t, "after the nightly job waited");
    for ((query, got), (_, want)) in bookings_state(&t).iter().zip(bookings_state(&clean)) {
        crate::util::assert_same_rows(got, &want, query);
    }
    for q in [
        "SELECT * EXCLUDE (ingestion_run_id) FROM silver.bookings ORDER BY natural_key_fingerprint",
        "SELECT \"table\", status, rows_read, rows_written FROM audit.silver_build_log ORDER BY 1",
    ] {
        let names = (id_names(&t), id_names(&clean));
        crate::util::assert_same_rows(
            &normalize_rows(t.query(q), &names.0),
            &normalize_rows(clean.query(q), &names.1),
            q,
        );
    }
}
