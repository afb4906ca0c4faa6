//! `ingot replay`: after a contract fix, only the failed rows of a run go through the current
//! contract as a new run, keeping their record numbers; replaying twice adds nothing; `failures
//! --run` shows which rows a replay loaded; a crash at every ingest failpoint during a replay,
//! followed by the same command, equals one clean replay.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::util::{TestLake, assert_ok, id_names, landing, normalize_rows, stderr, stdout};

type Row = BTreeMap<String, Value>;

fn allow(t: &TestLake, contract: &str, from: &str, to: &str) {
    let path = t.contracts().join(contract);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from} not in {contract}");
    std::fs::write(&path, text.replace(from, to)).unwrap();
}

fn first_run(t: &TestLake) -> String {
    t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at LIMIT 1")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn replay(t: &TestLake, id: &str) -> String {
    let out = t.run(&["replay", id]);
    assert_ok(&out);
    stdout(&out)
}

fn without(rows: Vec<Row>, cols: &[&str]) -> Vec<Row> {
    rows.into_iter()
        .map(|mut r| {
            for c in cols {
                r.remove(*c);
            }
            r
        })
        .collect()
}

const STATUS: (&str, &str) = (
    "allowed: [confirmed, cancelled, no_show]",
    "allowed: [confirmed, cancelled, no_show, tentative]",
);

#[test]
fn replay_loads_only_the_rows_the_fixed_contract_accepts_and_replaying_twice_adds_nothing() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    let original = first_run(&t);
    let failed = t.query(&format!(
        "SELECT source_row_number, rule FROM audit.row_failure_log WHERE run_id = '{original}' ORDER BY 1"
    ));
    assert_eq!(failed.len(), 8);

    allow(&t, "bookings.yaml", STATUS.0, STATUS.1);
    let said = replay(&t, &original);
    assert!(
        said.contains("(replay): 8 rows seen: 1 inserted, 0 updated, 0 unchanged, 7 failed"),
        "{said}"
    );
    let runs = t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at");
    assert_eq!(runs.len(), 2);
    let replay_run = runs[1]["run_id"].as_str().unwrap().to_string();
    assert_eq!(runs[1]["replay_of"], Value::from(original.as_str()));
    assert_eq!(runs[1]["status"], "succeeded_with_failures");

    // the loaded row is exactly the row a clean ingest with the fixed contract loads, with its
    // record number in the original file (only the run's own columns differ)
    let clean = TestLake::new();
    allow(&clean, "bookings.yaml", STATUS.0, STATUS.1);
    clean.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    let own = ["ingestion_run_id", "ingested_at", "file_hash"];
    let want = without(
        clean.query("SELECT * FROM bronze.bookings WHERE booking_status = 'tentative'"),
        &own,
    );
    let got = t.query(&format!(
        "SELECT * FROM bronze.bookings WHERE ingestion_run_id = '{replay_run}'"
    ));
    assert_eq!(without(got, &own), want);
    assert_eq!(want[0]["source_row_number"], 151);
    // the rows that still fail are the original's other failures, with the same record numbers
    let again = t.query(&format!(
        "SELECT source_row_number, rule FROM audit.row_failure_log WHERE run_id = '{replay_run}' ORDER BY 1"
    ));
    let still: Vec<&Row> = failed.iter().filter(|r| r["source_row_number"] != 151).collect();
    assert_eq!(again.iter().collect::<Vec<_>>(), still);

    // replaying again with the same contract: nothing new, no run
    let said = replay(&t, &original);
    assert!(said.contains("that still fail were replayed by run"), "{said}");
    // replaying the replay run means replaying its original
    let said = replay(&t, &replay_run);
    assert!(said.contains("that still fail were replayed by run"), "{said}");
    assert_eq!(t.query("SELECT count(*) AS n FROM audit.ingestion_run_log")[0]["n"], 2);

    // `failures --run` tells which rows a replay loaded
    let out = t.run(&["failures", "--run", &original, "--format", "json"]);
    assert_ok(&out);
    let rows: Vec<Row> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 8);
    for r in &rows {
        let by = r.get("replayed_by").cloned().unwrap_or(Value::Null);
        if r["source_row_number"] == 151 {
            assert_eq!(by, Value::from(replay_run.as_str()));
        } else {
            assert_eq!(by, Value::Null, "{r:?}");
        }
    }

    // an unknown id is an invalid invocation
    let out = t.run(&["replay", "no-such-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no committed run has the id"));
}

#[test]
fn replay_of_ndjson_rows_after_a_contract_fix() {
    let t = TestLake::new();
    t.ingest_ok("web_sessions", &landing("web_sessions/2026-11-02_web_sessions.ndjson"));
    let original = first_run(&t);
    let failed = t.query(&format!(
        "SELECT source_row_number, rule, raw_payload FROM audit.row_failure_log WHERE run_id = '{original}' ORDER BY 1"
    ));
    assert!(!failed.is_empty());
    allow(
        &t,
        "web_sessions.yaml",
        "allowed: [desktop, mobile, tablet]",
        "allowed: [desktop, mobile, tablet, smart_tv]",
    );
    let said = replay(&t, &original);
    assert!(said.contains("(replay)") && said.contains(" 1 inserted"), "{said}");
    let replay_run = t.query("SELECT run_id FROM audit.ingestion_run_log WHERE replay_of IS NOT NULL")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    // every failed row is either loaded now (with its record number) or failed again
    let loaded = t.query(&format!(
        "SELECT source_row_number FROM bronze.web_sessions WHERE ingestion_run_id = '{replay_run}'"
    ));
    let again = t.query(&format!(
        "SELECT DISTINCT source_row_number FROM audit.row_failure_log WHERE run_id = '{replay_run}'"
    ));
    let mut distinct: Vec<Value> = failed.iter().map(|r| r["source_row_number"].clone()).collect();
    distinct.dedup();
    assert_eq!(loaded.len() + again.len(), distinct.len());
    let tv = t.query("SELECT source_row_number, ingestion_run_id FROM bronze.web_sessions WHERE device = 'smart_tv'");
    assert_eq!(tv.len(), 1);
    assert_eq!(tv[0]["ingestion_run_id"], Value::from(replay_run.as_str()));
    assert!(
        failed
            .iter()
            .any(|r| r["source_row_number"] == tv[0]["source_row_number"])
    );
    for r in loaded.iter().chain(&again) {
        assert!(distinct.contains(&r["source_row_number"]), "{r:?} was not a failed row");
    }
}

#[test]
fn every_ingest_failpoint_during_a_replay_then_rerun_equals_one_clean_replay() {
    let prepare = || {
        let t = TestLake::new();
        t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
        allow(&t, "bookings.yaml", STATUS.0, STATUS.1);
        t
    };
    let state = |t: &TestLake| -> BTreeMap<&'static str, Vec<Row>> {
        let names = id_names(t);
        let mut out = BTreeMap::new();
        for (name, sql) in [
            (
                "runs",
                "SELECT * EXCLUDE (started_at, finished_at, file_hash) FROM audit.ingestion_run_log ORDER BY started_at",
            ),
            (
                "bronze",
                "SELECT * EXCLUDE (file_hash) FROM bronze.bookings ORDER BY ingested_at, source_row_number",
            ),
            (
                "current",
                "SELECT * EXCLUDE (file_hash) FROM bronze.bookings_current ORDER BY natural_key_fingerprint",
            ),
            (
                "failures",
                "SELECT * FROM audit.row_failure_log ORDER BY failed_at, source_row_number, rule",
            ),
        ] {
            out.insert(name, normalize_rows(t.query(sql), &names));
        }
        out
    };
    let clean = prepare();
    let original = first_run(&clean);
    replay(&clean, &original);
    let want = state(&clean);
    for point in ingot::table::failpoint::INGEST {
        let t = prepare();
        let original = first_run(&t);
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .args(["replay", &original])
            .output()
            .unwrap();
        assert!(
            !out.status.success() && stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: {}",
            stderr(&out)
        );
        replay(&t, &original);
        assert_eq!(state(&t), want, "{point}: crash + re-run");
    }
}
