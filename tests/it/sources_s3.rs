//! A table fed by two sources at the size users have, on S3 (moto): 150,000 + 150,000 records
//! with 10% of the keys in both, a silver table over 30 MiB written in multipart uploads S3
//! accepts, conflicts found and decided, a corrected re-delivery of 1% of one source built
//! incrementally; the lake equals the same story on a local lake, row for row by digest, and
//! doctor finds nothing wrong.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::s3::{Moto, runtime, s3_lake};
use crate::util::{TestLake, assert_ok, stdout};

const A: &str = "source: a
version: 1
format: csv
fields:
  - {name: id, type: int64, required: true}
  - {name: grp, type: int32}
  - {name: amount, type: \"decimal(12,2)\"}
  - {name: blob, type: string}
  - {name: changed, type: int64}
natural_key: {version: 1, fields: [id]}
";

const RULES: &str = "table: wide
version: 1
sources:
  - source: a
  - source: b
    steps:
      - rename: {ident: id, total: amount, payload: blob}
survivorship:
  default: precedence
  order_by: changed
  fields:
    amount: most_recent
conflicts:
  fields: [amount]
  on_conflict: flag
";

/// Rows `first..first + rows` of a source (`b`: its own column names); `bump(id)` gives a row a
/// different amount (the other source's view, or a correction).
fn csv(path: &Path, b: bool, first: i64, rows: i64, bump: &dyn Fn(i64) -> i64) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let header = if b {
        "ident,grp,total,payload,changed"
    } else {
        "id,grp,amount,blob,changed"
    };
    writeln!(out, "{header}").unwrap();
    for id in first..first + rows {
        let mut rng = crate::util::Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64).wrapping_mul(0x2545_f491));
        let mut blob = String::with_capacity(240);
        for _ in 0..15 {
            blob.push_str(&format!("{:016x}", rng.next()));
        }
        let cents = rng.below(10_000_000) as i64 + bump(id);
        let changed = 1_000 + bump(id);
        writeln!(
            out,
            "{id},{},{}.{:02},{blob},{changed}",
            rng.below(100),
            cents / 100,
            cents % 100
        )
        .unwrap();
    }
}

/// Every column of every silver row but build ids, as one digest, and the conflict counts.
fn digests(t: &TestLake) -> Vec<Value> {
    let mut out = t.query(
        "SELECT count(*) AS n, sha256(string_agg(concat_ws('|', id, grp, amount, blob, changed, \
         array_to_string(contributing_sources, '+'), \
         array_to_string(conflict_fields, '+'), natural_key_fingerprint, rules_version, \
         array_to_string(anomaly_flags, '+')), ',' ORDER BY id)) AS digest FROM silver.wide",
    );
    out.extend(t.query("SELECT count(*) AS n, sum(cardinality(field_sources)) AS taken_elsewhere FROM silver.wide"));
    out.extend(t.query(
        "SELECT conflicts_open, conflicts_decided, decisions_stale, rows_read FROM audit.silver_build_log ORDER BY commit_seq",
    ));
    out.into_iter().map(|r| serde_json::to_value(r).unwrap()).collect()
}

#[test]
fn two_sources_of_150_000_records_on_s3_build_decide_and_rebuild_as_on_a_local_lake() {
    let moto = Moto::start();
    let s3 = s3_lake(&moto, "sources");
    let local = TestLake::new();
    let data = tempfile::tempdir().unwrap();
    let rules = data.path().join("rules");
    std::fs::create_dir_all(rules.join("wide")).unwrap();
    std::fs::write(rules.join("wide/v1.yaml"), RULES).unwrap();
    let file = |name: &str| data.path().join(name).display().to_string();
    // a: ids 0..150k; b: 135k..285k (15,000 shared, a tenth of them with another amount)
    csv(Path::new(&file("a.csv")), false, 0, 150_000, &|_| 0);
    csv(Path::new(&file("b.csv")), true, 135_000, 150_000, &|id| {
        if id < 150_000 && id % 10 == 3 { 7 } else { 0 }
    });
    csv(Path::new(&file("b-corrected.csv")), true, 135_000, 150_000, &|id| {
        if id < 150_000 && id % 10 == 3 {
            7
        } else if id % 100 == 41 {
            9
        } else {
            0
        }
    });
    for t in [&s3, &local] {
        std::fs::write(t.contracts().join("a.yaml"), A).unwrap();
        let b = A
            .replace("source: a", "source: b")
            .replace("name: id,", "name: ident,")
            .replace("name: amount,", "name: total,")
            .replace("name: blob,", "name: payload,")
            .replace("fields: [id]", "fields: [ident]");
        std::fs::write(t.contracts().join("b.yaml"), b).unwrap();
        let run = |args: &[&str]| {
            let out = t
                .command()
                .env("INGOT_COMPACT", "0")
                .arg("--rules")
                .arg(&rules)
                .args(args)
                .output()
                .unwrap();
            assert_ok(&out);
            stdout(&out)
        };
        run(&["ingest", "a", &file("a.csv")]);
        run(&["ingest", "b", &file("b.csv")]);
        let built = run(&["build", "wide", "--json"]);
        let rec: Value = serde_json::from_str(built.trim()).unwrap();
        assert_eq!(rec["rows_written"], 285_000, "{built}");
        assert_eq!(rec["conflicts_open"], 1_500, "{built}");
        // one decision, then a corrected re-delivery of b: an incremental build
        let fp = t.query("SELECT natural_key_fingerprint AS f FROM silver.wide WHERE id = 140003")[0]["f"]
            .as_str()
            .unwrap()
            .to_string();
        run(&[
            "resolve",
            "wide",
            &fp,
            "--field",
            "amount",
            "--take",
            "a",
            "--reason",
            "a is the ledger",
        ]);
        run(&["ingest", "b", &file("b-corrected.csv")]);
        let again = run(&["build", "wide", "--json"]);
        let rec: Value = serde_json::from_str(again.trim()).unwrap();
        assert_eq!(rec["mode"], "incremental", "{again}");
        assert_eq!(
            rec["rows_read"], 1_501,
            "1,500 corrected records and the decided one: {again}"
        );
        assert_eq!(rec["conflicts_decided"], 1, "{again}");
        let doctor = run(&["doctor"]);
        assert!(doctor.contains("0 violations"), "{doctor}");
    }
    let got = digests(&s3);
    assert_eq!(got, digests(&local), "S3 lake vs local lake");
    assert_eq!(got[0]["n"], 285_000);

    // the silver files went up in parts S3 takes, and none was left incomplete
    let lake = ingot::table::lake::Lake::open_with("s3://sources/lake", &moto.options()).unwrap();
    let biggest = runtime()
        .block_on(lake.list("silver/wide"))
        .unwrap()
        .into_iter()
        .filter_map(|m| {
            let parts = m
                .e_tag
                .as_deref()?
                .trim_matches('"')
                .rsplit_once('-')?
                .1
                .parse::<u32>()
                .ok()?;
            Some((m.size, parts))
        })
        .max()
        .expect("no multipart silver object");
    assert!(biggest.0 > 5 << 20 && biggest.1 >= 2, "silver part: {biggest:?}");
    let total: u64 = runtime()
        .block_on(lake.list("silver/wide"))
        .unwrap()
        .iter()
        .filter(|m| m.location.as_ref().contains("/part-"))
        .map(|m| m.size)
        .sum();
    assert!(total > 30 << 20, "the table's files: {total} bytes");
    let pending = moto.http("GET", "/sources?uploads").unwrap_or_default();
    assert!(!pending.contains("<Upload>"), "{pending}");
}
