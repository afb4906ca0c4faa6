//! Deletions from full snapshots (`delivery: full`): a current record whose natural key a full
//! file lacks gets a tombstone version written by that run, leaves `_current` and, at the next
//! build, silver (incremental equal to full); rejected rows and conflicting rows keep their keys;
//! `delivery: incremental` never deletes; undo brings the records back; a deleted key delivered
//! again is inserted; a re-sent file is skipped; a crash at every ingest failpoint of a deleting
//! run, then the same command, equals one clean run (in memory and partitioned).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::util::{TestLake, assert_ok, id_names, normalize_rows, sha256_hex, stdout};

pub type Row = BTreeMap<String, Value>;

/// A contract for a small customer master data source keyed by (region, customer_id).
pub fn contract(delivery: &str, key_version: i64, key_fields: &str) -> String {
    format!(
        "source: customers
version: 1
description: Customer master data, sent whole every night.
format: csv
delivery: {delivery}
fields:
  - name: region
    type: string
    required: true
    normalize: [trim, upper]
  - name: customer_id
    type: string
    required: true
    normalize: [trim]
  - name: name
    type: string
  - name: credit
    type: int64
    min: 0
natural_key:
  version: {key_version}
  fields: [{key_fields}]
"
    )
}

const RULES: &str = "table: customers
source: customers
version: 1
description: Names in capitals; customers without credit are dropped.
steps:
  - set: name
    expr: \"upper(name)\"
  - filter: \"credit IS NOT NULL\"
";

/// A lake with the customers contract (and the repository's contracts) and its rules.
pub fn lake(delivery: &str) -> TestLake {
    lake_with(TestLake::new(), delivery)
}

pub fn lake_with(t: TestLake, delivery: &str) -> TestLake {
    set_contract(&t, &contract(delivery, 1, "region, customer_id"));
    let rules = t.dir.path().join("rules/customers");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("v1.yaml"), RULES).unwrap();
    t
}

pub fn set_contract(t: &TestLake, text: &str) {
    std::fs::write(t.contracts().join("customers.yaml"), text).unwrap();
}

/// A landing file of `rows` (after the header). Its path depends only on its name and contents
/// (two lakes given the same files record the same `file_path`); written once, atomically.
pub fn file(_t: &TestLake, name: &str, rows: &[&str]) -> PathBuf {
    let mut text = String::from("region,customer_id,name,credit\n");
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    let dir = std::env::temp_dir()
        .join("ingot-it-customers")
        .join(&sha256_hex(text.as_bytes())[..16]);
    let p = dir.join(name);
    if !p.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = tempfile::NamedTempFile::new_in(&dir).unwrap();
        std::fs::write(tmp.path(), &text).unwrap();
        tmp.persist(&p).unwrap();
    }
    p
}

/// A lake whose ingests use the partitioned change detection even for these small files.
pub fn partitioned() -> TestLake {
    let mut t = TestLake::new();
    t.envs.push(("INGOT_INDEX_MEMORY".into(), "64".into()));
    t
}

/// Run ingot with the lake's rules directory.
pub fn ingot(t: &TestLake, args: &[&str]) -> std::process::Output {
    t.command()
        .arg("--rules")
        .arg(t.dir.path().join("rules"))
        .args(args)
        .output()
        .unwrap()
}

pub fn ok(t: &TestLake, args: &[&str]) -> String {
    let out = ingot(t, args);
    assert_ok(&out);
    stdout(&out)
}

pub const MONDAY: &[&str] = &[
    "EU,c1,Ann,10",
    "EU,c2,Bob,20",
    "US,c1,Cid,30",
    "US,c3,Dee,40",
    "US,c4,Eve,50",
];
/// Bob (EU,c2) is gone, Cid changed, Dee's row is rejected (credit below 0) and Eve's key comes
/// twice with different contents (a natural-key conflict): neither Dee nor Eve is deleted.
pub const TUESDAY: &[&str] = &[
    "EU,c1,Ann,10",
    "US,c1,Cid,31",
    "US,c3,Dee,-5",
    "US,c4,Eve,51",
    "US,c4,Eve,52",
];

/// Bronze rows in a stable order with ids and times named, as the tests compare them.
pub fn bronze(t: &TestLake, table: &str) -> Vec<Row> {
    normalize_rows(
        t.query(&format!(
            "SELECT * FROM {table} ORDER BY ingested_at, source_row_number, natural_key_fingerprint"
        )),
        &id_names(t),
    )
}

fn pick(rows: &[Row], cols: &[&str]) -> Vec<Vec<Value>> {
    rows.iter()
        .map(|r| cols.iter().map(|c| r.get(*c).cloned().unwrap_or(Value::Null)).collect())
        .collect()
}

pub fn runs(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id")
}

fn doctor_clean(t: &TestLake) {
    let said = ok(t, &["doctor"]);
    assert!(said.contains(" 0 violations"), "{said}");
}

#[test]
fn a_full_delivery_writes_tombstones_for_the_absent_keys_only() {
    let t = lake("full");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    let said = t.ingest_ok("customers", &file(&t, "tue.csv", TUESDAY));
    assert!(said.contains("1 deleted (not in this full delivery)"), "{said}");

    let rows = bronze(&t, "bronze.customers");
    let cols = [
        "ingestion_run_id",
        "region",
        "customer_id",
        "name",
        "credit",
        "source_row_number",
        "is_deleted",
        "previous_natural_key_fingerprint",
    ];
    let monday = |r, c, n, k, no| json!(["run#0", r, c, n, k, no, false, null]);
    assert_eq!(
        pick(&rows, &cols),
        vec![
            monday("EU", "c1", "Ann", 10, 1),
            monday("EU", "c2", "Bob", 20, 2),
            monday("US", "c1", "Cid", 30, 3),
            monday("US", "c3", "Dee", 40, 4),
            monday("US", "c4", "Eve", 50, 5),
            json!(["run#1", "US", "c1", "Cid", 31, 2, false, null]),
            // the tombstone: the key fields of the record's last version, nothing else
            json!(["run#1", "EU", "c2", null, null, null, true, null]),
        ]
        .into_iter()
        .map(|v| v.as_array().unwrap().clone())
        .collect::<Vec<_>>()
    );
    // the tombstone carries the record's fingerprint, no row hash, and the run's stamps
    let bob = &rows[1];
    let tomb = &rows[6];
    assert_eq!(tomb["natural_key_fingerprint"], bob["natural_key_fingerprint"]);
    assert_eq!(tomb.get("row_hash"), None, "row_hash is null");
    assert_eq!(tomb["file_hash"], rows[5]["file_hash"]);
    assert_eq!(tomb["natural_key_version"], json!(1));
    // _current: Bob is gone; Dee and Eve (bad rows today) keep their Monday versions
    let current = t.query("SELECT region, customer_id, name, credit FROM bronze.customers_current ORDER BY 1, 2");
    assert_eq!(
        Value::from(current.into_iter().map(|r| json!(r)).collect::<Vec<_>>()),
        json!([
            {"region": "EU", "customer_id": "c1", "name": "Ann", "credit": 10},
            {"region": "US", "customer_id": "c1", "name": "Cid", "credit": 31},
            {"region": "US", "customer_id": "c3", "name": "Dee", "credit": 40},
            {"region": "US", "customer_id": "c4", "name": "Eve", "credit": 50},
        ])
    );
    // the run record: seen = inserted + updated + unchanged + failed; the file holds
    // inserted + updated + deleted rows
    let r = &runs(&t)[1];
    let counts: Vec<&Value> = [
        "rows_seen",
        "rows_inserted",
        "rows_updated",
        "rows_unchanged",
        "rows_failed",
        "rows_deleted",
    ]
    .iter()
    .map(|c| &r[*c])
    .collect();
    assert_eq!(
        counts,
        [&json!(5), &json!(0), &json!(1), &json!(1), &json!(3), &json!(1)]
    );
    assert_eq!(r["status"], json!("succeeded_with_failures"));
    let failures = t.query("SELECT source_row_number, rule FROM audit.row_failure_log ORDER BY 1");
    assert_eq!(
        failures,
        vec![
            BTreeMap::from([
                ("source_row_number".into(), json!(3)),
                ("rule".into(), json!("min:credit"))
            ]),
            BTreeMap::from([
                ("source_row_number".into(), json!(4)),
                ("rule".into(), json!("natural_key_conflict"))
            ]),
            BTreeMap::from([
                ("source_row_number".into(), json!(5)),
                ("rule".into(), json!("natural_key_conflict"))
            ]),
        ]
    );
    doctor_clean(&t);
}

#[test]
fn an_incremental_delivery_never_deletes() {
    let t = lake("incremental");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    let said = t.ingest_ok("customers", &file(&t, "tue.csv", TUESDAY));
    assert!(!said.contains("deleted"), "{said}");
    assert_eq!(runs(&t)[1]["rows_deleted"], json!(0));
    let tombstones = t.query("SELECT count(*) AS n FROM bronze.customers WHERE is_deleted");
    assert_eq!(tombstones[0]["n"], json!(0));
    let bob = t.query("SELECT name FROM bronze.customers_current WHERE customer_id = 'c2'");
    assert_eq!(bob, vec![BTreeMap::from([("name".into(), json!("Bob"))])]);
}

/// Silver rows without the build id (which only says which build wrote a kept row).
fn silver(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM silver.customers ORDER BY natural_key_fingerprint")
        .into_iter()
        .map(|mut r| {
            r.remove("silver_build_id");
            r
        })
        .collect()
}

#[test]
fn a_deleted_record_leaves_silver_at_the_next_incremental_build_as_at_a_full_build() {
    let t = lake("full");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    ok(&t, &["build", "customers"]);
    let monday = silver(&t);
    assert_eq!(monday.len(), 5);
    t.ingest_ok("customers", &file(&t, "tue.csv", TUESDAY));
    // doctor sees silver lag behind bronze until the next build
    let out = ingot(&t, &["doctor"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("silver: silver.customers: 1 fingerprints are not current"),
        "{}",
        stdout(&out)
    );

    ok(&t, &["build", "customers"]);
    let incremental = silver(&t);
    let names: Vec<&Value> = incremental.iter().map(|r| &r["name"]).collect();
    assert_eq!(incremental.len(), 4);
    assert!(!names.contains(&&json!("BOB")), "{names:?}");
    // the same as a full build of this lake and of a lake that got the same files
    ok(&t, &["build", "customers", "--full"]);
    assert_eq!(silver(&t), incremental);
    let other = lake("full");
    other.ingest_ok("customers", &file(&other, "mon.csv", MONDAY));
    other.ingest_ok("customers", &file(&other, "tue.csv", TUESDAY));
    ok(&other, &["build", "customers"]);
    let strip = |rows: Vec<Row>| -> Vec<Row> {
        rows.into_iter()
            .map(|mut r| {
                r.remove("ingestion_run_id");
                r
            })
            .collect()
    };
    assert_eq!(strip(silver(&other)), strip(incremental));
    doctor_clean(&t);
}

#[test]
fn undo_of_a_deleting_run_brings_the_deleted_records_back() {
    let want = lake("full");
    want.ingest_ok("customers", &file(&want, "mon.csv", MONDAY));
    ok(&want, &["build", "customers"]);

    let t = lake("full");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    ok(&t, &["build", "customers"]);
    t.ingest_ok("customers", &file(&t, "tue.csv", TUESDAY));
    ok(&t, &["build", "customers"]);
    let tuesday = runs(&t)[1]["run_id"].as_str().unwrap().to_string();
    let said = ok(&t, &["undo", &tuesday]);
    assert!(said.contains("1 deleted records are back"), "{said}");
    for table in ["bronze.customers", "bronze.customers_current"] {
        assert_eq!(bronze(&t, table), bronze(&want, table), "{table}");
    }
    ok(&t, &["build", "customers"]);
    let strip = |rows: Vec<Row>| -> Vec<Row> {
        rows.into_iter()
            .map(|mut r| {
                r.remove("ingestion_run_id");
                r
            })
            .collect()
    };
    assert_eq!(strip(silver(&t)), strip(silver(&want)));
    doctor_clean(&t);
}

#[test]
fn a_deleted_key_delivered_again_is_inserted_and_a_resent_file_is_skipped() {
    let t = lake("full");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    let tue = file(&t, "tue.csv", TUESDAY);
    t.ingest_ok("customers", &tue);
    // the same Tuesday file again: skipped by its hash, nothing deleted twice
    let said = t.ingest_ok("customers", &tue);
    assert!(said.contains("skipped, identical"), "{said}");
    // Wednesday: Bob is back (changed), Ann is gone
    let wed = file(
        &t,
        "wed.csv",
        &["EU,c2,Bob,25", "US,c1,Cid,31", "US,c3,Dee,40", "US,c4,Eve,50"],
    );
    let said = t.ingest_ok("customers", &wed);
    assert!(
        said.contains("1 inserted, 0 updated, 3 unchanged, 0 failed; 1 deleted"),
        "{said}"
    );
    let current = t.query("SELECT region, customer_id, name, credit FROM bronze.customers_current ORDER BY 1, 2");
    let got: Vec<(String, i64)> = current
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), r["credit"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        got,
        [("Bob", 25), ("Cid", 31), ("Dee", 40), ("Eve", 50)]
            .map(|(n, c)| (n.to_string(), c))
            .to_vec()
    );
    let versions = bronze(&t, "bronze.customers");
    let bob: Vec<Vec<Value>> = pick(&versions, &["ingestion_run_id", "customer_id", "name", "is_deleted"])
        .into_iter()
        .filter(|r| r[1] == json!("c2"))
        .collect();
    assert_eq!(
        bob,
        vec![
            vec![json!("run#0"), json!("c2"), json!("Bob"), json!(false)],
            vec![json!("run#1"), json!("c2"), Value::Null, json!(true)],
            vec![json!("run#3"), json!("c2"), json!("Bob"), json!(false)],
        ]
    );
    doctor_clean(&t);
}

#[test]
fn partitioned_change_detection_deletes_the_same_records() {
    let steps = |t: &TestLake| {
        t.ingest_ok("customers", &file(t, "mon.csv", MONDAY));
        t.ingest_ok("customers", &file(t, "tue.csv", TUESDAY));
        t.ingest_ok("customers", &file(t, "wed.csv", &["EU,c2,Bob,25", "US,c3,Dee,40"]));
    };
    // Wednesday deletes 3 of the 4 current records: past the default hold.max_delete_fraction
    let no_hold = contract("full", 1, "region, customer_id").replace(
        "delivery: full\n",
        "delivery: full\nhold:\n  max_delete_fraction: off\n",
    );
    let memory = lake("full");
    set_contract(&memory, &no_hold);
    steps(&memory);
    let partitioned = lake_with(partitioned(), "full");
    set_contract(&partitioned, &no_hold);
    steps(&partitioned);
    partitioned
        .snapshot(&["customers"])
        .assert_same(&memory.snapshot(&["customers"]), "partitioned vs in-memory");
    // Wednesday lacks Ann, Cid and Eve
    assert_eq!(runs(&memory)[2]["rows_deleted"], json!(3));
}

#[test]
fn every_ingest_failpoint_of_a_deleting_run_then_rerun_equals_one_clean_run() {
    crash_at_every_failpoint(TestLake::new);
}

#[test]
fn every_ingest_failpoint_of_a_deleting_run_partitioned() {
    crash_at_every_failpoint(partitioned);
}

fn crash_at_every_failpoint(new_lake: fn() -> TestLake) {
    let clean = |again: bool| {
        let t = lake_with(new_lake(), "full");
        t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
        let tue = file(&t, "tue.csv", TUESDAY);
        t.ingest_ok("customers", &tue);
        if again {
            t.ingest_ok("customers", &tue);
        }
        t.snapshot(&["customers"])
    };
    let (once, then_skip) = (clean(false), clean(true));
    for point in ingot::table::failpoint::INGEST {
        let t = lake_with(new_lake(), "full");
        t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
        let before = t.snapshot(&["customers"]);
        let tue = file(&t, "tue.csv", TUESDAY);
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .args(["ingest", "customers"])
            .arg(&tue)
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&format!("failpoint {point} reached")),
            "{point}: failpoint never reached: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let committed = *point == "ingest.after_commit";
        if !committed {
            t.snapshot(&["customers"])
                .assert_same(&before, &format!("{point}: nothing of the crashed run may be visible"));
        }
        t.ingest_ok("customers", &tue);
        let want = if committed { &then_skip } else { &once };
        t.snapshot(&["customers"])
            .assert_same(want, &format!("{point}: crash + re-run"));
    }
}

#[test]
fn an_unknown_delivery_is_a_located_error_listing_the_choices() {
    let t = lake("weekly");
    let out = ingot(&t, &["check"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let said = format!("{}{}", stdout(&out), crate::util::stderr(&out));
    assert!(
        said.contains("customers.yaml:5:11: delivery must be one of: incremental, full; found \"weekly\""),
        "{said}"
    );
}

/// `bronze.<source>_current` ranks only the versions of the runs that updated or deleted
/// records: an anti join of every version onto the highest slot per key of those few rows, which
/// go into a hash table. The view holds the right rows through a deletion, a key delivered again
/// after it, updates, a conflict and a rejected row; a source whose runs only inserted is a scan.
#[test]
fn the_current_view_ranks_only_the_versions_of_the_updating_runs() {
    let t = lake("full");
    let wednesday = [
        "EU,c1,Ann,10",
        "EU,c2,Bob,21",
        "US,c1,Cid,31",
        "US,c3,Dee,40",
        "US,c4,Eve,53",
    ];
    let thursday = ["EU,c2,Bob,21", "US,c1,Cid,32", "US,c3,Dee,40", "US,c4,Eve,53"];
    for (name, rows) in [
        ("mon.csv", MONDAY),
        ("tue.csv", TUESDAY),
        ("wed.csv", &wednesday[..]),
        ("thu.csv", &thursday[..]),
    ] {
        ok(&t, &["ingest", "customers", file(&t, name, rows).to_str().unwrap()]);
    }
    let q = "SELECT region, customer_id, name, credit FROM bronze.customers_current ORDER BY region, customer_id";
    let want: Vec<Vec<Value>> = [
        ("EU", "c2", "Bob", 21),
        ("US", "c1", "Cid", 32),
        ("US", "c3", "Dee", 40),
        ("US", "c4", "Eve", 53),
    ]
    .iter()
    .map(|(r, c, n, k)| vec![Value::from(*r), Value::from(*c), Value::from(*n), Value::from(*k)])
    .collect();
    assert_eq!(pick(&t.query(q), &["region", "customer_id", "name", "credit"]), want);
    let plan = ok(&t, &["sql", &format!("EXPLAIN {q}"), "--format", "csv"]);
    assert!(plan.contains("HashJoinExec") && plan.contains("RightAnti"), "{plan}");
    // the first delivery alone: nothing is superseded, the view is a scan of its file
    let first = lake("full");
    ok(
        &first,
        &["ingest", "customers", file(&first, "mon.csv", MONDAY).to_str().unwrap()],
    );
    let plan = ok(&first, &["sql", &format!("EXPLAIN {q}"), "--format", "csv"]);
    assert!(!plan.contains("Join"), "{plan}");
    assert_eq!(first.query(q).len(), MONDAY.len());
}
