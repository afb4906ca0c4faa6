//! Delta Lake tables read by other engines: DuckDB's `delta_scan` (the PyPI package
//! duckdb-ext-delta, loaded offline) and the `deltalake` package, installed into the venv
//! `.venv-test-delta` by this test. Every table of a lake driven through first ingests and
//! builds, a corrected re-delivery and a delta build, an undo and the build after it, and gc is
//! read by both and compared with `ingot sql` on the same table, row by row and column by column
//! (tests/py/delta_compare.py); silver at an older Delta version equals `ingot sql --as-of`; the
//! documented query of a source's current versions equals `bronze.<source>_current`. Then the
//! careless days: a crash between ingot's commit and the Delta commit, a lost or lying hint,
//! publishing twice, copy-on-write for readers without deletion vectors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::util::{TestLake, assert_ok, python_venv, repo, stderr, stdout};

const PACKAGES: &[&str] = &[
    "duckdb==1.4.4",
    "duckdb-ext-delta==1.4.4.20260205",
    "duckdb-ext-httpfs==1.4.4.20260205",
    "deltalake==1.6.6",
    "pyarrow==26.0.1",
];

pub fn python() -> PathBuf {
    python_venv(
        ".venv-test-delta",
        "import duckdb, deltalake, pyarrow, glob, os; \
         assert len(glob.glob(os.path.join(os.path.dirname(duckdb.__file__), '..', 'duckdb_ext', 'extensions', '*', '*', '*.duckdb_extension'))) >= 2",
        PACKAGES,
    )
}

const CONTRACT: &str = "\
source: events
version: 1
format: csv
fields:
  - {name: id, type: string, required: true}
  - {name: grp, type: string}
  - {name: day, type: date, required: true}
  - {name: val, type: int64}
  - {name: amount, type: 'decimal(10,2)'}
  - {name: seen, type: timestamp}
natural_key: {version: 1, fields: [id]}
";

const RULES: &str = "\
table: events
source: events
version: 1
steps:
  - set: val2
    expr: \"val * 2\"
  - filter: \"val IS NULL OR val >= 0\"
validate:
  - name: small
    check: \"val IS NULL OR val < 1000\"
    reason: \"too big\"
anomalies:
  - name: big
    when: \"val > 800\"
";

/// A lake of the `events` source and table, with extra environment for every command.
pub struct Events {
    pub t: TestLake,
    rules: PathBuf,
}

impl Events {
    pub fn new(envs: &[(&str, &str)]) -> Events {
        Events::on(TestLake::new(), envs)
    }

    /// The events source and table on `t` (a local or an S3 lake).
    pub fn on(mut t: TestLake, envs: &[(&str, &str)]) -> Events {
        std::fs::write(t.contracts().join("events.yaml"), CONTRACT).unwrap();
        let rules = t.dir.path().join("rules");
        std::fs::create_dir_all(rules.join("events")).unwrap();
        std::fs::write(rules.join("events/v1.yaml"), RULES).unwrap();
        // delta builds whenever they can
        t.envs.push(("INGOT_SILVER_DELTA_LIMIT".into(), "1".into()));
        for (k, v) in envs {
            t.envs.push((k.to_string(), v.to_string()));
        }
        Events { t, rules }
    }

    pub fn ingot(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    pub fn command(&self) -> Command {
        let mut c = self.t.command();
        c.arg("--rules").arg(&self.rules);
        c
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.ingot(args);
        assert_ok(&out);
        assert!(
            !stderr(&out).contains("warning: delta"),
            "ingot {args:?} warned about Delta: {}",
            stderr(&out)
        );
        stdout(&out)
    }

    /// Write a landing file of `rows` (id, grp, day, val) and ingest it.
    pub fn deliver(&self, name: &str, rows: &[(usize, i64)]) -> PathBuf {
        let dir = self.t.dir.path().join("landing");
        std::fs::create_dir_all(&dir).unwrap();
        let mut body = String::from("id,grp,day,val,amount,seen\n");
        for (id, val) in rows {
            body.push_str(&format!(
                "e{id},g{},2026-11-{:02},{val},{}.{:02},2026-11-01T{:02}:00:00.25Z\n",
                id % 5,
                1 + id % 27,
                id * 3,
                id % 100,
                id % 24
            ));
        }
        let file = dir.join(name);
        std::fs::write(&file, body).unwrap();
        self.ok(&["ingest", "events", file.to_str().unwrap()]);
        file
    }

    /// Ingest one new record with `INGOT_DELTA=off`: committed, not published (the tables lag).
    pub fn ingest_with_delta_off(&self) {
        let file = self.t.dir.path().join("landing/off.csv");
        std::fs::write(
            &file,
            "id,grp,day,val,amount,seen\noff1,g1,2026-11-02,5,1.00,2026-11-01T00:00:00Z\n",
        )
        .unwrap();
        let out = self
            .command()
            .env("INGOT_DELTA", "off")
            .args(["ingest", "events", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert_ok(&out);
    }

    pub fn lake(&self) -> PathBuf {
        self.t.lake()
    }

    /// The latest build id of events.
    pub fn latest_build(&self) -> String {
        let b = self.t.query(
            "SELECT build_id FROM audit.silver_build_log WHERE status = 'succeeded' ORDER BY commit_seq DESC LIMIT 1",
        );
        b[0]["build_id"].as_str().unwrap().to_string()
    }

    pub fn manifest(&self, build: &str) -> Value {
        let m = self
            .lake()
            .join(format!("silver/events/build_id={build}/manifest.json"));
        serde_json::from_slice(&std::fs::read(m).unwrap()).unwrap()
    }
}

/// One comparison for tests/py/delta_compare.py.
pub struct Check {
    pub name: String,
    /// The query whose `ingot sql` answer is the truth.
    pub sql: String,
    pub as_of: Option<String>,
    pub read: Value,
    pub key: Vec<&'static str>,
}

impl Check {
    pub fn table(name: &str, sql: &str, table: String, readers: &[&str], key: &[&'static str]) -> Check {
        Check {
            name: name.to_string(),
            sql: sql.to_string(),
            as_of: None,
            read: json!({"table": table, "readers": readers}),
            key: key.to_vec(),
        }
    }
}

/// Every table of a lake (sources and silver tables named), each read through `readers`.
pub fn lake_checks(lake: &str, sources: &[&str], tables: &[&str], readers: &[&str]) -> Vec<Check> {
    let mut out = vec![
        Check::table(
            "audit.ingestion_run_log",
            "SELECT * FROM audit.ingestion_run_log",
            format!("{lake}/audit/ingestion_run_log"),
            readers,
            &["run_id"],
        ),
        Check::table(
            "audit.row_failure_log",
            "SELECT * FROM audit.row_failure_log",
            format!("{lake}/audit/row_failure_log"),
            readers,
            &["run_id", "source_row_number", "rule", "raw_payload"],
        ),
    ];
    if !tables.is_empty() {
        out.push(Check::table(
            "audit.silver_build_log",
            "SELECT * FROM audit.silver_build_log",
            format!("{lake}/audit/silver_build_log"),
            readers,
            &["build_id"],
        ));
    }
    for s in sources {
        out.push(Check::table(
            &format!("bronze.{s}"),
            &format!("SELECT * FROM bronze.{s}"),
            format!("{lake}/bronze/{s}"),
            readers,
            &["natural_key_fingerprint", "ingestion_run_id"],
        ));
        // the documented query of the current versions (docs/guide.md#delta-lake-tables)
        let query = current_query(lake, s);
        out.push(Check {
            name: format!("bronze.{s}_current"),
            sql: format!("SELECT * FROM bronze.{s}_current"),
            as_of: None,
            read: json!({"query": query, "readers": ["duckdb"]}),
            key: vec!["natural_key_fingerprint"],
        });
        // the current versions as a Delta table (deletion vectors: readers that take them; its
        // paths leave its folder, which DuckDB's delta_scan follows only on a file system)
        let dv_readers: Vec<&str> = readers
            .iter()
            .copied()
            .filter(|r| *r != "deltalake_pyarrow" && !(*r == "duckdb" && lake.starts_with("s3://")))
            .collect();
        out.push(Check::table(
            &format!("bronze/{s}/_current"),
            &format!("SELECT * FROM bronze.{s}_current"),
            format!("{lake}/bronze/{s}/_current"),
            &dv_readers,
            &["natural_key_fingerprint"],
        ));
    }
    for t in tables {
        out.push(Check::table(
            &format!("silver.{t}"),
            &format!("SELECT * FROM silver.{t}"),
            format!("{lake}/silver/{t}"),
            readers,
            &["natural_key_fingerprint"],
        ));
    }
    out
}

/// The query docs/guide.md gives for a source's current versions, over the Delta tables.
pub fn current_query(lake: &str, source: &str) -> String {
    format!(
        "WITH runs AS (
           SELECT run_id, commit_seq, previous_natural_key_version FROM {{table:{lake}/audit/ingestion_run_log}}
           WHERE source = '{source}' AND status IN ('succeeded', 'succeeded_with_failures')),
         since AS (SELECT coalesce(max(commit_seq), 0) AS seq FROM runs WHERE previous_natural_key_version IS NOT NULL)
         SELECT b.* FROM {{table:{lake}/bronze/{source}}} b JOIN runs r ON b.ingestion_run_id = r.run_id
         WHERE r.commit_seq >= (SELECT seq FROM since)
         QUALIFY row_number() OVER (PARTITION BY b.natural_key_fingerprint ORDER BY r.commit_seq DESC) = 1
             AND NOT coalesce(b.is_deleted, false)"
    )
}

/// Run the checks: ingot's answer of each (`ingot sql --format parquet`) against every reader's.
/// Returns `{check: {reader: {rows, want_rows, ok, diff}}}`.
pub fn compare(command: &dyn Fn() -> Command, dir: &Path, checks: &[Check], storage: Option<Value>) -> Value {
    let out_dir = dir.join(format!("compare-{}", uuid_like()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut spec = Vec::new();
    for (i, c) in checks.iter().enumerate() {
        let want = out_dir.join(format!("{i}.parquet"));
        let mut cmd = command();
        cmd.arg("sql")
            .arg(&c.sql)
            .args(["--format", "parquet", "--output"])
            .arg(&want);
        if let Some(b) = &c.as_of {
            cmd.args(["--as-of", b]);
        }
        let out = cmd.output().unwrap();
        assert_ok(&out);
        spec.push(json!({"name": c.name, "want": want, "read": c.read, "key": c.key}));
    }
    let spec_file = out_dir.join("spec.json");
    std::fs::write(
        &spec_file,
        json!({"checks": spec, "storage_options": storage}).to_string(),
    )
    .unwrap();
    let out = Command::new(python())
        .arg(repo().join("tests/py/delta_compare.py"))
        .arg(&spec_file)
        .output()
        .unwrap();
    assert_ok(&out);
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

/// Every reader of every check agreed with ingot, and the tables named in `nonempty` had rows.
pub fn assert_agree(result: &Value, nonempty: &[&str], context: &str) {
    let mut bad = Vec::new();
    for (name, readers) in result.as_object().unwrap() {
        for (reader, r) in readers.as_object().unwrap() {
            if r["ok"] != json!(true) {
                bad.push(format!("{name} via {reader}: {}", r["diff"]));
            }
            if nonempty.contains(&name.as_str()) && r["want_rows"].as_u64().unwrap_or(0) == 0 {
                bad.push(format!("{name}: no rows to compare"));
            }
        }
    }
    assert!(bad.is_empty(), "{context}:\n{}", bad.join("\n"));
}

fn events_checks(l: &Events, readers: &[&str]) -> Vec<Check> {
    lake_checks(l.lake().to_str().unwrap(), &["events"], &["events"], readers)
}

fn check_events(l: &Events, readers: &[&str], context: &str) {
    let cmd = || l.command();
    let result = compare(&cmd, l.t.dir.path(), &events_checks(l, readers), None);
    assert_agree(
        &result,
        &[
            "bronze.events",
            "silver.events",
            "audit.ingestion_run_log",
            "bronze.events_current",
            "bronze/events/_current",
        ],
        context,
    );
    // doctor finds nothing wrong with the Delta tables (a silver table older than an undo is
    // another matter, which its next build settles)
    let out = l.ingot(&["doctor"]);
    let report = stdout(&out);
    assert!(
        !report
            .lines()
            .any(|l| l.starts_with("delta") || l.starts_with("files:") || l.starts_with("logs:")),
        "{context}: doctor: {report}"
    );
    let out = l.ingot(&["delta", "status"]);
    assert!(out.status.success(), "{context}: delta status: {}", stdout(&out));
}

/// The first delivery, 60 records (some rejected: val >= 1000 fails the rules' check; some
/// filtered), then a corrected re-delivery of 3 of them plus 5 new ones.
pub fn first_and_corrected(l: &Events) {
    let first: Vec<(usize, i64)> = (0..60).map(|i| (i, ((i * 37) % 1100) as i64 - 5)).collect();
    l.deliver("d1.csv", &first);
    l.ok(&["build", "events"]);
    let mut second = first.clone();
    for i in [3usize, 17, 42] {
        second[i].1 += 1;
    }
    second.extend((60..65).map(|i| (i, i as i64)));
    l.deliver("d2.csv", &second);
}

#[test]
fn every_table_reads_the_same_through_duckdb_and_deltalake_through_a_lakes_life() {
    let l = Events::new(&[]);
    let readers = ["duckdb", "deltalake"];
    // (a) first ingest and build
    first_and_corrected_step_a(&l);
    check_events(&l, &readers, "after the first ingest and build");
    let first_build = l.latest_build();
    // (b) a corrected re-delivery and a delta build: deletion vectors on the old files
    let second: Vec<(usize, i64)> = {
        let mut s: Vec<(usize, i64)> = (0..60).map(|i| (i, ((i * 37) % 1100) as i64 - 5)).collect();
        for i in [3usize, 17, 42] {
            s[i].1 += 1;
        }
        s.extend((60..65).map(|i| (i, i as i64)));
        s
    };
    l.deliver("d2.csv", &second);
    l.ok(&["build", "events"]);
    let b2 = l.latest_build();
    let m = l.manifest(&b2);
    assert_eq!(m["deltas"].as_array().map(Vec::len), Some(1), "a delta build: {m}");
    let published = &m["published"]["files"];
    assert!(
        published
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["dv"]["cardinality"].as_i64().unwrap_or(0) >= 3),
        "the old file has a deletion vector of the 3 corrected rows: {m}"
    );
    check_events(&l, &readers, "after a corrected re-delivery and a delta build");
    // time travel: silver at the Delta version of the first build equals --as-of it
    let version = delta_version_of(&l.lake().join("silver/events"), &first_build);
    let cmd = || l.command();
    let as_of = Check {
        name: "silver.events as of the first build".into(),
        sql: "SELECT * FROM silver.events".into(),
        as_of: Some(first_build.clone()),
        read: json!({"table": l.lake().join("silver/events"), "version": version, "readers": readers}),
        key: vec!["natural_key_fingerprint"],
    };
    let now = Check::table(
        "silver.events now (must differ from the first build)",
        "SELECT * FROM silver.events",
        l.lake().join("silver/events").to_str().unwrap().to_string(),
        &["duckdb"],
        &["natural_key_fingerprint"],
    );
    let mut now_vs_then = now;
    now_vs_then.as_of = Some(first_build.clone());
    let result = compare(&cmd, l.t.dir.path(), &[as_of, now_vs_then], None);
    assert_eq!(
        result["silver.events as of the first build"]["duckdb"]["ok"],
        json!(true),
        "{result}"
    );
    assert_eq!(
        result["silver.events as of the first build"]["deltalake"]["ok"],
        json!(true),
        "{result}"
    );
    assert_eq!(
        result["silver.events now (must differ from the first build)"]["duckdb"]["ok"],
        json!(false),
        "the comparison tells two versions apart: {result}"
    );
    // (c) undo of the re-delivery, and the build after it
    let runs =
        l.t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'events' ORDER BY commit_seq");
    let redelivery = runs.last().unwrap()["run_id"].as_str().unwrap().to_string();
    l.ok(&["undo", &redelivery]);
    check_events(&l, &readers, "after the undo of a run");
    l.ok(&["build", "events"]);
    check_events(&l, &readers, "after the build that follows the undo");
    // an undo of a build: silver is the previous snapshot again
    l.ok(&["undo", &l.latest_build()]);
    check_events(&l, &readers, "after the undo of a build");
    // (d) gc of everything nothing reads any more
    l.ok(&["build", "events", "--full"]);
    l.ok(&["gc", "--grace", "0s", "--retain", "0s"]);
    check_events(&l, &readers, "after gc");
    let log = std::fs::read_to_string(last_commit(&l.lake().join("silver/events"))).unwrap();
    assert!(log.contains("VACUUM END"), "gc says so in the Delta log: {log}");
}

fn first_and_corrected_step_a(l: &Events) {
    let first: Vec<(usize, i64)> = (0..60).map(|i| (i, ((i * 37) % 1100) as i64 - 5)).collect();
    l.deliver("d1.csv", &first);
    l.ok(&["build", "events"]);
}

/// The Delta version whose commit published `build` (its commitInfo names it).
fn delta_version_of(table: &Path, build: &str) -> i64 {
    let mut found = None;
    for e in std::fs::read_dir(table.join("_delta_log")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p).unwrap();
            let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
            if first["commitInfo"]["ingot"]["build_id"] == json!(build) {
                let v: i64 = p.file_stem().unwrap().to_str().unwrap().parse().unwrap();
                found = Some(found.map_or(v, |f: i64| f.min(v)));
            }
        }
    }
    found.unwrap_or_else(|| panic!("no Delta commit of build {build}"))
}

fn last_commit(table: &Path) -> PathBuf {
    let mut commits: Vec<PathBuf> = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    commits.sort();
    commits.pop().unwrap()
}

fn commits(table: &Path) -> usize {
    std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "json"))
        .count()
}

#[test]
fn checkpoints_every_few_versions_read_the_same_and_commits_go_on_after_them() {
    let l = Events::new(&[("INGOT_DELTA_CHECKPOINT_EVERY", "3")]);
    first_and_corrected(&l);
    l.ok(&["build", "events"]);
    for i in 0..4 {
        l.deliver(&format!("more{i}.csv"), &[(300 + i, i as i64)]);
        l.ok(&["build", "events"]);
    }
    for table in ["bronze/events", "silver/events", "audit/ingestion_run_log"] {
        let log = l.lake().join(table).join("_delta_log");
        let checkpoints = std::fs::read_dir(&log)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".checkpoint.")
            })
            .count();
        assert!(checkpoints >= 1, "{table}: {checkpoints} checkpoints");
        assert!(log.join("_last_checkpoint").exists(), "{table}");
    }
    check_events(&l, &["duckdb", "deltalake"], "with checkpoints");
    // a log whose JSON commits before the last checkpoint are gone still reads (readers start
    // at the checkpoint) and takes commits
    let log = l.lake().join("bronze/events/_delta_log");
    let last: Value = serde_json::from_slice(&std::fs::read(log.join("_last_checkpoint")).unwrap()).unwrap();
    let at = last["version"].as_i64().unwrap();
    for v in 0..at {
        std::fs::remove_file(log.join(format!("{v:020}.json"))).unwrap();
    }
    std::fs::remove_dir_all(l.lake().join("_cache/delta")).unwrap();
    l.deliver("after.csv", &[(400, 1)]);
    check_events(
        &l,
        &["duckdb", "deltalake"],
        "after the commits before the checkpoint are gone",
    );
}

#[test]
fn copy_on_write_tables_read_in_readers_without_deletion_vectors() {
    let l = Events::new(&[("INGOT_DELTA", "copy-on-write")]);
    first_and_corrected(&l);
    l.ok(&["build", "events"]);
    let m = l.manifest(&l.latest_build());
    assert_eq!(m["deltas"].as_array().map(Vec::len), Some(1), "a delta build: {m}");
    let files = m["published"]["files"].as_array().unwrap().clone();
    assert!(files.iter().all(|f| f["dv"].is_null()), "no deletion vectors: {m}");
    assert!(
        files.iter().any(|f| f["path"].as_str().unwrap().contains("/cow-")),
        "the touched file was copied without the replaced rows: {m}"
    );
    // deltalake's pyarrow path (what Polars and pandas use) refuses deletion vectors: here it reads
    check_events(&l, &["duckdb", "deltalake", "deltalake_pyarrow"], "copy-on-write");
    let protocol =
        std::fs::read_to_string(l.lake().join("silver/events/_delta_log/00000000000000000000.json")).unwrap();
    assert!(!protocol.contains("deletionVectors"), "{protocol}");
    // gc keeps the copies the current snapshot names
    l.ok(&["gc", "--grace", "0s", "--retain", "0s"]);
    check_events(&l, &["duckdb", "deltalake_pyarrow"], "copy-on-write after gc");
}

#[test]
fn a_crash_between_ingots_commit_and_the_delta_commit_leaves_the_log_behind_and_the_next_command_heals_it() {
    let l = Events::new(&[]);
    first_and_corrected_step_a(&l);
    let before = commits(&l.lake().join("bronze/events"));
    // the second delivery commits in ingot, then the process dies before its Delta commit
    let file = l.t.dir.path().join("landing/crash.csv");
    std::fs::write(
        &file,
        "id,grp,day,val,amount,seen\nx1,g1,2026-11-02,5,1.00,2026-11-01T00:00:00Z\n",
    )
    .unwrap();
    let out = l
        .command()
        .env("INGOT_FAILPOINT", "delta.before_commit")
        .args(["ingest", "events", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the failpoint aborts the process");
    let runs =
        l.t.query("SELECT status FROM audit.ingestion_run_log WHERE file_path LIKE '%crash.csv'");
    assert_eq!(runs.len(), 1, "ingot's commit stands: {runs:?}");
    assert_eq!(
        commits(&l.lake().join("bronze/events")),
        before,
        "the Delta log is behind, never ahead"
    );
    // doctor and delta status say so
    let status = l.ingot(&["delta", "status"]);
    assert!(!status.status.success(), "{}", stdout(&status));
    assert!(stdout(&status).contains("lags"), "{}", stdout(&status));
    let doctor = l.ingot(&["doctor"]);
    assert_ok(&doctor);
    assert!(
        stdout(&doctor).contains("delta behind: bronze/events"),
        "{}",
        stdout(&doctor)
    );
    // the next command of the source brings it up to date in one commit
    l.deliver("d3.csv", &[(100, 7)]);
    check_events(&l, &["duckdb", "deltalake"], "after the crash and the next ingest");
    // a crash after the Delta commit, before its hint: the next commit reads the log, not the hint
    let out = l
        .command()
        .env("INGOT_FAILPOINT", "delta.after_commit")
        .args(["build", "events"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    l.ok(&["delta", "sync"]);
    check_events(&l, &["duckdb", "deltalake"], "after a crash after the Delta commit");
}

#[test]
fn publishing_twice_changes_nothing_and_a_lost_or_lying_hint_is_not_trusted() {
    let l = Events::new(&[]);
    first_and_corrected(&l);
    l.ok(&["build", "events"]);
    let tables = [
        "bronze/events",
        "silver/events",
        "audit/ingestion_run_log",
        "audit/row_failure_log",
    ];
    let count =
        |l: &Events| -> BTreeMap<&str, usize> { tables.iter().map(|t| (*t, commits(&l.lake().join(t)))).collect() };
    let before = count(&l);
    let out = l.ok(&["delta", "sync"]);
    assert!(out.contains("delta sync: 0 table commits"), "{out}");
    assert_eq!(count(&l), before, "a second publish is a no-op");
    // the hints are caches: removed, the next commit reads the whole table
    std::fs::remove_dir_all(l.lake().join("_cache/delta")).unwrap();
    l.deliver("d3.csv", &[(200, 1), (201, 2)]);
    check_events(&l, &["duckdb", "deltalake"], "after the hints were removed");
    // a hint that claims a version the log does not have
    let hint = l.lake().join("_cache/delta/bronze/events.json");
    let mut h: Value = serde_json::from_slice(&std::fs::read(&hint).unwrap()).unwrap();
    h["version"] = json!(h["version"].as_i64().unwrap() + 5);
    std::fs::write(&hint, h.to_string()).unwrap();
    l.deliver("d4.csv", &[(300, 1)]);
    check_events(&l, &["duckdb", "deltalake"], "after a lying hint");
    // a hostile edit: a commit that removes a committed run's file, with no txn; the table is not
    // behind, it differs: a doctor violation, repaired by `ingot delta sync`
    let bronze = l.lake().join("bronze/events");
    let next = commits(&bronze);
    let run =
        l.t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'events' AND rows_inserted > 0 LIMIT 1");
    let run = run[0]["run_id"].as_str().unwrap();
    std::fs::write(
        bronze.join(format!("_delta_log/{next:020}.json")),
        format!(
            "{{\"commitInfo\":{{\"operation\":\"DELETE\"}}}}\n{{\"remove\":{{\"path\":\"run_id={run}/part-00000.parquet\",\"dataChange\":true,\"deletionTimestamp\":1}}}}\n"
        ),
    )
    .unwrap();
    let doctor = l.ingot(&["doctor"]);
    assert!(!doctor.status.success(), "{}", stdout(&doctor));
    assert!(
        stdout(&doctor).contains("missing from the Delta table"),
        "{}",
        stdout(&doctor)
    );
    let out = l.ok(&["delta", "sync"]);
    assert!(out.contains("delta sync: 1 table commit"), "{out}");
    check_events(&l, &["duckdb", "deltalake"], "after a hostile Delta commit and a sync");
    // a hostile file in a Delta log: every command still commits ingot's state and warns,
    // doctor names the file; moved away, the next command publishes what the table lacks
    let junk = bronze.join(format!("_delta_log/{:020}.json", commits(&bronze)));
    std::fs::write(&junk, "this is not a Delta commit\n").unwrap();
    let file = l.t.dir.path().join("landing/junk.csv");
    std::fs::write(
        &file,
        "id,grp,day,val,amount,seen\nj1,g1,2026-11-02,5,1.00,2026-11-01T00:00:00Z\n",
    )
    .unwrap();
    let out = l
        .command()
        .args(["ingest", "events", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(stderr(&out).contains("not a Delta commit"), "{}", stderr(&out));
    let doctor = l.ingot(&["doctor"]);
    assert!(!doctor.status.success(), "{}", stdout(&doctor));
    assert!(
        stdout(&doctor).contains(junk.file_name().unwrap().to_str().unwrap()),
        "{}",
        stdout(&doctor)
    );
    std::fs::remove_file(&junk).unwrap();
    l.deliver("d6.csv", &[(500, 1)]);
    check_events(&l, &["duckdb", "deltalake"], "after a hostile file was moved away");
    // INGOT_DELTA=off: nothing published; the next command with Delta on catches up
    l.ingest_with_delta_off();
    assert!(!l.ingot(&["delta", "status"]).status.success());
    l.deliver("d5.csv", &[(400, 1)]);
    check_events(&l, &["duckdb", "deltalake"], "after commands with Delta off");
}

#[test]
fn the_demo_lake_reads_the_same_through_other_engines() {
    let t = TestLake::new();
    let out = t
        .command()
        .arg("--rules")
        .arg(repo().join("rules"))
        .arg("--landing")
        .arg(repo().join("data/landing"))
        .arg("run")
        .output()
        .unwrap();
    assert!(out.status.success() || out.status.code() == Some(4), "{}", stderr(&out));
    let sources = crate::util::demo_sources();
    let tables = crate::util::demo_tables();
    let s: Vec<&str> = sources.iter().map(String::as_str).collect();
    let ts: Vec<&str> = tables.iter().map(String::as_str).collect();
    let checks = lake_checks(t.lake().to_str().unwrap(), &s, &ts, &["duckdb", "deltalake"]);
    let cmd = || {
        let mut c = t.command();
        c.arg("--rules").arg(repo().join("rules"));
        c
    };
    let result = compare(&cmd, t.dir.path(), &checks, None);
    let mut nonempty: Vec<String> = s.iter().map(|s| format!("bronze.{s}")).collect();
    nonempty.extend(ts.iter().map(|t| format!("silver.{t}")));
    nonempty.push("audit.row_failure_log".into());
    let nonempty: Vec<&str> = nonempty.iter().map(String::as_str).collect();
    assert_agree(&result, &nonempty, "the demo lake");
}

/// The source's own run tables read the same after a contract gains a column (older runs' files
/// lack it: null), after a rekey (the current versions are the rekey run's and later), and after a
/// held run is published behind a later run (it counts from its publish: commit order, not clocks).
#[test]
fn a_contract_that_gains_a_column_a_rekey_and_a_held_run_read_the_same_through_other_engines() {
    let l = Events::new(&[]);
    first_and_corrected_step_a(&l);
    // the contract gains an optional column; the next delivery has it
    let gained = CONTRACT.replace(
        "  - {name: seen, type: timestamp}\n",
        "  - {name: seen, type: timestamp}\n  - {name: channel, type: string}\n",
    );
    std::fs::write(l.t.contracts().join("events.yaml"), &gained).unwrap();
    let file = l.t.dir.path().join("landing/gained.csv");
    std::fs::write(
        &file,
        "id,grp,day,val,amount,seen,channel\ne1,g1,2026-11-02,9,1.00,2026-11-01T00:00:00Z,web\nn1,g2,2026-11-03,4,2.00,2026-11-01T00:00:00Z,phone\n",
    )
    .unwrap();
    l.ok(&["ingest", "events", file.to_str().unwrap()]);
    let schema = std::fs::read_to_string(last_commit(&l.lake().join("bronze/events"))).unwrap();
    assert!(
        schema.contains("metaData") && schema.contains("channel"),
        "the schema follows: {schema}"
    );
    check_events(&l, &["duckdb", "deltalake"], "after a contract gained a column");
    // a new natural key: the rekey run writes every current record again
    let rekeyed = gained.replace(
        "natural_key: {version: 1, fields: [id]}",
        "natural_key: {version: 2, fields: [id, day]}",
    );
    std::fs::write(l.t.contracts().join("events.yaml"), &rekeyed).unwrap();
    l.ok(&["rekey", "events"]);
    l.ok(&["build", "events", "--full"]);
    check_events(&l, &["duckdb", "deltalake"], "after a rekey");
}

#[test]
fn a_held_run_counts_from_its_publish_in_the_delta_tables() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("accounts.yaml"),
        "source: accounts\nversion: 1\nformat: csv\ndelivery: full\nhold:\n  max_delete_fraction: 0.5\nfields:\n  \
         - {name: id, type: int64, required: true}\n  - {name: balance, type: int64}\nnatural_key: {version: 1, fields: [id]}\n",
    )
    .unwrap();
    let dir = t.dir.path().join("landing");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, rows: std::ops::Range<i64>, balance: i64| {
        let mut body = String::from("id,balance\n");
        for i in rows {
            body.push_str(&format!("{i},{}\n", balance + i));
        }
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    assert_ok(&t.ingest("accounts", &write("a.csv", 0..10, 100)));
    // a truncated snapshot: held (exit 4)
    let held = t.ingest("accounts", &write("b.csv", 0..3, 200));
    assert_eq!(held.status.code(), Some(4), "{}", stdout(&held));
    let id = t.query("SELECT run_id FROM audit.ingestion_run_log WHERE status = 'held'");
    let id = id[0]["run_id"].as_str().unwrap().to_string();
    // the held run is published as is: its versions and tombstones count from now
    let out = t.run(&["publish", &id]);
    assert_ok(&out);
    assert_ok(&t.ingest("accounts", &write("c.csv", 0..3, 300)));
    let checks = lake_checks(t.lake().to_str().unwrap(), &["accounts"], &[], &["duckdb", "deltalake"]);
    let cmd = || t.command();
    let result = compare(&cmd, t.dir.path(), &checks, None);
    assert_agree(
        &result,
        &["bronze.accounts", "bronze.accounts_current"],
        "a published held run",
    );
    let out = t.run(&["delta", "status"]);
    assert_ok(&out);
}

/// gc repairs a lagging table (a run committed with Delta off) and, before its Delta commit, the
/// next run of the source commits and publishes: gc's repair, read before that run, must not take
/// the run's files out of the tables again.
#[test]
fn gc_repairing_a_lagging_table_beside_an_ingest_never_drops_what_the_ingest_published() {
    let l = Events::new(&[]);
    first_and_corrected_step_a(&l);
    l.ingest_with_delta_off();
    let marker = l.t.dir.path().join("gc-reached");
    let gc = l
        .command()
        .env("INGOT_FAILPOINT", "delta.before_commit:sleep:2500")
        .env("INGOT_FAILPOINT_MARKER", &marker)
        .args(["gc", "--grace", "0s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::util::wait_for_marker(&marker, "gc's first Delta commit");
    l.deliver("next.csv", &[(700, 3), (701, 4)]);
    let gc = gc.wait_with_output().unwrap();
    assert_ok(&gc);
    check_events(&l, &["duckdb", "deltalake"], "after gc's repair beside an ingest");
}

/// A lake made without Delta publishing (as before it existed): ingests, a delta build with
/// layers, an undo; `ingot delta sync` publishes every table, the layered snapshot with deletion
/// vectors kept in the log (nothing is written into the committed builds' folders), and the
/// next commands go on from there.
#[test]
fn a_lake_made_without_delta_is_published_whole_by_delta_sync() {
    let mut l = Events::new(&[("INGOT_DELTA", "off")]);
    first_and_corrected(&l);
    l.ok(&["build", "events"]);
    let m = l.manifest(&l.latest_build());
    assert_eq!(m["deltas"].as_array().map(Vec::len), Some(1), "a delta build: {m}");
    assert!(m["published"].is_null(), "made without Delta: {m}");
    assert!(!l.lake().join("bronze/events/_delta_log").exists());
    let before: Vec<PathBuf> = crate::util::files_under(&l.lake().join("silver"));
    // from here on, Delta publishing as by default
    l.t.envs.retain(|(k, _)| k != "INGOT_DELTA");
    let out = l.ingot(&["delta", "sync"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("silver/events"), "{}", stdout(&out));
    let mut after: Vec<PathBuf> = crate::util::files_under(&l.lake().join("silver"));
    after.retain(|p| !p.to_string_lossy().contains("_delta_log"));
    let (mut a, mut b) = (after.clone(), before.clone());
    a.sort();
    b.sort();
    assert_eq!(a, b, "no file written outside the Delta logs");
    let log = std::fs::read_to_string(last_commit(&l.lake().join("silver/events"))).unwrap();
    assert!(log.contains("\"storageType\":\"i\""), "inline deletion vectors: {log}");
    check_events(&l, &["duckdb", "deltalake"], "a lake published by delta sync");
    l.deliver("d3.csv", &[(90, 1)]);
    l.ok(&["build", "events"]);
    check_events(&l, &["duckdb", "deltalake"], "the next ingest and build after it");
}

/// Ingests of two sources at once commit to the shared audit tables at once: each takes the next
/// free version (the loser of a put reads the winner's commit and goes on); nothing is lost or
/// published twice.
#[test]
fn ingests_of_two_sources_at_once_share_the_audit_tables_without_losing_a_commit() {
    let l = Events::new(&[]);
    std::fs::write(
        l.t.contracts().join("others.yaml"),
        CONTRACT.replace("source: events", "source: others"),
    )
    .unwrap();
    let dir = l.t.dir.path().join("landing");
    std::fs::create_dir_all(&dir).unwrap();
    for round in 0..6 {
        let mut children = Vec::new();
        for source in ["events", "others"] {
            let file = dir.join(format!("{source}-{round}.csv"));
            std::fs::write(
                &file,
                format!(
                    "id,grp,day,val,amount,seen\n{source}{round},g1,2026-11-02,{round},1.00,2026-11-01T00:00:00Z\nbad{round},g1,not-a-date,1,1.00,2026-11-01T00:00:00Z\n"
                ),
            )
            .unwrap();
            children.push(
                l.command()
                    .args(["ingest", source, file.to_str().unwrap()])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        }
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert_ok(&out);
            assert!(!stderr(&out).contains("warning: delta"), "{}", stderr(&out));
        }
    }
    let checks = lake_checks(
        l.lake().to_str().unwrap(),
        &["events", "others"],
        &[],
        &["duckdb", "deltalake"],
    );
    let cmd = || l.command();
    let result = compare(&cmd, l.t.dir.path(), &checks, None);
    assert_agree(
        &result,
        &[
            "audit.ingestion_run_log",
            "audit.row_failure_log",
            "bronze.events",
            "bronze.others",
        ],
        "two sources at once",
    );
    let out = l.ingot(&["delta", "status"]);
    assert_ok(&out);
    // 12 runs, each one commit in the shared run log (after the table's creation)
    assert_eq!(commits(&l.lake().join("audit/ingestion_run_log")), 12);
}

/// Power lost while the first commit of a table was being written leaves only its staging file
/// (`00000000000000000000.json#<n>`, maybe torn) in `_delta_log`: that is no table yet, not an
/// unreadable one; the next command creates the table and readers never see the leftover.
#[test]
fn a_torn_first_commit_left_in_delta_log_is_no_table_and_the_next_command_creates_it() {
    let l = Events::new(&[]);
    l.deliver("d1.csv", &[(0, 1), (1, 2)]);
    let log = l.lake().join("silver/events/_delta_log");
    assert!(!log.exists(), "no build yet");
    std::fs::create_dir_all(&log).unwrap();
    std::fs::write(log.join("00000000000000000000.json#1"), "{\"commitInfo\":{\"ti").unwrap();
    let doctor = l.ingot(&["doctor"]);
    assert_ok(&doctor);
    assert!(!stdout(&doctor).contains("unreadable"), "{}", stdout(&doctor));
    l.ok(&["build", "events"]);
    assert!(log.join("00000000000000000000.json").exists(), "the table was created");
    check_events(&l, &["duckdb", "deltalake"], "after a torn first commit");
    let doctor = l.ingot(&["doctor"]);
    assert_ok(&doctor);
    assert!(!stdout(&doctor).contains("delta"), "{}", stdout(&doctor));
}

/// Lines of `ingot doctor` that start with `prefix`.
fn doctor_lines(l: &Events, prefix: &str) -> Vec<String> {
    // (its exit status is not the point: a silver table older than an undo is a violation)
    let out = l.ingot(&["doctor"]);
    stdout(&out)
        .lines()
        .filter(|x| x.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// The paths a bronze commit of `events` adds and removes.
fn adds_and_removes(commit: &Path) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(commit).unwrap();
    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(p) = v["add"]["path"].as_str() {
            adds.push(p.to_string());
        }
        if let Some(p) = v["remove"]["path"].as_str() {
            removes.push(p.to_string());
        }
    }
    (adds, removes)
}

/// The events contract with `grp` renamed to `group_name`, `amount` widened to decimal(12,2),
/// `seen` retyped to string (older values cast) and a field added, written over the old one.
pub fn change_contract(l: &Events) -> String {
    let changed = CONTRACT
        .replace(
            "  - {name: grp, type: string}\n",
            "  - {name: group_name, type: string, renamed_from: grp}\n",
        )
        .replace("type: 'decimal(10,2)'", "type: 'decimal(12,2)'")
        .replace(
            "  - {name: seen, type: timestamp}\n",
            "  - {name: seen, type: string, older_values: cast}\n  - {name: channel, type: string}\n",
        );
    std::fs::write(l.t.contracts().join("events.yaml"), &changed).unwrap();
    changed
}

/// Ingest a file of the contract [`change_contract`] writes (one new record, one changed).
pub fn deliver_under_changed_contract(l: &Events) {
    let file = l.t.dir.path().join("landing/renamed.csv");
    std::fs::write(
        &file,
        "id,group_name,day,val,amount,seen,channel\nr1,g9,2026-11-05,3,1.50,late morning,web\ne1,g8,2026-11-06,4,2.50,noon,phone\n",
    )
    .unwrap();
    l.ok(&["ingest", "events", file.to_str().unwrap()]);
}

/// A field renamed (`renamed_from`), widened, or retyped with `older_values: cast` since older runs
/// were written: ingot reads those runs under the new contract, and a Delta reader reads files by
/// column name, so bronze's Delta table publishes them as conformed copies (their rows as ingot
/// reads them). DuckDB and deltalake read the same as `ingot sql` after the change, an undo of a
/// copied run and gc; a crash while writing copies leaves the table behind, and the next command
/// publishes it whole; gc removes the copies of an earlier contract.
#[test]
fn runs_from_before_a_rename_a_widening_or_a_cast_read_the_same_through_other_engines() {
    let l = Events::new(&[]);
    let readers = ["duckdb", "deltalake"];
    let bronze = l.lake().join("bronze/events");
    first_and_corrected_step_a(&l);
    l.deliver("d2.csv", &[(70, 5), (71, 6)]);
    let runs = |l: &Events| -> Vec<String> {
        l.t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'events' ORDER BY commit_seq")
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let (r1, r2) = (runs(&l)[0].clone(), runs(&l)[1].clone());
    assert_eq!(doctor_lines(&l, "delta"), Vec::<String>::new());
    let changed = change_contract(&l);
    let behind = doctor_lines(&l, "delta behind: bronze/events:");
    assert_eq!(behind.len(), 1, "{behind:#?}");
    assert!(
        behind[0].contains("published conformed to another contract") && behind[0].contains("events.yaml"),
        "{behind:#?}"
    );
    // the next run of the source publishes the table under the new contract, in one commit
    deliver_under_changed_contract(&l);
    let r3 = runs(&l)[2].clone();
    check_events(&l, &readers, "after a rename, a widening and a cast");
    let commit = last_commit(&bronze);
    let (adds, removes) = adds_and_removes(&commit);
    let copies: Vec<&String> = adds.iter().filter(|p| p.starts_with("_conformed/")).collect();
    assert_eq!(copies.len(), 2, "the two older runs are published as copies: {adds:?}");
    assert!(copies.iter().any(|p| p.contains(&r1)) && copies.iter().any(|p| p.contains(&r2)));
    assert!(adds.contains(&format!("run_id={r3}/part-00000.parquet")), "{adds:?}");
    assert!(
        removes.contains(&format!("run_id={r1}/part-00000.parquet"))
            && removes.contains(&format!("run_id={r2}/part-00000.parquet")),
        "{removes:?}"
    );
    let text = std::fs::read_to_string(&commit).unwrap();
    assert!(text.contains("metaData") && text.contains("group_name"), "{text}");
    // the runs' own files are untouched: ingot still reads them
    assert!(bronze.join(format!("run_id={r1}/part-00000.parquet")).exists());
    let key = copies[0].split('/').nth(1).unwrap().to_string();
    // an undo of a copied run removes its copy from the table
    l.ok(&["undo", &r1]);
    let (_, removes) = adds_and_removes(&last_commit(&bronze));
    assert_eq!(
        removes,
        vec![format!("_conformed/{key}/run_id={r1}/part-00000.parquet")],
        "the undo removes the copy"
    );
    check_events(&l, &readers, "after the undo of a copied run");
    let out = l.ok(&["gc", "--grace", "0s"]);
    assert!(
        !bronze
            .join(format!("_conformed/{key}/run_id={r1}/part-00000.parquet"))
            .exists()
            && !bronze.join(format!("run_id={r1}/part-00000.parquet")).exists(),
        "gc removes the undone run's file and copy: {out}"
    );
    assert!(
        bronze
            .join(format!("_conformed/{key}/run_id={r2}/part-00000.parquet"))
            .exists()
    );
    check_events(&l, &readers, "after gc");
    // the contract changes again: a crash while the copies are written leaves the table behind
    let again = changed.replace(
        "  - {name: channel, type: string}\n",
        "  - {name: channel, type: string}\n  - {name: note, type: string}\n",
    );
    std::fs::write(l.t.contracts().join("events.yaml"), &again).unwrap();
    let crashed = l
        .command()
        .env("INGOT_FAILPOINT", "delta.conform")
        .args(["delta", "sync"])
        .output()
        .unwrap();
    assert!(!crashed.status.success(), "{}", stderr(&crashed));
    assert!(
        stderr(&crashed).contains("failpoint delta.conform reached"),
        "{}",
        stderr(&crashed)
    );
    assert_eq!(doctor_lines(&l, "delta behind: bronze/events:").len(), 1);
    l.ok(&["delta", "sync"]);
    let (adds, _) = adds_and_removes(&last_commit(&bronze));
    assert!(
        adds.iter()
            .any(|p| p.starts_with("_conformed/") && !p.contains(&key) && p.contains(&r2)),
        "{adds:?}"
    );
    check_events(
        &l,
        &readers,
        "after a second contract change and a crash while publishing it",
    );
    // the copies of the earlier contract are no table's any more
    let out = l.ok(&["gc", "--grace", "0s"]);
    assert!(out.contains("conformed copy of an earlier contract"), "{out}");
    assert!(
        !bronze
            .join(format!("_conformed/{key}/run_id={r2}/part-00000.parquet"))
            .exists(),
        "{out}"
    );
    check_events(&l, &readers, "after gc of the earlier contract's copies");
}

/// The `natural_key_fingerprint`s of a silver file's rows in file order, as the 32 hex digits of
/// their 16-byte keys.
fn file_keys(path: &Path) -> Vec<Option<String>> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::parquet::arrow::ProjectionMask;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let b = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let at = b.schema().index_of("natural_key_fingerprint").unwrap();
    let mask = ProjectionMask::roots(b.parquet_schema(), [at]);
    let mut out = Vec::new();
    for batch in b.with_projection(mask).build().unwrap() {
        let batch = batch.unwrap();
        let a = batch.column(0).as_string::<i32>();
        out.extend((0..a.len()).map(|i| a.is_valid(i).then(|| a.value(i)[..32].to_string())));
    }
    out
}

/// A key index: its keys in order (hex) and its footer's key-value pairs.
fn index_of(path: &Path) -> (Vec<Option<String>>, BTreeMap<String, String>) {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let b = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let footer: BTreeMap<String, String> = b
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .into_iter()
        .flatten()
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect();
    let mut keys = Vec::new();
    for batch in b.build().unwrap() {
        let batch = batch.unwrap();
        let a = batch.column(0).as_fixed_size_binary();
        keys.extend((0..a.len()).map(|i| {
            a.is_valid(i)
                .then(|| a.value(i).iter().map(|b| format!("{b:02x}")).collect::<String>())
        }));
    }
    (keys, footer)
}

/// Rewrite the key index at `path` with its rows in reverse order and its footer unchanged: the
/// same keys, the same length and the same file named, every position but the middle one wrong.
fn reverse_index(path: &Path) {
    use datafusion::arrow::array::{RecordBatch, UInt32Array};
    use datafusion::arrow::compute::{concat_batches, take_record_batch};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use datafusion::parquet::file::metadata::KeyValue;
    use datafusion::parquet::file::properties::WriterProperties;
    let b = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let schema = b.schema().clone();
    let footer: Vec<KeyValue> = b.metadata().file_metadata().key_value_metadata().unwrap().clone();
    let batches: Vec<RecordBatch> = b.build().unwrap().map(|b| b.unwrap()).collect();
    let all = concat_batches(&schema, &batches).unwrap();
    let n = all.num_rows() as u32;
    let reversed = take_record_batch(&all, &UInt32Array::from_iter_values((0..n).rev())).unwrap();
    let props = WriterProperties::builder().set_key_value_metadata(Some(footer)).build();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&reversed).unwrap();
    w.close().unwrap();
}

/// Every published file of `build` that names a key index: (file, index), lake-relative.
fn indexed_files(l: &Events, build: &str) -> Vec<(String, String)> {
    let m = l.manifest(build);
    m["published"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| Some((f["path"].as_str()?.to_string(), f["keys"].as_str()?.to_string())))
        .collect()
}

/// Every key index of `build`'s published files holds its file's keys row for row, and its
/// footer names that file.
fn assert_indexes_match(l: &Events, build: &str, context: &str) {
    let lake = l.lake();
    let files = indexed_files(l, build);
    assert!(!files.is_empty(), "{context}: no key indexes: {}", l.manifest(build));
    for (file, index) in files {
        let (keys, footer) = index_of(&lake.join(&index));
        assert_eq!(keys, file_keys(&lake.join(&file)), "{context}: {index} against {file}");
        assert_eq!(footer.get("ingot.keys_of"), Some(&file), "{context}: {index}");
        assert_eq!(
            footer.get("ingot.keys_digest").map(String::len),
            Some(32),
            "{context}: {index}"
        );
    }
}

/// `rows` with the value of each id in `ids` raised by one.
fn corrected(rows: &[(usize, i64)], ids: &[usize]) -> Vec<(usize, i64)> {
    rows.iter()
        .map(|&(id, v)| (id, if ids.contains(&id) { v + 1 } else { v }))
        .collect()
}

#[test]
fn delta_builds_find_the_rows_they_delete_through_key_indexes_and_a_damaged_index_costs_only_time() {
    let l = Events::new(&[]);
    let readers = ["duckdb", "deltalake"];
    let first: Vec<(usize, i64)> = (0..60).map(|i| (i, ((i * 37) % 1100) as i64 - 5)).collect();
    l.deliver("d1.csv", &first);
    l.ok(&["build", "events"]);
    let b1 = l.latest_build();
    assert_indexes_match(&l, &b1, "a full build");
    // a corrected re-delivery: a delta build's deletion vectors found through the indexes
    let mut rows = corrected(&first, &[3, 17, 42]);
    rows.extend((60..65).map(|i| (i, i as i64)));
    l.deliver("d2.csv", &rows);
    l.ok(&["build", "events"]);
    let b2 = l.latest_build();
    assert_indexes_match(&l, &b2, "a delta build");
    check_events(&l, &readers, "a delta build through the key indexes");
    // an index of the first build's file with its rows reversed (same keys, same length, same
    // footer): its digest gives it away, the positions come from the file's fingerprints, and
    // the next build no longer names it
    let (file1, index1) = indexed_files(&l, &b2)
        .into_iter()
        .find(|(f, _)| f.contains(&b1))
        .expect("the first build's file is still published");
    reverse_index(&l.lake().join(&index1));
    let rows = corrected(&rows, &[5, 20, 33, 59]);
    l.deliver("d3.csv", &rows);
    l.ok(&["build", "events"]);
    let b3 = l.latest_build();
    check_events(&l, &readers, "a delta build beside a reversed key index");
    let named = indexed_files(&l, &b3);
    assert!(
        !named.iter().any(|(f, _)| f == &file1),
        "the reversed index is dropped: {named:?}"
    );
    assert!(named.iter().any(|(f, _)| f.contains(&b2)), "the others stay: {named:?}");
    // a missing index and one cut short
    let (_, index2) = named.iter().find(|(f, _)| f.contains(&b2)).unwrap().clone();
    std::fs::remove_file(l.lake().join(&index2)).unwrap();
    let (_, index3) = named.iter().find(|(f, _)| f.contains(&b3)).unwrap().clone();
    let bytes = std::fs::read(l.lake().join(&index3)).unwrap();
    std::fs::write(l.lake().join(&index3), &bytes[..bytes.len() / 2]).unwrap();
    let rows = corrected(&rows, &[8, 33, 61]);
    l.deliver("d4.csv", &rows);
    l.ok(&["build", "events"]);
    let b4 = l.latest_build();
    check_events(&l, &readers, "a delta build beside a missing and a truncated key index");
    assert_indexes_match(&l, &b4, "after the damaged indexes were dropped");
    // gc keeps exactly the indexes the current snapshot names
    l.ok(&["gc", "--grace", "0s", "--retain", "0s"]);
    check_events(&l, &readers, "after gc");
    let lake = l.lake();
    let mut left: Vec<String> = crate::util::files_under(&lake.join("silver/events"))
        .into_iter()
        .map(|p| p.strip_prefix(&lake).unwrap().to_str().unwrap().to_string())
        .filter(|p| p.ends_with(".keys.parquet"))
        .collect();
    left.sort();
    let mut want: Vec<String> = indexed_files(&l, &b4).into_iter().map(|(_, i)| i).collect();
    want.sort();
    assert_eq!(left, want, "the key indexes gc left");
}
