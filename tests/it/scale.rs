//! History caches (log checkpoints and key states): they change the cost of a command, never its
//! answer. Two lakes driven through the same story, one writing its caches as often as possible
//! and one never, must agree on every table; damaged caches are passed over and reported by
//! `ingot doctor`; a crash while writing one, then the same command again, gives one clean run;
//! and a command makes as many object-store operations after a long history as after a short one.

use std::path::{Path, PathBuf};

use crate::util::{LakeSnapshot, TestLake, assert_ok, files_under, landing, normalize_rows, stderr, stdout};

const SOURCES: &[&str] = &["bookings", "hotels", "web_sessions"];

/// A lake whose caches are written at the given cadence (log checkpoint, key state).
fn lake_with(checkpoint_every: u64, key_state_every: u64) -> TestLake {
    let mut t = TestLake::new();
    t.envs
        .push(("INGOT_CHECKPOINT_EVERY".into(), checkpoint_every.to_string()));
    t.envs
        .push(("INGOT_KEY_STATE_EVERY".into(), key_state_every.to_string()));
    t
}

fn tiny() -> TestLake {
    lake_with(2, 1)
}

fn never() -> TestLake {
    lake_with(1_000_000, 1_000_000)
}

fn ok(t: &TestLake, args: &[&str]) -> String {
    let out = t.run(args);
    assert_ok(&out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ingest(t: &TestLake, source: &str, file: &Path) {
    assert_ok(&t.ingest(source, file));
}

/// The run id of the latest run of `source` whose file name ends with `suffix`.
fn run_of(t: &TestLake, source: &str, suffix: &str) -> String {
    let rows = t.query(&format!(
        "SELECT run_id FROM audit.ingestion_run_log WHERE source = '{source}' AND file_path LIKE '%{suffix}' \
         AND status = 'succeeded' ORDER BY started_at DESC LIMIT 1"
    ));
    rows[0]["run_id"].as_str().unwrap().to_string()
}

/// A corrected re-delivery of 2026-11-04: one amount changed, one booking added.
fn correction(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(landing("bookings/2026-11-04_bookings_corrected.csv")).unwrap();
    let text = text.replacen(",824.52,", ",825.52,", 1)
        + "BK199999,MAD01,new.guest@example.org,web,confirmed,2026-12-01,2026-12-03,2,300.00,EUR,,2026-11-05T03:30:00Z\n";
    let path = dir.join("2026-11-05_bookings.csv");
    std::fs::write(&path, text).unwrap();
    path
}

/// Ingests, a re-sent file, undo of a run and its re-ingest, builds and an undone build.
fn story(t: &TestLake) {
    for f in [
        "bookings/2026-11-01_bookings.csv",
        "bookings/2026-11-02_bookings_resend.csv",
        "bookings/2026-11-03_bookings.csv",
        "hotels/2026-11-01_hotels.csv",
        "bookings/2026-11-04_bookings_corrected.csv",
        "hotels/2026-11-03_hotels.csv",
        "web_sessions/2026-10-26_web_sessions.ndjson",
        "web_sessions/2026-11-02_web_sessions.ndjson",
    ] {
        let source = f.split('/').next().unwrap();
        ingest(t, source, &landing(f));
    }
    ok(t, &["build", "bookings"]);
    let third = run_of(t, "bookings", "2026-11-03_bookings.csv");
    ok(t, &["undo", &third]);
    ingest(t, "bookings", &landing("bookings/2026-11-03_bookings.csv"));
    ok(t, &["build", "bookings"]);
    let last = t.query("SELECT build_id FROM audit.silver_build_log ORDER BY started_at DESC LIMIT 1");
    ok(t, &["undo", last[0]["build_id"].as_str().unwrap()]);
    ok(t, &["build", "bookings"]);
}

/// Every table the story touches, ids and clocks normalized.
fn everything(t: &TestLake) -> LakeSnapshot {
    let mut s = t.snapshot(SOURCES);
    let names = crate::util::id_names(t);
    for (name, sql) in [
        (
            // silver rejections name their build: normalized with the build ids too
            "audit.row_failure_log",
            "SELECT * FROM audit.row_failure_log ORDER BY source, failed_at, source_row_number, rule",
        ),
        (
            "audit.silver_build_log",
            "SELECT * FROM audit.silver_build_log ORDER BY started_at, build_id",
        ),
        (
            "silver.bookings",
            "SELECT * FROM silver.bookings ORDER BY natural_key_fingerprint",
        ),
    ] {
        s.tables.insert(name.to_string(), normalize_rows(t.query(sql), &names));
    }
    s
}

/// The checkpoint and key-state files under `rel` (a log folder's `tail` hint is no checkpoint: it
/// is written at every commit, whatever the cadence).
fn cache_files(t: &TestLake, rel: &str) -> Vec<PathBuf> {
    let dir = t.lake().join(rel);
    let mut files = if dir.exists() { files_under(&dir) } else { Vec::new() };
    files.retain(|f| f.file_name().is_some_and(|n| n != "tail"));
    files
}

#[test]
fn checkpoints_and_key_states_change_no_answer() {
    let cached = tiny();
    let plain = never();
    story(&cached);
    story(&plain);
    everything(&cached).assert_same(&everything(&plain), "caches at every commit vs none");
    for rel in [
        "_cache/log/ingestion_run_log/bookings",
        "_cache/log/silver_build_log/bookings",
        "_cache/keys/bookings",
    ] {
        assert!(!cache_files(&cached, rel).is_empty(), "{rel}: no cache was written");
        assert!(
            cache_files(&plain, rel).is_empty(),
            "{rel}: written against the cadence"
        );
    }
    let doctor = cached.run(&["doctor"]);
    assert_ok(&doctor);

    // a hostile day: the newest run-log checkpoint truncated, every key state overwritten
    let checkpoints = cache_files(&cached, "_cache/log/ingestion_run_log/bookings");
    let newest = checkpoints.iter().max().unwrap();
    let bytes = std::fs::read(newest).unwrap();
    std::fs::write(newest, &bytes[..bytes.len() / 2]).unwrap();
    let states = cache_files(&cached, "_cache/keys/bookings");
    for s in &states {
        std::fs::write(s, b"PAR1 not a parquet file PAR1").unwrap();
    }
    let report = cached.run(&["doctor"]);
    assert_eq!(report.status.code(), Some(1), "{}", stderr(&report));
    let text = String::from_utf8_lossy(&report.stdout).to_string() + &stderr(&report);
    let newest_rel = newest.strip_prefix(cached.lake()).unwrap().display().to_string();
    assert!(text.contains(&format!("caches: {newest_rel}")), "{text}");
    assert!(text.contains("caches: _cache/keys/bookings/"), "{text}");
    everything(&cached).assert_same(&everything(&plain), "damaged caches are passed over");

    // the next delivery reads every run instead of the broken state, and says so
    let dir = tempfile::tempdir().unwrap();
    let file = correction(dir.path());
    let out = cached.ingest("bookings", &file);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("the key state is passed over"),
        "{}",
        stderr(&out)
    );
    ingest(&plain, "bookings", &file);
    ok(&cached, &["build", "bookings"]);
    ok(&plain, &["build", "bookings"]);
    everything(&cached).assert_same(&everything(&plain), "after a delivery past damaged caches");
}

/// The current view read through a run-log checkpoint (its rows name the slots of the runs it
/// covers) answers like one read from every record: across a rekey (the runs before it are in the
/// checkpoint and no longer current), an undo of a checkpointed run and deliveries after it, with
/// segments holding runs that are no longer current.
#[test]
fn the_current_view_through_a_checkpoint_equals_one_without_across_a_rekey_and_an_undo() {
    use crate::deletions::{contract, file, lake_with as customers, set_contract};
    let story = |t: &TestLake| {
        let days = [
            ("mon.csv", &["EU,c1,Ann,10", "EU,c2,Bob,20", "US,c3,Dee,40"][..]),
            ("tue.csv", &["EU,c2,Bob,21", "US,c3,Dee,40", "EU,c5,Fay,60"][..]),
            ("wed.csv", &["EU,c2,Bob,22", "US,c6,Gus,70"][..]),
        ];
        for (name, rows) in days {
            ingest(t, "customers", &file(t, name, rows));
        }
        set_contract(t, &contract("incremental", 2, "customer_id"));
        ok(t, &["rekey", "customers"]);
        ingest(t, "customers", &file(t, "thu.csv", &["EU,c2,Bob,23", "EU,c7,Hal,80"]));
        let thu = run_of(t, "customers", "thu.csv");
        ingest(t, "customers", &file(t, "fri.csv", &["US,c3,Dee,41"]));
        // segments now hold the runs from before the rekey and the run undone next
        ok(t, &["compact", "--all"]);
        ok(t, &["undo", &thu]);
    };
    let cached = customers(tiny(), "incremental");
    let plain = customers(never(), "incremental");
    story(&cached);
    story(&plain);
    assert!(!cache_files(&cached, "_cache/log/ingestion_run_log/customers").is_empty());
    let current = cached.query("SELECT customer_id, credit FROM bronze.customers_current ORDER BY customer_id");
    assert_eq!(current.len(), 5, "{current:?}");
    // the undo's record comes after the checkpoint, which still holds the run as loaded
    cached
        .snapshot(&["customers"])
        .assert_same(&plain.snapshot(&["customers"]), "through checkpoints vs every record");
    for t in [&cached, &plain] {
        ingest(t, "customers", &file(t, "sat.csv", &["EU,c8,Ivy,90"]));
    }
    cached
        .snapshot(&["customers"])
        .assert_same(&plain.snapshot(&["customers"]), "after a delivery past the undo");
}

/// `bronze.<source>_current` groups a fingerprint's versions by the key fields every version
/// holds the same value of, so that a filter on them reaches both sides of the view. A key field
/// with `normalize` steps is not one of them (bronze keeps each spelling), a tombstone carries
/// its key, and a contract edited since the runs were loaded turns the grouping off: in every
/// case the filtered view must be the view filtered.
#[test]
fn a_filter_on_the_natural_key_finds_the_latest_version_whatever_its_spelling() {
    use crate::deletions::{contract, file, lake_with as customers, set_contract};
    let explain = |t: &TestLake, sql: &str| ok(t, &["sql", &format!("EXPLAIN {sql}"), "--format", "csv"]);
    let rows = |t: &TestLake, sql: &str| {
        let mut out: Vec<String> = t.query(sql).iter().map(|r| format!("{r:?}")).collect();
        out.sort();
        out
    };
    // a trimmed key: " c1 " then "c1" then " c1" are one record, each spelling kept as it came
    let t = customers(TestLake::new(), "full");
    set_contract(&t, &contract("full", 1, "customer_id"));
    let days = [
        ("mon.csv", &["EU,c1,Ann,10", "EU,c2,Bob,20"][..]),
        ("tue.csv", &["EU, c1 ,Ann,11", "EU,c2,Bob,20"][..]),
        ("wed.csv", &["EU, c1,Ann,12"][..]),
    ];
    for (name, day) in days {
        ingest(&t, "customers", &file(&t, name, day));
    }
    let whole = "SELECT customer_id, credit, is_deleted FROM bronze.customers_current";
    assert_eq!(rows(&t, whole).len(), 1, "c2 is deleted by wednesday's full delivery");
    for spelling in ["c1", " c1 ", " c1", "c2"] {
        let filtered = format!("{whole} WHERE customer_id = '{spelling}'");
        let want: Vec<String> = rows(&t, whole)
            .into_iter()
            .filter(|r| r.contains(&format!("String(\"{spelling}\")")))
            .collect();
        assert_eq!(rows(&t, &filtered), want, "{filtered}");
    }
    assert!(!explain(&t, &format!("{whole} WHERE customer_id = 'c1'")).contains("__ingot_latest_k"));

    // a plain key (no normalize steps): the filter reaches both sides, and a tombstone still wins
    let plain = contract("full", 1, "name").replace(
        "  - name: name\n    type: string\n",
        "  - name: name\n    type: string\n    required: true\n",
    );
    let t = customers(TestLake::new(), "full");
    set_contract(&t, &plain);
    ingest(&t, "customers", &file(&t, "mon.csv", &["EU,c1,Ann,10", "EU,c2,Bob,20"]));
    ingest(&t, "customers", &file(&t, "tue.csv", &["EU,c1,Ann,11", "EU,c2,Bob,21"]));
    ingest(&t, "customers", &file(&t, "wed.csv", &["EU,c1,Ann,12"]));
    let whole = "SELECT name, credit FROM bronze.customers_current";
    let point = format!("{whole} WHERE name = 'Ann'");
    assert!(explain(&t, &point).contains("__ingot_latest_k0"), "the key rides along");
    assert_eq!(
        rows(&t, &point),
        rows(
            &t,
            "SELECT name, credit FROM bronze.customers_current WHERE credit = 12"
        )
    );
    assert_eq!(rows(&t, &point).len(), 1);
    assert!(
        rows(&t, &format!("{whole} WHERE name = 'Bob'")).is_empty(),
        "Bob's tombstone is his latest version"
    );
    let versions = rows(
        &t,
        "SELECT name FROM bronze.customers WHERE name = 'Bob' AND is_deleted",
    );
    assert_eq!(versions.len(), 1, "the tombstone carries the key: {versions:?}");

    // the key field renamed in the contract: the runs recorded the old name, so nothing is
    // grouped by the key and the answer stays the same
    set_contract(
        &t,
        &plain
            .replace("  - name: name\n", "  - name: full_name\n    renamed_from: name\n")
            .replace("fields: [name]", "fields: [full_name]"),
    );
    let renamed = "SELECT full_name AS name, credit FROM bronze.customers_current WHERE full_name = 'Ann'";
    assert!(!explain(&t, renamed).contains("__ingot_latest_k"));
    assert_eq!(
        rows(&t, renamed),
        rows(
            &t,
            "SELECT name, credit FROM (SELECT full_name AS name, credit FROM bronze.customers_current) WHERE credit = 12"
        )
    );
    assert_eq!(rows(&t, renamed).len(), 1);
}

#[test]
fn a_checkpoint_that_differs_from_its_records_is_reported() {
    let t = tiny();
    for f in ["bookings/2026-11-01_bookings.csv", "bookings/2026-11-03_bookings.csv"] {
        ingest(&t, "bookings", &landing(f));
    }
    assert!(!cache_files(&t, "_cache/log/ingestion_run_log/bookings").is_empty());
    // an earlier record edited in place (its slot now holds the next record's copy): the
    // checkpoint still names slot 2 as it was, but no longer summarizes slot 1
    let log = t.lake().join("audit/ingestion_run_log/bookings");
    std::fs::copy(log.join("0000000002.parquet"), log.join("0000000001.parquet")).unwrap();
    let report = t.run(&["doctor"]);
    let text = String::from_utf8_lossy(&report.stdout).to_string() + &stderr(&report);
    assert!(
        text.contains("caches: _cache/log/ingestion_run_log/bookings/0000000002.parquet")
            && text.contains("differs from the records through slot 2"),
        "{text}"
    );
}

#[test]
fn a_crash_at_every_cache_failpoint_then_rerun_equals_one_clean_run() {
    let seed = landing("bookings/2026-11-01_bookings.csv");
    let file = landing("bookings/2026-11-04_bookings_corrected.csv");
    let clean = |skip_after: bool| {
        let t = never();
        ingest(&t, "bookings", &seed);
        ingest(&t, "bookings", &file);
        if skip_after {
            ingest(&t, "bookings", &file);
        }
        t.snapshot(&["bookings"])
    };
    let (once, then_skip) = (clean(false), clean(true));
    for point in ingot::table::failpoint::CACHE {
        let t = tiny();
        ingest(&t, "bookings", &seed);
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .args(["ingest", "bookings"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: never reached: {}",
            stderr(&out)
        );
        assert!(!out.status.success(), "{point}: the process should have crashed");
        // a log checkpoint is written after the commit it follows; a key state before the pass
        let committed = point.starts_with("log.");
        assert_ok(&t.ingest("bookings", &file));
        let want = if committed { &then_skip } else { &once };
        t.snapshot(&["bookings"])
            .assert_same(want, &format!("{point}: crash + re-run"));
        assert_ok(&t.run(&["doctor"]));
    }
}

/// The operations line `INGOT_STORE_STATS=1` makes `ingot` print.
/// The store operations of one command, Delta publishing off: these tests hold ingot's own reads
/// and writes flat; the Delta logs' are bounded by their hints and checkpoints (tests/it/delta.rs).
fn store_ops(t: &TestLake, args: &[&str]) -> String {
    let out = t
        .command()
        .env("INGOT_STORE_STATS", "1")
        .env("INGOT_DELTA", "off")
        .args(args)
        .output()
        .unwrap();
    assert_ok(&out);
    stderr(&out)
        .lines()
        .find(|l| l.starts_with("store operations:"))
        .unwrap_or_else(|| panic!("no store operations line: {}", stderr(&out)))
        .to_string()
}

/// A lake of one source `t` (one-row files) with `runs` committed runs, caches every 4.
fn history(runs: usize, dir: &Path) -> TestLake {
    let t = lake_with(4, 4);
    std::fs::write(
        t.contracts().join("t.yaml"),
        "source: t\nversion: 1\nformat: csv\nfields:\n  - name: id\n    type: int64\n    required: true\n  \
         - name: v\n    type: string\nnatural_key:\n  fields: [id]\n  version: 1\n",
    )
    .unwrap();
    for i in 0..runs {
        let f = dir.join(format!("t{i}.csv"));
        std::fs::write(&f, format!("id,v\n{i},v{i}\n")).unwrap();
        ingest(&t, "t", &f);
    }
    t
}

#[test]
fn commands_make_as_many_store_operations_after_a_long_history_as_after_a_short_one() {
    let dir = tempfile::tempdir().unwrap();
    // 20 and 132 runs: both one segment (16 runs; 8 of them merged into one of 128) and four runs
    // after it, so the two lakes differ only in the length of their history (a reader checks each
    // live segment with a HEAD: their number grows with the logarithm of the history)
    let (short, long) = (history(20, dir.path()), history(132, dir.path()));
    let new = dir.path().join("new.csv");
    std::fs::write(&new, "id,v\n100000,new\n").unwrap();
    let update = dir.path().join("update.csv");
    std::fs::write(&update, "id,v\n3,changed\n").unwrap();
    for (what, args) in [
        (
            "a one-row ingest of a new key",
            vec!["ingest".to_string(), "t".into(), new.display().to_string()],
        ),
        (
            "a one-row update",
            vec!["ingest".into(), "t".into(), update.display().to_string()],
        ),
        ("SELECT 1", vec!["sql".into(), "SELECT 1".into()]),
        (
            "a query on the current view",
            vec!["sql".into(), "SELECT count(*) FROM bronze.t_current".into()],
        ),
        (
            "a query on the run log",
            vec!["sql".into(), "SELECT count(*) FROM audit.ingestion_run_log".into()],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (a, b) = (store_ops(&short, &args), store_ops(&long, &args));
        assert_eq!(a, b, "{what}: 20 runs vs 132 runs");
    }
    let counts = long.query("SELECT count(*) AS n FROM audit.ingestion_run_log");
    assert_eq!(counts[0]["n"], 134);
}

#[test]
fn a_query_on_one_source_makes_as_many_store_operations_beside_other_sources_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let alone = history(20, dir.path());
    let wide = history(20, dir.path());
    for name in ["u", "w"] {
        std::fs::write(
            wide.contracts().join(format!("{name}.yaml")),
            T_CONTRACT.replace("source: t", &format!("source: {name}")),
        )
        .unwrap();
        for i in 0..40 {
            let f = dir.path().join(format!("{name}{i}.csv"));
            std::fs::write(&f, format!("id,v\n{i},{name}{i}\n")).unwrap();
            ingest(&wide, name, &f);
        }
    }
    // the same contract for `t` on both lakes: only the other sources' runs differ
    let empty = lake_with(4, 4);
    std::fs::write(empty.contracts().join("t.yaml"), T_CONTRACT).unwrap();
    let update = dir.path().join("update.csv");
    std::fs::write(&update, "id,v\n3,changed\n").unwrap();
    let select1 = ["sql", "SELECT 1"];
    assert_eq!(
        store_ops(&wide, &select1),
        store_ops(&empty, &select1),
        "SELECT 1: 100 runs vs none"
    );
    for (what, args) in [
        ("SELECT 1", vec!["sql".to_string(), "SELECT 1".into()]),
        (
            "a query on the current view",
            vec!["sql".into(), "SELECT count(*) FROM bronze.t_current".into()],
        ),
        (
            "a one-row update",
            vec!["ingest".into(), "t".into(), update.display().to_string()],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(
            store_ops(&wide, &args),
            store_ops(&alone, &args),
            "{what}: beside 80 runs of 2 sources vs alone"
        );
    }
    // the run log still answers for every source
    let counts =
        wide.query("SELECT source, count(*) AS n FROM audit.ingestion_run_log GROUP BY source ORDER BY source");
    let got: Vec<(String, i64)> = counts
        .iter()
        .map(|r| (r["source"].as_str().unwrap().to_string(), r["n"].as_i64().unwrap()))
        .collect();
    assert_eq!(got, vec![("t".into(), 21), ("u".into(), 40), ("w".into(), 40)]);
}

/// A shell opened before a run of commits (the nightly job while an analyst keeps a session) still
/// reads the tables it built: the checkpoint its current view was planned over outlives the
/// newer checkpoints for a while; once it is removed, the session's statements fail and say why
/// (a listing of a missing file is empty: the view would silently miss those runs).
#[test]
fn a_shell_session_reads_its_tables_after_newer_checkpoints_are_written() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let t = history(4, dir.path());
    let mut shell = t
        .command()
        .args(["sql", "--format", "csv"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = shell.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(shell.stdout.take().unwrap());
    let mut count = |stdin: &mut std::process::ChildStdin, sql: &str| -> String {
        writeln!(stdin, "{sql};").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the shell ended before answering {sql}"
            );
            if line.trim().parse::<i64>().is_ok() {
                return line.trim().to_string();
            }
        }
    };
    assert_eq!(count(&mut stdin, "SELECT count(*) AS n FROM bronze.t_current"), "4");
    // three checkpoints later (every 4 commits): the one the view was planned over is superseded twice
    for i in 4..16 {
        let f = dir.path().join(format!("t{i}.csv"));
        std::fs::write(&f, format!("id,v\n{i},v{i}\n")).unwrap();
        ingest(&t, "t", &f);
    }
    assert!(cache_files(&t, "_cache/log/ingestion_run_log/t").len() >= 4);
    // the session sees each source as it first read it: its view as built, and the run log
    // first named now agrees with it
    assert_eq!(count(&mut stdin, "SELECT count(*) AS n FROM bronze.t_current"), "4");
    assert_eq!(
        count(&mut stdin, "SELECT count(*) AS n FROM audit.ingestion_run_log"),
        "4"
    );
    // gc removes every checkpoint but the newest two at once: the session says so instead of
    // answering without the runs that checkpoint held
    let gc = t.run(&["gc", "--grace", "0s"]);
    assert!(gc.status.success(), "{}", stderr(&gc));
    assert!(
        !t.lake()
            .join("_cache/log/ingestion_run_log/t/0000000004.parquet")
            .exists()
    );
    writeln!(stdin, "SELECT count(*) AS n FROM bronze.t_current;").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let done = shell.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(2), "{said}");
    assert!(
        said.contains(
            "_cache/log/ingestion_run_log/t/0000000004.parquet was removed after this session read t's run log"
        ),
        "{said}"
    );
    assert_eq!(
        String::from_utf8_lossy(&done.stdout).trim(),
        "",
        "no answer without its runs"
    );
}

/// A file that committed records name, removed by hand, fails the statements that read it, naming
/// it: a listing table over a missing file would otherwise read as no rows. Whole-lake: a run's
/// own file, and a checkpoint a fresh statement plans over.
#[test]
fn a_file_removed_by_hand_fails_the_query_instead_of_reading_as_no_rows() {
    let t = never();
    for f in ["bookings/2026-11-01_bookings.csv", "bookings/2026-11-03_bookings.csv"] {
        ingest(&t, "bookings", &landing(f));
    }
    let run = run_of(&t, "bookings", "2026-11-03_bookings.csv");
    let rel = format!("bronze/bookings/run_id={run}/part-00000.parquet");
    std::fs::remove_file(t.lake().join(&rel)).unwrap();
    for sql in [
        "SELECT count(*) FROM bronze.bookings",
        "SELECT count(*) FROM bronze.bookings_current",
    ] {
        let out = t.run(&["sql", sql]);
        assert!(!out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stdout));
        assert!(
            stderr(&out).contains(&rel) && stderr(&out).contains("missing from the lake"),
            "{sql}: {}",
            stderr(&out)
        );
    }

    // a checkpoint removed by hand between the statement's planning and its scan cannot be
    // staged here; one removed before is passed over (the records are read), so the answer stands
    let cached = tiny();
    for f in ["bookings/2026-11-01_bookings.csv", "bookings/2026-11-03_bookings.csv"] {
        ingest(&cached, "bookings", &landing(f));
    }
    let want = cached.query("SELECT count(*) AS n FROM bronze.bookings_current");
    for f in cache_files(&cached, "_cache/log/ingestion_run_log/bookings") {
        std::fs::remove_file(f).unwrap();
    }
    assert_eq!(cached.query("SELECT count(*) AS n FROM bronze.bookings_current"), want);
}

const T_CONTRACT: &str = "source: t\nversion: 1\nformat: csv\nfields:\n  - name: id\n    type: int64\n    required: true\n  \
                          - name: v\n    type: string\nnatural_key:\n  fields: [id]\n  version: 1\n";

/// `T_CONTRACT` with a field added.
const T_CONTRACT_WIDER: &str = "source: t\nversion: 2\nformat: csv\nfields:\n  - name: id\n    type: int64\n    required: true\n  \
                                - name: v\n    type: string\n  - name: w\n    type: string\nnatural_key:\n  fields: [id]\n  version: 1\n";

/// Deliveries of `t`: one to three rows each, new keys and new versions of earlier ones; from
/// delivery 24 on under a contract with one more field.
fn small_deliveries(t: &TestLake, dir: &Path, from: usize, to: usize) {
    for i in from..to {
        if i == 24 {
            std::fs::write(t.contracts().join("t.yaml"), T_CONTRACT_WIDER).unwrap();
        }
        let rows: Vec<String> = (0..1 + i % 3)
            .map(|j| {
                let id = (i * 7 + j * 3) % 29;
                if i >= 24 {
                    format!("{id},v{i}-{j},w{i}")
                } else {
                    format!("{id},v{i}-{j}")
                }
            })
            .collect();
        let header = if i >= 24 { "id,v,w" } else { "id,v" };
        let f = dir.join(format!("d{i}.csv"));
        std::fs::write(&f, format!("{header}\n{}\n", rows.join("\n"))).unwrap();
        ingest(t, "t", &f);
    }
}

fn t_tables(t: &TestLake) -> LakeSnapshot {
    t.snapshot(&["t"])
}

fn segment_manifests(t: &TestLake) -> Vec<PathBuf> {
    cache_files(t, "_cache/segments/t")
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect()
}

/// A lake that compacts (as by default) and one that never does (`INGOT_COMPACT=0`), both with
/// `contract` as `t`'s.
fn compacted_and_plain(contract: &str) -> (TestLake, TestLake) {
    let mut plain = TestLake::new();
    plain.envs.push(("INGOT_COMPACT".into(), "0".into()));
    let compacted = TestLake::new();
    for t in [&compacted, &plain] {
        std::fs::write(t.contracts().join("t.yaml"), contract).unwrap();
    }
    (compacted, plain)
}

#[test]
fn compacted_runs_answer_as_their_own_files_through_undo_evolution_and_gc() {
    let dir = tempfile::tempdir().unwrap();
    let (compacted, plain) = compacted_and_plain(T_CONTRACT);
    for t in [&compacted, &plain] {
        small_deliveries(t, dir.path(), 0, 40);
    }
    assert!(!segment_manifests(&compacted).is_empty(), "no segment was written");
    assert!(segment_manifests(&plain).is_empty(), "INGOT_COMPACT=0 compacted");
    t_tables(&compacted).assert_same(&t_tables(&plain), "segments vs run files");

    // undo a run a segment holds: its rows leave bronze.t and bronze.t_current all the same
    let third = t_run(&compacted, 3);
    ok(&compacted, &["undo", &third]);
    ok(&plain, &["undo", &t_run(&plain, 3)]);
    t_tables(&compacted).assert_same(&t_tables(&plain), "after undo of a compacted run");

    // a run holding the only version of its key, compacted, then undone: no other version
    // outranks its row, so only knowing the run is no longer current keeps the key out of the view
    let lone = dir.path().join("lone.csv");
    std::fs::write(&lone, "id,v,w\n500,lone,w\n").unwrap();
    let lone_run = |t: &TestLake| {
        let rows = t.query("SELECT run_id FROM audit.ingestion_run_log WHERE file_path LIKE '%lone.csv'");
        rows[0]["run_id"].as_str().unwrap().to_string()
    };
    let pair = dir.path().join("pair.csv");
    std::fs::write(&pair, "id,v,w\n501,pair,w\n").unwrap();
    for t in [&compacted, &plain] {
        ingest(t, "t", &lone);
        ingest(t, "t", &pair);
    }
    // a segment merges two runs at least
    ok(&compacted, &["compact", "t", "--all"]);
    let run = lone_run(&compacted);
    let manifests: String = segment_manifests(&compacted)
        .iter()
        .map(|m| std::fs::read_to_string(m).unwrap())
        .collect();
    assert!(manifests.contains(&run), "no segment holds the lone run");
    ok(&compacted, &["undo", &run]);
    ok(&plain, &["undo", &lone_run(&plain)]);
    assert!(
        compacted
            .query("SELECT * FROM bronze.t_current WHERE id = 500")
            .is_empty()
    );
    t_tables(&compacted).assert_same(&t_tables(&plain), "after undo of a compacted run with a key of its own");

    // everything else compacted on demand, then gc: the answers stay
    let out = ok(&compacted, &["compact", "t", "--all"]);
    assert!(out.contains("t: "), "{out}");
    small_deliveries(&compacted, dir.path(), 40, 44);
    small_deliveries(&plain, dir.path(), 40, 44);
    ok(&compacted, &["gc", "--grace", "0s"]);
    t_tables(&compacted).assert_same(&t_tables(&plain), "after compact --all, more runs and gc");
    assert!(
        segment_manifests(&compacted).len() <= 2,
        "gc keeps the two newest manifests"
    );
    for t in [&compacted, &plain] {
        assert_ok(&t.run(&["doctor"]));
    }
    // a segment gone missing is passed over: its runs are read from their own files
    for seg in cache_files(&compacted, "_cache/segments/t") {
        if seg.extension().is_some_and(|x| x == "parquet") {
            std::fs::remove_file(seg).unwrap();
        }
    }
    t_tables(&compacted).assert_same(&t_tables(&plain), "segments removed by hand");
}

/// The run id of `t`'s `n`-th committed run (0-based, commit order).
fn t_run(t: &TestLake, n: usize) -> String {
    let rows = t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 't' ORDER BY started_at");
    rows[n]["run_id"].as_str().unwrap().to_string()
}

#[test]
fn a_crash_at_every_compaction_failpoint_then_rerun_equals_one_clean_run() {
    let dir = tempfile::tempdir().unwrap();
    let clean = TestLake::new();
    std::fs::write(clean.contracts().join("t.yaml"), T_CONTRACT).unwrap();
    small_deliveries(&clean, dir.path(), 0, 16);
    let want = t_tables(&clean);
    for point in ingot::table::failpoint::COMPACT {
        let t = TestLake::new();
        std::fs::write(t.contracts().join("t.yaml"), T_CONTRACT).unwrap();
        small_deliveries(&t, dir.path(), 0, 15);
        // the 16th small run commits, then its compaction crashes
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .args(["ingest", "t"])
            .arg(dir.path().join("d15.csv"))
            .output()
            .unwrap();
        assert!(
            stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: {}",
            stderr(&out)
        );
        assert!(!out.status.success());
        let mut again = t_tables(&t);
        // the run had committed: running the same command again only skips the file
        assert_ok(&t.ingest("t", &dir.path().join("d15.csv")));
        let skipped =
            t.query("SELECT count(*) AS n FROM audit.ingestion_run_log WHERE status = 'skipped_duplicate_file'");
        assert_eq!(skipped[0]["n"], 1, "{point}");
        again.tables.remove("audit.ingestion_run_log");
        let mut now = t_tables(&t);
        now.tables.remove("audit.ingestion_run_log");
        let mut expected = LakeSnapshot {
            tables: want.tables.clone(),
        };
        expected.tables.remove("audit.ingestion_run_log");
        now.assert_same(&expected, &format!("{point}: crash + re-run"));
        again.assert_same(&expected, &format!("{point}: right after the crash"));
        let out = ok(&t, &["compact", "t"]);
        assert!(out.contains("in all"), "{out}");
        assert!(
            !segment_manifests(&t).is_empty(),
            "{point}: compact did not finish the job"
        );
        ok(&t, &["gc", "--grace", "0s"]);
        now = t_tables(&t);
        now.tables.remove("audit.ingestion_run_log");
        now.assert_same(&expected, &format!("{point}: after compact and gc"));
        assert_ok(&t.run(&["doctor"]));
    }
}

/// A log record removed by hand (a slip, a partial copy of the lake) leaves a gap among its
/// folder's slots. A reader that reads the records after a checkpoint slot by slot would stop at
/// it and miss every later run; the tail hint says a later slot was taken, so the folder is read
/// whole instead: the tables show every run but the removed one, the next ingest commits after
/// the last record (never into the gap), and `ingot doctor` names the empty slot. The same
/// without the hint (caches removed): the folder is listed.
#[test]
fn a_gap_in_a_log_is_read_around_and_named_by_doctor() {
    let dir = tempfile::tempdir().unwrap();
    // caches every 4: checkpoints through slots 4 and 8, records 9 and 10 after them
    let t = history(10, dir.path());
    let current = "SELECT * FROM bronze.t_current ORDER BY id";
    let before = t.query(current);
    assert_eq!(before.len(), 10);
    let removed = t.query("SELECT run_id FROM audit.ingestion_run_log WHERE file_path LIKE '%/t8.csv'");
    let removed = removed[0]["run_id"].as_str().unwrap().to_string();
    let slot9 = t.lake().join("audit/ingestion_run_log/t/0000000009.parquet");
    assert!(slot9.exists());
    std::fs::remove_file(&slot9).unwrap();

    let want: Vec<_> = before
        .iter()
        .filter(|r| r["ingestion_run_id"].as_str() != Some(removed.as_str()))
        .cloned()
        .collect();
    assert_eq!(want.len(), 9);
    let out = t.run(&["sql", current, "--format", "json"]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("slot 9 holds no record, but a commit took slot 10"),
        "{}",
        stderr(&out)
    );
    assert_eq!(t.query(current), want, "the current view around the gap");
    let runs = t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at");
    assert_eq!(runs.len(), 9);
    assert!(runs.iter().all(|r| r["run_id"].as_str() != Some(removed.as_str())));

    let doctor = t.run(&["doctor"]);
    assert_eq!(
        doctor.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    let report = String::from_utf8_lossy(&doctor.stdout).into_owned() + &stderr(&doctor);
    assert!(
        report.contains("audit/ingestion_run_log/t/0000000009.parquet")
            && report.contains("slot 9 is empty while slot 10 holds a record"),
        "{report}"
    );

    // the next ingest takes slot 11, after the last record
    let f = dir.path().join("t-next.csv");
    std::fs::write(&f, "id,v\n100,next\n").unwrap();
    ingest(&t, "t", &f);
    assert!(!slot9.exists());
    assert!(t.lake().join("audit/ingestion_run_log/t/0000000011.parquet").exists());
    let after = t.query(current);
    assert_eq!(after.len(), 10);
    assert_eq!(after[..9], want[..], "the earlier records stand");
    assert_eq!(after[9]["v"], "next");

    // without the hint and the checkpoints (caches removed), reading from slot 1 slot by slot
    // would end at the gap: the folder is listed instead
    std::fs::remove_dir_all(t.lake().join("_cache/log")).unwrap();
    assert_eq!(t.query(current), after, "no caches: the folder is listed");
}

/// The tail hint is only a lower bound: one older than the last commit (lost in a power loss,
/// written before a concurrent commit's) or unreadable changes no answer.
#[test]
fn a_stale_or_damaged_tail_hint_changes_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let t = history(11, dir.path());
    let current = "SELECT * FROM bronze.t_current ORDER BY id";
    let want = t.query(current);
    assert_eq!(want.len(), 11);
    let hint = t.lake().join("_cache/log/ingestion_run_log/t/tail");
    assert_eq!(std::fs::read_to_string(&hint).unwrap(), "11");
    for stale in ["9", "1", "0", "not a slot", ""] {
        std::fs::write(&hint, stale).unwrap();
        let out = t.run(&["sql", current, "--format", "json"]);
        assert_ok(&out);
        assert!(
            !stderr(&out).contains("holds no record"),
            "hint {stale:?}: {}",
            stderr(&out)
        );
        assert_eq!(t.query(current), want, "hint {stale:?}");
    }
    // a hint past the last commit (records lost after it) makes the folder be listed
    std::fs::write(&hint, "40").unwrap();
    let out = t.run(&["sql", current, "--format", "json"]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("slot 12 holds no record, but a commit took slot 40"),
        "{}",
        stderr(&out)
    );
    assert_eq!(t.query(current), want);
    // the next commit writes the hint again
    let f = dir.path().join("t-next.csv");
    std::fs::write(&f, "id,v\n100,next\n").unwrap();
    ingest(&t, "t", &f);
    assert_eq!(std::fs::read_to_string(&hint).unwrap(), "12");
}

/// `t` keyed by `id` (version 1), or by `g` (version 2).
fn keyed(version: u32) -> String {
    let key = if version == 1 { "id" } else { "g" };
    format!(
        "source: t\nversion: {version}\nformat: csv\nfields:\n  - name: id\n    type: int64\n    required: true\n  \
         - name: v\n    type: string\n  - name: g\n    type: string\n    required: true\nnatural_key:\n  fields: [{key}]\n  \
         version: {version}\n"
    )
}

/// Deliveries `from..to` of `t` under [`keyed`]: one or two rows, new keys and new versions.
fn keyed_deliveries(t: &TestLake, dir: &Path, from: usize, to: usize) {
    for i in from..to {
        let rows: Vec<String> = (0..1 + i % 2)
            .map(|j| {
                let id = (i * 5 + j * 3) % 23;
                // ids apart by 7 share a `g`: the rekey to `g` makes them collide
                format!("{id},v{i}-{j},g{}", id % 7)
            })
            .collect();
        let f = dir.join(format!("k{i}.csv"));
        std::fs::write(&f, format!("id,v,g\n{}\n", rows.join("\n"))).unwrap();
        ingest(t, "t", &f);
    }
}

/// The view state of `t`'s newest segment manifest, as JSON.
fn view_state(t: &TestLake) -> (PathBuf, serde_json::Value) {
    let newest = segment_manifests(t).into_iter().max().expect("no segment manifest");
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&newest).unwrap()).unwrap();
    (newest, m)
}

/// The catalog reads a compacted source from its segment manifest's view state and the records
/// after it, not from the run log: across undo of compacted and own runs, a rekey and the runs
/// after it, every table equals a lake that never compacts. A log restored from an older copy (its
/// newest records gone) voids the state: readers pass it over, doctor names it, and the next
/// compaction writes it again. A state edited to say something else is named by doctor.
#[test]
fn the_view_state_of_a_compacted_source_changes_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (compacted, plain) = compacted_and_plain(&keyed(1));
    let both = [&compacted, &plain];
    for t in both {
        keyed_deliveries(t, dir.path(), 0, 21);
    }
    let (_, m) = view_state(&compacted);
    // taken by the compaction after the 16th run: the 5 runs after it are read from their records
    assert_eq!(m["state"]["through"], 16, "{m}");
    assert!(
        m["segments"].as_array().unwrap().iter().all(|s| s["slotted"] == true),
        "{m}"
    );
    t_tables(&compacted).assert_same(&t_tables(&plain), "view state vs run log");

    // undo a run a segment holds and the latest (own) run
    for t in both {
        ok(t, &["undo", &t_run(t, 2)]);
        ok(t, &["undo", &t_run(t, 20)]);
    }
    t_tables(&compacted).assert_same(&t_tables(&plain), "after undo of a held and an own run");

    // a rekey, then enough runs under the new key for the state to be written after it
    for t in both {
        std::fs::write(t.contracts().join("t.yaml"), keyed(2)).unwrap();
        ok(t, &["rekey", "t"]);
    }
    t_tables(&compacted).assert_same(&t_tables(&plain), "after the rekey");
    for t in both {
        keyed_deliveries(t, dir.path(), 21, 40);
    }
    let (_, m) = view_state(&compacted);
    assert!(m["state"]["rekey"].is_array(), "{m}");
    t_tables(&compacted).assert_same(&t_tables(&plain), "runs after the rekey");
    for t in both {
        ok(t, &["undo", &t_run(t, 35)]);
    }
    t_tables(&compacted).assert_same(&t_tables(&plain), "after undo of a run after the rekey");
    for t in both {
        assert_ok(&t.run(&["doctor"]));
    }

    // the run log restored from an older copy: its newest records (the one the state was taken
    // after among them) are gone, in both lakes alike
    let (_, m) = view_state(&compacted);
    let through = m["state"]["through"].as_u64().unwrap();
    for t in both {
        let log = t.lake().join("audit/ingestion_run_log/t");
        for f in files_under(&log) {
            let slot: u64 = f.file_stem().unwrap().to_str().unwrap().parse().unwrap();
            if slot >= through {
                std::fs::remove_file(f).unwrap();
            }
        }
        let _ = std::fs::remove_file(t.lake().join("_cache/log/ingestion_run_log/t/tail"));
    }
    t_tables(&compacted).assert_same(&t_tables(&plain), "log restored from an older copy");
    let said = stdout(&compacted.run(&["doctor"]));
    assert!(
        said.contains("_cache/segments/t/manifest-") && said.contains("no longer holds"),
        "{said}"
    );
    // the next compaction writes the state again, from the log as it is
    ok(&compacted, &["compact", "t"]);
    let (_, m) = view_state(&compacted);
    assert!(m["state"]["through"].as_u64().unwrap() < through, "{m}");
    t_tables(&compacted).assert_same(&t_tables(&plain), "state written again");
    let said = stdout(&compacted.run(&["doctor"]));
    assert!(!said.contains("_cache/segments/t/manifest-"), "{said}");

    // a state edited by hand to forget the rekey: readers would show the old keys again; doctor
    // names the manifest
    let (path, mut m) = view_state(&compacted);
    m["state"]["rekey"] = serde_json::Value::Null;
    std::fs::write(&path, m.to_string()).unwrap();
    let said = stdout(&compacted.run(&["doctor"]));
    assert!(
        said.contains("_cache/segments/t/manifest-") && said.contains("ranks the current runs"),
        "{said}"
    );
}

/// A slot holding an object no reader can parse is passed over by the commit that meets it (the
/// record takes the next slot): the segment compaction writes then carries the slot the record
/// took, and the view state is taken after that record, so the tables equal a lake that never
/// compacts and doctor names only the unreadable object.
#[test]
fn a_commit_past_an_unreadable_slot_is_compacted_with_the_slot_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let (compacted, plain) = compacted_and_plain(T_CONTRACT);
    for t in [&compacted, &plain] {
        small_deliveries(t, dir.path(), 0, 15);
        std::fs::write(t.lake().join("audit/ingestion_run_log/t/0000000016.parquet"), b"PAR1").unwrap();
        small_deliveries(t, dir.path(), 15, 20);
    }
    // the 16th run took slot 17, and its compaction read the log through it
    let (_, m) = view_state(&compacted);
    assert_eq!(m["state"]["through"], 17, "{m}");
    t_tables(&compacted).assert_same(&t_tables(&plain), "a commit past an unreadable slot");
    let said = stdout(&compacted.run(&["doctor"]));
    assert!(
        said.contains("audit/ingestion_run_log/t/0000000016.parquet") && !said.contains("_cache/segments/t/manifest-"),
        "{said}"
    );
}

/// Every run a segment holds undone: the views are empty, as on a lake that never compacts, and
/// doctor finds the view state (which keeps the key the undone runs recorded) agrees with the log.
#[test]
fn undoing_every_compacted_run_empties_the_views_and_doctor_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let (compacted, plain) = compacted_and_plain(T_CONTRACT);
    for t in [&compacted, &plain] {
        small_deliveries(t, dir.path(), 0, 2);
    }
    ok(&compacted, &["compact", "t", "--all"]);
    assert!(view_state(&compacted).1["state"].is_object());
    for t in [&compacted, &plain] {
        for n in 0..2 {
            ok(t, &["undo", &t_run(t, n)]);
        }
    }
    assert!(compacted.query("SELECT * FROM bronze.t_current").is_empty());
    t_tables(&compacted).assert_same(&t_tables(&plain), "every compacted run undone");
    assert_ok(&compacted.run(&["doctor"]));
}
