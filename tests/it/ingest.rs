//! Ingest end to end through the real binary: run records, failure rows and bronze rows are
//! compared whole against the independent oracle in data/expected.json (computed by the Python
//! generator from the formulas of docs/formats.md#hashes, not by ingot).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::util::{TestLake, assert_ok, landing, repo, sha256_hex};

fn oracle() -> Value {
    let text = std::fs::read_to_string(repo().join("data/expected.json")).expect("data/expected.json (make data)");
    serde_json::from_str(&text).unwrap()
}

fn files_of<'a>(oracle: &'a Value, source: &str) -> Vec<&'a Value> {
    oracle["landing"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["source"] == source)
        .collect()
}

/// Ingest every landing file of `source` in order and compare each run with the oracle.
fn check_source(source: &str) {
    check_source_in(source, TestLake::new());
}

fn check_source_in(source: &str, t: TestLake) {
    let oracle = oracle();
    for (i, expected) in files_of(&oracle, source).iter().enumerate() {
        let file = landing(expected["file"].as_str().unwrap().trim_start_matches("landing/"));
        t.ingest_ok(source, &file);
        let runs = t.query(&format!(
            "SELECT * FROM audit.ingestion_run_log WHERE source = '{source}' ORDER BY started_at, run_id"
        ));
        assert_eq!(runs.len(), i + 1);
        let run = &runs[i];
        let ctx = format!("{source} file {}", expected["file"]);
        assert_eq!(run["file_hash"], expected["file_hash"], "{ctx}");
        assert_eq!(
            run["file_hash"].as_str().unwrap(),
            sha256_hex(&std::fs::read(&file).unwrap()),
            "{ctx}"
        );
        for k in [
            "status",
            "rows_seen",
            "rows_inserted",
            "rows_updated",
            "rows_unchanged",
            "rows_failed",
        ] {
            assert_eq!(run[k], expected[k], "{ctx}: {k}");
        }
        assert_eq!(run["file_path"].as_str().unwrap(), file.display().to_string());
        assert_eq!(run["contract_version"], 1);
        assert_eq!(run.get("error"), None, "{ctx}: error must be null");
        let seen = run["rows_seen"].as_i64().unwrap();
        let sum: i64 = ["rows_inserted", "rows_updated", "rows_unchanged", "rows_failed"]
            .iter()
            .map(|k| run[*k].as_i64().unwrap())
            .sum();
        assert_eq!(seen, sum, "{ctx}: counts reconcile");
        let run_id = run["run_id"].as_str().unwrap();

        // failure rows, whole
        let failures = t.query(&format!(
            "SELECT * FROM audit.row_failure_log WHERE run_id = '{run_id}' ORDER BY source_row_number, rule"
        ));
        let want = expected["failures"].as_array().unwrap();
        assert_eq!(failures.len(), want.len(), "{ctx}: failures {failures:#?}");
        for (got, want) in failures.iter().zip(want) {
            assert_eq!(got["source_row_number"], want["source_row_number"], "{ctx}");
            assert_eq!(got["rule"], want["rule"], "{ctx} row {}", want["source_row_number"]);
            assert_eq!(
                got.get("natural_key_fingerprint").cloned().unwrap_or(Value::Null),
                want["natural_key_fingerprint"],
                "{ctx} row {}",
                want["source_row_number"]
            );
            if !want["raw_payload"].is_null() {
                assert_eq!(
                    got["raw_payload"], want["raw_payload"],
                    "{ctx} row {}",
                    want["source_row_number"]
                );
            }
            assert_eq!(got["layer"], "bronze");
            assert_eq!(got["source"], source);
            assert_eq!(got.get("table"), None);
            assert_eq!(got.get("rules_version"), None);
            assert!(!got["reason"].as_str().unwrap().is_empty());
        }

        // the rows this run wrote, with their hashes
        let written = t.query(&format!(
            "SELECT source_row_number, natural_key_fingerprint, row_hash, file_hash, natural_key_version, contract_version \
             FROM bronze.{source} WHERE ingestion_run_id = '{run_id}' ORDER BY source_row_number"
        ));
        let want = expected["written"].as_array().unwrap();
        assert_eq!(written.len(), want.len(), "{ctx}: written rows");
        for (got, want) in written.iter().zip(want) {
            for k in ["source_row_number", "natural_key_fingerprint", "row_hash"] {
                assert_eq!(got[k], want[k], "{ctx}: {k} of row {}", want["source_row_number"]);
            }
            assert_eq!(got["file_hash"], expected["file_hash"]);
            assert_eq!(got["natural_key_version"], 1);
            assert_eq!(got["contract_version"], 1);
        }
    }
    // the current view: one row per fingerprint, the latest version
    let current = t.query(&format!(
        "SELECT natural_key_fingerprint, row_hash FROM bronze.{source}_current ORDER BY natural_key_fingerprint"
    ));
    let want: Vec<BTreeMap<String, Value>> = oracle["current"][source]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut m = BTreeMap::new();
            m.insert(
                "natural_key_fingerprint".to_string(),
                r["natural_key_fingerprint"].clone(),
            );
            m.insert("row_hash".to_string(), r["row_hash"].clone());
            m
        })
        .collect();
    assert_eq!(current, want, "{source}: bronze.{source}_current");
}

#[test]
fn bookings_story_matches_oracle() {
    check_source("bookings");
}

#[test]
fn hotels_story_matches_oracle() {
    check_source("hotels");
}

#[test]
fn marketing_spend_story_matches_oracle() {
    check_source("marketing_spend");
}

#[test]
fn web_sessions_story_matches_oracle() {
    check_source("web_sessions");
}

#[test]
fn site_traffic_story_matches_oracle() {
    check_source("site_traffic");
}

/// The partitioned (spilling) change detection gives exactly the same runs, rows and failures.
#[test]
fn bookings_story_matches_oracle_with_partitioned_change_detection() {
    check_source_in("bookings", TestLake::partitioned());
}

#[test]
fn marketing_spend_story_matches_oracle_with_partitioned_change_detection() {
    check_source_in("marketing_spend", TestLake::partitioned());
}

#[test]
fn typed_values_land_as_arrived_and_volatile_changes_write_nothing() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    let rows = t.query("SELECT booking_ref, hotel_code, amount, check_in, nights, exported_at, arrow_typeof(amount) AS t_amount, arrow_typeof(exported_at) AS t_exported FROM bronze.bookings WHERE source_row_number = 1");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["booking_ref"], "BK100001");
    assert_eq!(r["hotel_code"], "MAD01");
    assert_eq!(r["check_in"], "2026-11-08");
    assert_eq!(r["nights"], 4);
    assert_eq!(r["t_amount"], "Decimal128(12, 2)");
    assert_eq!(r["t_exported"], "Timestamp(µs, \"UTC\")");
    // the e-mail typed with spaces and capitals is stored as it arrived
    let ann = t.query("SELECT guest_email FROM bronze.bookings WHERE guest_email LIKE '%Ann.Smith%'");
    assert_eq!(ann.len(), 1);
    assert_eq!(ann[0]["guest_email"], "  Ann.Smith@Example.COM ");
}

#[test]
fn ingesting_the_same_file_twice_is_skipped_and_changes_nothing() {
    let t = TestLake::new();
    let file = landing("bookings/2026-11-01_bookings.csv");
    t.ingest_ok("bookings", &file);
    let before = t.snapshot(&["bookings"]);
    let out = t.ingest_ok("bookings", &file);
    assert!(out.contains("skipped, identical to a file already loaded"), "{out}");
    let runs = t
        .query("SELECT status, rows_seen, rows_inserted, rows_failed FROM audit.ingestion_run_log ORDER BY started_at");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["status"], "skipped_duplicate_file");
    assert_eq!(runs[1]["rows_seen"], 0);
    let after = t.snapshot(&["bookings"]);
    assert_eq!(before.tables["bronze.bookings"], after.tables["bronze.bookings"]);
    assert_eq!(
        before.tables["audit.row_failure_log"],
        after.tables["audit.row_failure_log"]
    );
}

#[test]
fn sql_udfs_agree_with_stored_hashes() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    let rows = t.query(
        "SELECT count(*) AS n, sum(CASE WHEN natural_key_fingerprint = natural_key_fingerprint(1, normalize_text(hotel_code, 'trim,upper')) THEN 1 ELSE 0 END) AS same FROM bronze.hotels",
    );
    assert_eq!(rows[0]["n"], rows[0]["same"]);
    assert_eq!(rows[0]["n"], 20);
}

#[test]
fn output_formats_for_scripts() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    let out = t.run(&[
        "sql",
        "SELECT hotel_code, rooms FROM bronze.hotels ORDER BY hotel_code LIMIT 2",
        "--format",
        "csv",
    ]);
    assert_ok(&out);
    let text = crate::util::stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "hotel_code,rooms");
    assert_eq!(lines.len(), 3);
    let parquet = t.dir.path().join("out.parquet");
    let out = t.run(&[
        "sql",
        "SELECT * FROM bronze.hotels",
        "--format",
        "parquet",
        "--output",
        parquet.to_str().unwrap(),
    ]);
    assert_ok(&out);
    let file = std::fs::File::open(&parquet).unwrap();
    let reader = ingot_parquet_rows(file);
    assert_eq!(reader, 20);

    // an Arrow IPC stream on stdout holds the same rows as the JSON lines of the same query
    let q = "SELECT hotel_code, hotel_id, name, rooms, opened_on, row_hash FROM bronze.hotels ORDER BY hotel_code";
    let out = t.run(&["sql", q, "--format", "arrow"]);
    assert_ok(&out);
    let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(out.stdout), None).unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    let mut json = datafusion::arrow::json::LineDelimitedWriter::new(Vec::new());
    for b in &batches {
        json.write(b).unwrap();
    }
    json.finish().unwrap();
    let from_arrow: Vec<BTreeMap<String, Value>> = String::from_utf8(json.into_inner())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rows = t.query(q);
    assert_eq!(rows.len(), 20);
    assert_eq!(from_arrow, rows);
}

fn ingot_parquet_rows(file: std::fs::File) -> usize {
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    let r = SerializedFileReader::new(file).unwrap();
    r.metadata().file_metadata().num_rows() as usize
}

#[test]
fn sql_is_read_only() {
    let t = TestLake::new();
    for q in [
        "CREATE TABLE x AS SELECT 1",
        "CREATE EXTERNAL TABLE y STORED AS PARQUET LOCATION '/tmp/y'",
        "INSERT INTO audit.ingestion_run_log SELECT * FROM audit.ingestion_run_log",
        "COPY (SELECT 1) TO '/tmp/ingot-copy-test.parquet'",
        "DROP TABLE bronze.bookings",
    ] {
        let out = t.run(&["sql", q]);
        assert_eq!(out.status.code(), Some(2), "{q}");
        let err = crate::util::stderr(&out);
        assert!(err.contains("read-only"), "{q}: {err}");
    }
}

#[test]
fn parquet_input_gives_the_same_hashes_as_csv_and_rejects_uncastable_values() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    // a Parquet export of the same typed rows, loaded through a Parquet contract
    let contract = std::fs::read_to_string(t.contracts().join("hotels.yaml")).unwrap();
    let pq_contract = contract
        .replace("source: hotels", "source: hotels_pq")
        .replace("format: csv", "format: parquet");
    let pq_contract: String = pq_contract
        .lines()
        .filter(|l| {
            !l.starts_with("csv:")
                && !l.starts_with("  delimiter")
                && !l.starts_with("  header")
                && !l.starts_with("  quote")
                && !l.starts_with("  null_values")
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(t.contracts().join("hotels_pq.yaml"), pq_contract).unwrap();
    let fields: Vec<String> = {
        let mut problems = ingot::spec::yaml::Problems::default();
        let c = ingot::spec::contract::Contract::from_file(&t.contracts().join("hotels_pq.yaml"), &mut problems)
            .unwrap_or_else(|| panic!("{:?}", problems.items));
        c.fields.iter().map(|f| f.name.clone()).collect()
    };
    let export = t.dir.path().join("hotels.parquet");
    let q = format!(
        "SELECT {} FROM bronze.hotels ORDER BY source_row_number",
        fields.join(", ")
    );
    assert_ok(&t.run(&["sql", &q, "--format", "parquet", "--output", export.to_str().unwrap()]));
    t.ingest_ok("hotels_pq", &export);
    let csv_rows = t.query(
        "SELECT source_row_number, natural_key_fingerprint, row_hash FROM bronze.hotels ORDER BY source_row_number",
    );
    let pq_rows = t.query(
        "SELECT source_row_number, natural_key_fingerprint, row_hash FROM bronze.hotels_pq ORDER BY source_row_number",
    );
    assert_eq!(csv_rows.len(), 20);
    assert_eq!(csv_rows, pq_rows);

    // a value that cannot be cast to the contract type rejects just that row
    let rooms_idx = fields.iter().position(|f| f == "rooms").unwrap();
    let mut cols = fields.clone();
    cols[rooms_idx] = "CASE WHEN source_row_number = 3 THEN 'many' ELSE CAST(rooms AS VARCHAR) END AS rooms".into();
    let bad = t.dir.path().join("hotels_bad.parquet");
    let q = format!(
        "SELECT {} FROM bronze.hotels ORDER BY source_row_number",
        cols.join(", ")
    );
    assert_ok(&t.run(&["sql", &q, "--format", "parquet", "--output", bad.to_str().unwrap()]));
    std::fs::remove_dir_all(t.lake()).unwrap();
    t.ingest_ok("hotels_pq", &bad);
    let f = t.query("SELECT source_row_number, rule, raw_payload FROM audit.row_failure_log");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["source_row_number"], 3);
    assert_eq!(f[0]["rule"], "type:rooms");
    assert!(
        f[0]["raw_payload"].as_str().unwrap().contains("\"rooms\":\"many\""),
        "{f:?}"
    );
    assert_eq!(t.query("SELECT count(*) AS n FROM bronze.hotels_pq")[0]["n"], 19);
}

#[test]
fn runs_and_failures_views_for_people_and_scripts() {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    let out = t.run(&["runs", "--source", "bookings", "--format", "csv"]);
    assert_ok(&out);
    let text = crate::util::stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "started_at,run_id,source,status,rows_seen,rows_inserted,rows_updated,rows_unchanged,rows_failed,rows_deleted,file_path,replay_of,rolled_back_at,error,held_reason"
    );
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[1].contains(",bookings,succeeded_with_failures,305,296,0,1,8,"),
        "{text}"
    );

    let run_id = t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'bookings'")[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = t.run(&["failures", "--run", &run_id, "--format", "json"]);
    assert_ok(&out);
    let rows: Vec<Value> = crate::util::stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rules: Vec<&str> = rows.iter().map(|r| r["rule"].as_str().unwrap()).collect();
    assert_eq!(
        rules,
        vec![
            "type:amount",
            "type:check_in",
            "required:booking_ref",
            "min:amount",
            "pattern:currency",
            "allowed:booking_status",
            "natural_key_conflict",
            "natural_key_conflict"
        ]
    );
    let table = crate::util::stdout(&t.run(&["failures"]));
    assert!(table.contains("| type:amount") && table.contains("(8 rows)"), "{table}");
}

#[test]
fn help_explains_commands_and_exit_codes() {
    let t = TestLake::new();
    let out = t.run(&["--help"]);
    assert_ok(&out);
    let text = crate::util::stdout(&out);
    for needle in [
        "ingest",
        "check",
        "sql",
        "runs",
        "failures",
        "Exit codes",
        "--lake",
        "INGOT_LAKE",
        "--memory-limit",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}:\n{text}");
    }
    let out = t.run(&["ingest", "--help"]);
    assert!(crate::util::stdout(&out).contains("skipped_duplicate_file"));
    let out = t.run(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn committed_sample_data_matches_its_generator() {
    let out = std::process::Command::new("python3")
        .arg(repo().join("scripts/gen_demo_data.py"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "data/ differs from scripts/gen_demo_data.py:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ndjson_numbers_are_typed_from_their_exact_digits() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("exact.yaml"),
        r#"source: exact
version: 1
format: ndjson
fields:
  - {name: id, type: string, required: true}
  - {name: d, type: "decimal(38,2)"}
  - {name: i, type: int64}
  - {name: b, type: boolean}
natural_key: {version: 1, fields: [id]}
"#,
    )
    .unwrap();
    let input = t.dir.path().join("exact.ndjson");
    std::fs::write(
        &input,
        "{\"id\":\"a\",\"d\":923456789012345.61,\"i\":9007199254740993,\"b\":true}\n{\"id\":\"b\",\"d\":1.234,\"i\":1}\n{\"id\":\"c\",\"d\":\"7.5\",\"i\":null,\"b\":\"no\"}\n",
    )
    .unwrap();
    t.ingest_ok("exact", &input);
    let rows = t.query("SELECT id, CAST(d AS VARCHAR) AS d, CAST(i AS VARCHAR) AS i, b FROM bronze.exact ORDER BY id");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["d"], "923456789012345.61");
    assert_eq!(rows[0]["i"], "9007199254740993");
    assert_eq!(rows[0]["b"], true);
    assert_eq!(rows[1]["d"], "7.50");
    assert_eq!(rows[1]["b"], false);
    let f = t.query("SELECT source_row_number, rule, reason FROM audit.row_failure_log");
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["rule"], "type:d");
    assert!(f[0]["reason"].as_str().unwrap().contains("found \"1.234\""), "{f:?}");
}

#[test]
fn parquet_values_are_never_rounded_and_text_columns_use_the_contract_formats() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("pq.yaml"),
        r#"source: pq
version: 1
format: parquet
fields:
  - {name: id, type: string, required: true}
  - {name: i, type: int64}
  - {name: d, type: "decimal(12,2)"}
  - {name: dt, type: date, format: "%d/%m/%Y"}
natural_key: {version: 1, fields: [id]}
"#,
    )
    .unwrap();
    let file = t.dir.path().join("in.parquet");
    let q = "SELECT * FROM (VALUES \
        ('a', CAST(2.0 AS DOUBLE), arrow_cast(1.230, 'Decimal128(10,3)'), '03/11/2026'), \
        ('b', CAST(1.7 AS DOUBLE), arrow_cast(1.230, 'Decimal128(10,3)'), '03/11/2026'), \
        ('c', CAST(3.0 AS DOUBLE), arrow_cast(1.235, 'Decimal128(10,3)'), '03/11/2026'), \
        ('d', CAST(4.0 AS DOUBLE), arrow_cast(1.000, 'Decimal128(10,3)'), '2026-11-03')) AS v(id, i, d, dt)";
    assert_ok(&t.run(&["sql", q, "--format", "parquet", "--output", file.to_str().unwrap()]));
    t.ingest_ok("pq", &file);
    let rows = t.query("SELECT id, i, CAST(d AS VARCHAR) AS d, CAST(dt AS VARCHAR) AS dt FROM bronze.pq ORDER BY id");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["id"], "a");
    assert_eq!(rows[0]["i"], 2);
    assert_eq!(rows[0]["d"], "1.23");
    assert_eq!(rows[0]["dt"], "2026-11-03");
    let f = t.query("SELECT source_row_number, rule, reason FROM audit.row_failure_log ORDER BY source_row_number");
    let got: Vec<(i64, &str)> = f
        .iter()
        .map(|r| (r["source_row_number"].as_i64().unwrap(), r["rule"].as_str().unwrap()))
        .collect();
    assert_eq!(got, vec![(2, "type:i"), (3, "type:d"), (4, "type:dt")]);
    assert!(
        f[0]["reason"].as_str().unwrap().contains("1.7") && f[0]["reason"].as_str().unwrap().contains("without loss"),
        "{f:?}"
    );
    assert!(f[2]["reason"].as_str().unwrap().contains("%d/%m/%Y"), "{f:?}");
}

/// CSV values in canonical form are hashed from their input bytes (decimals padded to their
/// scale); any other spelling makes the batch hash its typed values. Both must store exactly the
/// hashes the SQL UDFs compute from the stored typed columns. (The key is `id` alone: `s` holds
/// a `|` and nulls, which a composite key refuses as `natural_key_invalid`.)
#[test]
fn hashes_from_input_text_equal_the_udfs_over_typed_values() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("canon.yaml"),
        r#"source: canon
version: 1
format: csv
csv: {delimiter: ",", header: true, quote: '"', null_values: [""]}
fields:
  - {name: id, type: int64, required: true}
  - {name: n, type: int32}
  - {name: d, type: "decimal(15,2)"}
  - {name: z, type: "decimal(9,0)"}
  - {name: dt, type: date}
  - {name: b, type: boolean}
  - {name: s, type: string}
  - {name: v, type: string, volatile: true}
natural_key: {version: 3, fields: [id]}
"#,
    )
    .unwrap();
    let canonical = t.dir.path().join("canonical.csv");
    std::fs::write(
        &canonical,
        "id,n,d,z,dt,b,s,v\n\
         1,17,17,5,1996-03-13,true,plain,x\n\
         2,-5,-0.05,-7,0000-03-01,false,\"pipe|and\\\\back\",y\n\
         3,0,0.04,0,9999-12-31,,\"quoted, \"\"comma\"\"\",\n\
         4,,21168.23,,,true,,z\n\
         5,2147483647,17.5,123456789,2026-02-28,false,\\N,w\n\
         6,-2147483648,-1234567890123.00,-1,1970-01-01,true,é ü,v\n",
    )
    .unwrap();
    let other = t.dir.path().join("other.csv");
    std::fs::write(
        &other,
        "id,n,d,z,dt,b,s,v\n\
         7,+5,1.500,007,1996-03-13,TRUE,a,x\n\
         8, 5 ,-0.00,-0,1996-03-13,yes,b,x\n\
         9,-0,.25,0,1996-03-13,0,c,x\n",
    )
    .unwrap();
    t.ingest_ok("canon", &canonical);
    t.ingest_ok("canon", &other);
    // The same rows without the volatile column: the row hash covers every field, so a row with
    // no null and no `|` or `\` to escape is hashed straight from the captured texts.
    std::fs::write(
        t.contracts().join("plain.yaml"),
        r#"source: plain
version: 1
format: csv
csv: {delimiter: ",", header: true, quote: '"', null_values: [""]}
fields:
  - {name: id, type: int64, required: true}
  - {name: n, type: int32}
  - {name: d, type: "decimal(15,2)"}
  - {name: z, type: "decimal(9,0)"}
  - {name: dt, type: date}
  - {name: b, type: boolean}
  - {name: s, type: string}
natural_key: {version: 3, fields: [id]}
"#,
    )
    .unwrap();
    for file in [&canonical, &other] {
        let text = std::fs::read_to_string(file).unwrap();
        let without_v: String = text
            .lines()
            .map(|l| format!("{}\n", l.rsplit_once(',').unwrap().0))
            .collect();
        let path = t
            .dir
            .path()
            .join(format!("plain-{}", file.file_name().unwrap().to_string_lossy()));
        std::fs::write(&path, without_v).unwrap();
        t.ingest_ok("plain", &path);
    }
    for source in ["canon", "plain"] {
        let rows = t.query(&format!(
            "SELECT count(*) AS n, \
             sum(CASE WHEN row_hash = row_hash(id, n, d, z, dt, b, s) THEN 1 ELSE 0 END) AS rh, \
             sum(CASE WHEN natural_key_fingerprint = natural_key_fingerprint(3, id) THEN 1 ELSE 0 END) AS fp \
             FROM bronze.{source}"
        ));
        assert_eq!(rows[0]["n"], 9, "{source}: {rows:?}");
        assert_eq!(rows[0]["rh"], 9, "{source}: {rows:?}");
        assert_eq!(rows[0]["fp"], 9, "{source}: {rows:?}");
    }
    let f = t.query("SELECT count(*) AS n FROM audit.row_failure_log");
    assert_eq!(f[0]["n"], 0);
}

/// String fields with `normalize` steps are normalized once per value while the rows are typed,
/// and a batch without rejections is hashed from those normalized texts: the stored hashes must
/// be those the SQL UDFs compute from the stored (raw) columns through `normalize_text`, and the
/// normalized value is what the required, key, `allowed` and `pattern` checks see.
#[test]
fn normalized_texts_hash_as_the_udfs_over_normalized_values() {
    let t = TestLake::new();
    std::fs::write(
        t.contracts().join("norm.yaml"),
        r#"source: norm
version: 1
format: csv
csv: {delimiter: ",", header: true, quote: '"', null_values: [""]}
fields:
  - {name: code, type: string, required: true, normalize: [trim, upper]}
  - {name: ref, type: string, normalize: [trim, lower, collapse_whitespace]}
  - {name: email, type: string, normalize: [trim, lower]}
  - {name: state, type: string, allowed: [a, b], normalize: [trim, lower]}
  - {name: cur, type: string, pattern: "^[A-Z]{3}$", normalize: [trim, upper]}
  - {name: note, type: string, normalize: [nfkc]}
  - {name: n, type: int32}
natural_key: {version: 2, fields: [code, ref]}
"#,
    )
    .unwrap();
    let good = t.dir.path().join("good.csv");
    std::fs::write(
        &good,
        "code,ref,email,state,cur,n,note\n\
         \" ams01 \",\"  Hello   World \", Ann@X.COM , A ,eur,1,\u{fb01}ne\n\
         Σx,ΣΑΣ,,b,Usd ,2,a|b\n\
         çA,r\u{a0}\u{a0}1,BOB@y.org,a,GBP,3,back\\slash\n",
    )
    .unwrap();
    t.ingest_ok("norm", &good);
    // The same rules with rejected rows in the batch (its hashes come from the typed values).
    let mixed = t.dir.path().join("mixed.csv");
    std::fs::write(
        &mixed,
        "code,ref,email,state,cur,n,note\n\
         \"   \",x,,a,EUR,1,\n\
         k1,\" a|b \",,a,EUR,1,\n\
         k2,y,,zz,EUR,1,\n\
         k3,y,, B ,eu,1,\n\
         \" k4 \",\" Y \",,b,chf,4,ok\n",
    )
    .unwrap();
    t.ingest_ok("norm", &mixed);
    let rows = t.query(
        "SELECT count(*) AS n, \
         sum(CASE WHEN row_hash = row_hash(normalize_text(code, 'trim,upper'), \
             normalize_text(ref, 'trim,lower,collapse_whitespace'), normalize_text(email, 'trim,lower'), \
             normalize_text(state, 'trim,lower'), normalize_text(cur, 'trim,upper'), \
             normalize_text(note, 'nfkc'), n) THEN 1 ELSE 0 END) AS rh, \
         sum(CASE WHEN natural_key_fingerprint = natural_key_fingerprint(2, normalize_text(code, 'trim,upper'), \
             normalize_text(ref, 'trim,lower,collapse_whitespace')) THEN 1 ELSE 0 END) AS fp \
         FROM bronze.norm",
    );
    assert_eq!(rows[0]["n"], 4, "{rows:?}");
    assert_eq!(rows[0]["rh"], 4, "{rows:?}");
    assert_eq!(rows[0]["fp"], 4, "{rows:?}");
    let f = t.query("SELECT source_row_number, rule FROM audit.row_failure_log ORDER BY source_row_number");
    let got: Vec<(i64, &str)> = f
        .iter()
        .map(|r| (r["source_row_number"].as_i64().unwrap(), r["rule"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "required:code"),
            (2, "natural_key_invalid"),
            (3, "allowed:state"),
            (4, "pattern:cur")
        ]
    );
}
