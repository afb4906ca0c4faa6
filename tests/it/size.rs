//! The size tier: generated data large enough to cross the thresholds small tests never reach
//! (the S3 half, files of tens of MiB in multipart uploads, is in `s3.rs`).
//!
//! A million and a half lineitem-like rows, ingested once and re-delivered with 1% of the rows
//! changed, then queried under a memory limit below the data (`--memory-limit 256M`), each
//! query with a watchdog: it must give its answer, or a clear error naming `--memory-limit`,
//! within the watchdog's time, never hang. `SELECT *` over `bronze.<source>_current` exported to
//! Parquet and CSV (the export that parked forever at SF1), the same with `ORDER BY ... LIMIT 3`,
//! and an aggregate that cannot spill. The exported rows are compared, whole, with a lake that
//! ingested only the final state of the records.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::{Rng, TestLake, assert_ok, repo, stderr, stdout};

/// Rows of the generated delivery.
const ROWS: i64 = 1_500_000;
/// The memory limit the queries run under: a pool of 217 MB for about 300 MB of rows in memory
/// (the SF1 export that hung had 870 MB for 1.2 GB).
const SMALL_LIMIT: &str = "256M";
/// A query that gives no answer in this long has hung (a debug build over 1.5M rows).
const WATCHDOG: Duration = Duration::from_secs(300);

const WORDS: &[&str] = &[
    "furiously",
    "regular",
    "pending",
    "deposits",
    "sleep",
    "carefully",
    "ironic",
    "packages",
    "quickly",
    "final",
    "accounts",
    "boost",
    "blithely",
    "express",
    "requests",
    "haggle",
    "slyly",
    "bold",
    "theodolites",
];
const MODES: &[&str] = &["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"];

/// The delivery as lineitem CSV (the contract of `bench/contracts/lineitem.yaml`); rows whose
/// index `changed` picks get another quantity and comment (a corrected re-delivery).
fn lineitem_csv(path: &Path, changed: &dyn Fn(i64) -> bool) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(
        out,
        "l_orderkey,l_partkey,l_suppkey,l_linenumber,l_quantity,l_extendedprice,l_discount,l_tax,\
         l_returnflag,l_linestatus,l_shipdate,l_commitdate,l_receiptdate,l_shipinstruct,l_shipmode,l_comment"
    )
    .unwrap();
    for i in 0..ROWS {
        let mut rng = Rng(0x51f1_5eed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let bump = if changed(i) { 1 } else { 0 };
        let quantity = rng.range(1, 50) + bump;
        let price = rng.range(90_000, 10_000_000);
        let day = |rng: &mut Rng| {
            let d = rng.range(0, 2500);
            format!("{}-{:02}-{:02}", 1992 + d / 365, 1 + (d % 365) / 31 % 12, 1 + d % 28)
        };
        let comment: Vec<&str> = (0..4 + rng.below(4))
            .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
            .collect();
        writeln!(
            out,
            "{},{},{},{},{quantity}.00,{}.{:02},0.0{},0.0{},{},{},{},{},{},DELIVER IN PERSON,{},\"{}{}\"",
            i / 4 + 1,
            rng.range(1, 200_000),
            rng.range(1, 10_000),
            i % 4 + 1,
            price / 100,
            price % 100,
            rng.below(10),
            rng.below(9),
            ["A", "N", "R"][rng.below(3) as usize],
            ["F", "O"][rng.below(2) as usize],
            day(&mut rng),
            day(&mut rng),
            day(&mut rng),
            MODES[rng.below(MODES.len() as u64) as usize],
            comment.join(" "),
            if bump == 1 { " (corrected)" } else { "" },
        )
        .unwrap();
    }
}

/// A lake with the lineitem contract.
fn lineitem_lake() -> TestLake {
    let t = TestLake::new();
    std::fs::copy(
        repo().join("bench/contracts/lineitem.yaml"),
        t.contracts().join("lineitem.yaml"),
    )
    .unwrap();
    t
}

/// `ingot <args>` with a watchdog: killed and failed when it gives no answer within [`WATCHDOG`].
fn watched(t: &TestLake, args: &[&str]) -> Output {
    let mut child = t
        .command()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if started.elapsed() > WATCHDOG {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "ingot {args:?} gave no answer within {WATCHDOG:?} (hung):\n{}",
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An order-independent digest of a CSV export's rows: how often each row occurs, by its SHA-256
/// (the rows themselves would not fit a test's comparison output).
fn row_multiset(path: &Path) -> (u64, BTreeMap<String, u64>) {
    let mut rows = 0;
    let mut by_prefix: BTreeMap<String, u64> = BTreeMap::new();
    let f = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    for line in f.lines().skip(1) {
        let line = line.unwrap();
        rows += 1;
        // rows folded into 256 buckets of summed digests: equal multisets give equal sums
        let h = crate::util::sha256_hex(line.as_bytes());
        let bucket = h[..2].to_string();
        let v = u64::from_str_radix(&h[2..18], 16).unwrap();
        let e = by_prefix.entry(bucket).or_default();
        *e = e.wrapping_add(v);
    }
    (rows, by_prefix)
}

/// The columns of a bronze export that do not depend on which run wrote a row.
const PAYLOAD: &str = "SELECT * EXCLUDE (ingestion_run_id, ingested_at, file_hash, source_row_number)";

#[test]
fn current_versions_of_a_million_and_a_half_rows_under_a_small_memory_limit_answer_or_fail_clearly() {
    let data = tempfile::tempdir().unwrap();
    let (first, corrected) = (data.path().join("lineitem-1.csv"), data.path().join("lineitem-2.csv"));
    lineitem_csv(&first, &|_| false);
    lineitem_csv(&corrected, &|i| i % 100 == 42);

    let t = lineitem_lake();
    for file in [&first, &corrected] {
        let out = t
            .command()
            .args(["ingest", "lineitem", "--json"])
            .arg(file)
            .output()
            .unwrap();
        assert_ok(&out);
    }
    let runs =
        t.query("SELECT rows_inserted, rows_updated, rows_unchanged FROM audit.ingestion_run_log ORDER BY started_at");
    assert_eq!(runs[1]["rows_updated"], ROWS / 100);
    // the final state of every record, loaded once: what _current must show
    let want = lineitem_lake();
    assert_ok(
        &want
            .command()
            .args(["ingest", "lineitem"])
            .arg(&corrected)
            .output()
            .unwrap(),
    );

    let out_dir = data.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let export = |t: &TestLake, sql: &str, format: &str, name: &str| -> PathBuf {
        let path = out_dir.join(name);
        let out = watched(
            t,
            &[
                "--memory-limit",
                SMALL_LIMIT,
                "sql",
                sql,
                "--format",
                format,
                "--output",
                path.to_str().unwrap(),
            ],
        );
        assert_ok(&out);
        path
    };
    // every current row, whole, as the lake of the final state has them
    let current = export(
        &t,
        &format!("{PAYLOAD} FROM bronze.lineitem_current"),
        "csv",
        "current.csv",
    );
    let expected = export(&want, &format!("{PAYLOAD} FROM bronze.lineitem"), "csv", "expected.csv");
    let (n, digest) = row_multiset(&current);
    assert_eq!(n, ROWS as u64);
    assert_eq!(
        (n, digest),
        row_multiset(&expected),
        "_current vs the final state loaded once"
    );
    // the Parquet export of every column (the shape that parked forever)
    let parquet = export(
        &t,
        "SELECT * FROM bronze.lineitem_current",
        "parquet",
        "current.parquet",
    );
    assert!(std::fs::metadata(&parquet).unwrap().len() > 10 << 20);
    let file = std::fs::File::open(&parquet).unwrap();
    let reader = datafusion::parquet::file::reader::SerializedFileReader::new(file).unwrap();
    use datafusion::parquet::file::reader::FileReader;
    assert_eq!(reader.metadata().file_metadata().num_rows(), ROWS);

    // the first three keys, sorted under the same limit
    let out = watched(
        &t,
        &[
            "--memory-limit",
            SMALL_LIMIT,
            "sql",
            "SELECT l_orderkey, l_linenumber, l_quantity FROM bronze.lineitem_current ORDER BY l_orderkey, l_linenumber LIMIT 3",
            "--format",
            "csv",
        ],
    );
    assert_ok(&out);
    let first_rows: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    let want_rows: Vec<String> = std::io::BufReader::new(std::fs::File::open(&corrected).unwrap())
        .lines()
        .skip(1)
        .take(3)
        .map(|l| {
            let l = l.unwrap();
            let f: Vec<&str> = l.split(',').collect();
            format!("{},{},{}", f[0], f[3], f[4])
        })
        .collect();
    assert_eq!(first_rows[1..], want_rows[..], "{}", stdout(&out));

    // an aggregate that cannot spill: a clear error naming the flag, not a hang
    let out = watched(
        &t,
        &[
            "--memory-limit",
            "16M",
            "sql",
            "SELECT array_agg(l_comment) AS all_comments FROM bronze.lineitem_current",
            "--format",
            "csv",
            "--output",
            out_dir.join("never.csv").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("--memory-limit"), "{said}");
    assert!(said.contains("16M"), "{said}");
}
