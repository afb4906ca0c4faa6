//! S3 lakes against a real S3 server on loopback: moto (`moto[server]` from PyPI, installed by this
//! test into the venv `.venv-test-s3`; moto enforces `If-None-Match` and `If-Match` atomically),
//! started on a free port and stopped by its process id when the test ends, pass or fail.
//!
//! The same stories run on an S3 lake and on a local lake and the whole lakes are compared (every
//! audit record, bronze row, hash and silver row; ids and clocks normalized, file paths compared by
//! file name): ingest from `s3://` URLs and globs, the re-sent file skipped, the corrected
//! re-delivery, builds, an undo, SQL; and the nightly job over an `s3://` landing prefix. Commit
//! races: 16 writers committing into one run-log slot, 8 processes taking one stale lock, and 8
//! concurrent `ingot ingest` processes of one file; exactly one wins and every row is there once.
//! A compacted source read from its view state answers as a local lake that never compacts.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::{
    TestLake, assert_ok, assert_same_tables, demo_sources, demo_tables, id_names, landing, normalize_rows, python_venv,
    repo, stderr, stdout,
};

const MOTO: &str = "moto[server]==5.2.5";

type Row = BTreeMap<String, Value>;

/// The venv's `moto_server`, created (and moto installed) on first use.
fn moto_server() -> PathBuf {
    let python = python_venv(".venv-test-s3", "import moto.server, flask", &[MOTO]);
    let bin = python.with_file_name("moto_server");
    assert!(bin.exists(), "{MOTO} installed but {} is missing", bin.display());
    bin
}

/// A moto S3 server on a free loopback port; killed (by its pid) when dropped.
pub(crate) struct Moto {
    child: Child,
    port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    pub(crate) fn start() -> Moto {
        let bin = moto_server();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let child = Command::new(&bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut moto = Moto { child, port };
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = moto.child.try_wait() {
                    break; // exited: the port was taken in between; try another
                }
                if moto.http("GET", "/").is_some_and(|r| r.starts_with("HTTP/1.1 200")) {
                    return moto;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(moto);
        }
        panic!("moto_server did not start");
    }

    /// One plain HTTP request; the response, or `None` when the server is not listening yet.
    pub(crate) fn http(&self, method: &str, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    fn create_bucket(&self, bucket: &str) {
        let r = self.http("PUT", &format!("/{bucket}")).unwrap_or_default();
        assert!(r.starts_with("HTTP/1.1 200"), "create bucket {bucket}: {r}");
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment an `ingot` process needs for this server.
    fn envs(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
        ]
    }

    /// The same as object_store options, for in-process lakes (tests do not change their
    /// process environment).
    pub(crate) fn options(&self) -> Vec<(String, String)> {
        vec![
            ("aws_endpoint".into(), self.endpoint()),
            ("aws_access_key_id".into(), "testing".into()),
            ("aws_secret_access_key".into(), "testing".into()),
            ("aws_region".into(), "us-east-1".into()),
            ("aws_allow_http".into(), "true".into()),
        ]
    }

    /// Create `bucket` and upload a local folder under `s3://bucket/prefix/` (through the
    /// in-process object store).
    fn upload(&self, dir: &Path, bucket: &str, prefix: &str) {
        self.create_bucket(bucket);
        let lake = ingot::table::lake::Lake::open_with(&format!("s3://{bucket}/{prefix}"), &self.options()).unwrap();
        let rt = runtime();
        let mut stack = vec![(dir.to_path_buf(), String::new())];
        while let Some((d, rel)) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                let r = if rel.is_empty() { name } else { format!("{rel}/{name}") };
                if p.is_dir() {
                    stack.push((p, r));
                } else {
                    rt.block_on(lake.put(&r, std::fs::read(&p).unwrap().into())).unwrap();
                }
            }
        }
    }
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A test lake on `s3://<bucket>/lake` of `moto` (contracts copied locally as for every TestLake).
pub(crate) fn s3_lake(moto: &Moto, bucket: &str) -> TestLake {
    moto.create_bucket(bucket);
    let mut t = TestLake::new();
    t.lake_url = Some(format!("s3://{bucket}/lake"));
    t.envs.extend(moto.envs());
    t
}

/// Rows with `file_path` reduced to the file name (the S3 lake read `s3://...` URLs, the local
/// one local paths).
fn by_file_name(rows: Vec<Row>) -> Vec<Row> {
    rows.into_iter()
        .map(|mut r| {
            if let Some(Value::String(p)) = r.get_mut("file_path") {
                *p = p.rsplit('/').next().unwrap_or_default().to_string();
            }
            r
        })
        .collect()
}

/// Every table of a lake, whole: audit logs, bronze and bronze current of every source, silver
/// tables; run and build ids by start order, clocks hidden, file paths by file name.
fn whole_lake(t: &TestLake) -> BTreeMap<String, Vec<Row>> {
    let names = id_names(t);
    let q = |sql: &str| by_file_name(normalize_rows(t.query(sql), &names));
    let mut out = BTreeMap::new();
    out.insert(
        "audit.ingestion_run_log".to_string(),
        q("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id"),
    );
    out.insert(
        "audit.row_failure_log".to_string(),
        q("SELECT * FROM audit.row_failure_log ORDER BY layer, source, \"table\", failed_at, source_row_number, rule"),
    );
    out.insert(
        "audit.silver_build_log".to_string(),
        q("SELECT * FROM audit.silver_build_log ORDER BY started_at, build_id"),
    );
    for s in demo_sources() {
        out.insert(
            format!("bronze.{s}"),
            q(&format!(
                "SELECT * FROM bronze.{s} ORDER BY ingested_at, source_row_number"
            )),
        );
        out.insert(
            format!("bronze.{s}_current"),
            q(&format!(
                "SELECT * FROM bronze.{s}_current ORDER BY natural_key_fingerprint"
            )),
        );
    }
    for table in demo_tables() {
        out.insert(
            format!("silver.{table}"),
            q(&format!(
                "SELECT * FROM silver.{table} ORDER BY natural_key_fingerprint"
            )),
        );
    }
    out
}

/// The story of the demo on one lake: `input(rel)` names a landing file (a local path or an s3://
/// URL). Every command must succeed; returns what the final SQL query printed.
fn story(t: &TestLake, input: &dyn Fn(&str) -> String) -> String {
    let run = |args: &[&str]| {
        let out = t
            .command()
            .arg("--rules")
            .arg(repo().join("rules"))
            .args(args)
            .output()
            .unwrap();
        assert_ok(&out);
        stdout(&out)
    };
    run(&["ingest", "hotels", &input("hotels/2026-11-01_hotels.csv")]);
    run(&["ingest", "bookings", &input("bookings/2026-11-01_bookings.csv")]);
    // the re-sent file: skipped by its hash
    let resent = run(&["ingest", "bookings", &input("bookings/2026-11-02_bookings_resend.csv")]);
    assert!(
        resent.contains("skipped, identical to a file already loaded"),
        "{resent}"
    );
    run(&["ingest", "bookings", &input("bookings/2026-11-03_bookings.csv")]);
    // the corrected re-delivery: only the changed rows are written
    run(&[
        "ingest",
        "bookings",
        &input("bookings/2026-11-04_bookings_corrected.csv"),
    ]);
    run(&["ingest", "hotels", &input("hotels/2026-11-03_hotels.csv")]);
    // globs (one of the files is gzipped)
    run(&["ingest", "marketing_spend", &input("marketing_spend/*")]);
    run(&["ingest", "web_sessions", &input("web_sessions/*.ndjson")]);
    run(&["build", "bookings", "--rules-version", "1"]);
    run(&["build", "marketing_spend"]);
    run(&["build", "web_sessions"]);
    run(&["build", "bookings", "--rebuild-where", "rules_version < 2"]);
    // undo the corrected re-delivery, then build again
    let corrected =
        t.query("SELECT run_id FROM audit.ingestion_run_log WHERE file_path LIKE '%2026-11-04_bookings_corrected.csv'");
    assert_eq!(corrected.len(), 1, "{corrected:?}");
    run(&["undo", corrected[0]["run_id"].as_str().unwrap()]);
    run(&["build", "bookings"]);
    run(&["doctor"]);
    run(&[
        "sql",
        "SELECT channel, rules_version, count(*) AS n FROM silver.bookings GROUP BY 1, 2 ORDER BY 1, 2",
        "--format",
        "csv",
    ])
}

#[test]
fn an_s3_lake_fed_from_s3_urls_equals_the_same_story_on_a_local_lake() {
    let moto = Moto::start();
    moto.upload(&repo().join("data/landing"), "landing", "in");
    let s3 = s3_lake(&moto, "story");
    let s3_said = story(&s3, &|rel| format!("s3://landing/in/{rel}"));
    let local = TestLake::new();
    let local_said = story(&local, &|rel| landing(rel).display().to_string());

    let got = whole_lake(&s3);
    let want = whole_lake(&local);
    assert_same_tables(&got, &want, "S3 lake vs local lake");
    assert_eq!(s3_said, local_said, "command output");
    // the story did what it says: a skipped re-send, a corrected re-delivery, an undo
    let runs = &got["audit.ingestion_run_log"];
    let status = |file: &str| {
        runs.iter()
            .find(|r| r["file_path"] == file)
            .map(|r| r["status"].as_str().unwrap().to_string())
    };
    assert_eq!(
        status("2026-11-02_bookings_resend.csv").as_deref(),
        Some("skipped_duplicate_file")
    );
    assert_eq!(
        status("2026-11-04_bookings_corrected.csv").as_deref(),
        Some("rolled_back")
    );
    assert_eq!(runs.len(), 11, "{runs:?}");
    assert!(!got["silver.bookings"].is_empty());
    // the S3 lake's run log names the URLs it read
    let paths = s3.query("SELECT file_path FROM audit.ingestion_run_log ORDER BY file_path");
    assert!(
        paths
            .iter()
            .all(|r| r["file_path"].as_str().unwrap().starts_with("s3://landing/in/")),
        "{paths:?}"
    );
    // and the lake is really on S3: nothing was written to the test directory's lake folder
    assert!(!s3.lake().exists());
}

/// A compacted source on S3, whose views are read from its segment manifest's view state and the
/// records after it (found by a `start-after` listing), answers as a local lake that never
/// compacts: row for row, through an undo of a run a segment holds and one of a later run.
#[test]
fn a_compacted_source_on_s3_answers_as_a_local_lake_that_never_compacts() {
    let moto = Moto::start();
    let s3 = s3_lake(&moto, "compacted");
    let mut plain = TestLake::new();
    plain.envs.push(("INGOT_COMPACT".into(), "0".into()));
    let dir = tempfile::tempdir().unwrap();
    let contract = "source: t\nversion: 1\nformat: csv\nfields:\n  - name: id\n    type: int64\n    required: true\n  \
                    - name: v\n    type: string\nnatural_key:\n  fields: [id]\n  version: 1\n";
    for i in 0..21 {
        let f = dir.path().join(format!("d{i}.csv"));
        std::fs::write(&f, format!("id,v\n{},v{i}\n{},w{i}\n", i % 9, 100 + i)).unwrap();
        for t in [&s3, &plain] {
            std::fs::write(t.contracts().join("t.yaml"), contract).unwrap();
            assert_ok(&t.ingest("t", &f));
        }
    }
    let tables = |t: &TestLake| {
        let names = id_names(t);
        [
            "SELECT * FROM bronze.t ORDER BY id, v",
            "SELECT * FROM bronze.t_current ORDER BY id",
        ]
        .map(|sql| normalize_rows(t.query(sql), &names))
    };
    assert_eq!(tables(&s3), tables(&plain), "after 21 runs");
    for n in [2, 19] {
        for t in [&s3, &plain] {
            let runs = t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at");
            assert_ok(&t.run(&["undo", runs[n]["run_id"].as_str().unwrap()]));
        }
        assert_eq!(tables(&s3), tables(&plain), "after undo of run {n}");
    }
    assert_eq!(tables(&s3)[1].len(), 9 + 19, "the two undone runs' new keys are gone");
    assert_ok(&s3.run(&["doctor"]));
}

#[test]
fn the_nightly_job_over_an_s3_landing_prefix_equals_the_local_job_and_a_second_run_changes_nothing() {
    let moto = Moto::start();
    moto.upload(&repo().join("data/landing"), "nightly", "landing");
    let s3 = s3_lake(&moto, "nightly-lake");
    let nightly = |t: &TestLake, landing: &str| {
        let out = t
            .command()
            .args(["--landing", landing, "--rules"])
            .arg(repo().join("rules"))
            .arg("run")
            .output()
            .unwrap();
        assert_ok(&out);
        stdout(&out)
    };
    let first = nightly(&s3, "s3://nightly/landing");
    assert!(
        first.contains("nightly job: 14 runs (1 skipped as duplicates, 0 failed), 4 builds (0 failed)"),
        "{first}"
    );
    let local = TestLake::new();
    let local_first = nightly(&local, &repo().join("data/landing").display().to_string());
    let norm = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("ingest "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(norm(&first), norm(&local_first));
    let before = whole_lake(&s3);
    assert_same_tables(&before, &whole_lake(&local), "nightly: S3 vs local");

    let second = nightly(&s3, "s3://nightly/landing");
    assert!(
        second.starts_with(
            "nightly job: 0 runs (0 skipped as duplicates, 0 failed), 0 builds (0 failed); 14 landing files already loaded"
        ),
        "{second}"
    );
    assert_same_tables(&whole_lake(&s3), &before, "second nightly run");
}

/// The nightly job on a cluster of separate `ingot cluster` processes (one scheduler, two
/// executors) whose lake is on S3: the executors open the lake from the same environment the
/// client uses, every plan runs on the cluster, and the lake ends exactly as the same job leaves
/// a local lake run in one process. Analyst queries on the cluster give the local answers.
#[cfg(feature = "cluster")]
#[test]
fn a_cluster_over_an_s3_lake_runs_the_nightly_job_like_one_local_process() {
    let moto = Moto::start();
    moto.upload(&repo().join("data/landing"), "cluster-in", "landing");
    let s3 = s3_lake(&moto, "cluster-lake");
    let lake_url = s3.lake_url.clone().unwrap();
    let (_cluster, url) = crate::cluster::process_cluster(&lake_url, &moto.envs());
    let local = TestLake::new();
    let local_landing = repo().join("data/landing").display().to_string();
    let run = |t: &TestLake, cluster: Option<&str>, args: &[&str]| {
        let landing = if cluster.is_some() {
            "s3://cluster-in/landing"
        } else {
            &local_landing
        };
        crate::cluster::ok_on(t, landing, cluster, args)
    };
    let out = run(&s3, Some(&url), &["run"]);
    for stage in ["build: transform", "ingest: committed versions"] {
        assert!(
            stderr(&out).contains(&format!("cluster: {stage}: on the cluster")),
            "{stage} did not run on the cluster:\n{}",
            stderr(&out)
        );
    }
    run(&local, None, &["run"]);
    let got = whole_lake(&s3);
    assert_same_tables(
        &got,
        &whole_lake(&local),
        "nightly job: S3 lake on a cluster vs local lake in one process",
    );
    assert!(got["silver.bookings"].len() > 10 && got["audit.row_failure_log"].len() > 10);
    assert!(!s3.lake().exists(), "the lake must be on S3 only");

    for q in [
        "SELECT natural_key_fingerprint, row_hash, \
           natural_key_fingerprint(1, upper(trim(hotel_code)), upper(trim(booking_ref))) AS fp_again \
         FROM bronze.bookings_current ORDER BY natural_key_fingerprint",
        "SELECT rules_version, anomaly_flags, count(*) AS n FROM silver.bookings GROUP BY 1, 2 ORDER BY 1, 2",
    ] {
        let on = |t: &TestLake, cluster: Option<&str>| stdout(&run(t, cluster, &["sql", q, "--format", "json"]));
        let there = on(&s3, Some(&url));
        assert!(there.lines().count() >= 2, "{q}: {there}");
        assert_eq!(there, on(&local, None), "{q}: S3 lake on the cluster vs local lake");
    }
}

/// A committed run record for the race tests.
fn record(run_id: &str, seq: u64) -> ingot::table::audit::RunRecord {
    use ingot::table::audit::{RunRecord, RunStatus};
    RunRecord {
        run_id: run_id.into(),
        source: "bookings".into(),
        contract_version: 1,
        file_path: format!("s3://landing/{run_id}.csv").into(),
        file_hash: Some("0".repeat(64).into()),
        file_bytes: 1,
        started_at: 1,
        finished_at: 2,
        status: RunStatus::Failed,
        rows_seen: 0,
        rows_inserted: 0,
        rows_updated: 0,
        rows_unchanged: 0,
        rows_failed: 0,
        rows_deleted: 0,
        natural_key_version: None,
        previous_natural_key_version: None,
        natural_key_definition: None,
        rows_superseded: 0,
        contract_fields: None,
        failure_class: None,
        held_reason: None,
        decided_at: None,
        data_file: None,
        failure_file: None,
        pull: None,
        replay_of: None,
        error: Some(format!("writer {run_id}").into()),
        ingot_version: "test".into(),
        ignored_columns: None,
        rolled_back_at: None,
        seq,
    }
}

#[test]
fn sixteen_writers_racing_for_one_commit_slot_leave_exactly_one_record_every_round() {
    let moto = Moto::start();
    moto.create_bucket("race");
    let lake = ingot::table::lake::Lake::open_with("s3://race/lake", &moto.options()).unwrap();
    let rt = runtime();
    for round in 1..=10u64 {
        let results: Vec<(String, bool, String)> = rt.block_on(async {
            let tasks: Vec<_> = (0..16)
                .map(|w| {
                    let lake = lake.clone();
                    let id = format!("round{round}-writer{w:02}");
                    tokio::spawn(async move {
                        let r = ingot::table::audit::commit_run(&lake, &record(&id, round), None).await;
                        let msg = r.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
                        (id, r.is_ok(), msg)
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        let winners: Vec<&String> = results.iter().filter(|r| r.1).map(|r| &r.0).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for (id, ok, msg) in &results {
            assert!(
                *ok || msg.contains("nothing of run") && msg.contains("was published"),
                "round {round}: {id}: {msg}"
            );
        }
        let log = rt.block_on(ingot::table::audit::read_run_log(&lake)).unwrap();
        assert_eq!(log.len() as u64, round, "round {round}");
        let committed = log.iter().find(|r| r.seq == round).unwrap();
        assert_eq!(
            &committed.run_id, winners[0],
            "round {round}: the record in the slot is the winner's"
        );
        assert_eq!(committed, &record(winners[0], round));
    }
}

#[test]
fn eight_processes_taking_over_one_stale_s3_lock_leave_exactly_one_holder() {
    let moto = Moto::start();
    moto.create_bucket("locks");
    let lake = ingot::table::lake::Lake::open_with("s3://locks/lake", &moto.options()).unwrap();
    let rt = runtime();
    for round in 0..5 {
        // a lock whose heartbeat is long past its TTL, left by a crashed process elsewhere
        let stale = serde_json::json!({
            "run_id": format!("crashed-{round}"), "host": "elsewhere", "pid": 1,
            "acquired_at": "2020-01-01T00:00:00Z", "heartbeat_ms": 0, "ttl_ms": 1000
        });
        rt.block_on(lake.put("_locks/bookings.lock", stale.to_string().into()))
            .unwrap();
        let results = rt.block_on(async {
            let tasks: Vec<_> = (0..8)
                .map(|w| {
                    let lake = lake.clone();
                    tokio::spawn(async move {
                        let id = format!("taker-{w}");
                        let r = ingot::table::lock::acquire(
                            &lake,
                            "bookings",
                            &id,
                            Duration::from_secs(30),
                            Duration::ZERO,
                        )
                        .await;
                        (id, r)
                    })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        let mut holders = Vec::new();
        for (id, r) in results {
            match r {
                Ok(lock) => holders.push((id, lock)),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("is being ingested by run taker-") || msg.contains("could not take the lock"),
                        "{id}: {msg}"
                    );
                }
            }
        }
        assert_eq!(
            holders.len(),
            1,
            "round {round}: holders {:?}",
            holders.iter().map(|h| &h.0).collect::<Vec<_>>()
        );
        let (id, lock) = holders.pop().unwrap();
        let held = rt.block_on(lake.get("_locks/bookings.lock")).unwrap().unwrap();
        let held: Value = serde_json::from_slice(&held).unwrap();
        assert_eq!(held["run_id"], id.as_str());
        rt.block_on(lock.release()).unwrap();
        // released: the next ingest takes it at once
        let next = rt
            .block_on(ingot::table::lock::acquire(
                &lake,
                "bookings",
                "next",
                Duration::from_secs(30),
                Duration::ZERO,
            ))
            .unwrap();
        rt.block_on(next.release()).unwrap();
    }
}

#[test]
fn eight_concurrent_ingests_of_one_s3_file_commit_it_exactly_once() {
    let moto = Moto::start();
    moto.upload(&repo().join("data/landing/bookings"), "concurrent", "in");
    let s3 = Arc::new(s3_lake(&moto, "concurrent-lake"));
    let url = "s3://concurrent/in/2026-11-01_bookings.csv";
    let children: Vec<_> = (0..8)
        .map(|_| {
            s3.command()
                .args(["ingest", "bookings", url, "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    // every process waits its turn (the default --wait): one loads, the others find the file
    // loaded and skip it
    let mut loaded = 0;
    for out in &outs {
        assert_ok(out);
        let rec: Value = serde_json::from_str(stdout(out).trim()).unwrap();
        match rec["status"].as_str().unwrap() {
            "succeeded_with_failures" => loaded += 1,
            "skipped_duplicate_file" => {}
            other => panic!("unexpected status {other}: {}", stdout(out)),
        }
    }
    assert_eq!(loaded, 1, "{outs:?}");
    // every row exactly once, and exactly the lake of one clean ingest of the file
    let dups =
        s3.query("SELECT natural_key_fingerprint, count(*) AS n FROM bronze.bookings GROUP BY 1 HAVING count(*) > 1");
    assert!(dups.is_empty(), "{dups:?}");
    let local = TestLake::new();
    local.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    let runs = |t: &TestLake| {
        t.query("SELECT * FROM audit.ingestion_run_log WHERE status <> 'skipped_duplicate_file' ORDER BY started_at")
    };
    let rows = |t: &TestLake, sql: &str| {
        let names = id_names(t);
        by_file_name(normalize_rows(t.query(sql), &names))
    };
    assert_eq!(
        by_file_name(normalize_rows(runs(&s3), &id_names(&s3)))
            .into_iter()
            .map(|mut r| {
                r.remove("run_id");
                r
            })
            .collect::<Vec<_>>(),
        by_file_name(normalize_rows(runs(&local), &id_names(&local)))
            .into_iter()
            .map(|mut r| {
                r.remove("run_id");
                r
            })
            .collect::<Vec<_>>()
    );
    for sql in [
        "SELECT * EXCLUDE (ingestion_run_id, ingested_at) FROM bronze.bookings ORDER BY source_row_number",
        "SELECT * EXCLUDE (run_id, failed_at) FROM audit.row_failure_log ORDER BY source_row_number, rule",
    ] {
        assert_eq!(rows(&s3, sql), rows(&local, sql), "{sql}");
    }
}

#[test]
fn s3_mistakes_are_named_with_what_would_be_valid() {
    let moto = Moto::start();
    moto.create_bucket("exists");
    let mut t = TestLake::new();
    t.envs.extend(moto.envs());
    // a lake in a bucket that does not exist
    t.lake_url = Some("s3://no-such-bucket/lake".into());
    let out = t.run(&["runs"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("s3://no-such-bucket/lake") && e.contains("the bucket does not exist"),
        "{e}"
    );
    // a landing object that does not exist
    t.lake_url = Some("s3://exists/lake".into());
    let out = t.run(&["ingest", "bookings", "s3://exists/in/missing.csv"]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains("no such object: s3://exists/in/missing.csv") && e.contains("quote a glob"),
        "{e}"
    );
    let out = t.run(&["ingest", "bookings", "s3://exists/in/*.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no object matches \"s3://exists/in/*.csv\""),
        "{}",
        stderr(&out)
    );
    // no bucket in the URL; an unsupported scheme
    t.lake_url = Some("s3:///lake".into());
    let e = stderr(&t.run(&["runs"]));
    assert!(e.contains("names no bucket: use s3://<bucket>/<prefix>"), "{e}");
    t.lake_url = Some("gs://bucket/lake".into());
    let e = stderr(&t.run(&["runs"]));
    assert!(
        e.contains("\"gs://\" is not supported; use a local path, file:// or s3://bucket/prefix"),
        "{e}"
    );
    // a plain-http endpoint without AWS_ALLOW_HTTP
    t.lake_url = Some("s3://exists/lake".into());
    t.envs.retain(|(k, _)| k != "AWS_ALLOW_HTTP");
    let out = t
        .command()
        .env_remove("AWS_ALLOW_HTTP")
        .args(["runs"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("AWS_ALLOW_HTTP"), "{}", stderr(&out));
}

/// A write killed on S3 leaves an incomplete multipart upload (no object, but its parts are kept
/// and billed until aborted). gc aborts those under the lake's prefix once older than the grace
/// period, lists them in a dry run, and leaves alone younger ones and those outside the lake.
#[test]
fn gc_aborts_incomplete_multipart_uploads_under_the_lake_after_the_grace_period() {
    let moto = Moto::start();
    let t = s3_lake(&moto, "uploads");
    assert_ok(&t.ingest("hotels", &landing("hotels/2026-11-01_hotels.csv")));
    let before = t.query("SELECT * FROM bronze.hotels ORDER BY hotel_code");
    let keys = [
        "lake/bronze/hotels/run_id=killed/part-00000.parquet",
        "lake/silver/bookings/build_id=killed/part-00000.parquet",
        "elsewhere/part-00000.parquet",
    ];
    for key in keys {
        let r = moto
            .http("POST", &format!("/uploads/{key}?uploads"))
            .unwrap_or_default();
        assert!(r.starts_with("HTTP/1.1 200"), "create upload {key}: {r}");
    }
    let pending = || -> Vec<String> {
        let body = moto.http("GET", "/uploads?uploads").unwrap_or_default();
        let mut keys: Vec<String> = body
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_string)
            .collect();
        keys.sort();
        keys
    };
    let mut all: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    all.sort();
    assert_eq!(pending(), all);

    // moto reports every upload as initiated in 2010: a grace of 10,000 days still covers them
    let out = t.run(&["gc", "--grace", "10000d"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("gc: removed 0 files (0 bytes); 2 more within the grace period"),
        "{}",
        stdout(&out)
    );
    assert_eq!(pending(), all, "young uploads stay (writes in progress)");

    let out = t.run(&["gc", "--dry-run", "--grace", "0s"]);
    assert_ok(&out);
    for rel in [
        "bronze/hotels/run_id=killed/part-00000.parquet",
        "silver/bookings/build_id=killed/part-00000.parquet",
    ] {
        assert!(
            stdout(&out).contains(&format!("would remove {rel} (0 bytes): incomplete multipart upload ")),
            "{}",
            stdout(&out)
        );
    }
    assert_eq!(pending(), all, "a dry run aborts nothing");

    let out = t.run(&["gc", "--grace", "0s"]);
    assert_ok(&out);
    assert_eq!(pending(), vec!["elsewhere/part-00000.parquet".to_string()]);
    assert_eq!(t.query("SELECT * FROM bronze.hotels ORDER BY hotel_code"), before);
}

/// Delta tables on an S3 lake: bronze and silver (and the audit tables) of a lake driven through
/// a first ingest and build, a corrected re-delivery and a delta build (deletion vectors), read by
/// DuckDB (httpfs and delta extensions) and deltalake from moto equal `ingot sql`.
#[test]
fn delta_tables_on_an_s3_lake_read_the_same_through_duckdb_and_deltalake() {
    let moto = Moto::start();
    let t = s3_lake(&moto, "deltas");
    let l = crate::delta::Events::on(t, &[]);
    crate::delta::first_and_corrected(&l);
    let first_build = l.latest_build();
    l.ok(&["build", "events"]);
    let m =
        l.t.query("SELECT count(*) AS n FROM audit.silver_build_log WHERE mode = 'incremental'");
    assert_eq!(m[0]["n"], Value::from(1), "{m:?}");
    let mut checks = crate::delta::lake_checks("s3://deltas/lake", &["events"], &["events"], &["duckdb", "deltalake"]);
    // silver as of the first build: its Delta version is the first after the table's creation
    checks.push(crate::delta::Check {
        name: "silver.events as of the first build".into(),
        sql: "SELECT * FROM silver.events".into(),
        as_of: Some(first_build),
        read: serde_json::json!({"table": "s3://deltas/lake/silver/events", "version": 0, "readers": ["duckdb", "deltalake"]}),
        key: vec!["natural_key_fingerprint"],
    });
    let storage: serde_json::Map<String, Value> = moto.envs().into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    let cmd = || l.command();
    let result = crate::delta::compare(&cmd, l.t.dir.path(), &checks, Some(Value::Object(storage.clone())));
    crate::delta::assert_agree(
        &result,
        &["bronze.events", "silver.events", "bronze.events_current"],
        "an S3 lake",
    );
    let out = l.ingot(&["delta", "status"]);
    assert_ok(&out);
    // a field renamed, widened and cast: the older runs are published as conformed copies
    crate::delta::change_contract(&l);
    crate::delta::deliver_under_changed_contract(&l);
    let checks: Vec<crate::delta::Check> =
        crate::delta::lake_checks("s3://deltas/lake", &["events"], &[], &["duckdb", "deltalake"])
            .into_iter()
            .filter(|c| c.name.starts_with("bronze."))
            .collect();
    let result = crate::delta::compare(&cmd, l.t.dir.path(), &checks, Some(Value::Object(storage)));
    crate::delta::assert_agree(
        &result,
        &["bronze.events", "bronze.events_current"],
        "an S3 lake after a rename, a widening and a cast",
    );
    let out = l.ingot(&["delta", "status"]);
    assert_ok(&out);
}

/// The contract of the size tier's source: a key, two small columns and a wide column of random
/// hex digits (they compress to about half), so that a few hundred thousand rows make files of
/// tens of MiB.
const WIDE_CONTRACT: &str = "source: wide
version: 1
format: csv
unknown_fields: reject
fields:
  - {name: id, type: int64, required: true}
  - {name: grp, type: int32}
  - {name: amount, type: \"decimal(12,2)\"}
  - {name: blob, type: string}
natural_key:
  version: 1
  fields: [id]
";

const WIDE_RULES: &str = "table: wide
source: wide
version: 1
steps:
  - set: amount_x2
    expr: \"amount * 2\"
validate:
  - name: amount_known
    check: \"amount IS NOT NULL\"
    reason: \"no amount\"
anomalies:
  - name: big_amount
    when: \"amount > 99000\"
";

/// `rows` rows with ids from `first`, as CSV; `changed(id)` gives a row a different amount (a
/// corrected re-delivery). The same ids give the same rows on every run.
fn wide_csv(path: &Path, first: i64, rows: i64, changed: &dyn Fn(i64) -> bool) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(out, "id,grp,amount,blob").unwrap();
    for id in first..first + rows {
        let mut rng = crate::util::Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64).wrapping_mul(0x2545_f491));
        let mut blob = String::with_capacity(240);
        for _ in 0..15 {
            blob.push_str(&format!("{:016x}", rng.next()));
        }
        let cents = rng.below(10_000_000) + if changed(id) { 1 } else { 0 };
        writeln!(out, "{id},{},{}.{:02},{blob}", rng.below(100), cents / 100, cents % 100).unwrap();
    }
}

/// One digest per table of the size tier's lake: every column of every row but run ids and
/// clocks, in key order (a whole-row comparison of tables too large to print).
fn wide_digests(t: &TestLake) -> BTreeMap<String, Vec<Row>> {
    let digest = |from: &str, cols: &str, order: &str| {
        t.query(&format!(
            "SELECT count(*) AS n, sha256(string_agg(concat_ws('|', {cols}), ',' ORDER BY {order})) AS digest FROM {from}"
        ))
    };
    let bronze = "id, grp, amount, blob, row_hash, natural_key_fingerprint, source_row_number, is_deleted";
    let mut out = BTreeMap::new();
    out.insert("bronze.wide".into(), digest("bronze.wide", bronze, "id, row_hash"));
    out.insert(
        "bronze.wide_current".into(),
        digest("bronze.wide_current", bronze, "id"),
    );
    out.insert(
        "silver.wide".into(),
        digest(
            "silver.wide",
            "id, grp, amount, amount_x2, blob, natural_key_fingerprint, rules_version, anomaly_flags",
            "id",
        ),
    );
    let names = id_names(t);
    out.insert(
        "audit.ingestion_run_log".into(),
        by_file_name(normalize_rows(
            t.query("SELECT * EXCLUDE (run_id) FROM audit.ingestion_run_log ORDER BY started_at"),
            &names,
        )),
    );
    out.insert(
        "audit.silver_build_log".into(),
        normalize_rows(
            t.query("SELECT * EXCLUDE (build_id) FROM audit.silver_build_log ORDER BY started_at"),
            &names,
        ),
    );
    out
}

/// The size tier on S3: files of tens of MiB, written in multipart uploads whose parts S3 takes
/// (every part but the last at least 5 MiB; moto refuses smaller ones as AWS does). A 200,000-row
/// ingest (a bronze file over 30 MiB), a full build, two more deliveries compacted into one
/// segment, a corrected re-delivery of 1% of the rows, an incremental build, the Delta tables
/// kept up to date beside them; then the lake equals the same story on a local lake, row for row
/// by digest, and doctor finds nothing wrong.
#[test]
fn tables_over_30_mib_on_s3_ingest_build_compact_and_publish_in_parts_s3_accepts() {
    let moto = Moto::start();
    let s3 = s3_lake(&moto, "size");
    let local = TestLake::new();
    let data = tempfile::tempdir().unwrap();
    let rules = data.path().join("rules");
    std::fs::create_dir_all(rules.join("wide")).unwrap();
    std::fs::write(rules.join("wide/v1.yaml"), WIDE_RULES).unwrap();
    let file = |name: &str| data.path().join(name);
    wide_csv(&file("big.csv"), 0, 200_000, &|_| false);
    wide_csv(&file("more-1.csv"), 200_000, 60_000, &|_| false);
    wide_csv(&file("more-2.csv"), 260_000, 60_000, &|_| false);
    wide_csv(&file("big-corrected.csv"), 0, 200_000, &|id| id % 100 == 7);
    for t in [&s3, &local] {
        std::fs::write(t.contracts().join("wide.yaml"), WIDE_CONTRACT).unwrap();
        let run = |args: &[&str]| {
            let out = t
                .command()
                .env("INGOT_COMPACT", "0")
                .arg("--rules")
                .arg(&rules)
                .args(args)
                .output()
                .unwrap();
            assert_ok(&out);
            stdout(&out)
        };
        let path = |name: &str| file(name).display().to_string();
        run(&["ingest", "wide", &path("big.csv")]);
        run(&["build", "wide"]);
        run(&["ingest", "wide", &path("more-1.csv")]);
        run(&["ingest", "wide", &path("more-2.csv")]);
        let compacted = run(&["compact", "wide", "--all"]);
        assert!(
            compacted.contains("wide: 1 segment written, 2 runs newly compacted"),
            "{compacted}"
        );
        let corrected = run(&["ingest", "wide", &path("big-corrected.csv"), "--json"]);
        let rec: Value = serde_json::from_str(corrected.trim()).unwrap();
        assert_eq!(rec["rows_updated"], 2_000, "{corrected}");
        assert_eq!(rec["rows_unchanged"], 198_000, "{corrected}");
        run(&["build", "wide"]);
        let doctor = run(&["doctor"]);
        assert!(doctor.contains("0 violations"), "{doctor}");
    }
    let got = wide_digests(&s3);
    assert_eq!(got, wide_digests(&local), "S3 lake vs local lake");
    assert_eq!(got["bronze.wide_current"][0]["n"], 320_000);
    assert_eq!(got["bronze.wide"][0]["n"], 322_000);

    // the big files went up in several parts (a multipart ETag ends in -<parts>), and each of the
    // kinds of file the issue names is over the 5 MiB part size
    let lake = ingot::table::lake::Lake::open_with("s3://size/lake", &moto.options()).unwrap();
    let rt = runtime();
    let mut multipart = BTreeMap::new();
    for prefix in ["bronze/wide", "silver/wide", "_cache/segments/wide"] {
        for meta in rt.block_on(lake.list(prefix)).unwrap() {
            let parts = meta
                .e_tag
                .as_deref()
                .and_then(|e| e.trim_matches('"').rsplit_once('-'))
                .and_then(|(_, n)| n.parse::<u32>().ok());
            if let Some(n) = parts {
                multipart.insert(meta.location.to_string(), (meta.size, n));
            }
        }
    }
    let biggest = |prefix: &str| {
        multipart
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("lake/{prefix}")))
            .map(|(_, &(size, parts))| (size, parts))
            .max()
            .unwrap_or_else(|| panic!("no multipart object under {prefix}: {multipart:?}"))
    };
    let (size, parts) = biggest("bronze/wide/");
    assert!(
        size > 30 << 20 && parts >= 3,
        "bronze run file: {size} bytes in {parts} parts"
    );
    let (size, parts) = biggest("silver/wide/");
    assert!(
        size > 5 << 20 && parts >= 2,
        "silver part: {size} bytes in {parts} parts"
    );
    let (size, parts) = biggest("_cache/segments/wide/");
    assert!(size > 5 << 20 && parts >= 2, "segment: {size} bytes in {parts} parts");
    // no upload was left incomplete
    let pending = moto.http("GET", "/size?uploads").unwrap_or_default();
    assert!(!pending.contains("<Upload>"), "{pending}");

    // a full build on a cluster over the S3 lake writes the same table as one in this process
    #[cfg(feature = "cluster")]
    {
        let (_cluster, url) = crate::cluster::process_cluster(s3.lake_url.as_deref().unwrap(), &moto.envs());
        let full = |t: &TestLake, cluster: Option<&str>| {
            let mut c = t.command();
            c.arg("--rules").arg(&rules).env("INGOT_CLUSTER_TRACE", "1");
            if let Some(url) = cluster {
                c.arg("--cluster").arg(url);
            }
            let out = c.args(["build", "wide", "--full"]).output().unwrap();
            assert_ok(&out);
            stderr(&out)
        };
        let trace = full(&s3, Some(&url));
        assert!(
            trace.contains("on the cluster") && !trace.contains(": in this process"),
            "{trace}"
        );
        full(&local, None);
        let (got, want) = (wide_digests(&s3), wide_digests(&local));
        assert_eq!(
            got["silver.wide"], want["silver.wide"],
            "a full build on a cluster vs in one process"
        );
        assert_eq!(got["audit.silver_build_log"], want["audit.silver_build_log"]);
    }
}

/// A damaged bronze file of an S3 lake fed from `s3://` landing files is derived again from its
/// landing object (streamed to a local copy), the same bytes as committed; once the landing
/// object changed, and once it is gone, the damaged file is left and `--fix` says why.
#[test]
fn a_damaged_bronze_file_on_s3_is_derived_again_from_its_s3_landing_file() {
    let moto = Moto::start();
    moto.upload(&repo().join("data/landing/bookings"), "landing", "in");
    let t = s3_lake(&moto, "rederive");
    let url = "s3://landing/in/2026-11-01_bookings.csv";
    for input in [url, "s3://landing/in/2026-11-04_bookings_corrected.csv"] {
        assert_ok(&t.run(&["ingest", "bookings", input]));
    }
    let runs = t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY commit_seq");
    let run = runs[0]["run_id"].as_str().unwrap().to_string();
    let rel = format!("bronze/bookings/run_id={run}/part-00000.parquet");
    let q = "SELECT * FROM bronze.bookings ORDER BY ingested_at, source_row_number, natural_key_fingerprint";
    let rows = t.query(q);
    let rt = runtime();
    let lake = ingot::table::lake::Lake::open_with("s3://rederive/lake", &moto.options()).unwrap();
    let inbox = ingot::table::lake::Lake::open_with("s3://landing/in", &moto.options()).unwrap();
    let original = rt.block_on(lake.get(&rel)).unwrap().unwrap();
    let doctor = |args: &[&str]| crate::damage::doctor(&t, args);

    rt.block_on(lake.put(&rel, original.slice(..100))).unwrap();
    let (code, said) = doctor(&["--fix"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "fixed: bronze.bookings: re-derived run {run}'s file {rel} from its landing file {url} ("
        )),
        "{said}"
    );
    assert_eq!(rt.block_on(lake.get(&rel)).unwrap().unwrap(), original);
    assert_eq!(t.query(q), rows);

    rt.block_on(lake.put(&rel, original.slice(..100))).unwrap();
    let name = "2026-11-01_bookings.csv";
    let mut changed = rt.block_on(inbox.get(name)).unwrap().unwrap().to_vec();
    changed.extend_from_slice(
        b"BK999999,MAD01,x@example.org,bcom,confirmed,2026-11-08,2026-11-12,4,1.00,EUR,,2026-11-01T02:00:00Z\n",
    );
    rt.block_on(inbox.put(name, changed.into())).unwrap();
    let (code, said) = doctor(&["--fix"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "not re-derived: landing file {url} has changed: its SHA-256 is now "
        )),
        "{said}"
    );
    rt.block_on(inbox.delete(name)).unwrap();
    let (code, said) = doctor(&["--fix"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!("not re-derived: landing file {url} is gone; undo it")),
        "{said}"
    );
    assert_eq!(
        rt.block_on(lake.get(&rel)).unwrap().unwrap().len(),
        100,
        "left as it was"
    );
}
