//! `ingot doctor --fix` of a pull's damaged bronze file: derived again from the file the pull
//! kept in the lake (no request sent), byte for byte the file the run committed, for a first pull
//! and for a later pull of three updates; a kept file that is gone or whose records were altered
//! leaves the damaged file and says why.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::api_server::Server;
use crate::damage::{doctor, run_ids};
use crate::pull::{lake_with, pull, records, vendor};
use crate::util::TestLake;

fn bronze_rel(run: &str) -> String {
    format!("bronze/orders/run_id={run}/part-00000.parquet")
}

fn kept_rel(run: &str) -> String {
    format!("bronze/orders/run_id={run}/pull.ndjson.gz")
}

fn bronze_rows(t: &TestLake) -> Vec<std::collections::BTreeMap<String, serde_json::Value>> {
    t.query("SELECT * FROM bronze.orders ORDER BY ingested_at, source_row_number")
}

fn truncate(path: &Path, keep: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(keep).unwrap();
}

/// A lake with two loaded pulls of 25 orders: the first, then revision 2's three updates.
fn two_pulls() -> (Server, TestLake, Vec<String>) {
    let data = Arc::new(Mutex::new((records(25, 0), 0)));
    let server = Server::start(vendor(data.clone(), 10));
    let t = lake_with(&server, "");
    assert_eq!(pull(&t)["rows_inserted"], 25);
    *data.lock().unwrap() = (records(25, 2), 2);
    assert_eq!(pull(&t)["rows_updated"], 3);
    let runs = run_ids(&t, "orders");
    (server, t, runs)
}

#[test]
fn a_pulls_damaged_bronze_file_is_derived_again_from_its_kept_file_without_a_request() {
    let (server, t, runs) = two_pulls();
    let rows = bronze_rows(&t);
    for (victim, n) in [(1, 3), (0, 25)] {
        let run = &runs[victim];
        let rel = bronze_rel(run);
        let path = t.lake().join(&rel);
        let committed = std::fs::read(&path).unwrap();
        truncate(&path, 300);
        let (code, said) = doctor(&t, &[]);
        assert_eq!(code, Some(1), "{said}");
        assert!(
            said.contains(&format!("{rel}: damaged (bronze.orders, run {run})")),
            "{said}"
        );
        server.clear();
        let (code, said) = doctor(&t, &["--fix"]);
        assert_eq!(code, Some(0), "{said}");
        assert!(server.requests().is_empty(), "a repair sends no request");
        assert!(
            said.contains(&format!(
                "fixed: bronze.orders: re-derived run {run}'s file {rel} from its kept pull file "
            )),
            "{said}"
        );
        assert!(said.contains(&kept_rel(run)), "{said}");
        assert!(said.contains(&format!(" ({n} rows, CRC-32 matches)")), "{said}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            committed,
            "the run's file, byte for byte"
        );
        assert_eq!(bronze_rows(&t), rows);
        let (code, said) = doctor(&t, &["--verify"]);
        assert_eq!(code, Some(0), "{said}");
    }
}

#[test]
fn a_kept_pull_file_altered_or_gone_leaves_the_damaged_file_and_says_why() {
    let (_server, t, runs) = two_pulls();
    let run = &runs[1];
    let rel = bronze_rel(run);
    let path = t.lake().join(&rel);
    truncate(&path, 300);
    let damaged = std::fs::read(&path).unwrap();
    // one record's amount changed in the kept file: its records no longer hash to the run's
    let kept = t.lake().join(kept_rel(run));
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&kept).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let altered = text.replacen("\"amount\":\"13.99\"", "\"amount\":\"13.98\"", 1);
    assert_ne!(altered, text, "{text}");
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&kept).unwrap(), flate2::Compression::fast());
    gz.write_all(altered.as_bytes()).unwrap();
    gz.finish().unwrap();
    let (code, said) = doctor(&t, &["--fix"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "not fixed: {rel} (bronze.orders, run {run}): not re-derived: deriving it again from kept pull file "
        )),
        "{said}"
    );
    assert!(said.contains("no longer hash to its file_hash"), "{said}");
    assert_eq!(std::fs::read(&path).unwrap(), damaged, "the damaged file is left");
    std::fs::remove_file(&kept).unwrap();
    let (code, said) = doctor(&t, &["--fix"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "not fixed: {rel} (bronze.orders, run {run}): not re-derived: kept pull file "
        )),
        "{said}"
    );
    assert!(
        said.contains(" is gone: the pull's records can only be pulled again"),
        "{said}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), damaged, "the damaged file is left");
}

#[test]
fn doctor_finds_a_kept_pull_file_cut_short_altered_or_gone_and_the_tables_still_answer() {
    let (_server, t, runs) = two_pulls();
    let run = &runs[0];
    let rel = kept_rel(run);
    let kept = t.lake().join(&rel);
    let whole = std::fs::read(&kept).unwrap();
    let (code, said) = doctor(&t, &["--verify"]);
    assert_eq!(code, Some(0), "{said}");
    let owner = format!("the kept records of bronze.orders, run {run}");
    // cut short: its size is not the run's file_bytes
    std::fs::write(&kept, &whole[..whole.len() / 2]).unwrap();
    let (code, said) = doctor(&t, &[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "{rel}: damaged ({owner}): it is {} bytes, its run recorded {}",
            whole.len() / 2,
            whole.len()
        )),
        "{said}"
    );
    assert!(said.contains("nothing is lost"), "{said}");
    assert!(said.contains(&format!("`ingot undo` {}, {run}", runs[1])), "{said}");
    // a byte flipped in the compressed records, the size kept: only --verify reads it whole
    let mut flipped = whole.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x5a;
    std::fs::write(&kept, &flipped).unwrap();
    let (code, said) = doctor(&t, &[]);
    assert_eq!(code, Some(0), "{said}");
    let (code, said) = doctor(&t, &["--verify"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!("{rel}: damaged ({owner}): it is not whole gzip (")),
        "{said}"
    );
    // gone
    std::fs::remove_file(&kept).unwrap();
    let (code, said) = doctor(&t, &[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!("{rel}: damaged ({owner}): it is gone")),
        "{said}"
    );
    // the source still answers: the kept file is a copy
    assert_eq!(t.query("SELECT count(*) AS n FROM bronze.orders_current")[0]["n"], 25);
    std::fs::write(&kept, &whole).unwrap();
    let (code, said) = doctor(&t, &["--verify"]);
    assert_eq!(code, Some(0), "{said}");
}

/// A lake whose API source's contract lives in another folder (the demo's): doctor checks the
/// rest and says which source it could not read, instead of counting its files as empty.
#[test]
fn doctor_without_a_sources_contract_says_it_did_not_check_it_and_finds_nothing_amiss() {
    let (_server, t, _runs) = two_pulls();
    // the API source's contract moved out of the lake's contracts folder
    std::fs::rename(t.contracts().join("orders.yaml"), t.dir.path().join("orders.yaml")).unwrap();
    let (code, said) = doctor(&t, &["--verify"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "not checked: bronze.orders: the run log has runs of it and no contract in {} reads it",
            t.contracts().display()
        )),
        "{said}"
    );
    assert!(said.contains(" 0 violations"), "{said}");
}
