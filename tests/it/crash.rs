//! Crash safety: for every failpoint of the ingest commit sequence, abort a real `ingot`
//! process there, re-run the same command, and compare the whole lake (bronze rows with their
//! hashes, current view, run log, failure log) with a lake that saw one clean run.

use crate::util::{LakeSnapshot, TestLake, assert_ok, landing};

const SOURCES: &[&str] = &["bookings"];

fn seed(t: &TestLake) {
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
}

fn clean(extra_skip_rerun: bool) -> LakeSnapshot {
    let t = TestLake::new();
    seed(&t);
    t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    if extra_skip_rerun {
        t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    }
    t.snapshot(SOURCES)
}

#[test]
fn every_ingest_failpoint_crash_then_rerun_equals_one_clean_run() {
    crash_at_every_failpoint(TestLake::new);
}

#[test]
fn every_ingest_failpoint_with_partitioned_change_detection() {
    crash_at_every_failpoint(TestLake::partitioned);
}

fn crash_at_every_failpoint(new_lake: fn() -> TestLake) {
    let clean_once = clean(false);
    let clean_then_skip = clean(true);
    let file = landing("bookings/2026-11-04_bookings_corrected.csv");
    for point in ingot::table::failpoint::INGEST {
        let t = new_lake();
        seed(&t);
        let before = t.snapshot(SOURCES);
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .args(["ingest", "bookings"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{point}: the process should have crashed");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&format!("failpoint {point} reached")),
            "{point}: failpoint never reached"
        );
        let committed = *point == "ingest.after_commit";
        if !committed {
            t.snapshot(SOURCES)
                .assert_same(&before, &format!("{point}: nothing of the crashed run may be visible"));
        }
        let rerun = t.ingest("bookings", &file);
        assert_ok(&rerun);
        let want = if committed { &clean_then_skip } else { &clean_once };
        t.snapshot(SOURCES)
            .assert_same(want, &format!("{point}: crash + re-run"));
    }
}

#[test]
fn a_crash_during_the_first_run_leaves_an_empty_lake_then_loads_once() {
    let t = TestLake::new();
    let file = landing("bookings/2026-11-01_bookings.csv");
    let out = t
        .command()
        .env("INGOT_FAILPOINT", "ingest.mid_data")
        .args(["ingest", "bookings"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(t.query("SELECT count(*) AS n FROM bronze.bookings")[0]["n"], 0);
    t.ingest_ok("bookings", &file);
    let twice =
        t.query("SELECT natural_key_fingerprint, count(*) AS n FROM bronze.bookings GROUP BY 1 HAVING count(*) > 1");
    assert!(twice.is_empty(), "duplicates after crash + re-run: {twice:?}");
    let clean = {
        let c = TestLake::new();
        c.ingest_ok("bookings", &file);
        c.snapshot(SOURCES)
    };
    t.snapshot(SOURCES)
        .assert_same(&clean, "first run crashed mid-data then re-run");
}

/// A run that stalls past its lock (the lock is taken over) must not publish after another run
/// of the same source committed: its commit slot is taken, it fails, and the lake holds exactly
/// one copy of every row.
#[test]
fn a_stalled_run_whose_lock_was_taken_over_cannot_commit() {
    let t = TestLake::new();
    let file = landing("bookings/2026-11-01_bookings.csv");
    let marker = t.dir.path().join("reached");
    let stalled = t
        .command()
        .env("INGOT_FAILPOINT", "ingest.before_commit:sleep:3000")
        .env("INGOT_FAILPOINT_MARKER", &marker)
        .args(["ingest", "bookings"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::util::wait_for_marker(&marker, "the stalled run");
    // the lock is taken over (as after its TTL), and another run of the source commits
    std::fs::remove_file(t.lake().join("_locks/bookings.lock")).unwrap();
    t.ingest_ok("bookings", &file);
    let out = stalled.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing of run"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let clean = {
        let c = TestLake::new();
        c.ingest_ok("bookings", &file);
        c.snapshot(SOURCES)
    };
    t.snapshot(SOURCES).assert_same(&clean, "stalled run + takeover");
}
