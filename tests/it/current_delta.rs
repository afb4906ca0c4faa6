//! `bronze/<source>/_current`, the current versions as a Delta table with deletion vectors:
//! DuckDB and deltalake read exactly `bronze.<source>_current` through full deliveries that
//! delete, a deleted key delivered again, an undo of the deleting run, a rekey, a table removed
//! by hand and a commit edited to lie; a run of only new records appends one add without a vector.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::deletions::{MONDAY, file, lake, ok, runs};
use crate::delta::{Check, assert_agree, compare};
use crate::util::TestLake;

fn current_table(t: &TestLake) -> PathBuf {
    t.lake().join("bronze/customers/_current")
}

/// `_current` read through DuckDB and deltalake equals ingot's `bronze.customers_current`.
fn agree(t: &TestLake, context: &str) {
    let table = current_table(t);
    let checks = [Check::table(
        "current",
        "SELECT * FROM bronze.customers_current",
        table.to_str().unwrap().to_string(),
        &["duckdb", "deltalake"],
        &["natural_key_fingerprint"],
    )];
    let cmd = || t.command();
    let result = compare(&cmd, t.dir.path(), &checks, None);
    assert_agree(&result, &[], context);
}

/// The table's latest commit: its adds (path, deletion-vector cardinality) and removes.
fn last_commit(table: &Path) -> (Vec<(String, i64)>, Vec<String>) {
    let mut commits: Vec<PathBuf> = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    commits.sort();
    let text = std::fs::read_to_string(commits.last().unwrap()).unwrap();
    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(a) = v.get("add") {
            let n = a["deletionVector"]["cardinality"].as_i64().unwrap_or(0);
            adds.push((a["path"].as_str().unwrap().to_string(), n));
        }
        if let Some(r) = v.get("remove") {
            removes.push(r["path"].as_str().unwrap().to_string());
        }
    }
    adds.sort();
    (adds, removes)
}

fn run_ids(t: &TestLake) -> Vec<String> {
    runs(t)
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect()
}

fn file_of(run: &str) -> String {
    format!("../run_id={run}/part-00000.parquet")
}

fn doctor(t: &TestLake) -> String {
    let out = t.command().arg("doctor").output().unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn the_current_delta_table_reads_as_bronze_current_through_deletions_an_undo_and_a_rekey() {
    let t = lake("full");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    let monday = run_ids(&t)[0].clone();
    // a run of new records only: one add, no vector, nothing read or removed
    assert_eq!(last_commit(&current_table(&t)), (vec![(file_of(&monday), 0)], vec![]));
    agree(&t, "after the first delivery");

    // Bob is gone (a tombstone), Cid changed, Fay is new
    let tuesday_rows = [
        "EU,c1,Ann,10",
        "US,c1,Cid,31",
        "US,c3,Dee,40",
        "US,c4,Eve,50",
        "EU,c5,Fay,60",
    ];
    t.ingest_ok("customers", &file(&t, "tue.csv", &tuesday_rows));
    let tuesday = run_ids(&t)[1].clone();
    let (adds, _) = last_commit(&current_table(&t));
    let mut want = vec![(file_of(&monday), 2), (file_of(&tuesday), 1)];
    want.sort();
    assert_eq!(
        adds, want,
        "Bob's and Cid's Monday versions, and Bob's tombstone, are not current"
    );
    agree(&t, "after a full delivery that deleted and updated");

    // Bob comes back: an insert, appended without reading a file
    let mut wednesday_rows = tuesday_rows.to_vec();
    wednesday_rows.push("EU,c2,Bob,21");
    t.ingest_ok("customers", &file(&t, "wed.csv", &wednesday_rows));
    let wednesday = run_ids(&t)[2].clone();
    assert_eq!(
        last_commit(&current_table(&t)),
        (vec![(file_of(&wednesday), 0)], vec![])
    );
    agree(&t, "after a deleted key was delivered again");

    ok(&t, &["undo", &tuesday]);
    let (adds, removes) = last_commit(&current_table(&t));
    assert!(removes.contains(&file_of(&tuesday)), "{removes:?}");
    assert!(!adds.iter().any(|(p, _)| *p == file_of(&tuesday)), "{adds:?}");
    agree(&t, "after an undo of the deleting run");
    assert!(!doctor(&t).contains("_current"), "{}", doctor(&t));
    // Bob counts once: the newest remaining version (Wednesday's), not Monday's beside it
    let bob = t.query("SELECT name, credit, ingestion_run_id FROM bronze.customers_current WHERE customer_id = 'c2'");
    assert_eq!(
        bob,
        vec![
            serde_json::json!({"name": "Bob", "credit": 21, "ingestion_run_id": wednesday})
                .as_object()
                .unwrap()
                .clone()
                .into_iter()
                .collect()
        ],
        "{bob:?}"
    );

    // a new natural key: every current record written again; nothing before it is current
    let rekeyed = crate::deletions::contract("full", 2, "customer_id, region");
    crate::deletions::set_contract(&t, &rekeyed);
    ok(&t, &["rekey", "customers"]);
    let rekey = run_ids(&t).last().unwrap().clone();
    let (adds, _) = last_commit(&current_table(&t));
    assert_eq!(
        adds.iter().filter(|(p, _)| *p == file_of(&rekey)).count(),
        1,
        "{adds:?}"
    );
    agree(&t, "after a rekey");
}

#[test]
fn a_current_table_removed_or_edited_by_hand_is_reported_and_rebuilt_from_the_run_log() {
    let t = lake("full");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    let tuesday_rows = ["EU,c1,Ann,11", "US,c1,Cid,30", "US,c3,Dee,40", "US,c4,Eve,50"];
    t.ingest_ok("customers", &file(&t, "tue.csv", &tuesday_rows));
    agree(&t, "before the damage");
    let table = current_table(&t);

    // a commit edited to drop a vector: the table would show Ann twice
    let mut commits: Vec<PathBuf> = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    commits.sort();
    let last = commits.last().unwrap();
    let text = std::fs::read_to_string(last).unwrap();
    let edited: Vec<String> = text
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if let Some(a) = v.get_mut("add").and_then(Value::as_object_mut) {
                a.remove("deletionVector");
            }
            v.to_string()
        })
        .collect();
    assert_ne!(edited.join("\n") + "\n", text, "the commit had a vector to drop");
    std::fs::write(last, edited.join("\n") + "\n").unwrap();
    std::fs::remove_dir_all(t.lake().join("_cache/delta")).ok();
    let said = doctor(&t);
    assert!(
        said.lines().any(|l| l.contains("bronze/customers/_current")
            && l.contains("in the Delta table, not in customers's current versions")),
        "{said}"
    );
    ok(&t, &["delta", "sync"]);
    agree(&t, "after delta sync repaired an edited commit");
    assert!(!doctor(&t).contains("_current"), "{}", doctor(&t));

    // the whole table removed: reported as not published, and the next commit rebuilds it
    std::fs::remove_dir_all(&table).unwrap();
    std::fs::remove_dir_all(t.lake().join("_cache/delta")).ok();
    let said = doctor(&t);
    assert!(
        said.lines()
            .any(|l| l.contains("bronze/customers/_current") && l.contains("no Delta table yet")),
        "{said}"
    );
    let wednesday_rows = ["EU,c1,Ann,11", "US,c1,Cid,30", "US,c3,Dee,40"];
    t.ingest_ok("customers", &file(&t, "wed.csv", &wednesday_rows));
    agree(&t, "after the next ingest rebuilt a removed table");
    assert!(!doctor(&t).contains("_current"), "{}", doctor(&t));
}
