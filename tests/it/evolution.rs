//! Contract evolution: adding an optional field, reordering, toggling `volatile`, widening a type,
//! renaming a field (`renamed_from`) and dropping one never mark an unchanged record updated, and
//! every earlier run reads under the newest contract. A type change old runs cannot be read as is
//! refused by `ingot check` and `ingot ingest`, naming the runs, unless the field says
//! `older_values: cast`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::util::{TestLake, assert_same_rows, stderr, stdout};

fn contract(t: &TestLake, fields: &str) {
    let text = format!("source: shop\nversion: 1\nfields:\n{fields}natural_key: {{version: 1, fields: [id]}}\n");
    std::fs::write(t.contracts().join("shop.yaml"), text).unwrap();
}

/// Deliver `csv` and return the summary line's counts (`N rows seen: ...`).
fn deliver(t: &TestLake, name: &str, csv: &str) -> String {
    let path = t.dir.path().join(format!("{name}.csv"));
    std::fs::write(&path, csv).unwrap();
    let out = t.ingest_ok("shop", &path);
    let at = out.find("rows seen").expect("summary");
    let start = out[..at].rfind(": ").map_or(0, |i| i + 2);
    let end = out[at..].find(" failed").map_or(out.len(), |i| at + i + 7);
    out[start..end].to_string()
}

fn rows(v: Value) -> Vec<BTreeMap<String, Value>> {
    serde_json::from_value(v).unwrap()
}

const V1: &str = "  - {name: id, type: string, required: true}\n  - {name: amount, type: int32}\n  - {name: city, type: string}\n  - {name: seen, type: string, volatile: true}\n";

fn evolve(t: &TestLake) {
    contract(t, V1);
    let first = deliver(t, "day1", "id,amount,city,seen\na,1,x,s1\nb,2,y,s1\nc,3,z,s1\n");
    assert_eq!(first, "3 rows seen: 3 inserted, 0 updated, 0 unchanged, 0 failed");
    let one_changed = "3 rows seen: 0 inserted, 1 updated, 2 unchanged, 0 failed";

    // an optional field that arrives empty
    contract(t, &format!("{V1}  - {{name: note, type: string}}\n"));
    let got = deliver(t, "add", "id,amount,city,seen,note\na,1,x,s2,\nb,20,y,s2,\nc,3,z,s2,\n");
    assert_eq!(got, one_changed, "adding an optional field");

    // reordered fields (and columns)
    let reordered = "  - {name: id, type: string, required: true}\n  - {name: city, type: string}\n  - {name: amount, type: int32}\n  - {name: seen, type: string, volatile: true}\n  - {name: note, type: string}\n";
    contract(t, reordered);
    let got = deliver(
        t,
        "reorder",
        "id,city,amount,seen,note\na,x,1,s3,\nb,y,20,s3,\nc,z,30,s3,\n",
    );
    assert_eq!(got, one_changed, "reordering fields");

    // `seen` stops being volatile (its stored value is compared from now on), `note` becomes so
    let toggled = reordered
        .replace("seen, type: string, volatile: true", "seen, type: string")
        .replace("note, type: string}", "note, type: string, volatile: true}");
    contract(t, &toggled);
    let got = deliver(
        t,
        "toggle",
        "id,city,amount,seen,note\na,x,1,s1,n\nb,y,20,s2,n\nc,z,30,s9,n\n",
    );
    assert_eq!(got, one_changed, "toggling volatile (c's seen changed)");

    // int32 -> int64, and `city` renamed to `town` upstream
    let widened = toggled.replace("amount, type: int32", "amount, type: int64").replace(
        "{name: city, type: string}",
        "{name: town, type: string, renamed_from: city}",
    );
    contract(t, &widened);
    let got = deliver(
        t,
        "rename",
        "id,town,amount,seen,note\na,x,1,s1,n\nb,y,20,s2,n\nc,zz,30,s9,n\n",
    );
    assert_eq!(got, one_changed, "widening a type and renaming a field");

    // `note` dropped
    let dropped = widened.replace("  - {name: note, type: string, volatile: true}\n", "");
    contract(t, &dropped);
    let got = deliver(t, "drop", "id,town,amount,seen\na,x,100,s1\nb,y,20,s2\nc,zz,30,s9\n");
    assert_eq!(got, one_changed, "dropping a field");
    let got = deliver(
        t,
        "again",
        "id,town,amount,seen\na,x,100,s1\nb,y,20,s2\nc,zz,30,s9\nd,w,4,s1\n",
    );
    assert_eq!(got, "4 rows seen: 1 inserted, 0 updated, 3 unchanged, 0 failed");
}

#[test]
fn contract_evolution_marks_only_changed_records_updated() {
    for t in [TestLake::new(), crate::deletions::partitioned()] {
        evolve(&t);
        // every run reads under the newest contract: renamed under its new name, widened, the
        // dropped field gone, an added one null where a run did not have it
        let history =
            t.query("SELECT id, town, amount, seen, contract_version FROM bronze.shop ORDER BY ingested_at, id");
        let want = rows(json!([
            {"id": "a", "town": "x", "amount": 1, "seen": "s1", "contract_version": 1},
            {"id": "b", "town": "y", "amount": 2, "seen": "s1", "contract_version": 1},
            {"id": "c", "town": "z", "amount": 3, "seen": "s1", "contract_version": 1},
            {"id": "b", "town": "y", "amount": 20, "seen": "s2", "contract_version": 1},
            {"id": "c", "town": "z", "amount": 30, "seen": "s3", "contract_version": 1},
            {"id": "c", "town": "z", "amount": 30, "seen": "s9", "contract_version": 1},
            {"id": "c", "town": "zz", "amount": 30, "seen": "s9", "contract_version": 1},
            {"id": "a", "town": "x", "amount": 100, "seen": "s1", "contract_version": 1},
            {"id": "d", "town": "w", "amount": 4, "seen": "s1", "contract_version": 1},
        ]));
        assert_same_rows(&history, &want, "bronze.shop under the newest contract");
        let current = t.query("SELECT id, town, amount, seen FROM bronze.shop_current ORDER BY id");
        let want = rows(json!([
            {"id": "a", "town": "x", "amount": 100, "seen": "s1"},
            {"id": "b", "town": "y", "amount": 20, "seen": "s2"},
            {"id": "c", "town": "zz", "amount": 30, "seen": "s9"},
            {"id": "d", "town": "w", "amount": 4, "seen": "s1"},
        ]));
        assert_same_rows(&current, &want, "bronze.shop_current under the newest contract");
        // the hashes recomputed for a run under a contract are kept: one cache file per run
        // and contract, so the next ingest under the same contract reads two columns again
        let caches = cache_files(&t);
        let first = t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at LIMIT 1");
        let first = first[0]["run_id"].as_str().unwrap();
        assert!(
            caches.iter().filter(|c| c.contains(first)).count() >= 5,
            "the first run was re-hashed once per contract change: {caches:?}"
        );
        // each run records the fields its row_hash covers
        let fields = t.query("SELECT contract_fields FROM audit.ingestion_run_log ORDER BY started_at");
        assert_eq!(
            fields[0]["contract_fields"],
            "id string, amount int32, city string, seen string volatile"
        );
        assert_eq!(
            fields[6]["contract_fields"],
            "id string, town string, amount int64, seen string"
        );
    }
}

/// The row-hash cache files of the lake, lake-relative.
fn cache_files(t: &TestLake) -> Vec<String> {
    let root = t.lake().join("_cache/row_hash");
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(t.lake()).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// A cache file that cannot be read (damaged by hand, a disk error) is computed again, and the
/// ingest classifies as if it had never existed; `gc` removes the cache of an undone run.
#[test]
fn a_damaged_row_hash_cache_is_computed_again_and_gc_removes_a_dead_runs_cache() {
    let t = TestLake::new();
    contract(&t, V1);
    deliver(&t, "day1", "id,amount,city,seen\na,1,x,s1\nb,2,y,s1\n");
    contract(&t, &format!("{V1}  - {{name: note, type: string}}\n"));
    let got = deliver(&t, "day2", "id,amount,city,seen,note\na,1,x,s1,\nb,3,y,s1,\n");
    assert_eq!(got, "2 rows seen: 0 inserted, 1 updated, 1 unchanged, 0 failed");
    let caches = cache_files(&t);
    assert_eq!(caches.len(), 1, "{caches:?}");
    std::fs::write(t.lake().join(&caches[0]), b"not parquet").unwrap();
    let path = t.dir.path().join("day3.csv");
    std::fs::write(&path, "id,amount,city,seen,note\na,1,x,s1,\nb,3,y,s1,\nc,4,z,s1,\n").unwrap();
    let out = t.ingest("shop", &path);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("3 rows seen: 1 inserted, 0 updated, 2 unchanged, 0 failed"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("computing the row hashes again"),
        "{}",
        stderr(&out)
    );
    assert_eq!(cache_files(&t), caches, "the cache was written again");
    assert_ne!(std::fs::read(t.lake().join(&caches[0])).unwrap(), b"not parquet");

    // undo the first run: its cache goes with its files
    let first = t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at LIMIT 1");
    let first = first[0]["run_id"].as_str().unwrap().to_string();
    assert!(t.run(&["undo", &first]).status.success());
    let gc = t.run(&["gc", "--grace", "0s"]);
    assert!(gc.status.success(), "{}", stderr(&gc));
    assert_eq!(cache_files(&t), Vec::<String>::new());
}

#[test]
fn a_type_change_old_runs_cannot_be_read_as_is_refused_unless_the_field_says_cast() {
    let t = TestLake::new();
    contract(&t, V1);
    deliver(&t, "day1", "id,amount,city,seen\na,1,x,s1\nb,2,y,s1\n");
    let run = t.query("SELECT run_id FROM audit.ingestion_run_log")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    contract(&t, &V1.replace("amount, type: int32", "amount, type: boolean"));
    let want = format!(
        "shop: field \"amount\" is boolean in {}, but run {run} stored it as int32, which cannot be read as boolean \
         without loss",
        t.contracts().join("shop.yaml").display()
    );
    let check = t.run(&["check"]);
    assert_eq!(check.status.code(), Some(2), "{}", stdout(&check));
    assert!(stderr(&check).contains(&want), "{}", stderr(&check));
    let path = t.dir.path().join("day2.csv");
    std::fs::write(&path, "id,amount,city,seen\na,false,x,s1\nb,true,y,s1\n").unwrap();
    let out = t.ingest("shop", &path);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains(&want), "{}", stderr(&out));
    assert_eq!(t.query("SELECT count(*) AS n FROM audit.ingestion_run_log")[0]["n"], 1);

    // with `older_values: cast` the old runs read through TRY_CAST (1 -> true, 2 -> true): b is
    // unchanged, a changed
    contract(
        &t,
        &V1.replace("amount, type: int32", "amount, type: boolean, older_values: cast"),
    );
    assert!(t.run(&["check"]).status.success());
    let got = t.ingest_ok("shop", &path);
    assert!(
        got.contains("2 rows seen: 0 inserted, 1 updated, 1 unchanged, 0 failed"),
        "{got}"
    );
    let current = t.query("SELECT id, amount FROM bronze.shop_current ORDER BY id");
    assert_same_rows(
        &current,
        &rows(json!([{"id": "a", "amount": false}, {"id": "b", "amount": true}])),
        "old values cast",
    );
}

/// A decimal's precision raised (its scale kept) writes the same canonical text: the same records
/// again are unchanged, and the old run reads at the new precision.
#[test]
fn raising_a_decimals_precision_marks_nothing_updated() {
    let t = TestLake::new();
    let fields = |precision: u32| {
        format!(
            "  - {{name: id, type: string, required: true}}\n  - {{name: price, type: \"decimal({precision},2)\"}}\n"
        )
    };
    contract(&t, &fields(6));
    let day1 = deliver(&t, "day1", "id,price\na,1.50\nb,9999.99\n");
    assert_eq!(day1, "2 rows seen: 2 inserted, 0 updated, 0 unchanged, 0 failed");
    contract(&t, &fields(12));
    let again = deliver(&t, "day2", "id,price\na,1.50\nb,9999.99\nc,12345678.90\n");
    assert_eq!(again, "3 rows seen: 1 inserted, 0 updated, 2 unchanged, 0 failed");
    let current = t.query("SELECT id, CAST(price AS VARCHAR) AS price FROM bronze.shop_current ORDER BY id");
    assert_same_rows(
        &current,
        &rows(json!([
            {"id": "a", "price": "1.50"},
            {"id": "b", "price": "9999.99"},
            {"id": "c", "price": "12345678.90"},
        ])),
        "decimal(6,2) runs read as decimal(12,2)",
    );
}
