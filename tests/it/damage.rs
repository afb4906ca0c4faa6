//! Damaged lake files: every committed data file is recorded with its size and CRC-32; a command
//! that meets a damaged one names it (with its table, its run or build and what to do), `ingot
//! doctor` reports it, `--verify` finds a changed byte, and `--fix` rebuilds what bronze can give
//! again (a silver snapshot) or drops what is a cache (segments).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::{TestLake, assert_ok, landing, repo, stderr, stdout};

fn ok(t: &TestLake, args: &[&str]) -> String {
    let out = t
        .command()
        .arg("--rules")
        .arg(repo().join("rules"))
        .args(args)
        .output()
        .unwrap();
    assert_ok(&out);
    stdout(&out)
}

/// The run ids of `source`, in commit order.
pub fn run_ids(t: &TestLake, source: &str) -> Vec<String> {
    t.query(&format!(
        "SELECT run_id FROM audit.ingestion_run_log WHERE source = '{source}' ORDER BY commit_seq"
    ))
    .iter()
    .map(|r| r["run_id"].as_str().unwrap().to_string())
    .collect()
}

fn truncate(path: &Path, keep: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(keep).unwrap();
}

/// Flip one byte in the middle of a file (its size stays).
fn flip_a_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

/// `ingot doctor` with the repository's rules and `args`: its exit code and everything it printed.
pub fn doctor(t: &TestLake, args: &[&str]) -> (Option<i32>, String) {
    let out = t
        .command()
        .arg("--rules")
        .arg(repo().join("rules"))
        .arg("doctor")
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), stdout(&out) + &stderr(&out))
}

#[test]
fn every_committed_file_is_recorded_with_its_size_and_crc32() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    ok(
        &t,
        &[
            "ingest",
            "hotels",
            landing("hotels/2026-11-01_hotels.csv").to_str().unwrap(),
        ],
    );
    ok(&t, &["build", "bookings"]);
    let rec = &t.query(
        "SELECT run_id, data_file_bytes, data_file_crc32, failure_file_bytes, failure_file_crc32 \
         FROM audit.ingestion_run_log WHERE source = 'bookings'",
    )[0];
    let run = rec["run_id"].as_str().unwrap();
    for (rel, bytes, crc) in [
        (
            format!("bronze/bookings/run_id={run}/part-00000.parquet"),
            "data_file_bytes",
            "data_file_crc32",
        ),
        (
            format!("audit/row_failure_log/run_id={run}/part-00000.parquet"),
            "failure_file_bytes",
            "failure_file_crc32",
        ),
    ] {
        let file = std::fs::read(t.lake().join(&rel)).unwrap();
        assert_eq!(rec[bytes], file.len() as u64, "{rel}");
        assert_eq!(rec[crc], format!("{:08x}", crc32fast::hash(&file)), "{rel}");
    }
    // the build's manifest stamps every file the build wrote into its folder
    let build = t.query("SELECT build_id FROM audit.silver_build_log")[0]["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = t.lake().join(format!("silver/bookings/build_id={build}"));
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_object().unwrap();
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".json"))
        .collect();
    on_disk.sort();
    assert_eq!(files.keys().cloned().collect::<Vec<_>>(), on_disk);
    for (name, stamp) in files {
        let file = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(stamp["bytes"], file.len() as u64, "{name}");
        assert_eq!(stamp["crc32"], crc32fast::hash(&file), "{name}");
    }
    let (code, said) = doctor(&t, &["--verify"]);
    assert_eq!(code, Some(0), "{said}");
}

/// A truncated bronze file of the first of three runs: a query names the file, its table and run,
/// and the runs to undo; doctor says the same and leaves the source's query checks alone; undoing
/// the runs and ingesting their files again gives the lake of one clean history.
#[test]
fn a_truncated_bronze_file_is_named_with_its_run_and_the_runs_to_undo() {
    let files: Vec<PathBuf> = [
        "bookings/2026-11-01_bookings.csv",
        "bookings/2026-11-03_bookings.csv",
        "bookings/2026-11-04_bookings_corrected.csv",
    ]
    .iter()
    .map(|f| landing(f))
    .collect();
    let t = TestLake::new();
    for f in &files {
        t.ingest_ok("bookings", f);
    }
    let before = t.query("SELECT * EXCLUDE (ingestion_run_id, ingested_at) FROM bronze.bookings_current ORDER BY natural_key_fingerprint");
    let runs = run_ids(&t, "bookings");
    let rel = format!("bronze/bookings/run_id={}/part-00000.parquet", runs[0]);
    truncate(&t.lake().join(&rel), 4096);

    let out = t.run(&["sql", "SELECT count(*) FROM bronze.bookings"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!(
            "{rel} (bronze.bookings, run {}): damaged: it is 4096 bytes, its run committed",
            runs[0]
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("(`ingot undo` {}, {}, {})", runs[2], runs[1], runs[0])),
        "{said}"
    );

    let (code, said) = doctor(&t, &[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!("files: {rel}: damaged (bronze.bookings, run {})", runs[0])),
        "{said}"
    );
    assert!(!said.contains("Corrupt footer"), "{said}");
    assert!(said.contains("1 violation"), "{said}");

    // the fix it names: undo newest first, then the files again in order
    for r in runs.iter().rev() {
        ok(&t, &["undo", r]);
    }
    for f in &files {
        t.ingest_ok("bookings", f);
    }
    let after = t.query("SELECT * EXCLUDE (ingestion_run_id, ingested_at) FROM bronze.bookings_current ORDER BY natural_key_fingerprint");
    assert_eq!(after, before);
    let (code, said) = doctor(&t, &["--verify"]);
    assert_eq!(code, Some(0), "{said}");
}

/// A changed byte in a silver snapshot file (its size unchanged): doctor without --verify cannot
/// see it, --verify names the file and build, --fix builds the table again from bronze, and the
/// table is what it was.
#[test]
fn a_changed_byte_in_a_silver_snapshot_is_found_by_verify_and_rebuilt_by_fix() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    ok(&t, &["build", "bookings"]);
    let want = t.query("SELECT * EXCLUDE (silver_build_id) FROM silver.bookings ORDER BY natural_key_fingerprint");
    let build = t.query("SELECT build_id FROM audit.silver_build_log")[0]["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    let rel = format!("silver/bookings/build_id={build}/part-00000.parquet");
    flip_a_byte(&t.lake().join(&rel));

    let (code, said) = doctor(&t, &["--verify"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "files: {rel}: damaged (silver.bookings, build {build}): its CRC-32 is"
        )),
        "{said}"
    );
    assert!(said.contains("`ingot build bookings --full`"), "{said}");

    let (code, said) = doctor(&t, &["--fix", "--verify"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!("replaces build {build}, whose snapshot had a damaged file")),
        "{said}"
    );
    let got = t.query("SELECT * EXCLUDE (silver_build_id) FROM silver.bookings ORDER BY natural_key_fingerprint");
    assert_eq!(got, want);
}

/// A truncated segment: doctor names it as a cache, --fix removes the source's segments, and
/// every query answers as before.
#[test]
fn a_truncated_segment_is_a_cache_fix_removes() {
    let t = TestLake::new();
    for f in ["bookings/2026-11-01_bookings.csv", "bookings/2026-11-03_bookings.csv"] {
        t.ingest_ok("bookings", &landing(f));
    }
    ok(&t, &["compact", "bookings", "--all"]);
    let q = "SELECT * FROM bronze.bookings_current ORDER BY natural_key_fingerprint";
    let want = t.query(q);
    let segs = t.lake().join("_cache/segments/bookings/files");
    let seg = std::fs::read_dir(&segs).unwrap().next().unwrap().unwrap().path();
    let len = std::fs::metadata(&seg).unwrap().len();
    truncate(&seg, len / 2);
    let (code, said) = doctor(&t, &[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("damaged (bronze.bookings, a segment): it is"), "{said}");
    assert!(said.contains("remove _cache/segments/bookings"), "{said}");
    let (code, said) = doctor(&t, &["--fix"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("fixed: removed _cache/segments/bookings"), "{said}");
    assert_eq!(t.query(q), want);
}
