//! `ingot gc` and `ingot doctor` on real lakes: gc removes exactly the files of crashed, failed,
//! rolled-back and retired runs and builds and nothing any query reads; a crash during gc is
//! repaired by running it again; doctor finds each kind of injected damage, with its location.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::util::{TestLake, assert_ok, id_names, landing, normalize_rows, repo, stderr, stdout};

type Row = std::collections::BTreeMap<String, serde_json::Value>;

/// Every file of the lake but the locks (gc takes over and releases a stale lock a crashed build
/// left, as any writer would).
fn files(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                stack.push(p);
            } else if !rel.starts_with("_locks/") && !rel.contains("_delta_log/") && !rel.starts_with("_cache/delta/") {
                // the Delta logs follow every commit and gc's own (tests/it/delta.rs reads them)
                out.insert(rel);
            }
        }
    }
    out
}

fn rules() -> PathBuf {
    repo().join("rules")
}

fn ingot(t: &TestLake, args: &[&str]) -> std::process::Output {
    t.command().arg("--rules").arg(rules()).args(args).output().unwrap()
}

fn ok(t: &TestLake, args: &[&str]) -> String {
    let out = ingot(t, args);
    assert_ok(&out);
    stdout(&out)
}

fn ids(t: &TestLake, sql: &str) -> Vec<String> {
    t.query(sql)
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

/// Everything a reader can see: every table, whole.
fn visible(t: &TestLake) -> Vec<Vec<Row>> {
    [
        "SELECT * FROM bronze.bookings ORDER BY ingestion_run_id, source_row_number",
        "SELECT * FROM bronze.hotels ORDER BY ingestion_run_id, source_row_number",
        "SELECT * FROM bronze.bookings_current ORDER BY natural_key_fingerprint",
        "SELECT * FROM audit.ingestion_run_log ORDER BY run_id",
        "SELECT * FROM audit.silver_build_log ORDER BY build_id",
        "SELECT * FROM audit.row_failure_log ORDER BY run_id, source_row_number, rule, natural_key_fingerprint",
        "SELECT * FROM silver.bookings ORDER BY natural_key_fingerprint",
    ]
    .iter()
    .map(|q| t.query(q))
    .collect()
}

/// A lake with committed runs and builds, a crashed ingest, a rolled-back run, an older build
/// and a crashed build.
fn messy() -> TestLake {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    ok(&t, &["build", "bookings"]);
    let crashed = t
        .command()
        .env("INGOT_FAILPOINT", "ingest.after_failures")
        .args(["ingest", "bookings"])
        .arg(landing("bookings/2026-11-03_bookings.csv"))
        .output()
        .unwrap();
    assert!(!crashed.status.success());
    t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    ok(&t, &["build", "bookings"]);
    let last = ids(
        &t,
        "SELECT run_id AS id FROM audit.ingestion_run_log ORDER BY started_at DESC LIMIT 1",
    );
    ok(&t, &["undo", &last[0]]);
    ok(&t, &["build", "bookings"]);
    let crashed = t
        .command()
        .env("INGOT_FAILPOINT", "build.after_data")
        .arg("--rules")
        .arg(rules())
        .args(["build", "bookings", "--full"])
        .output()
        .unwrap();
    assert!(!crashed.status.success());
    t
}

/// The files gc may remove, derived from the logs and the file listing: everything under a
/// run directory whose id is not a loaded run, under a snapshot directory whose id is not the
/// latest succeeded build, and under a build's failure directory whose build did not succeed.
fn expected_garbage(t: &TestLake) -> BTreeSet<String> {
    let loaded: BTreeSet<String> = ids(
        t,
        "SELECT run_id AS id FROM audit.ingestion_run_log WHERE status IN ('succeeded', 'succeeded_with_failures')",
    )
    .into_iter()
    .collect();
    let succeeded: BTreeSet<String> = ids(
        t,
        "SELECT build_id AS id FROM audit.silver_build_log WHERE status = 'succeeded'",
    )
    .into_iter()
    .collect();
    let latest: BTreeSet<String> = ids(
        t,
        "SELECT build_id AS id FROM audit.silver_build_log WHERE status = 'succeeded' ORDER BY started_at DESC LIMIT 1",
    )
    .into_iter()
    .collect();
    files(&t.lake())
        .into_iter()
        .filter(|f| {
            let dir = f.split('/').rev().nth(1).unwrap_or("");
            match (dir.strip_prefix("run_id="), dir.strip_prefix("build_id=")) {
                (Some(id), _) => !loaded.contains(id),
                (_, Some(id)) if f.starts_with("audit/") => !succeeded.contains(id),
                (_, Some(id)) => !latest.contains(id),
                _ => false,
            }
        })
        .collect()
}

#[test]
fn gc_removes_exactly_what_nothing_reads_and_doctor_is_clean_after() {
    let t = messy();
    let before_files = files(&t.lake());
    let before = visible(&t);
    let garbage = expected_garbage(&t);
    // a crashed run, a rolled-back run, two retired builds and a crashed build
    assert!(garbage.iter().any(|f| f.starts_with("bronze/bookings/")), "{garbage:?}");
    assert!(garbage.iter().any(|f| f.starts_with("silver/bookings/")), "{garbage:?}");

    // within the default grace period and retention nothing goes
    let said = ok(&t, &["gc"]);
    assert!(said.contains("gc: removed 0 files"), "{said}");
    assert_eq!(files(&t.lake()), before_files);

    // a dry run lists exactly the garbage and removes nothing
    let said = ok(&t, &["gc", "--dry-run", "--grace", "0s", "--retain", "0s"]);
    let listed: BTreeSet<String> = said
        .lines()
        .filter_map(|l| l.strip_prefix("would remove "))
        .map(|l| l.split(" (").next().unwrap().to_string())
        .collect();
    assert_eq!(listed, garbage);
    assert_eq!(files(&t.lake()), before_files);

    // doctor sees them as orphans, not violations
    let out = ingot(&t, &["doctor"]);
    assert_ok(&out);
    let orphans: BTreeSet<String> = stdout(&out)
        .lines()
        .filter_map(|l| l.strip_prefix("orphan: "))
        .map(|l| l.split(": ").next().unwrap().to_string())
        .collect();
    let retired_build = |f: &String| f.contains("build_id=") && !orphans.contains(f);
    assert!(orphans.is_subset(&garbage));
    assert!(garbage.iter().all(|f| orphans.contains(f) || retired_build(f)));

    let said = ok(&t, &["gc", "--grace", "0s", "--retain", "0s"]);
    assert!(said.contains(&format!("gc: removed {} files", garbage.len())), "{said}");
    let after: BTreeSet<String> = files(&t.lake());
    assert_eq!(after, before_files.difference(&garbage).cloned().collect());
    for (i, (got, want)) in visible(&t).iter().zip(&before).enumerate() {
        assert!(
            got == want,
            "table {i} reads differently after gc: {} rows, {} before",
            got.len(),
            want.len()
        );
    }
    let out = ingot(&t, &["doctor"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("0 violations, 0 orphan files"),
        "{}",
        stdout(&out)
    );
    // and a build after gc still works incrementally
    ok(&t, &["build", "bookings"]);
}

#[test]
fn a_crash_during_gc_is_repaired_by_running_it_again() {
    let clean = messy();
    ok(&clean, &["gc", "--grace", "0s", "--retain", "0s"]);
    let want_visible = visible(&clean);
    let t = messy();
    let garbage = expected_garbage(&t);
    let before = files(&t.lake());
    let out = t
        .command()
        .env("INGOT_FAILPOINT", "gc.after_first_delete")
        .args(["gc", "--grace", "0s", "--retain", "0s"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("failpoint gc.after_first_delete reached"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        before.difference(&files(&t.lake())).count(),
        1,
        "one file went before the crash"
    );
    ok(&t, &["gc", "--grace", "0s", "--retain", "0s"]);
    assert_eq!(files(&t.lake()), before.difference(&garbage).cloned().collect());
    let named = |t: &TestLake, tables: Vec<Vec<Row>>| -> Vec<Vec<Row>> {
        let names = id_names(t);
        tables.into_iter().map(|rows| normalize_rows(rows, &names)).collect()
    };
    assert_eq!(named(&t, visible(&t)), named(&clean, want_visible));
}

#[test]
fn doctor_reports_each_kind_of_damage_with_its_location() {
    let t = TestLake::new();
    let dir = t.dir.path().join("rules");
    for table in ["bookings"] {
        std::fs::create_dir_all(dir.join(table)).unwrap();
        for f in std::fs::read_dir(rules().join(table)).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, dir.join(table).join(f.file_name().unwrap())).unwrap();
        }
    }
    let doctor = |t: &TestLake| {
        let out = t.command().arg("--rules").arg(&dir).arg("doctor").output().unwrap();
        (out.status.code(), stdout(&out))
    };
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    let out = t
        .command()
        .arg("--rules")
        .arg(&dir)
        .args(["build", "bookings"])
        .output()
        .unwrap();
    assert_ok(&out);
    let (code, said) = doctor(&t);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("0 violations"), "{said}");

    let runs = ids(
        &t,
        "SELECT run_id AS id FROM audit.ingestion_run_log WHERE source = 'bookings' ORDER BY started_at",
    );
    let lake = t.lake();
    // the failure file of one run replaced by the other's: not the file its run committed (and
    // so the counts are not checked on it)
    let f0 = format!("audit/row_failure_log/run_id={}/part-00000.parquet", runs[0]);
    let f1 = format!("audit/row_failure_log/run_id={}/part-00000.parquet", runs[1]);
    let saved = std::fs::read(lake.join(&f1)).unwrap();
    std::fs::copy(lake.join(&f0), lake.join(&f1)).unwrap();
    let (code, said) = doctor(&t);
    assert_eq!(code, Some(1));
    assert!(
        said.contains(&format!(
            "files: {f1}: damaged (audit.row_failure_log of bronze.bookings, run {}): it is {} bytes, its run committed {}",
            runs[1],
            std::fs::metadata(lake.join(&f0)).unwrap().len(),
            saved.len()
        )),
        "{said}"
    );
    assert!(!said.contains(&format!("counts: {f1}")), "{said}");
    std::fs::write(lake.join(&f1), saved).unwrap();

    // a rules file edited after a build used it
    let v2 = dir.join("bookings/v2.yaml");
    let text = std::fs::read_to_string(&v2).unwrap();
    std::fs::write(&v2, format!("{text}\n# edited\n")).unwrap();
    let (code, said) = doctor(&t);
    assert_eq!(code, Some(1));
    assert!(said.contains(&format!("rules: {}: sha256 ", v2.display())), "{said}");
    std::fs::write(&v2, text).unwrap();

    // an undo without a rebuild: silver holds records bronze no longer has
    let out = t.run(&["undo", &runs[1]]);
    assert_ok(&out);
    let (code, said) = doctor(&t);
    assert_eq!(code, Some(1));
    assert!(
        said.contains("silver: silver.bookings: 4 fingerprints are not current in bronze.bookings"),
        "{said}"
    );
    let out = t
        .command()
        .arg("--rules")
        .arg(&dir)
        .args(["build", "bookings"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(doctor(&t).0, Some(0));

    // a committed run's data file lost
    let data = format!("bronze/bookings/run_id={}/part-00000.parquet", runs[0]);
    std::fs::remove_file(lake.join(&data)).unwrap();
    let (code, said) = doctor(&t);
    assert_eq!(code, Some(1));
    assert!(
        said.contains(&format!("files: {data}: missing: run {} of bookings", runs[0])),
        "{said}"
    );
}

/// One stray object never stops the lake: a `._0000000001.parquet` (a macOS copy on a share) in
/// the run log and the build log is skipped by every command and reported by `doctor` with its
/// path; a silver table whose manifest is damaged fails only its own queries, and the warning
/// names the file.
#[test]
fn a_stray_object_in_a_log_or_one_broken_table_never_stops_the_lake() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    t.ingest_ok(
        "marketing_spend",
        &landing("marketing_spend/2026-10-13_marketing_spend.csv"),
    );
    for table in ["bookings", "marketing_spend"] {
        assert!(t.run(&["build", table]).status.success());
    }
    let runs = t.lake().join("audit/ingestion_run_log/hotels");
    std::fs::copy(runs.join("0000000001.parquet"), runs.join("._0000000001.parquet")).unwrap();
    std::fs::write(runs.join("notes.parquet"), b"scratch").unwrap();
    let builds = t.lake().join("audit/silver_build_log/bookings");
    std::fs::write(builds.join("._0000000001.parquet"), b"\x00\x05\x16\x07").unwrap();
    for args in [
        vec!["runs"],
        vec!["sql", "SELECT 1"],
        vec!["sql", "SELECT count(*) FROM silver.bookings"],
    ] {
        let out = t.run(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(t.query("SELECT count(*) AS n FROM audit.ingestion_run_log")[0]["n"], 3);
    let out = t.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    for path in [
        "audit/ingestion_run_log/hotels/._0000000001.parquet",
        "audit/ingestion_run_log/hotels/notes.parquet",
        "audit/silver_build_log/bookings/._0000000001.parquet",
    ] {
        assert!(stdout(&out).contains(path), "{path} not reported:\n{}", stdout(&out));
    }

    // a damaged manifest: silver.bookings fails, naming the file; silver.marketing_spend works
    let build = t.query("SELECT build_id FROM audit.silver_build_log WHERE \"table\" = 'bookings'")[0]["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    let manifest = format!("silver/bookings/build_id={build}/manifest.json");
    std::fs::write(t.lake().join(&manifest), b"{ not json").unwrap();
    let out = t.run(&["sql", "SELECT count(*) AS n FROM silver.marketing_spend"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(&manifest), "{}", stderr(&out));
    let out = t.run(&["sql", "SELECT count(*) FROM silver.bookings"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&manifest), "{}", stderr(&out));
    assert!(t.run(&["runs"]).status.success());

    // a record in a slot that no reader can parse: doctor still names it
    std::fs::write(
        t.lake().join("audit/ingestion_run_log/hotels/0000000002.parquet"),
        b"PAR1",
    )
    .unwrap();
    let out = t.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("audit/ingestion_run_log/hotels/0000000002.parquet: unreadable run log record"),
        "{}",
        stdout(&out)
    );
    // ... and every other command skips it: the next run of the source commits past its slot
    for args in [vec!["runs"], vec!["sql", "SELECT 1"]] {
        let out = t.run(&args);
        assert!(
            out.status.success(),
            "{args:?} with an unreadable record: {}",
            stderr(&out)
        );
    }
    t.ingest_ok("hotels", &landing("hotels/2026-11-03_hotels.csv"));
    let hotels =
        t.query("SELECT status, file_path FROM audit.ingestion_run_log WHERE source = 'hotels' ORDER BY started_at");
    assert_eq!(hotels.len(), 2, "{hotels:?}");
    assert!(
        hotels[1]["file_path"]
            .as_str()
            .unwrap()
            .ends_with("2026-11-03_hotels.csv"),
        "{hotels:?}"
    );
    assert!(
        t.lake()
            .join("audit/ingestion_run_log/hotels/0000000003.parquet")
            .exists()
    );
}

/// A write killed before its rename leaves a hidden `<name>#<n>` staging file on a local lake
/// (the object store lists none of them): gc removes it once older than the grace period, and
/// keeps a fresh one (a write in progress).
#[test]
fn gc_removes_staging_leftovers_of_killed_writes_after_the_grace_period() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    let run = t.query("SELECT run_id FROM audit.ingestion_run_log")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = t.lake().join(format!("bronze/hotels/run_id={run}"));
    let old = dir.join("part-00000.parquet#7");
    let fresh = t.lake().join("audit/row_failure_log/run_id=x/part-00000.parquet#2");
    std::fs::create_dir_all(fresh.parent().unwrap()).unwrap();
    std::fs::write(&old, vec![0u8; 100]).unwrap();
    std::fs::write(&fresh, b"in progress").unwrap();
    let f = std::fs::File::options().write(true).open(&old).unwrap();
    f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200))
        .unwrap();
    drop(f);
    let before = t.query("SELECT * FROM bronze.hotels ORDER BY hotel_code");

    let dry = t.run(&["gc", "--dry-run", "--grace", "30m"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let want = format!(
        "would remove bronze/hotels/run_id={run}/part-00000.parquet#7 (100 bytes): staging file of a write that never finished"
    );
    assert!(stdout(&dry).contains(&want), "{}", stdout(&dry));
    assert!(old.exists());
    let out = t.run(&["gc", "--grace", "30m"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!old.exists(), "the old staging file is gone");
    assert!(fresh.exists(), "a fresh one (a write in progress) stays");
    assert_eq!(t.query("SELECT * FROM bronze.hotels ORDER BY hotel_code"), before);
}
