//! Real crashes and real concurrency: a SIGKILL at random moments during a large ingest and a
//! build, followed by the same command, gives the lake of one clean run (every row exactly
//! once); two concurrent ingests of one source end in the state of one; an ingest during a build
//! leaves the build consistent with the bronze it started from.
//!
//! The kill moments come from a fixed seed (`INGOT_KILL_SEED` overrides it) and are printed
//! with every failure, so a failure can be replayed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{Rng, TestLake, assert_ok, id_names, normalize_rows, repo, stderr};

type Row = BTreeMap<String, Value>;

const MODES: &[&str] = &["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"];

/// `rows` TPC-H-like lineitem rows (the bench contract's columns); `version` changes the comment
/// of every 50th row and adds `extra` new orders, like a corrected re-delivery.
fn lineitem(rows: u64, version: u64, extra: u64) -> String {
    let mut s = String::from(
        "l_orderkey,l_partkey,l_suppkey,l_linenumber,l_quantity,l_extendedprice,l_discount,l_tax,\
         l_returnflag,l_linestatus,l_shipdate,l_commitdate,l_receiptdate,l_shipinstruct,l_shipmode,l_comment\n",
    );
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..rows + extra {
        let (order, line) = (i / 4 + 1, i % 4 + 1);
        let part = rng.below(2000) + 1;
        let qty = rng.below(50) + 1;
        let price = qty * (rng.below(90_000) + 1000);
        let day = rng.below(2000);
        let ship = chrono::NaiveDate::from_ymd_opt(1993, 1, 1).unwrap() + chrono::Days::new(day);
        let commit = ship + chrono::Days::new(rng.below(60));
        let receipt = ship + chrono::Days::new(rng.below(30) + 1);
        let comment = if version > 0 && i % 50 == 0 {
            format!("corrected v{version}, \"\"line\"\" {i}")
        } else {
            format!("quiet packages {i}, sleep")
        };
        s.push_str(&format!(
            "{order},{part},{},{line},{qty},{}.{:02},0.0{},0.0{},N,O,{ship},{commit},{receipt},DELIVER IN PERSON,{},\"{comment}\"\n",
            rng.below(100) + 1,
            price / 100,
            price % 100,
            rng.below(10),
            rng.below(9),
            MODES[rng.below(MODES.len() as u64) as usize],
        ));
    }
    s
}

const ROWS: u64 = 60_000;
const EXTRA: u64 = 1_200;

struct Bench {
    first: PathBuf,
    second: PathBuf,
    _dir: tempfile::TempDir,
}

fn files() -> Bench {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("lineitem-1.csv");
    let second = dir.path().join("lineitem-2.csv");
    std::fs::write(&first, lineitem(ROWS, 0, 0)).unwrap();
    std::fs::write(&second, lineitem(ROWS, 1, EXTRA)).unwrap();
    Bench {
        first,
        second,
        _dir: dir,
    }
}

fn lake() -> TestLake {
    let mut t = TestLake::new();
    t.envs.push(("INGOT_RULES".into(), rules().display().to_string()));
    std::fs::copy(
        repo().join("bench/contracts/lineitem.yaml"),
        t.contracts().join("lineitem.yaml"),
    )
    .unwrap();
    t
}

fn rules() -> PathBuf {
    repo().join("bench/rules")
}

fn ingest(t: &TestLake, file: &Path) -> std::process::Command {
    let mut c = t.command();
    c.args(["ingest", "lineitem"]).arg(file);
    c
}

fn build(t: &TestLake) -> std::process::Command {
    let mut c = t.command();
    c.arg("--rules").arg(rules()).args(["build", "lineitem"]);
    c
}

fn spawn(mut c: std::process::Command) -> Child {
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// The whole lake with ids named by start order, without records a re-run adds after a kill
/// that came after the commit (a skipped duplicate file, a build with nothing to do).
fn state(t: &TestLake) -> BTreeMap<&'static str, Vec<Row>> {
    let names = id_names(t);
    let mut out = BTreeMap::new();
    for (name, sql) in [
        (
            "runs",
            "SELECT * EXCLUDE (run_id, file_path, started_at, finished_at) FROM audit.ingestion_run_log \
             WHERE status <> 'skipped_duplicate_file' ORDER BY started_at",
        ),
        (
            "bronze",
            "SELECT * EXCLUDE (ingestion_run_id, ingested_at) FROM bronze.lineitem \
             ORDER BY natural_key_fingerprint, row_hash",
        ),
        (
            "current",
            "SELECT * EXCLUDE (ingestion_run_id, ingested_at) FROM bronze.lineitem_current \
             ORDER BY natural_key_fingerprint",
        ),
        (
            "failures",
            "SELECT * EXCLUDE (run_id, failed_at) FROM audit.row_failure_log ORDER BY layer, source_row_number, rule",
        ),
        (
            "silver",
            "SELECT * EXCLUDE (silver_build_id, ingestion_run_id) FROM silver.lineitem ORDER BY natural_key_fingerprint",
        ),
    ] {
        out.insert(name, normalize_rows(t.query(sql), &names));
    }
    out
}

fn assert_state(got: &BTreeMap<&'static str, Vec<Row>>, want: &BTreeMap<&'static str, Vec<Row>>, context: &str) {
    for (name, rows) in want {
        let have = &got[name];
        if let Some(i) = (0..rows.len().min(have.len())).find(|&i| rows[i] != have[i]) {
            panic!(
                "{context}: {name} row {i} differs:\n got  {:?}\n want {:?}",
                have[i], rows[i]
            );
        }
        assert_eq!(have.len(), rows.len(), "{context}: {name} row count");
    }
}

/// Run `c` to completion and return how long it took.
fn timed(c: std::process::Command) -> Duration {
    let start = Instant::now();
    let out = spawn(c).wait_with_output().unwrap();
    assert_ok(&out);
    start.elapsed()
}

/// Start `c`, SIGKILL it after `after` (if it is still running). True when it was killed.
fn kill_after(c: std::process::Command, after: Duration) -> bool {
    let mut child = spawn(c);
    let deadline = Instant::now() + after;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let killed = child.try_wait().unwrap().is_none();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    killed
}

#[test]
fn sigkill_at_random_moments_during_an_ingest_and_a_build_then_rerun_equals_one_clean_run() {
    let seed: u64 = std::env::var("INGOT_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_130);
    let mut rng = Rng(seed | 1);
    let f = files();
    let clean = lake();
    timed(ingest(&clean, &f.first));
    let ingest_time = timed(ingest(&clean, &f.second));
    let build_time = timed(build(&clean));
    let want = state(&clean);
    // every key exactly once in _current, and each run wrote a key at most once
    let once = clean.query(
        "SELECT (SELECT count(*) FROM bronze.lineitem_current) AS current, \
         (SELECT count(DISTINCT natural_key_fingerprint) FROM bronze.lineitem) AS keys",
    );
    assert_eq!(once[0]["current"], ROWS + EXTRA);
    assert_eq!(once[0]["keys"], ROWS + EXTRA);

    let mut kills = 0;
    for round in 0..3 {
        let t = lake();
        timed(ingest(&t, &f.first));
        let at_ingest = Duration::from_millis(rng.below(ingest_time.as_millis() as u64 + 1));
        let at_build = Duration::from_millis(rng.below(build_time.as_millis() as u64 + 1));
        let context = format!("seed {seed} round {round}: ingest killed at {at_ingest:?}, build at {at_build:?}");
        kills += kill_after(ingest(&t, &f.second), at_ingest) as u32;
        let out = ingest(&t, &f.second).output().unwrap();
        assert_ok(&out);
        kills += kill_after(build(&t), at_build) as u32;
        let out = build(&t).output().unwrap();
        assert_ok(&out);
        assert_state(&state(&t), &want, &context);
        let dup = t.query(
            "SELECT count(*) AS n FROM (SELECT ingestion_run_id, natural_key_fingerprint FROM bronze.lineitem \
             GROUP BY 1, 2 HAVING count(*) > 1)",
        );
        assert_eq!(dup[0]["n"], 0, "{context}: a row written twice");
    }
    assert!(
        kills > 0,
        "seed {seed}: no process was killed while running; the test proved nothing"
    );
}

#[test]
fn two_concurrent_ingests_of_one_source_end_in_the_state_of_one() {
    let f = files();
    let clean = lake();
    timed(ingest(&clean, &f.first));
    let want = state(&clean);

    let t = lake();
    let a = spawn(ingest(&t, &f.first));
    let b = spawn(ingest(&t, &f.first));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ok = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert!(ok >= 1, "one of them loads: {}\n{}", stderr(&a), stderr(&b));
    for o in [&a, &b] {
        if !o.status.success() {
            // the other one fails cleanly, naming why, and publishes nothing
            assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
            assert!(stderr(o).contains("lineitem"), "{}", stderr(o));
        }
    }
    assert_state(&state(&t), &want, "two concurrent ingests");
    // whichever lost, running it again now is a skipped duplicate
    let out = ingest(&t, &f.first).output().unwrap();
    assert_ok(&out);
    assert_state(&state(&t), &want, "after the retry");
}

#[test]
fn an_ingest_during_a_build_leaves_the_build_consistent_with_the_bronze_it_started_from() {
    let f = files();
    // what the build must produce: silver of the first file only, then of both
    let only_first = lake();
    timed(ingest(&only_first, &f.first));
    timed(build(&only_first));
    let want_first = state(&only_first)["silver"].clone();
    let both = lake();
    timed(ingest(&both, &f.first));
    timed(ingest(&both, &f.second));
    timed(build(&both));
    timed(build(&both));
    let want_both = state(&both)["silver"].clone();

    let t = lake();
    timed(ingest(&t, &f.first));
    let marker = t.dir.path().join("build-reached");
    let mut c = build(&t);
    c.env("INGOT_FAILPOINT", "build.after_data:sleep:3000")
        .env("INGOT_FAILPOINT_MARKER", &marker);
    let running = spawn(c);
    crate::util::wait_for_marker(&marker, "the build");
    // the ingest is not blocked by the build, and the build commits what it started from
    let out = ingest(&t, &f.second).output().unwrap();
    assert_ok(&out);
    let out = running.wait_with_output().unwrap();
    assert_ok(&out);
    assert_eq!(
        state(&t)["silver"],
        want_first,
        "the build saw the bronze it started from"
    );
    timed(build(&t));
    assert_eq!(state(&t)["silver"], want_both, "the next build picks up the ingest");
}
