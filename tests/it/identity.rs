//! Record identity under real operations: keys that cannot name one record unambiguously are
//! rejected with their own rule, never merged (docs/formats.md#hashes).

use crate::util::{TestLake, assert_same_rows};

fn contract(t: &TestLake, name: &str, text: &str) {
    std::fs::write(t.contracts().join(format!("{name}.yaml")), text).unwrap();
}

/// Failure rows of the lake (rule, reason, record number, whether a fingerprint was kept).
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
                false,
            ),
            row(
                "pairs",
                2,
                "natural_key_invalid",
                &format!("line 3: b: natural key part \"y|z\" {sep}"),
                false,
            ),
            row(
                "pairs",
                3,
                "natural_key_invalid",
                "line 4: a: natural key part is missing (null), so the record has no identity",
                false,
            ),
            row(
                "phones",
                1,
                "natural_key_invalid",
                &format!("line 2: phone: natural key part \"N/A\" {empty}"),
                false,
            ),
            row(
                "phones",
                2,
                "natural_key_invalid",
                &format!("line 3: phone: natural key part \"unknown\" {empty}"),
                false,
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
                false,
            ),
            row(
                "pq",
                2,
                "natural_key_invalid",
                "a: natural key part \"  \" is empty after normalize, so the record has no identity",
                false,
            ),
            row(
                "pq",
                3,
                "natural_key_invalid",
                "n: natural key part is missing (null), so the record has no identity",
                false,
            ),
        ],
        "failures",
    );
    let current = t.query("SELECT a, n, v FROM bronze.pq_current");
    assert_eq!(serde_json::to_string(&current).unwrap(), r#"[{"a":"x","n":4,"v":4}]"#);
}
