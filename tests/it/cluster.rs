//! `--cluster`: the same commands on a lake with and without an ingot cluster (Apache DataFusion
//! Ballista) give the same lake — whole rows of bronze, silver and the audit tables, hashes
//! included — on an in-process loopback cluster (scheduler and executor tasks of this test, on
//! free ports) and on a cluster of separate `ingot cluster` processes; an executor that lacks a
//! UDF fails the query with an error naming it; an unreachable cluster is named.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

use crate::nightly::copy_dir;
use crate::util::{
    TestLake, assert_ok, demo_sources, demo_tables, id_names, landing, normalize_rows, repo, stderr, stdout,
};

type Row = BTreeMap<String, Value>;

/// `ingot ...` on `t` with the repository's rules and the landing folder `landing` (a path or
/// URL), on `cluster` when given (with the placement trace on).
fn ingot_on(t: &TestLake, landing: &str, cluster: Option<&str>, args: &[&str]) -> Output {
    let mut c = t.command();
    c.arg("--rules").arg(repo().join("rules"));
    c.args(["--landing", landing]);
    if let Some(url) = cluster {
        c.arg("--cluster").arg(url).env("INGOT_CLUSTER_TRACE", "1");
    } else {
        c.env_remove("INGOT_CLUSTER");
    }
    c.args(args).output().unwrap()
}

/// [`ingot_on`], insisting on exit 0 and, on a cluster, that every plan ran there.
pub(crate) fn ok_on(t: &TestLake, landing: &str, cluster: Option<&str>, args: &[&str]) -> Output {
    let out = ingot_on(t, landing, cluster, args);
    assert_ok(&out);
    if cluster.is_some() {
        let trace = stderr(&out);
        assert!(
            !trace.contains(": in this process"),
            "{args:?}: a plan ran in the client:\n{trace}"
        );
    }
    out
}

/// The landing folder of a test lake: `landing/` of its directory.
fn own_landing(t: &TestLake) -> String {
    t.dir.path().join("landing").display().to_string()
}

fn ingot(t: &TestLake, cluster: Option<&str>, args: &[&str]) -> Output {
    ingot_on(t, &own_landing(t), cluster, args)
}

fn ok(t: &TestLake, cluster: Option<&str>, args: &[&str]) -> Output {
    ok_on(t, &own_landing(t), cluster, args)
}

/// Rows of a query as JSON objects, run on `cluster` when given.
fn query(t: &TestLake, cluster: Option<&str>, sql: &str) -> Vec<Row> {
    let out = ok(t, cluster, &["sql", sql, "--format", "json"]);
    if cluster.is_some() {
        assert!(
            stderr(&out).contains("cluster: sql: on the cluster"),
            "the query did not run on the cluster: {}",
            stderr(&out)
        );
    }
    stdout(&out)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The whole lake, every table ordered and with ids (runs and builds, by start order), clock
/// values and the test directory normalized: bronze, `_current`, silver and the audit tables.
fn whole_lake(t: &TestLake) -> BTreeMap<String, Vec<Row>> {
    let names = id_names(t);
    let dir = t.dir.path().display().to_string();
    let mut queries: Vec<(String, String)> = vec![
        (
            "audit.ingestion_run_log".into(),
            "SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id".into(),
        ),
        (
            "audit.row_failure_log".into(),
            "SELECT * FROM audit.row_failure_log ORDER BY source, failed_at, source_row_number, rule".into(),
        ),
        (
            "audit.silver_build_log".into(),
            "SELECT * FROM audit.silver_build_log ORDER BY \"table\", started_at".into(),
        ),
    ];
    for s in demo_sources() {
        queries.push((
            format!("bronze.{s}"),
            format!("SELECT * FROM bronze.{s} ORDER BY ingested_at, source_row_number"),
        ));
        queries.push((
            format!("bronze.{s}_current"),
            format!("SELECT * FROM bronze.{s}_current ORDER BY natural_key_fingerprint"),
        ));
    }
    for table in demo_tables() {
        queries.push((
            format!("silver.{table}"),
            format!("SELECT * FROM silver.{table} ORDER BY natural_key_fingerprint"),
        ));
    }
    queries
        .into_iter()
        .map(|(name, q)| {
            let mut rows = normalize_rows(t.query(&q), &names);
            for row in &mut rows {
                for v in row.values_mut() {
                    if let Value::String(s) = v
                        && s.contains(&dir)
                    {
                        *v = Value::String(s.replace(&dir, "<dir>"));
                    }
                }
            }
            (name, rows)
        })
        .collect()
}

fn assert_same_lake(local: &TestLake, remote: &TestLake) {
    let a = whole_lake(local);
    let b = whole_lake(remote);
    crate::util::assert_same_tables(&b, &a, "cluster vs local");
    for name in ["silver.bookings", "audit.row_failure_log", "bronze.bookings"] {
        assert!(a[name].len() > 10, "the comparison must cover real rows of {name}");
    }
}

/// Queries analysts run, with the hashing UDFs recomputing what bronze stored.
const QUERIES: [&str; 3] = [
    "SELECT natural_key_fingerprint, row_hash, \
       natural_key_fingerprint(1, upper(trim(hotel_code)), upper(trim(booking_ref))) AS fp_again, \
       canonical_text(check_in) AS day, canonical_text(amount) AS amount \
     FROM bronze.bookings_current ORDER BY natural_key_fingerprint",
    "SELECT rules_version, count(*) AS n, count(DISTINCT natural_key_fingerprint) AS fps, \
       sum(CASE WHEN is_anomaly THEN 1 ELSE 0 END) AS flagged, min(row_hash) AS low, max(row_hash) AS high \
     FROM silver.bookings GROUP BY rules_version ORDER BY 1",
    "SELECT r.source, r.status, count(f.rule) AS failures FROM audit.ingestion_run_log r \
     LEFT JOIN audit.row_failure_log f ON f.run_id = r.run_id GROUP BY r.source, r.status ORDER BY 1, 2",
];

fn same_queries(t: &TestLake, cluster: &str) {
    for q in QUERIES {
        let here = query(t, None, q);
        let there = query(t, Some(cluster), q);
        assert!(!here.is_empty(), "{q}: no rows");
        assert_eq!(here, there, "{q}: local vs cluster");
    }
}

/// A runtime whose worker threads serve an in-process loopback cluster while the test thread
/// runs `ingot` processes against it.
pub(crate) fn loopback(
    t: &mut TestLake,
    executor_udfs: Vec<datafusion::logical_expr::ScalarUDF>,
) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let lake = t.lake().display().to_string();
    t.envs.push(("INGOT_CLUSTER_TOKEN".into(), CLUSTER_TOKEN.into()));
    let security = ingot::engine::cluster::guard::ClusterSecurity {
        token: Some(CLUSTER_TOKEN.to_string()),
        ca: None,
    };
    let cluster = rt
        .block_on(ingot::engine::cluster::loopback::start_with(
            &lake,
            1,
            2,
            executor_udfs,
            &security,
        ))
        .unwrap();
    (rt, cluster.url)
}

#[test]
fn an_in_process_loopback_cluster_gives_the_lake_local_execution_gives() {
    let local = TestLake::new();
    let mut remote = TestLake::new();
    let (_rt, url) = loopback(&mut remote, ingot::engine::cluster::udfs());
    for (t, cluster) in [(&local, None), (&remote, Some(url.as_str()))] {
        // day one: one run per source, so the first builds send their whole transform
        for f in ["hotels/2026-11-01_hotels.csv", "bookings/2026-11-01_bookings.csv"] {
            let source = f.split('/').next().unwrap();
            ok(t, cluster, &["ingest", source, landing(f).to_str().unwrap()]);
        }
        let out = ok(t, cluster, &["build", "bookings"]);
        if cluster.is_some() {
            let trace = stderr(&out);
            for stage in ["build: transform", "build: resolve rejections", "build: filtered rows"] {
                assert!(
                    trace.contains(&format!("cluster: {stage}: on the cluster")),
                    "{stage} did not run on the cluster:\n{trace}"
                );
            }
        }
        // later deliveries: change detection scans committed bronze on the cluster
        for f in [
            "bookings/2026-11-02_bookings_resend.csv",
            "hotels/2026-11-03_hotels.csv",
            "bookings/2026-11-03_bookings.csv",
            "bookings/2026-11-04_bookings_corrected.csv",
        ] {
            let source = f.split('/').next().unwrap();
            let out = ok(t, cluster, &["ingest", source, landing(f).to_str().unwrap()]);
            if cluster.is_some() && !stdout(&out).contains("skipped") {
                assert!(
                    stderr(&out).contains("cluster: ingest: committed versions: on the cluster"),
                    "{}",
                    stderr(&out)
                );
            }
        }
        let out = ok(t, cluster, &["build", "bookings"]);
        if cluster.is_some() {
            assert!(
                stderr(&out).contains("cluster: build: bronze fingerprints: on the cluster"),
                "{}",
                stderr(&out)
            );
        }
        ok(t, cluster, &["build", "bookings", "--full"]);
        ok(
            t,
            cluster,
            &["build", "bookings", "--rebuild-where", "rules_version >= 2"],
        );
        for f in [
            "marketing_spend/2026-10-13_marketing_spend.csv",
            "marketing_spend/2026-10-23_marketing_spend.csv",
            "marketing_spend/2026-11-02_marketing_spend.csv.gz",
        ] {
            ok(t, cluster, &["ingest", "marketing_spend", landing(f).to_str().unwrap()]);
        }
        ok(t, cluster, &["build", "marketing_spend"]);
        ok(t, cluster, &["build", "web_sessions"]);
    }
    assert_same_lake(&local, &remote);
    same_queries(&remote, &url);
}

/// `bronze.<source>_current` on a cluster takes the slots of the checkpointed runs from the
/// run-log checkpoint's file (the plan sent must stay small); in this process it takes them from
/// the records already read. Both answer alike on a lake checkpointed at every third record:
/// after a correction superseding checkpointed versions, compacted with them, its undo (a record
/// after the checkpoint that changes a run the checkpoint holds as loaded), and its reload.
#[test]
fn the_current_view_through_a_checkpoint_on_a_cluster_equals_the_one_in_this_process() {
    let mut t = TestLake::new();
    t.envs.push(("INGOT_CHECKPOINT_EVERY".into(), "3".into()));
    let (_rt, url) = loopback(&mut t, ingot::engine::cluster::udfs());
    let corrected = landing("bookings/2026-11-04_bookings_corrected.csv");
    for f in ["bookings/2026-11-01_bookings.csv", "bookings/2026-11-03_bookings.csv"] {
        ok(&t, None, &["ingest", "bookings", landing(f).to_str().unwrap()]);
    }
    ok(&t, None, &["ingest", "bookings", corrected.to_str().unwrap()]);
    let sql = "SELECT * FROM bronze.bookings_current ORDER BY natural_key_fingerprint";
    let same = |what: &str| {
        let here = query(&t, None, sql);
        assert!(!here.is_empty(), "{what}: no rows");
        assert_eq!(
            here,
            query(&t, Some(&url), sql),
            "{what}: in this process vs on the cluster"
        );
        here
    };
    // one segment holds the three runs, so the undone run's rows stay in a file the view reads
    ok(&t, None, &["compact", "--all"]);
    let before = same("after the correction");
    let runs = query(
        &t,
        None,
        "SELECT run_id FROM audit.ingestion_run_log WHERE file_path LIKE '%corrected%'",
    );
    let run = runs[0]["run_id"].as_str().unwrap().to_string();
    assert!(
        before.iter().any(|r| r["ingestion_run_id"] == run.as_str()),
        "{before:?}"
    );
    ok(&t, None, &["undo", &run]);
    let undone = same("after the undo");
    assert!(
        undone.iter().all(|r| r["ingestion_run_id"] != run.as_str()),
        "{undone:?}"
    );
    ok(&t, None, &["ingest", "bookings", corrected.to_str().unwrap()]);
    same("after the reload");
    let checkpoints = t.lake().join("_cache/log/ingestion_run_log/bookings");
    assert!(
        std::fs::read_dir(&checkpoints)
            .unwrap()
            .any(|e| e.unwrap().path().extension().is_some_and(|x| x == "parquet")),
        "no run-log checkpoint in {}",
        checkpoints.display()
    );
}

/// A child process killed (by its id) when the guard is dropped, also when the test fails.
/// A process killed when dropped, then the directory it worked in (an executor's `--work-dir`:
/// its shuffle files and spill directories) removed: a killed process cleans up nothing.
pub(crate) struct Killed(Child, Option<tempfile::TempDir>);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawn `ingot <args>` with `envs` and return it with the first line it prints.
fn spawn(args: &[&str], envs: &[(String, String)]) -> (Killed, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .env_remove("INGOT_CLUSTER")
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let guard = Killed(child, None);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    (guard, line)
}

/// A cluster of separate `ingot cluster` processes on loopback ports for the lake at `lake`
/// (path or URL), started with `envs`: one scheduler and two executors of one task each. Returns
/// the guards (dropping them stops every process) and the client's `df://` URL.
pub(crate) fn process_cluster(lake: &str, envs: &[(String, String)]) -> (Vec<Killed>, String) {
    let c = process_cluster_with_ports(lake, envs);
    (c.guards, c.url)
}

/// A running [`process_cluster`], with its executors' Flight ports.
pub(crate) struct ProcessCluster {
    pub guards: Vec<Killed>,
    pub url: String,
    pub executor_ports: Vec<u16>,
}

pub(crate) fn process_cluster_with_ports(lake: &str, envs: &[(String, String)]) -> ProcessCluster {
    process_cluster_with_args(lake, envs, &[])
}

/// [`process_cluster_with_ports`] with `extra` arguments for every process (e.g. TLS files).
pub(crate) fn process_cluster_with_args(lake: &str, envs: &[(String, String)], extra: &[String]) -> ProcessCluster {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut args = vec!["--lake", lake, "cluster", "scheduler", "--bind", "127.0.0.1:0"];
    args.extend(&extra);
    let (scheduler, line) = spawn(&args, envs);
    let addr = line
        .split_whitespace()
        .nth(5)
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");
    let mut guards = vec![scheduler];
    let mut executor_ports = Vec::new();
    for _ in 0..2 {
        let work = tempfile::tempdir().unwrap();
        let work_dir = work.path().display().to_string();
        let (mut e, line) = spawn(
            &[
                "--lake",
                lake,
                "--memory-limit",
                "256M",
                "cluster",
                "executor",
                "--scheduler",
                &addr,
                "--bind",
                "127.0.0.1:0",
                "--grpc-bind",
                "127.0.0.1:0",
                "--concurrent-tasks",
                "1",
                "--work-dir",
                &work_dir,
            ]
            .into_iter()
            .chain(extra.iter().copied())
            .collect::<Vec<_>>(),
            envs,
        );
        assert!(line.contains("ingot cluster executor"), "{line}");
        let port = line
            .split("results on 127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no results port in {line:?}"));
        executor_ports.push(port);
        e.1 = Some(work);
        guards.push(e);
    }
    ProcessCluster {
        guards,
        url: format!("df://{addr}"),
        executor_ports,
    }
}

/// The token the clusters of these tests run with (the clients get it through `TestLake::envs`).
pub(crate) const CLUSTER_TOKEN: &str = "3b1f6a0c9d8e4f2a7b5c1d0e9f8a7b6c";

#[test]
fn a_cluster_of_ingot_processes_runs_the_nightly_job_like_one_process() {
    let local = TestLake::new();
    let mut remote = TestLake::new();
    let token = vec![("INGOT_CLUSTER_TOKEN".to_string(), CLUSTER_TOKEN.to_string())];
    remote.envs.extend(token.clone());
    let (_cluster, url) = process_cluster(&remote.lake().display().to_string(), &token);
    for (t, cluster) in [(&local, None), (&remote, Some(url.as_str()))] {
        copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
        let out = ok(t, cluster, &["run"]);
        if cluster.is_some() {
            assert!(
                stderr(&out).contains("cluster: build: transform: on the cluster"),
                "{}",
                stderr(&out)
            );
        }
    }
    assert_same_lake(&local, &remote);
    same_queries(&remote, &url);
}

#[test]
fn an_executor_without_a_udf_fails_the_query_naming_it() {
    let mut t = TestLake::new();
    ok(
        &t,
        None,
        &[
            "ingest",
            "hotels",
            landing("hotels/2026-11-01_hotels.csv").to_str().unwrap(),
        ],
    );
    let udfs = ingot::engine::cluster::udfs()
        .into_iter()
        .filter(|u| u.name() != "canonical_text")
        .collect();
    let (_rt, url) = loopback(&mut t, udfs);
    let out = ingot(
        &t,
        Some(&url),
        &["sql", "SELECT canonical_text(hotel_code) FROM bronze.hotels"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "the cluster at {url} cannot run the function \"canonical_text\""
        )),
        "{err}"
    );
    assert!(err.contains("does not register it"), "{err}");
    // the other UDFs are there
    ok(
        &t,
        Some(&url),
        &["sql", "SELECT row_hash(hotel_code) FROM bronze.hotels"],
    );
}

#[test]
fn an_unreachable_cluster_is_named() {
    let t = TestLake::new();
    let out = ingot(&t, Some("df://127.0.0.1:1"), &["sql", "SELECT 1"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot reach the ingot cluster scheduler at df://127.0.0.1:1"),
        "{}",
        stderr(&out)
    );
    let out = ingot(&t, Some("127.0.0.1"), &["sql", "SELECT 1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
