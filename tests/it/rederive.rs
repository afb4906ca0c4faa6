//! `ingot doctor --fix` derives a damaged bronze data file again from its run's landing file:
//! the same bytes as the file the run committed (so the same rows, stamps included), whether the
//! run was a first load, a corrected re-delivery with later runs after it, or a full delivery
//! with tombstones; a landing file that changed or is gone leaves the damaged file and says which
//! runs to undo; garbage of the same size is found by `--verify` and replaced; a crash on either
//! side of the replacement leaves a file `--fix` finishes.

use std::path::{Path, PathBuf};

use crate::damage::{doctor, run_ids};
use crate::util::{Rng, TestLake, landing, repo, stderr, stdout};

/// `ingot doctor` with `rules` and `args`: its exit code and everything it printed.
fn doctor_with(t: &TestLake, rules: &Path, args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut c = t.command();
    c.arg("--rules").arg(rules).arg("doctor").args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (out.status.code(), stdout(&out) + &stderr(&out))
}

fn bronze_rel(source: &str, run: &str) -> String {
    format!("bronze/{source}/run_id={run}/part-00000.parquet")
}

/// Every row of `bronze.<source>`, every column, in a stable order.
fn bronze_rows(t: &TestLake, source: &str) -> Vec<std::collections::BTreeMap<String, serde_json::Value>> {
    t.query(&format!(
        "SELECT * FROM bronze.{source} ORDER BY ingested_at, source_row_number, natural_key_fingerprint, is_deleted"
    ))
}

fn truncate(path: &Path, keep: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(keep).unwrap();
}

/// The bronze data file of every run of `source`, by run id, as bytes.
fn bronze_files(t: &TestLake, source: &str) -> Vec<(String, Vec<u8>)> {
    run_ids(t, source)
        .into_iter()
        .filter_map(|r| {
            let bytes = std::fs::read(t.lake().join(bronze_rel(source, &r))).ok()?;
            Some((r, bytes))
        })
        .collect()
}

/// A later delivery of bookings: the first `n` records of the corrected export, cancelled.
fn cancellations(t: &TestLake, n: usize) -> PathBuf {
    let text = std::fs::read_to_string(landing("bookings/2026-11-04_bookings_corrected.csv")).unwrap();
    let mut out = String::new();
    for (i, line) in text.lines().enumerate().take(n + 1) {
        out.push_str(&if i == 0 {
            line.to_string()
        } else {
            line.replace(",confirmed,", ",cancelled,")
        });
        out.push('\n');
    }
    let p = t.dir.path().join("2026-11-05_bookings_cancelled.csv");
    std::fs::write(&p, out).unwrap();
    p
}

/// Damage run `victim`'s file with `damage`, run `doctor --fix` (with `fix_args`), and check that
/// the file is again the one the run committed, byte for byte, that every other run's file is
/// untouched, that `bronze.<source>` is what it was, whole rows, and that `doctor --verify` is
/// clean. Returns what `--fix` printed.
fn damage_and_fix(
    t: &TestLake,
    rules: &Path,
    source: &str,
    victim: usize,
    damage: impl FnOnce(&Path),
    fix_args: &[&str],
) -> String {
    let runs = run_ids(t, source);
    let files = bronze_files(t, source);
    let rows = bronze_rows(t, source);
    let rel = bronze_rel(source, &runs[victim]);
    damage(&t.lake().join(&rel));
    assert_ne!(std::fs::read(t.lake().join(&rel)).unwrap(), files[victim].1, "damaged");

    let (code, said) = doctor_with(t, rules, fix_args, &[]);
    assert_eq!(code, Some(0), "{said}");
    let n = t.query(&format!(
        "SELECT rows_inserted + rows_updated + rows_deleted AS n FROM audit.ingestion_run_log WHERE run_id = '{}'",
        runs[victim]
    ))[0]["n"]
        .clone();
    let want = format!(
        "fixed: bronze.{source}: re-derived run {}'s file {rel} from its landing file ",
        runs[victim]
    );
    assert!(said.contains(&want), "{said}");
    assert!(said.contains(&format!(" ({n} rows, CRC-32 matches)")), "{said}");
    assert!(said.contains(" 0 violations"), "{said}");
    assert_eq!(
        bronze_files(t, source),
        files,
        "the run's file again, the others untouched"
    );
    assert_eq!(bronze_rows(t, source), rows);
    let (code, said) = doctor_with(t, rules, &["--verify"], &[]);
    assert_eq!(code, Some(0), "{said}");
    said
}

#[test]
fn a_truncated_first_load_is_derived_again_from_its_landing_file() {
    let t = TestLake::new();
    for f in ["bookings/2026-11-01_bookings.csv", "bookings/2026-11-03_bookings.csv"] {
        t.ingest_ok("bookings", &landing(f));
    }
    let current = t.query("SELECT * FROM bronze.bookings_current ORDER BY natural_key_fingerprint");
    let rules = repo().join("rules");
    damage_and_fix(&t, &rules, "bookings", 0, |p| truncate(p, 4096), &["--fix"]);
    assert_eq!(
        t.query("SELECT * FROM bronze.bookings_current ORDER BY natural_key_fingerprint"),
        current
    );
}

/// A corrected re-delivery (only its changed records are written) in the middle: it is derived
/// against the runs before it, not the later run that cancelled some of the same bookings.
#[test]
fn a_corrected_redelivery_with_a_later_run_is_derived_as_of_its_own_slot() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    t.ingest_ok("bookings", &cancellations(&t, 40));
    let counts = t.query(
        "SELECT rows_updated, rows_unchanged FROM audit.ingestion_run_log WHERE source = 'bookings' ORDER BY commit_seq",
    );
    for i in [1, 2] {
        assert!(counts[i]["rows_updated"].as_i64().unwrap() > 0, "{counts:?}");
        assert!(counts[i]["rows_unchanged"].as_i64().unwrap() > 0, "{counts:?}");
    }
    let rules = repo().join("rules");
    damage_and_fix(&t, &rules, "bookings", 1, |p| truncate(p, 100), &["--fix"]);
}

/// The partitioned (spilling) change detection derives the same file as the in-memory index,
/// whichever of the two the ingest used.
#[test]
fn partitioned_change_detection_derives_the_same_file() {
    for (ingest, fix) in [(true, true), (false, true), (true, false)] {
        let t = if ingest {
            TestLake::partitioned()
        } else {
            TestLake::new()
        };
        t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
        t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
        let files = bronze_files(&t, "bookings");
        let rel = bronze_rel("bookings", &files[1].0);
        truncate(&t.lake().join(&rel), 100);
        let budget = if fix { "1K" } else { "1G" };
        let mut c = t.command();
        c.arg("--rules").arg(repo().join("rules")).args(["doctor", "--fix"]);
        let out = c.env("INGOT_INDEX_MEMORY", budget).output().unwrap();
        let said = stdout(&out) + &stderr(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "ingest partitioned {ingest}, fix {fix}: {said}"
        );
        assert!(said.contains("CRC-32 matches"), "{said}");
        assert_eq!(
            bronze_files(&t, "bookings"),
            files,
            "ingest partitioned {ingest}, fix {fix}"
        );
    }
}

/// The log as the run's ingest read it: a run before it that was undone later still counts
/// (the run's updates were made against it), which the log's latest state no longer shows.
#[test]
fn a_run_whose_predecessor_was_undone_later_is_derived_against_the_log_of_its_own_time() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    let first = run_ids(&t, "bookings").remove(0);
    let out = t.run(&["undo", &first]);
    crate::util::assert_ok(&out);
    // the undo's record is the newest: the corrected run comes first in commit order now
    let victim = run_ids(&t, "bookings").iter().position(|r| *r != first).unwrap();
    let rules = repo().join("rules");
    damage_and_fix(&t, &rules, "bookings", victim, |p| truncate(p, 100), &["--fix"]);
}

/// A full delivery that deleted a record (a tombstone), rejected one and had a natural-key
/// conflict, with a later full delivery after it.
#[test]
fn a_full_delivery_with_tombstones_is_derived_again() {
    use crate::deletions::{MONDAY, TUESDAY, file, lake, ok};
    let t = lake("full");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    let said = t.ingest_ok("customers", &file(&t, "tue.csv", TUESDAY));
    assert!(said.contains("1 deleted"), "{said}");
    let wednesday = ["EU,c1,Ann,11", "US,c1,Cid,31", "US,c3,Dee,40", "US,c4,Eve,53"];
    t.ingest_ok("customers", &file(&t, "wed.csv", &wednesday));
    ok(&t, &["build", "customers"]);
    let rules = t.dir.path().join("rules");
    damage_and_fix(&t, &rules, "customers", 1, |p| truncate(p, 10), &["--fix"]);
}

/// Garbage of the file's own size: only `--verify` sees it (its CRC-32), and `--fix --verify`
/// derives the file again.
#[test]
fn garbage_of_the_same_size_is_found_by_verify_and_derived_again() {
    let t = TestLake::new();
    for f in [
        "bookings/2026-11-01_bookings.csv",
        "bookings/2026-11-04_bookings_corrected.csv",
    ] {
        t.ingest_ok("bookings", &landing(f));
    }
    let garbage = |p: &Path| {
        let len = std::fs::metadata(p).unwrap().len();
        let mut rng = Rng(7);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        std::fs::write(p, bytes).unwrap();
    };
    let rules = repo().join("rules");
    damage_and_fix(&t, &rules, "bookings", 0, garbage, &["--fix", "--verify"]);
}

/// A landing file that changed, then one that is gone: nothing is touched, and `--fix` says why
/// and which run to undo.
#[test]
fn a_changed_or_missing_landing_file_leaves_the_damaged_file_and_names_the_undo() {
    let t = TestLake::new();
    let drop = t.dir.path().join("landing");
    std::fs::create_dir_all(&drop).unwrap();
    let copy = drop.join("2026-11-01_bookings.csv");
    std::fs::copy(landing("bookings/2026-11-01_bookings.csv"), &copy).unwrap();
    t.ingest_ok("bookings", &copy);
    let run = run_ids(&t, "bookings").remove(0);
    let rel = bronze_rel("bookings", &run);
    truncate(&t.lake().join(&rel), 4096);

    let mut text = std::fs::read_to_string(&copy).unwrap();
    text.push_str(
        "BK999999,MAD01,x@example.org,bcom,confirmed,2026-11-08,2026-11-12,4,1.00,EUR,,2026-11-01T02:00:00Z\n",
    );
    std::fs::write(&copy, text).unwrap();
    let undo = format!(
        "`ingot undo {run}`, then ingest its file again (`ingot ingest bookings {}`)",
        copy.display()
    );
    let (code, said) = doctor(&t, &["--fix"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "not fixed: {rel} (bronze.bookings, run {run}): not re-derived: landing file {} has changed: its SHA-256 is now ",
            copy.display()
        )),
        "{said}"
    );
    assert!(said.contains(", the run loaded "), "{said}");
    assert!(said.contains(&format!("…; {undo}")), "{said}");
    assert!(
        said.contains(&format!("files: {rel}: damaged (bronze.bookings, run {run})")),
        "{said}"
    );
    assert_eq!(
        std::fs::metadata(t.lake().join(&rel)).unwrap().len(),
        4096,
        "left as it was"
    );

    std::fs::remove_file(&copy).unwrap();
    let (code, said) = doctor(&t, &["--fix"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "not fixed: {rel} (bronze.bookings, run {run}): not re-derived: landing file {} is gone; {undo}",
            copy.display()
        )),
        "{said}"
    );
    assert_eq!(
        std::fs::metadata(t.lake().join(&rel)).unwrap().len(),
        4096,
        "left as it was"
    );
}

/// A crash before the derived file replaces the damaged one leaves the damaged file; a crash
/// after it leaves the right one; either way `--fix` again ends with a clean lake.
#[test]
fn a_crash_on_either_side_of_the_replacement_is_finished_by_fix_again() {
    for point in ["doctor.before_replace", "doctor.after_replace"] {
        let t = TestLake::new();
        for f in ["bookings/2026-11-01_bookings.csv", "bookings/2026-11-03_bookings.csv"] {
            t.ingest_ok("bookings", &landing(f));
        }
        let files = bronze_files(&t, "bookings");
        let rows = bronze_rows(&t, "bookings");
        let rel = bronze_rel("bookings", &files[0].0);
        truncate(&t.lake().join(&rel), 4096);
        let rules = repo().join("rules");
        let (code, said) = doctor_with(&t, &rules, &["--fix"], &[("INGOT_FAILPOINT", point)]);
        assert_ne!(code, Some(0), "{point}: {said}");
        let now = std::fs::read(t.lake().join(&rel)).unwrap();
        match point {
            "doctor.before_replace" => assert_eq!(now.len(), 4096, "{point}: the damaged file stays"),
            _ => assert_eq!(now, files[0].1, "{point}: the right file"),
        }
        let (code, said) = doctor(&t, &["--fix"]);
        assert_eq!(code, Some(0), "{point}: {said}");
        assert_eq!(bronze_files(&t, "bookings"), files, "{point}");
        assert_eq!(bronze_rows(&t, "bookings"), rows, "{point}");
        let (code, said) = doctor(&t, &["--verify"]);
        assert_eq!(code, Some(0), "{point}: {said}");
    }
}
