//! Record identity under real operations: keys that cannot name one record unambiguously are
//! rejected with their own rule, never merged (docs/formats.md#hashes).

use crate::util::{TestLake, assert_same_rows, stderr, stdout};

fn contract(t: &TestLake, name: &str, text: &str) {
    std::fs::write(t.contracts().join(format!("{name}.yaml")), text).unwrap();
}

/// Failure rows of the lake (rule, reason, record number, whether a fingerprint was logged: it is,
/// so the key counts as delivered and a full delivery never deletes the record it names).
fn failures(t: &TestLake) -> Vec<std::collections::BTreeMap<String, serde_json::Value>> {
    t.query(
        "SELECT source, source_row_number, rule, reason, natural_key_fingerprint IS NOT NULL AS has_fp \
         FROM audit.row_failure_log ORDER BY source, source_row_number",
    )
}

fn row(
    source: &str,
    n: i64,
    rule: &str,
    reason: &str,
    has_fp: bool,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    serde_json::from_value(serde_json::json!({
        "source": source, "source_row_number": n, "rule": rule, "reason": reason, "has_fp": has_fp
    }))
    .unwrap()
}

#[test]
fn ambiguous_keys_are_rejected_not_merged() {
    let t = TestLake::new();
    contract(
        &t,
        "pairs",
        r#"source: pairs
version: 1
fields:
  - {name: a, type: string}
  - {name: b, type: string}
  - {name: v, type: int32}
natural_key: {version: 1, fields: [a, b]}
"#,
    );
    contract(
        &t,
        "phones",
        r#"source: phones
version: 1
fields:
  - {name: phone, type: string, normalize: [digits_only]}
  - {name: v, type: int32}
natural_key: {version: 1, fields: [phone]}
"#,
    );
    let pairs = t.dir.path().join("pairs.csv");
    std::fs::write(&pairs, "a,b,v\nx|y,z,1\nx,y|z,2\n,z,3\nx,y,4\n").unwrap();
    let out = t.ingest_ok("pairs", &pairs);
    assert!(
        out.contains("4 rows seen: 1 inserted, 0 updated, 0 unchanged, 3 failed"),
        "{out}"
    );
    let phones = t.dir.path().join("phones.csv");
    std::fs::write(&phones, "phone,v\nN/A,1\nunknown,2\n+49 (30) 1234,3\n").unwrap();
    let out = t.ingest_ok("phones", &phones);
    assert!(
        out.contains("3 rows seen: 1 inserted, 0 updated, 0 unchanged, 2 failed"),
        "{out}"
    );

    let sep = "contains the separator |, which makes a composite key ambiguous (\"a|b\",\"c\" and \"a\",\"b|c\" would be one record)";
    let empty = "is empty after normalize, so the record has no identity";
    assert_same_rows(
        &failures(&t),
        &[
            row(
                "pairs",
                1,
                "natural_key_invalid",
                &format!("line 2: a: natural key part \"x|y\" {sep}"),
                true,
            ),
            row(
                "pairs",
                2,
                "natural_key_invalid",
                &format!("line 3: b: natural key part \"y|z\" {sep}"),
                true,
            ),
            row(
                "pairs",
                3,
                "natural_key_invalid",
                "line 4: a: natural key part is missing (null), so the record has no identity",
                true,
            ),
            row(
                "phones",
                1,
                "natural_key_invalid",
                &format!("line 2: phone: natural key part \"N/A\" {empty}"),
                true,
            ),
            row(
                "phones",
                2,
                "natural_key_invalid",
                &format!("line 3: phone: natural key part \"unknown\" {empty}"),
                true,
            ),
        ],
        "failures",
    );
    let current = t.query(
        "SELECT a, b, v, natural_key_fingerprint = natural_key_fingerprint(1, a, b) AS same FROM bronze.pairs_current",
    );
    assert_eq!(
        serde_json::to_string(&current).unwrap(),
        r#"[{"a":"x","b":"y","same":true,"v":4}]"#
    );
    let current = t.query("SELECT phone, v FROM bronze.phones_current");
    assert_eq!(
        serde_json::to_string(&current).unwrap(),
        r#"[{"phone":"+49 (30) 1234","v":3}]"#
    );
}

/// The same rule for Parquet input: a null key part, an empty one and a separator in a
/// composite key, whatever the column's type.
#[test]
fn ambiguous_keys_in_parquet_are_rejected_too() {
    let t = TestLake::new();
    contract(
        &t,
        "pq",
        r#"source: pq
version: 1
format: parquet
fields:
  - {name: a, type: string, normalize: [trim]}
  - {name: n, type: int64}
  - {name: v, type: int32}
natural_key: {version: 1, fields: [a, n]}
"#,
    );
    let file = t.dir.path().join("in.parquet");
    let q =
        "SELECT * FROM (VALUES ('x|y', 1, 1), ('  ', 2, 2), ('x', CAST(NULL AS BIGINT), 3), ('x', 4, 4)) AS v(a, n, v)";
    crate::util::assert_ok(&t.run(&["sql", q, "--format", "parquet", "--output", file.to_str().unwrap()]));
    let out = t.ingest_ok("pq", &file);
    assert!(
        out.contains("4 rows seen: 1 inserted, 0 updated, 0 unchanged, 3 failed"),
        "{out}"
    );
    assert_same_rows(
        &failures(&t),
        &[
            row(
                "pq",
                1,
                "natural_key_invalid",
                "a: natural key part \"x|y\" contains the separator |, which makes a composite key ambiguous (\"a|b\",\"c\" and \"a\",\"b|c\" would be one record)",
                true,
            ),
            row(
                "pq",
                2,
                "natural_key_invalid",
                "a: natural key part \"  \" is empty after normalize, so the record has no identity",
                true,
            ),
            row(
                "pq",
                3,
                "natural_key_invalid",
                "n: natural key part is missing (null), so the record has no identity",
                true,
            ),
        ],
        "failures",
    );
    let current = t.query("SELECT a, n, v FROM bronze.pq_current");
    assert_eq!(serde_json::to_string(&current).unwrap(), r#"[{"a":"x","n":4,"v":4}]"#);
}

/// The key definition is recorded with every run: a changed key (a field added, a normalize step
/// added) under the same `natural_key.version` is refused, naming both definitions; a change that
/// no canonical text sees (int32 to int64) is not; raising the version and re-keying is the way.
#[test]
fn a_key_edited_without_raising_its_version_is_refused() {
    let t = TestLake::new();
    let keyed = |key: &str, a_steps: &str, n_type: &str, version: u32| {
        contract(
            &t,
            "k",
            &format!(
                "source: k\nversion: 1\nfields:\n  - {{name: a, type: string, normalize: [{a_steps}]}}\n  \
                 - {{name: n, type: {n_type}}}\n  - {{name: v, type: int32}}\n\
                 natural_key: {{version: {version}, fields: [{key}]}}\n"
            ),
        )
    };
    keyed("a, n", "trim", "int32", 1);
    let file = |name: &str, body: &str| {
        let p = t.dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    t.ingest_ok("k", &file("1.csv", "a,n,v\nx,1,1\ny,2,2\n"));
    let runs = |t: &TestLake| {
        t.query("SELECT run_id, natural_key_definition FROM audit.ingestion_run_log ORDER BY started_at")
    };
    assert_eq!(runs(&t)[0]["natural_key_definition"], "a string [trim]; n integer []");
    let current = || t.query("SELECT * FROM bronze.k_current ORDER BY a");
    let before = current();
    let path = t.contracts().join("k.yaml").display().to_string();
    let refused = |t: &TestLake, now: &str| {
        let out = t.ingest("k", &t.dir.path().join("2.csv"));
        assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
        let want = format!(
            "error: k: natural_key changed under version 1: bronze.k is keyed by (a string [trim]; n integer []), \
             but {path} says ({now}); that changes every fingerprint, so records delivered again would be current \
             twice. Raise natural_key.version in {path}, then run `ingot rekey k` (or restore the key)\n"
        );
        assert_eq!(stderr(&out), want);
    };
    file("2.csv", "a,n,v\nx,1,1\ny,2,3\n");
    keyed("a", "trim", "int32", 1);
    refused(&t, "a string [trim]");
    keyed("a, n", "trim, upper", "int32", 1);
    refused(&t, "a string [trim, upper]; n integer []");
    keyed("n, a", "trim", "int32", 1);
    refused(&t, "n integer []; a string [trim]");
    assert_eq!(current(), before, "nothing loaded");
    assert_eq!(runs(&t).len(), 1, "a refused ingest records no run");

    // int32 -> int64 writes the same canonical text: the same key
    keyed("a, n", "trim", "int64", 1);
    let out = t.ingest_ok("k", &t.dir.path().join("2.csv"));
    assert!(
        out.contains("2 rows seen: 0 inserted, 1 updated, 1 unchanged, 0 failed"),
        "{out}"
    );

    // the way to change a key: raise its version, then rekey
    keyed("a", "trim", "int64", 2);
    crate::util::assert_ok(&t.run(&["rekey", "k"]));
    let out = t.ingest_ok("k", &file("3.csv", "a,n,v\nx,1,1\n"));
    assert!(
        out.contains("1 rows seen: 0 inserted, 0 updated, 1 unchanged, 0 failed"),
        "{out}"
    );
    let defs: Vec<String> = runs(&t)
        .iter()
        .map(|r| r["natural_key_definition"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        defs,
        [
            "a string [trim]; n integer []",
            "a string [trim]; n integer []",
            "a string [trim]",
            "a string [trim]",
        ]
    );
}

/// Renaming a key field in the contract (after an upstream rename, declared with `renamed_from`)
/// is not a key change: the fingerprint never includes field names. A key field may not say
/// `missing: null`.
#[test]
fn a_renamed_key_field_is_the_same_key_and_a_key_field_is_never_optional() {
    let t = TestLake::new();
    let write = |name: &str, missing: &str| {
        contract(
            &t,
            "r",
            &format!(
                "source: r\nversion: 1\nfields:\n  - {{name: {name}, type: string{missing}}}\n  - {{name: v, type: int32}}\n\
                 natural_key: {{version: 1, fields: [{name}]}}\n"
            ),
        )
    };
    write("code", "");
    let file = |name: &str, body: &str| {
        let p = t.dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    t.ingest_ok("r", &file("1.csv", "code,v\nx,1\n"));
    write("product_code", ", renamed_from: code");
    let out = t.ingest_ok("r", &file("2.csv", "product_code,v\nx,1\ny,2\n"));
    assert!(
        out.contains("2 rows seen: 1 inserted, 0 updated, 1 unchanged, 0 failed"),
        "{out}"
    );

    write("product_code", ", missing: null");
    let out = t.run(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    let want = format!(
        "{}:6:14: natural key field \"product_code\" says missing: null; a key field must be in every file (a file \
         without it could not name its records)",
        t.contracts().join("r.yaml").display()
    );
    assert!(stderr(&out).contains(&want), "{}\nwant: {want}", stderr(&out));
}

const PRICES: &str = r#"source: prices
version: 1
fields:
  - {name: sku, type: string, required: true}
  - {name: price, type: int32, max: 100}
natural_key: {version: 1, fields: [sku]}
"#;

/// `_current` of `prices` as (sku, price, run that wrote it).
fn current_prices(t: &TestLake) -> Vec<std::collections::BTreeMap<String, serde_json::Value>> {
    t.query("SELECT sku, price, ingestion_run_id AS run FROM bronze.prices_current ORDER BY sku")
}

fn price(sku: &str, price: i64, run: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    serde_json::from_value(serde_json::json!({"sku": sku, "price": price, "run": run})).unwrap()
}

fn run_ids(t: &TestLake) -> Vec<String> {
    t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at")
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_replayed_row_never_supersedes_a_later_delivery() {
    let t = TestLake::new();
    contract(&t, "prices", PRICES);
    let monday = t.dir.path().join("monday.csv");
    std::fs::write(&monday, "sku,price\nk1,150\nk2,160\nk3,5\n").unwrap();
    let tuesday = t.dir.path().join("tuesday.csv");
    std::fs::write(&tuesday, "sku,price\nk1,20\n").unwrap();
    t.ingest_ok("prices", &monday);
    t.ingest_ok("prices", &tuesday);
    let [mon, tue] = <[String; 2]>::try_from(run_ids(&t)).unwrap();

    // the contract is fixed and Monday replayed: k1 was delivered again on Tuesday, so Monday's
    // older price stays out; k2 nobody delivered since, so it loads
    contract(&t, "prices", &PRICES.replace("max: 100", "max: 1000"));
    let out = t.run(&["replay", &mon]);
    let said = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        said.contains("2 rows seen: 1 inserted, 0 updated, 0 unchanged, 1 failed; 1 of the failed superseded"),
        "{said}"
    );
    let replay = run_ids(&t)[2].clone();
    assert_same_rows(
        &current_prices(&t),
        &[price("k1", 20, &tue), price("k2", 160, &replay), price("k3", 5, &mon)],
        "after the replay",
    );
    let logged = t.query(&format!(
        "SELECT source_row_number, rule, reason, raw_payload FROM audit.row_failure_log WHERE run_id = '{replay}'"
    ));
    assert_same_rows(
        &logged,
        &[serde_json::from_value(serde_json::json!({
            "source_row_number": 1,
            "rule": "replay_superseded",
            "reason": format!(
                "run {tue} (committed after run {mon}) delivered this key: the replayed version is older, so it is \
                 not loaded (undo that run first to make it current)"
            ),
            "raw_payload": "k1,150",
        }))
        .unwrap()],
        "the superseded row",
    );
    let runs = t.query(&format!(
        "SELECT rows_superseded, rows_failed FROM audit.ingestion_run_log WHERE run_id = '{replay}'"
    ));
    assert_eq!(runs[0]["rows_superseded"], 1);
    assert_eq!(runs[0]["rows_failed"], 1);
    let listed = stdout(&t.run(&["failures", "--run", &replay]));
    assert!(listed.contains("replay_superseded"), "{listed}");

    // the same replay again changes nothing; once Tuesday is undone, Monday's version is the
    // latest delivery of k1 and the replay may load it
    let said = stdout(&t.run(&["replay", &mon]));
    assert!(said.contains("that still fail were replayed by run"), "{said}");
    assert!(t.run(&["undo", &tue]).status.success());
    let out = t.run(&["replay", &mon]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again = run_ids(&t)[3].clone();
    assert_same_rows(
        &current_prices(&t),
        &[
            price("k1", 150, &again),
            price("k2", 160, &replay),
            price("k3", 5, &mon),
        ],
        "after undoing Tuesday and replaying again",
    );
}

/// `ingot rekey` applies the same rule to the new key: a current record whose new key has a null
/// part, a part empty after normalize or `|` in a part of the composite key is logged with rule
/// `natural_key_invalid` (with its fields as JSON and its new fingerprint), never merged.
#[test]
fn rekey_rejects_records_the_new_key_cannot_name() {
    let t = TestLake::new();
    let write = |key: &str, version: u32| {
        contract(
            &t,
            "k",
            &format!(
                "source: k\nversion: 1\nfields:\n  - {{name: a, type: string, required: true}}\n  - {{name: b, type: string, normalize: [trim]}}\n\
                 natural_key: {{version: {version}, fields: [{key}]}}\n"
            ),
        )
    };
    write("a", 1);
    let file = t.dir.path().join("k.csv");
    std::fs::write(&file, "a,b\nx,p|q\ny,\nz,ok\nw,\"  \"\n").unwrap();
    assert!(t.ingest_ok("k", &file).contains("4 rows seen: 4 inserted"));
    write("a, b", 2);
    let out = t.run(&["rekey", "k"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = t.query(
        "SELECT rule, reason, raw_payload FROM audit.row_failure_log WHERE natural_key_fingerprint IS NOT NULL \
         ORDER BY raw_payload",
    );
    let row = |reason: &str, payload: &str| -> std::collections::BTreeMap<String, serde_json::Value> {
        serde_json::from_value(
            serde_json::json!({"rule": "natural_key_invalid", "reason": reason, "raw_payload": payload}),
        )
        .unwrap()
    };
    assert_same_rows(
        &got,
        &[
            row(
                "b: natural key part \"  \" is empty after normalize, so the record has no identity",
                "{\"a\":\"w\",\"b\":\"  \"}",
            ),
            row(
                "b: natural key part \"p|q\" contains the separator |, which makes a composite key ambiguous (\"a|b\",\"c\" and \"a\",\"b|c\" would be one record)",
                "{\"a\":\"x\",\"b\":\"p|q\"}",
            ),
            row(
                "b: natural key part is missing (null), so the record has no identity",
                "{\"a\":\"y\",\"b\":null}",
            ),
        ],
        "records the new key cannot name",
    );
    let current = t.query("SELECT a, b FROM bronze.k_current");
    assert_same_rows(
        &current,
        &[serde_json::from_value(serde_json::json!({"a": "z", "b": "ok"})).unwrap()],
        "only the record the new key names",
    );
}
