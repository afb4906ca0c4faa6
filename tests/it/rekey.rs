//! `ingot rekey`: ingest refuses a contract whose natural key version differs from the lake's;
//! a rekey writes every current record once under the new key with its old fingerprint beside
//! it (compared whole with a lake that loaded the same data under the new key), logs records the
//! new key makes collide as `rekey_conflict` and keeps them out of `_current`; silver follows
//! (incremental equal to full); undo restores the old keys; a crash at every rekey failpoint,
//! then the same command, equals one clean rekey.

use serde_json::{Value, json};

use crate::deletions::{Row, bronze, contract, file, ingot, lake, ok, runs, set_contract};
use crate::util::{TestLake, id_names, normalize_rows, stderr, stdout};

const MONDAY: &[&str] = &["EU,c1,Ann,10", "EU,c2,Bob,20", "US,c3,Dee,40"];
/// Two regions share customer id c1 with different contents: a collision under a key of
/// customer_id alone.
const COLLIDING: &[&str] = &["EU,c1,Ann,10", "EU,c2,Bob,20", "US,c1,Cid,30", "US,c3,Dee,40"];
const TUESDAY: &[&str] = &["EU,c2,Bob,21", "US,c3,Dee,40", "EU,c5,Fay,60"];

/// Version 2 of the key: customer_id alone.
fn v2(t: &TestLake) {
    set_contract(t, &contract("incremental", 2, "customer_id"));
}

fn columns(rows: &[Row], cols: &[&str]) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            Value::from(
                cols.iter()
                    .map(|c| r.get(*c).cloned().unwrap_or(Value::Null))
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
}

fn silver(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM silver.customers ORDER BY natural_key_fingerprint")
        .into_iter()
        .map(|mut r| {
            r.remove("silver_build_id");
            r.remove("ingestion_run_id");
            r
        })
        .collect()
}

#[test]
fn ingest_is_refused_until_the_source_is_rekeyed() {
    let t = lake("incremental");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    v2(&t);
    let before = runs(&t);
    let out = t.ingest("customers", &file(&t, "tue.csv", TUESDAY));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    for part in [
        "customers: bronze.customers is keyed with natural_key version 1",
        "customers.yaml says version 2",
        "run `ingot rekey customers` first",
    ] {
        assert!(said.contains(part), "{part}: {said}");
    }
    assert_eq!(runs(&t), before, "a refused ingest records nothing");
}

#[test]
fn rekey_without_collisions_equals_loading_the_data_under_the_new_key() {
    // Reference: the same current records loaded under key version 2 from the start.
    let want = lake("incremental");
    v2(&want);
    want.ingest_ok("customers", &file(&want, "mon.csv", MONDAY));

    let t = lake("incremental");
    t.ingest_ok("customers", &file(&t, "mon.csv", MONDAY));
    ok(&t, &["build", "customers"]);
    let old = bronze(&t, "bronze.customers_current");
    v2(&t);
    let said = ok(&t, &["rekey", "customers"]);
    assert!(
        said.contains(
            "re-keyed customers from natural_key v1 to v2: 3 current records, 3 written under the new key, 0 merged"
        ),
        "{said}"
    );
    let cur = bronze(&t, "bronze.customers_current");
    let same = [
        "region",
        "customer_id",
        "name",
        "credit",
        "row_hash",
        "natural_key_fingerprint",
        "natural_key_version",
        "file_hash",
        "source_row_number",
        "contract_version",
        "is_deleted",
    ];
    assert_eq!(
        columns(&cur, &same),
        columns(&bronze(&want, "bronze.customers_current"), &same)
    );
    // the old fingerprint beside the new one; the rekey run wrote the versions
    assert_eq!(
        columns(&cur, &["previous_natural_key_fingerprint", "ingestion_run_id"]),
        old.iter()
            .map(|r| json!([r["natural_key_fingerprint"], "run#1"]))
            .collect::<Vec<_>>()
    );
    // history is kept: bronze.customers has the v1 versions and the v2 versions
    let all = bronze(&t, "bronze.customers");
    assert_eq!(
        columns(&all, &["ingestion_run_id", "natural_key_version"]),
        std::iter::repeat_n(json!(["run#0", 1]), 3)
            .chain(std::iter::repeat_n(json!(["run#1", 2]), 3))
            .collect::<Vec<_>>()
    );
    let r = &runs(&t)[1];
    assert_eq!(
        columns(
            std::slice::from_ref(r),
            &[
                "file_path",
                "status",
                "rows_seen",
                "rows_inserted",
                "rows_updated",
                "rows_unchanged",
                "rows_failed",
                "rows_deleted",
                "natural_key_version",
                "previous_natural_key_version",
            ]
        ),
        vec![json!([
            "rekey customers: natural_key v1 -> v2",
            "succeeded",
            3,
            3,
            0,
            0,
            0,
            0,
            2,
            1
        ])]
    );
    // ingest works again, with the new key; running rekey again does nothing
    let said = t.ingest_ok("customers", &file(&t, "tue.csv", TUESDAY));
    assert!(said.contains("1 inserted, 1 updated, 1 unchanged"), "{said}");
    let said = ok(&t, &["rekey", "customers"]);
    assert!(said.contains("keyed with natural_key version 2 already"), "{said}");
    // silver: the incremental build after the rekey equals a full build and the reference's
    ok(&t, &["build", "customers"]);
    let incremental = silver(&t);
    ok(&t, &["build", "customers", "--full"]);
    assert_eq!(silver(&t), incremental);
    want.ingest_ok("customers", &file(&want, "tue.csv", TUESDAY));
    ok(&want, &["build", "customers"]);
    assert_eq!(incremental, silver(&want));
    let said = ok(&t, &["doctor"]);
    assert!(said.contains(" 0 violations"), "{said}");
}

#[test]
fn rekey_collisions_are_logged_and_no_colliding_record_stays_current() {
    let t = lake("incremental");
    t.ingest_ok("customers", &file(&t, "mon.csv", COLLIDING));
    let old = bronze(&t, "bronze.customers_current");
    let fp_of = |region: &str| -> Value {
        old.iter()
            .find(|r| r["region"] == json!(region) && r["customer_id"] == json!("c1"))
            .map(|r| r["natural_key_fingerprint"].clone())
            .unwrap()
    };
    v2(&t);
    let said = ok(&t, &["rekey", "customers"]);
    assert!(
        said.contains("4 current records, 2 written under the new key, 0 merged (same contents), 2 in conflict"),
        "{said}"
    );
    let current = t.query("SELECT customer_id, name FROM bronze.customers_current ORDER BY customer_id");
    assert_eq!(
        Value::from(current.into_iter().map(|r| json!(r)).collect::<Vec<_>>()),
        json!([{"customer_id": "c2", "name": "Bob"}, {"customer_id": "c3", "name": "Dee"}])
    );
    let names = id_names(&t);
    let failures = normalize_rows(
        t.query("SELECT * FROM audit.row_failure_log ORDER BY source_row_number"),
        &names,
    );
    let new_fp = failures[0]["natural_key_fingerprint"].clone();
    let reason = |me: &str, other: &str| {
        format!(
            "natural key (customer_id) v2 gives this record (previous fingerprint {}) the fingerprint of 1 other \
             current record with different contents (previous fingerprint {}); none of them is current under the \
             new key until a delivery brings it again",
            fp_of(me).as_str().unwrap(),
            fp_of(other).as_str().unwrap()
        )
    };
    let expected: Vec<Row> = [
        (
            1,
            "EU",
            "US",
            r#"{"region":"EU","customer_id":"c1","name":"Ann","credit":10}"#,
        ),
        (
            3,
            "US",
            "EU",
            r#"{"region":"US","customer_id":"c1","name":"Cid","credit":30}"#,
        ),
    ]
    .into_iter()
    .map(|(no, me, other, payload)| {
        serde_json::from_value(json!({
            "run_id": "run#1",
            "layer": "bronze",
            "source": "customers",
            "source_row_number": no,
            "natural_key_fingerprint": new_fp,
            "raw_payload": payload,
            "rule": "rekey_conflict",
            "reason": reason(me, other),
            "failed_at": "<time>",
        }))
        .unwrap()
    })
    .collect();
    assert_eq!(failures, expected);
    let r = &runs(&t)[1];
    assert_eq!(
        columns(
            std::slice::from_ref(r),
            &["status", "rows_seen", "rows_inserted", "rows_unchanged", "rows_failed"]
        ),
        vec![json!(["succeeded_with_failures", 4, 2, 0, 2])]
    );
    // a rekey run's failures are not rows of a file: replay refuses
    let out = ingot(&t, &["replay", r["run_id"].as_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    // the next delivery of c1 (now one record) inserts it
    let said = t.ingest_ok("customers", &file(&t, "tue.csv", &["US,c1,Cid,35"]));
    assert!(said.contains("1 inserted, 0 updated"), "{said}");
    let said = ok(&t, &["doctor"]);
    assert!(said.contains(" 0 violations"), "{said}");
}

#[test]
fn undo_of_a_rekey_restores_the_old_keys_and_undo_refuses_to_mix_versions() {
    let t = lake("incremental");
    t.ingest_ok("customers", &file(&t, "mon.csv", COLLIDING));
    ok(&t, &["build", "customers"]);
    let tables = |t: &TestLake| {
        (
            bronze(t, "bronze.customers"),
            bronze(t, "bronze.customers_current"),
            t.query("SELECT * FROM audit.row_failure_log ORDER BY run_id, source_row_number"),
            silver(t),
        )
    };
    let before = tables(&t);
    v2(&t);
    ok(&t, &["rekey", "customers"]);
    ok(&t, &["build", "customers"]);
    let ids: Vec<String> = runs(&t)
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    // the run before the rekey cannot be undone alone
    let out = ingot(&t, &["undo", &ids[0]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("undo the rekey run first"), "{}", stderr(&out));
    // nor the rekey while a run keyed with the new key follows it
    t.ingest_ok("customers", &file(&t, "tue.csv", TUESDAY));
    let out = ingot(&t, &["undo", &ids[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("undo them first"), "{}", stderr(&out));
    let tuesday = runs(&t)[2]["run_id"].as_str().unwrap().to_string();
    ok(&t, &["undo", &tuesday]);
    let said = ok(&t, &["undo", &ids[1]]);
    assert!(
        said.contains(&format!("rolled back run {} of customers", ids[1])),
        "{said}"
    );
    ok(&t, &["build", "customers"]);
    let after = tables(&t);
    assert_eq!(after.0, before.0, "bronze.customers");
    assert_eq!(after.1, before.1, "bronze.customers_current");
    assert_eq!(after.2, before.2, "audit.row_failure_log");
    assert_eq!(after.3, before.3, "silver.customers");
    // the contract still says version 2: ingest is refused again until a new rekey
    let out = t.ingest("customers", &file(&t, "tue.csv", TUESDAY));
    assert_eq!(out.status.code(), Some(2));
    let said = ok(&t, &["doctor"]);
    assert!(said.contains(" 0 violations"), "{said}");
}

#[test]
fn every_rekey_failpoint_crash_then_rerun_equals_one_clean_rekey() {
    let prepare = || {
        let t = lake("incremental");
        t.ingest_ok("customers", &file(&t, "mon.csv", COLLIDING));
        t.ingest_ok("customers", &file(&t, "tue.csv", &["EU,c2,Bob,21"]));
        v2(&t);
        t
    };
    let clean = prepare();
    ok(&clean, &["rekey", "customers"]);
    let clean = clean.snapshot(&["customers"]);
    for point in ingot::table::failpoint::REKEY {
        let t = prepare();
        let before = t.snapshot(&["customers"]);
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .args(["rekey", "customers"])
            .output()
            .unwrap();
        assert!(
            stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: failpoint never reached: {}",
            stderr(&out)
        );
        if *point != "rekey.after_commit" {
            t.snapshot(&["customers"]).assert_same(
                &before,
                &format!("{point}: nothing of the crashed rekey may be visible"),
            );
        }
        let out = ingot(&t, &["rekey", "customers"]);
        crate::util::assert_ok(&out);
        t.snapshot(&["customers"])
            .assert_same(&clean, &format!("{point}: crash + re-run"));
        let said = ok(&t, &["doctor"]);
        assert!(said.contains(" 0 violations"), "{point}: {said}");
    }
}
