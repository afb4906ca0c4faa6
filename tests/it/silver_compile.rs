//! Silver plans (`ingot::silver::compile`): resolve, every step kind, validations and the
//! anomaly semantics of docs/guide.md#rules, over small MemTables and compared whole (every column of
//! every row, sorted), plus one build over the repository's demo data.
//!
//! The anomaly expectations are computed by hand in the comments next to each row; the tests
//! pin the boundaries (exactly `min_history` earlier rows, a value equal to `factor × mean`, a
//! gap of exactly `gap_days`, ties broken by fingerprint, nulls taking no part).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, new_null_array,
};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::Column;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;
use ingot::engine::session::{DEFAULT_MEMORY_LIMIT, Workspace};
use ingot::silver::compile::{
    FAILURE_COLUMNS, FILTERED_COLUMNS, Lookup, Lookups, Transformed, explain, flag, read_inputs, resolve, transform,
};
use ingot::spec::contract::{Contract, ContractSet};
use ingot::spec::rules::{RuleSet, RulesSet};
use ingot::spec::yaml::Problems;

use crate::util::{TestLake, landing, repo};

const ORDERS: &str = "source: orders
version: 1
format: csv
fields:
  - name: order_id
    type: string
    required: true
  - name: shop
    type: string
    normalize: [trim, upper]
  - name: partner
    type: string
  - name: amt
    type: decimal(10,2)
  - name: placed
    type: date
  - name: note
    type: string
natural_key:
  version: 1
  fields: [order_id]
resolve:
  - name: shop
    from: shop
    lookup: shops
    key: code
    value: shop_id
    on_missing: reject
  - name: partner
    from: partner
    lookup: shops
    key: code
    value: name
    as: partner_name
    on_missing: \"null\"
";

const SHOPS: &str = "source: shops
version: 1
format: csv
fields:
  - name: code
    type: string
    normalize: [upper]
  - name: shop_id
    type: int64
  - name: name
    type: string
natural_key:
  version: 1
  fields: [code]
";

/// Columns for the anomaly tests; `flag` only needs the ones a test's rules read.
const METRICS: &str = "source: metrics
version: 1
format: csv
fields:
  - name: id
    type: string
    required: true
  - name: grp
    type: string
  - name: grp2
    type: string
  - name: day
    type: date
  - name: ts
    type: timestamp
  - name: val
    type: int64
  - name: amount
    type: decimal(10,2)
  - name: ratio
    type: float64
natural_key:
  version: 1
  fields: [id]
";

struct Fixture {
    _dir: tempfile::TempDir,
    contracts: ContractSet,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [("orders", ORDERS), ("shops", SHOPS), ("metrics", METRICS)] {
            std::fs::write(dir.path().join(format!("{name}.yaml")), text).unwrap();
        }
        let mut problems = Problems::default();
        let contracts = ContractSet::load(dir.path(), &mut problems);
        assert!(problems.is_empty(), "{:#?}", problems.items);
        Fixture { _dir: dir, contracts }
    }

    fn contract(&self, source: &str) -> Arc<Contract> {
        self.contracts.contracts[source].clone()
    }

    fn rules(&self, table: &str, text: &str) -> RuleSet {
        let mut problems = Problems::default();
        let path = format!("rules/{table}/v1.yaml");
        let rules = RuleSet::from_str(Path::new(&path), text, &self.contracts, &mut problems);
        assert!(problems.is_empty(), "{:#?}", problems.items);
        rules.unwrap()
    }
}

fn strings(v: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

fn ints(v: &[Option<i64>]) -> ArrayRef {
    Arc::new(Int64Array::from(v.to_vec()))
}

fn floats(v: &[Option<f64>]) -> ArrayRef {
    Arc::new(Float64Array::from(v.to_vec()))
}

/// Decimal(10,2) from hundredths.
fn cents(v: &[Option<i128>]) -> ArrayRef {
    Arc::new(
        Decimal128Array::from(v.to_vec())
            .with_precision_and_scale(10, 2)
            .unwrap(),
    )
}

/// Dates from `YYYY-MM-DD` text.
fn dates(v: &[Option<&str>]) -> ArrayRef {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap();
    Arc::new(Date32Array::from(
        v.iter()
            .map(|d| d.map(|d| (d.parse::<chrono::NaiveDate>().unwrap() - epoch).num_days() as i32))
            .collect::<Vec<_>>(),
    ))
}

/// UTC timestamps (microseconds) from RFC 3339 text.
fn timestamps(v: &[Option<&str>]) -> ArrayRef {
    Arc::new(
        TimestampMicrosecondArray::from(
            v.iter()
                .map(|t| t.map(|t| chrono::DateTime::parse_from_rfc3339(t).unwrap().timestamp_micros()))
                .collect::<Vec<_>>(),
        )
        .with_timezone("UTC"),
    )
}

/// A MemTable of `schema` where the named columns are given and every other column is null.
fn mem(ctx: &SessionContext, schema: SchemaRef, given: Vec<(&str, ArrayRef)>) -> DataFrame {
    let n = given.first().map_or(0, |(_, a)| a.len());
    let given: BTreeMap<&str, ArrayRef> = given.into_iter().collect();
    let schema = Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), f.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| {
            given
                .get(f.name().as_str())
                .cloned()
                .unwrap_or_else(|| new_null_array(f.data_type(), n))
        })
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    ctx.read_table(Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()))
        .unwrap()
}

/// Current bronze rows of `contract`: the given fields, and per row the fingerprint `fp-<id>`,
/// row hash `rh-<id>`, run `run-1` and record number i + 1 (`id` is the first given column).
fn bronze(ctx: &SessionContext, contract: &Contract, mut given: Vec<(&str, ArrayRef)>) -> DataFrame {
    let ids = given[0].1.clone();
    let ids = ids.as_any().downcast_ref::<StringArray>().unwrap();
    let each = |prefix: &str| -> ArrayRef {
        Arc::new(StringArray::from(
            ids.iter()
                .map(|id| format!("{prefix}{}", id.unwrap_or("")))
                .collect::<Vec<_>>(),
        ))
    };
    given.push(("natural_key_fingerprint", each("fp-")));
    given.push(("row_hash", each("rh-")));
    given.push((
        "ingestion_run_id",
        Arc::new(StringArray::from(vec!["run-1"; ids.len()])),
    ));
    given.push((
        "source_row_number",
        Arc::new(Int64Array::from((1..=ids.len() as i64).collect::<Vec<_>>())),
    ));
    mem(ctx, contract.bronze_schema(), given)
}

/// Every row of `df` sorted by `sort`, as `a | b | c` lines after a header line; null is `NULL`.
async fn rows(df: DataFrame, sort: &[&str]) -> Vec<String> {
    let df = if sort.is_empty() {
        df
    } else {
        df.sort(
            sort.iter()
                .map(|s| Expr::Column(Column::new_unqualified(*s)).sort(true, true))
                .collect(),
        )
        .unwrap()
    };
    let header = df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect::<Vec<_>>()
        .join(" | ");
    let options = FormatOptions::default().with_null("NULL");
    let mut out = vec![header];
    for batch in df.collect().await.unwrap() {
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for row in 0..batch.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| f.value(row).to_string())
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
    }
    out
}

fn assert_rows(got: &[String], expected: &[&str]) {
    assert_eq!(
        got,
        expected,
        "\ngot:\n{}\nexpected:\n{}",
        got.join("\n"),
        expected.join("\n")
    );
}

// ---- transform: resolve, steps, validations -------------------------------------------------

/// The shops lookup: `ams` and `BER` match after upper-casing; `Rom`/`ROM` are ambiguous; a row
/// without a code never matches.
fn shops(ctx: &SessionContext, f: &Fixture) -> Lookups {
    let contract = f.contract("shops");
    let rows = bronze(
        ctx,
        &contract,
        vec![
            (
                "code",
                strings(&[Some("ams"), Some("BER"), Some("Rom"), Some("ROM"), None]),
            ),
            ("shop_id", ints(&[Some(1), Some(2), Some(3), Some(4), Some(5)])),
            (
                "name",
                strings(&[
                    Some("Amsterdam"),
                    Some("Berlin"),
                    Some("Rome"),
                    Some("Roma"),
                    Some("nowhere"),
                ]),
            ),
        ],
    );
    BTreeMap::from([("shops".to_string(), Lookup { contract, rows })])
}

async fn run(f: &Fixture, rules: &RuleSet, input: DataFrame, ctx: &SessionContext) -> Transformed {
    let lookups = shops(ctx, f);
    transform(ctx, rules, &f.contract("orders"), input, &lookups).unwrap()
}

const NO_RULES: &str = "table: orders\nsource: orders\nversion: 3\n";

#[tokio::test]
async fn resolve_matches_after_normalize_and_rejects_or_nulls_what_is_missing() {
    let f = Fixture::new();
    let ctx = SessionContext::new();
    let input = bronze(
        &ctx,
        &f.contract("orders"),
        vec![
            (
                "order_id",
                strings(&[Some("o1"), Some("o2"), Some("o3"), Some("o4"), Some("o5"), Some("o6")]),
            ),
            // orders.shop normalizes with [trim, upper], shops.code with [upper]
            (
                "shop",
                strings(&[Some(" ams "), Some("ber"), Some("xyz"), None, Some("rom"), Some("BER")]),
            ),
            // partner has no normalize steps: "ams" does not match "AMS"; a miss is null
            (
                "partner",
                strings(&[Some("AMS"), Some("ams"), Some("BER"), None, None, Some("nope")]),
            ),
            (
                "amt",
                cents(&[Some(1000), Some(-100), Some(500), Some(1), Some(2), Some(3)]),
            ),
        ],
    );
    let mut problems = Problems::default();
    let rules = RuleSet::from_str(Path::new("rules/orders/v3.yaml"), NO_RULES, &f.contracts, &mut problems).unwrap();
    let t = run(&f, &rules, input.clone(), &ctx).await;
    assert_rows(
        &rows(t.passed, &["order_id"]).await,
        &[
            "order_id | shop | partner | amt | placed | note | shop_id | partner_name | rules_version | natural_key_fingerprint | row_hash | ingestion_run_id",
            "o1 |  ams  | AMS | 10.00 | NULL | NULL | 1 | Amsterdam | 3 | fp-o1 | rh-o1 | run-1",
            "o2 | ber | ams | -1.00 | NULL | NULL | 2 | NULL | 3 | fp-o2 | rh-o2 | run-1",
            "o6 | BER | nope | 0.03 | NULL | NULL | 2 | NULL | 3 | fp-o6 | rh-o6 | run-1",
        ],
    );
    assert_rows(
        &rows(t.rejected, &["natural_key_fingerprint"]).await,
        &[
            &FAILURE_COLUMNS.join(" | "),
            r#"fp-o3 | 3 | resolve:shop | no shops row has code "xyz" | {"order_id":"o3","shop":"xyz","partner":"BER","amt":5.00,"placed":null,"note":null,"shop_id":null,"partner_name":"Berlin"}"#,
            r#"fp-o4 | 4 | resolve:shop | shop is null: nothing to look up in shops | {"order_id":"o4","shop":null,"partner":null,"amt":0.01,"placed":null,"note":null,"shop_id":null,"partner_name":null}"#,
            r#"fp-o5 | 5 | resolve:shop | 2 shops rows have code "rom"; resolve needs exactly one | {"order_id":"o5","shop":"rom","partner":null,"amt":0.02,"placed":null,"note":null,"shop_id":null,"partner_name":null}"#,
        ],
    );
    assert_rows(&rows(t.failed, &[]).await, &[&FAILURE_COLUMNS.join(" | ")]);
    assert_rows(&rows(t.filtered, &[]).await, &[&FILTERED_COLUMNS.join(" | ")]);

    // resolve alone: the values and the first missing reject-resolve, in hidden columns
    let lookups = shops(&ctx, &f);
    let resolved = resolve(input, &f.contract("orders"), &lookups)
        .unwrap()
        .select_columns(&[
            "order_id",
            "shop_id",
            "partner_name",
            "__ingot_resolve_rule",
            "__ingot_resolve_reason",
        ])
        .unwrap();
    assert_rows(
        &rows(resolved, &["order_id"]).await,
        &[
            "order_id | shop_id | partner_name | __ingot_resolve_rule | __ingot_resolve_reason",
            "o1 | 1 | Amsterdam | NULL | NULL",
            "o2 | 2 | NULL | NULL | NULL",
            r#"o3 | NULL | Berlin | resolve:shop | no shops row has code "xyz""#,
            "o4 | NULL | NULL | resolve:shop | shop is null: nothing to look up in shops",
            r#"o5 | NULL | NULL | resolve:shop | 2 shops rows have code "rom"; resolve needs exactly one"#,
            "o6 | 2 | NULL | NULL | NULL",
        ],
    );
}

#[tokio::test]
async fn every_step_kind_runs_end_to_end_and_filtered_rows_are_counted_by_their_filter() {
    let f = Fixture::new();
    let ctx = SessionContext::new();
    let rules = f.rules(
        "orders",
        r#"table: orders
source: orders
version: 1
steps:
  - set: shop
    expr: "upper(trim(shop))"
  - map: shop
    values: {"AMS": ams01, "BER": ber01}
    default: other
  - rename: {amt: amount, note: remark}
  - cast: {amount: float64}
  - set: amount_x2
    expr: "amount * 2"
  - drop: [remark, partner]
  - filter: "amount_x2 > 10 OR partner_name IS NULL"
  - set: label
    expr: "concat(shop, '/', order_id)"
  - filter: "label <> 'ber01/o6'"
"#,
    );
    let input = bronze(
        &ctx,
        &f.contract("orders"),
        vec![
            (
                "order_id",
                strings(&[Some("o1"), Some("o2"), Some("o3"), Some("o4"), Some("o5"), Some("o6")]),
            ),
            (
                "shop",
                strings(&[
                    Some(" ams"),
                    Some("BER "),
                    Some("bER"),
                    Some("ams"),
                    Some("AMS"),
                    Some("ber"),
                ]),
            ),
            (
                "partner",
                strings(&[Some("ams"), Some("BER"), None, Some("AMS"), Some("AMS"), None]),
            ),
            (
                "amt",
                cents(&[Some(1250), Some(99), Some(400), Some(500), None, Some(10000)]),
            ),
            ("placed", dates(&[Some("2026-01-02"); 6])),
            ("note", strings(&[Some("n"); 6])),
        ],
    );
    let t = run(&f, &rules, input, &ctx).await;
    // o2: amount_x2 1.98 and a partner -> removed by step 7; o4: 10.0 is not > 10 -> step 7;
    // o5: null amount -> the filter is NULL -> removed by step 7; o6 -> step 9
    assert_rows(
        &rows(t.passed, &["order_id"]).await,
        &[
            "order_id | shop | amount | placed | shop_id | partner_name | amount_x2 | label | rules_version | natural_key_fingerprint | row_hash | ingestion_run_id",
            "o1 | ams01 | 12.5 | 2026-01-02 | 1 | NULL | 25.0 | ams01/o1 | 1 | fp-o1 | rh-o1 | run-1",
            "o3 | ber01 | 4.0 | 2026-01-02 | 2 | NULL | 8.0 | ber01/o3 | 1 | fp-o3 | rh-o3 | run-1",
        ],
    );
    assert_rows(
        &rows(t.filtered, &["natural_key_fingerprint"]).await,
        &[
            "natural_key_fingerprint | source_row_number | step | filter",
            "fp-o2 | 2 | 7 | amount_x2 > 10 OR partner_name IS NULL",
            "fp-o4 | 4 | 7 | amount_x2 > 10 OR partner_name IS NULL",
            "fp-o5 | 5 | 7 | amount_x2 > 10 OR partner_name IS NULL",
            "fp-o6 | 6 | 9 | label <> 'ber01/o6'",
        ],
    );
    assert_rows(&rows(t.rejected, &[]).await, &[&FAILURE_COLUMNS.join(" | ")]);
    assert_rows(&rows(t.failed, &[]).await, &[&FAILURE_COLUMNS.join(" | ")]);
}

#[tokio::test]
async fn validations_reject_or_fail_with_the_first_failing_rule_and_null_fails() {
    let f = Fixture::new();
    let ctx = SessionContext::new();
    let rules = f.rules(
        "orders",
        r#"table: orders
source: orders
version: 1
steps:
  - drop: [partner]
validate:
  - name: amount_positive
    check: "amt > 0"
    reason: "amount must be positive"
  - name: placed_known
    check: "placed IS NOT NULL"
    action: fail
  - name: note_short
    check: "length(note) < 5"
    reason: "note too long"
    action: reject
"#,
    );
    let input = bronze(
        &ctx,
        &f.contract("orders"),
        vec![
            (
                "order_id",
                strings(&[
                    Some("v1"),
                    Some("v2"),
                    Some("v3"),
                    Some("v4"),
                    Some("v5"),
                    Some("v6"),
                    Some("v7"),
                ]),
            ),
            (
                "shop",
                strings(&[
                    Some("ams"),
                    Some("ams"),
                    Some("ams"),
                    Some("ams"),
                    Some("ber"),
                    Some("ber"),
                    Some("zzz"),
                ]),
            ),
            (
                "amt",
                cents(&[Some(1000), Some(-100), Some(500), None, Some(500), Some(500), Some(-1)]),
            ),
            (
                "placed",
                dates(&[
                    Some("2026-01-01"),
                    None,
                    None,
                    Some("2026-01-01"),
                    Some("2026-01-01"),
                    Some("2026-01-01"),
                    None,
                ]),
            ),
            (
                "note",
                strings(&[
                    Some("ok"),
                    Some("far too long"),
                    Some("ok"),
                    Some("ok"),
                    Some("toolong"),
                    None,
                    None,
                ]),
            ),
        ],
    );
    let t = run(&f, &rules, input, &ctx).await;
    assert_rows(
        &rows(t.passed, &["order_id"]).await,
        &[
            "order_id | shop | amt | placed | note | shop_id | partner_name | rules_version | natural_key_fingerprint | row_hash | ingestion_run_id",
            "v1 | ams | 10.00 | 2026-01-01 | ok | 1 | NULL | 1 | fp-v1 | rh-v1 | run-1",
        ],
    );
    // v2 breaks all three: the first (a reject) decides, so it is not in `failed`; v4 and v6
    // fail by NULL; v7 is rejected by resolve before any validation sees it
    assert_rows(
        &rows(t.rejected, &["natural_key_fingerprint"]).await,
        &[
            &FAILURE_COLUMNS.join(" | "),
            r#"fp-v2 | 2 | amount_positive | amount must be positive | {"order_id":"v2","shop":"ams","amt":-1.00,"placed":null,"note":"far too long","shop_id":1,"partner_name":null}"#,
            r#"fp-v4 | 4 | amount_positive | amount must be positive | {"order_id":"v4","shop":"ams","amt":null,"placed":"2026-01-01","note":"ok","shop_id":1,"partner_name":null}"#,
            r#"fp-v5 | 5 | note_short | note too long | {"order_id":"v5","shop":"ber","amt":5.00,"placed":"2026-01-01","note":"toolong","shop_id":2,"partner_name":null}"#,
            r#"fp-v6 | 6 | note_short | note too long | {"order_id":"v6","shop":"ber","amt":5.00,"placed":"2026-01-01","note":null,"shop_id":2,"partner_name":null}"#,
            r#"fp-v7 | 7 | resolve:shop | no shops row has code "zzz" | {"order_id":"v7","shop":"zzz","partner":null,"amt":-0.01,"placed":null,"note":null,"shop_id":null,"partner_name":null}"#,
        ],
    );
    assert_rows(
        &rows(t.failed, &["natural_key_fingerprint"]).await,
        &[
            &FAILURE_COLUMNS.join(" | "),
            r#"fp-v3 | 3 | placed_known | check failed: placed IS NOT NULL | {"order_id":"v3","shop":"ams","amt":5.00,"placed":null,"note":"ok","shop_id":1,"partner_name":null}"#,
        ],
    );
    assert_rows(&rows(t.filtered, &[]).await, &[&FILTERED_COLUMNS.join(" | ")]);
}

// ---- flag: anomaly semantics ------------------------------------------------------------------

/// `flag` with `anomalies` (YAML list items) over rows with the given columns; the first column
/// is `natural_key_fingerprint`. Sorted by fingerprint.
async fn flagged(anomalies: &str, given: Vec<(&str, ArrayRef)>) -> Vec<String> {
    let f = Fixture::new();
    let rules = f.rules(
        "metrics",
        &format!("table: metrics\nsource: metrics\nversion: 1\nanomalies:\n{anomalies}"),
    );
    let ctx = SessionContext::new();
    let schema = Arc::new(Schema::new(
        given
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let df = mem(&ctx, schema, given);
    let once = flag(df, &rules).unwrap();
    // flagging a flagged table replaces the flags in place (a stored silver table is re-flagged)
    let twice = flag(once.clone(), &rules).unwrap();
    let got = rows(once, &["natural_key_fingerprint"]).await;
    assert_eq!(rows(twice, &["natural_key_fingerprint"]).await, got);
    got
}

fn fps(n: usize) -> ArrayRef {
    strings(
        &(1..=n)
            .map(|i| Some(format!("f{i:02}")))
            .collect::<Vec<_>>()
            .iter()
            .map(|s| s.as_deref())
            .collect::<Vec<_>>(),
    )
}

#[tokio::test]
async fn spike_needs_min_history_earlier_rows_and_averages_only_the_window() {
    // min_history 3, window 2, factor 2
    let got = flagged(
        "  - name: jump\n    spike: {column: val, by: [grp], order: day, window: 2, factor: 2, min_history: 3}\n",
        vec![
            ("natural_key_fingerprint", fps(7)),
            ("grp", strings(&[Some("a"); 7])),
            (
                "day",
                dates(&[
                    Some("2026-01-01"),
                    Some("2026-01-02"),
                    Some("2026-01-03"),
                    Some("2026-01-04"),
                    Some("2026-01-05"),
                    Some("2026-01-06"),
                    Some("2026-01-07"),
                ]),
            ),
            (
                "val",
                ints(&[Some(1), Some(1), Some(50), Some(200), Some(10), Some(25), Some(36)]),
            ),
        ],
    )
    .await;
    assert_rows(
        &got,
        &[
            "natural_key_fingerprint | grp | day | val | anomaly_flags | is_anomaly",
            "f01 | a | 2026-01-01 | 1 | [] | false",      // no history
            "f02 | a | 2026-01-02 | 1 | [] | false",      // 1 earlier row
            "f03 | a | 2026-01-03 | 50 | [] | false",     // 2 = min_history - 1 earlier rows (50 > 2 x 1)
            "f04 | a | 2026-01-04 | 200 | [jump] | true", // 3 earlier: mean(1, 50) = 25.5, 200 > 51
            "f05 | a | 2026-01-05 | 10 | [] | false",     // mean(50, 200) = 125
            "f06 | a | 2026-01-06 | 25 | [] | false",     // mean(200, 10) = 105
            // mean(10, 25) = 17.5, 36 > 35; over all 6 earlier rows (mean 47.8) or 3 (78.3) it would not
            "f07 | a | 2026-01-07 | 36 | [jump] | true",
        ],
    );
}

#[tokio::test]
async fn spike_never_fires_on_a_mean_of_zero_or_below_and_not_at_exactly_factor_times_mean() {
    let spike = |column: &str, factor: &str| {
        format!(
            "  - name: jump\n    spike: {{column: {column}, by: [grp], order: day, window: 3, factor: {factor}, min_history: 3}}\n"
        )
    };
    let days = || {
        dates(&[
            Some("2026-01-01"),
            Some("2026-01-02"),
            Some("2026-01-03"),
            Some("2026-01-04"),
        ])
    };
    let four = |g: &str| strings(&[Some(g); 4]);
    // integers, factor 2: zero mean, negative mean, value = 2 x mean, value just above
    let mut out = Vec::new();
    for (g, vals, _) in [
        ("z", [0, 0, 0, 5], "mean 0"),
        ("n", [-1, -1, -1, 5], "mean -1"),
        ("e", [10, 10, 10, 20], "20 = 2 x 10"),
        ("a", [10, 10, 10, 21], "21 > 2 x 10"),
    ] {
        out.push(
            flagged(
                &spike("val", "2"),
                vec![
                    ("natural_key_fingerprint", fps(4)),
                    ("grp", four(g)),
                    ("day", days()),
                    ("val", ints(&vals.map(Some))),
                ],
            )
            .await,
        );
    }
    let last = |rows: &Vec<String>| rows.last().unwrap().clone();
    assert_eq!(
        out.iter().map(last).collect::<Vec<_>>(),
        vec![
            "f04 | z | 2026-01-04 | 5 | [] | false",
            "f04 | n | 2026-01-04 | 5 | [] | false",
            "f04 | e | 2026-01-04 | 20 | [] | false",
            "f04 | a | 2026-01-04 | 21 | [jump] | true",
        ]
    );
    // no earlier row fired either
    for rows in &out {
        assert!(rows[1..4].iter().all(|r| r.ends_with("| [] | false")), "{rows:#?}");
    }

    // decimals are exact: 0.7 x mean(0.10) is 0.07, which Float64 would make 0.06999999999999999;
    // 2.5 x mean(4.00) = 10.00
    for (factor, history, value, fires) in [
        ("0.7", 10, 7, false),
        ("0.7", 10, 8, true),
        ("2.5", 400, 1000, false),
        ("2.5", 400, 1001, true),
    ] {
        let got = flagged(
            &spike("amount", factor),
            vec![
                ("natural_key_fingerprint", fps(4)),
                ("grp", four("d")),
                ("day", days()),
                (
                    "amount",
                    cents(&[Some(history), Some(history), Some(history), Some(value)]),
                ),
            ],
        )
        .await;
        let amount = format!("{}.{:02}", value / 100, value % 100);
        let expected = format!(
            "f04 | d | 2026-01-04 | {amount} | {} | {fires}",
            if fires { "[jump]" } else { "[]" }
        );
        assert_eq!(got.last().unwrap(), &expected, "factor {factor}");
    }

    // floats: 2 x mean(1.5) = 3.0 does not fire, 3.5 does
    for (value, fires) in [(3.0, false), (3.5, true)] {
        let got = flagged(
            &spike("ratio", "2"),
            vec![
                ("natural_key_fingerprint", fps(4)),
                ("grp", four("r")),
                ("day", days()),
                ("ratio", floats(&[Some(1.5), Some(1.5), Some(1.5), Some(value)])),
            ],
        )
        .await;
        let expected = format!(
            "f04 | r | 2026-01-04 | {value:?} | {} | {fires}",
            if fires { "[jump]" } else { "[]" }
        );
        assert_eq!(got.last().unwrap(), &expected);
    }
}

#[tokio::test]
async fn spike_rows_with_a_null_by_order_or_value_are_never_flagged_and_are_not_history() {
    // min_history 3, window 3, factor 2; group a, plus rows with nulls that would spike
    let got = flagged(
        "  - name: jump\n    spike: {column: val, by: [grp, grp2], order: day, window: 3, factor: 2, min_history: 3}\n",
        vec![
            ("natural_key_fingerprint", fps(9)),
            (
                "grp",
                strings(&[
                    Some("a"),
                    Some("a"),
                    Some("a"),
                    Some("a"),
                    None,
                    Some("a"),
                    Some("a"),
                    Some("a"),
                    Some("a"),
                ]),
            ),
            (
                "grp2",
                strings(&[
                    Some("x"),
                    Some("x"),
                    Some("x"),
                    Some("x"),
                    Some("x"),
                    None,
                    Some("x"),
                    Some("x"),
                    Some("x"),
                ]),
            ),
            (
                "day",
                dates(&[
                    Some("2026-01-01"),
                    Some("2026-01-02"),
                    None,
                    Some("2026-01-03"),
                    Some("2026-01-04"),
                    Some("2026-01-04"),
                    Some("2026-01-05"),
                    Some("2026-01-06"),
                    Some("2026-01-07"),
                ]),
            ),
            (
                "val",
                ints(&[
                    Some(1),
                    Some(1),
                    Some(100),
                    None,
                    Some(100),
                    Some(100),
                    Some(10),
                    Some(10),
                    Some(10),
                ]),
            ),
        ],
    )
    .await;
    assert_rows(
        &got,
        &[
            "natural_key_fingerprint | grp | grp2 | day | val | anomaly_flags | is_anomaly",
            "f01 | a | x | 2026-01-01 | 1 | [] | false",
            "f02 | a | x | 2026-01-02 | 1 | [] | false",
            "f03 | a | x | NULL | 100 | [] | false",          // null order
            "f04 | a | x | 2026-01-03 | NULL | [] | false",   // null value
            "f05 | NULL | x | 2026-01-04 | 100 | [] | false", // null by
            "f06 | a | NULL | 2026-01-04 | 100 | [] | false", // null second by
            // only 2 participating earlier rows (f01, f02): with any null row as history it would fire
            "f07 | a | x | 2026-01-05 | 10 | [] | false",
            // 3 earlier: mean(1, 1, 10) = 4, 10 > 8
            "f08 | a | x | 2026-01-06 | 10 | [jump] | true",
            // mean(1, 10, 10) = 7, 10 <= 14
            "f09 | a | x | 2026-01-07 | 10 | [] | false",
        ],
    );
}

#[tokio::test]
async fn ties_in_order_are_broken_by_fingerprint() {
    // min_history 1, window 1, factor 2, all on one day; rows given in reverse fingerprint order
    let got = flagged(
        "  - name: jump\n    spike: {column: val, by: [grp], order: day, window: 1, factor: 2, min_history: 1}\n  - name: first\n    first_seen: {by: [grp], order: day, gap_days: 1}\n",
        vec![
            ("natural_key_fingerprint", strings(&[Some("t3"), Some("t2"), Some("t1")])),
            ("grp", strings(&[Some("g"); 3])),
            ("day", dates(&[Some("2026-03-01"); 3])),
            ("val", ints(&[Some(10), Some(3), Some(1)])),
        ],
    )
    .await;
    // by fingerprint: t1 (1), t2 (3 > 2 x 1), t3 (10 > 2 x 3); the other way round nothing spikes
    // and t3 would be first
    assert_rows(
        &got,
        &[
            "natural_key_fingerprint | grp | day | val | anomaly_flags | is_anomaly",
            "t1 | g | 2026-03-01 | 1 | [first] | true",
            "t2 | g | 2026-03-01 | 3 | [jump] | true",
            "t3 | g | 2026-03-01 | 10 | [jump] | true",
        ],
    );
}

#[tokio::test]
async fn first_seen_fires_on_the_first_row_and_after_a_gap_of_at_least_gap_days() {
    let got = flagged(
        "  - name: back\n    first_seen: {by: [grp], order: day, gap_days: 365}\n",
        vec![
            ("natural_key_fingerprint", fps(8)),
            (
                "grp",
                strings(&[
                    Some("a"),
                    Some("a"),
                    Some("a"),
                    Some("a"),
                    Some("b"),
                    None,
                    Some("b"),
                    Some("a"),
                ]),
            ),
            (
                "day",
                dates(&[
                    Some("2025-10-10"),
                    Some("2025-10-11"),
                    Some("2026-10-11"), // 365 days after 2025-10-11: fires
                    Some("2027-10-10"), // 364 days after 2026-10-11: does not
                    Some("2020-01-01"),
                    Some("2019-01-01"), // null by: never flagged
                    None,               // null order: never flagged, not the previous row
                    Some("2029-10-09"), // 730 days after 2027-10-10
                ]),
            ),
        ],
    )
    .await;
    assert_rows(
        &got,
        &[
            "natural_key_fingerprint | grp | day | anomaly_flags | is_anomaly",
            "f01 | a | 2025-10-10 | [back] | true",
            "f02 | a | 2025-10-11 | [] | false",
            "f03 | a | 2026-10-11 | [back] | true",
            "f04 | a | 2027-10-10 | [] | false",
            "f05 | b | 2020-01-01 | [back] | true",
            "f06 | NULL | 2019-01-01 | [] | false",
            "f07 | b | NULL | [] | false",
            "f08 | a | 2029-10-09 | [back] | true",
        ],
    );
}

#[tokio::test]
async fn first_seen_on_timestamps_counts_elapsed_days() {
    let got = flagged(
        "  - name: back\n    first_seen: {by: [grp], order: ts, gap_days: 2}\n",
        vec![
            ("natural_key_fingerprint", fps(5)),
            ("grp", strings(&[Some("a"); 5])),
            (
                "ts",
                timestamps(&[
                    Some("2024-01-01T00:00:00Z"),
                    Some("2024-01-03T00:00:00Z"),        // exactly 2 x 24 h later: fires
                    Some("2024-01-04T23:59:59.999999Z"), // 1 µs short of 2 days: does not
                    Some("2024-01-07T00:00:00.000001Z"), // 2 days + 2 µs: fires
                    Some("2024-01-09T00:00:00+00:00"),   // two calendar days on, but 1 µs short of 2 x 24 h: does not
                ]),
            ),
        ],
    )
    .await;
    assert_rows(
        &got,
        &[
            "natural_key_fingerprint | grp | ts | anomaly_flags | is_anomaly",
            "f01 | a | 2024-01-01T00:00:00Z | [back] | true",
            "f02 | a | 2024-01-03T00:00:00Z | [back] | true",
            "f03 | a | 2024-01-04T23:59:59.999999Z | [] | false",
            "f04 | a | 2024-01-07T00:00:00.000001Z | [back] | true",
            "f05 | a | 2024-01-09T00:00:00Z | [] | false",
        ],
    );
}

#[tokio::test]
async fn several_anomalies_fire_on_one_row_in_rule_order_and_null_when_does_not_fire() {
    let got = flagged(
        "  - name: big\n    when: \"val > 50\"\n  - name: jump\n    spike: {column: val, by: [grp], order: day, window: 7, factor: 3, min_history: 1}\n  - name: first\n    first_seen: {by: [grp], order: day, gap_days: 10}\n",
        vec![
            ("natural_key_fingerprint", fps(5)),
            (
                "grp",
                strings(&[Some("a"), Some("a"), Some("a"), Some("a"), Some("a")]),
            ),
            (
                "day",
                dates(&[
                    Some("2026-01-01"),
                    Some("2026-01-02"),
                    Some("2026-01-20"),
                    Some("2026-01-21"),
                    Some("2026-01-22"),
                ]),
            ),
            ("val", ints(&[Some(60), Some(2), Some(100), None, Some(1)])),
        ],
    )
    .await;
    assert_rows(
        &got,
        &[
            "natural_key_fingerprint | grp | day | val | anomaly_flags | is_anomaly",
            "f01 | a | 2026-01-01 | 60 | [big, first] | true", // spike: no history
            "f02 | a | 2026-01-02 | 2 | [] | false",
            // 100 > 50; mean(60, 2) = 31, 100 > 93; 18 days after 2026-01-02
            "f03 | a | 2026-01-20 | 100 | [big, jump, first] | true",
            // when is NULL (not fired); takes part in first_seen (1 day on), not in spike
            "f04 | a | 2026-01-21 | NULL | [] | false",
            "f05 | a | 2026-01-22 | 1 | [] | false",
        ],
    );
}

#[tokio::test]
async fn flag_without_anomalies_gives_an_empty_list_and_false() {
    let f = Fixture::new();
    let rules = f.rules("metrics", "table: metrics\nsource: metrics\nversion: 1\n");
    let ctx = SessionContext::new();
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "natural_key_fingerprint",
            datafusion::arrow::datatypes::DataType::Utf8,
            true,
        ),
        Field::new("rules_version", datafusion::arrow::datatypes::DataType::Int32, true),
        Field::new("row_hash", datafusion::arrow::datatypes::DataType::Utf8, true),
    ]));
    let df = mem(
        &ctx,
        schema,
        vec![
            ("natural_key_fingerprint", strings(&[Some("a")])),
            ("rules_version", Arc::new(Int32Array::from(vec![1]))),
            ("row_hash", strings(&[Some("h")])),
        ],
    );
    // the flags go after rules_version (the order of docs/formats.md#tables)
    assert_rows(
        &rows(flag(df, &rules).unwrap(), &[]).await,
        &[
            "natural_key_fingerprint | rules_version | anomaly_flags | is_anomaly | row_hash",
            "a | 1 | [] | false | h",
        ],
    );
}

// ---- the demo data ----------------------------------------------------------------------------

#[tokio::test]
async fn marketing_spend_v1_over_the_demo_data_flags_the_refund_and_lis01_after_381_days() {
    let t = TestLake::new();
    for file in ["hotels/2026-11-01_hotels.csv", "hotels/2026-11-03_hotels.csv"] {
        t.ingest_ok("hotels", &landing(file));
    }
    for file in [
        "marketing_spend/2026-10-13_marketing_spend.csv",
        "marketing_spend/2026-10-23_marketing_spend.csv",
        "marketing_spend/2026-11-02_marketing_spend.csv.gz",
    ] {
        t.ingest_ok("marketing_spend", &landing(file));
    }
    let ws = Workspace {
        contracts_dir: t.contracts(),
        rules_dir: repo().join("rules"),
        landing_dir: repo().join("data/landing"),
        memory_limit: DEFAULT_MEMORY_LIMIT,
        ..Workspace::new(ingot::table::lake::Lake::open(t.lake().to_str().unwrap()).unwrap())
    };
    let catalog = ingot::query::open_catalog(&ws, None).await.unwrap();
    let mut problems = Problems::default();
    let rules = RulesSet::load(&ws.rules_dir, &catalog.contracts, &mut problems);
    assert!(problems.is_empty(), "{:#?}", problems.items);
    let rules = rules.select("marketing_spend", None).unwrap();
    let ctx = &catalog.ctx;

    let inputs = read_inputs(ctx, &catalog.contracts, &rules).await.unwrap();
    let plan = explain(ctx, &rules, &inputs.contract, inputs.input.clone(), &inputs.lookups).unwrap();
    assert!(plan.starts_with("-- silver.marketing_spend (rules v1)"), "{plan}");
    assert!(plan.contains("WindowAggr"), "{plan}");

    let out = transform(ctx, &rules, &inputs.contract, inputs.input, &inputs.lookups).unwrap();
    let silver = flag(out.passed, &rules).unwrap();
    ctx.register_table("flagged", silver.into_view()).unwrap();
    ctx.register_table("rejected", out.rejected.into_view()).unwrap();

    let query = |sql: &'static str| async move { rows(ctx.sql(sql).await.unwrap(), &[]).await };
    // every current record is in silver (no validation fails on the demo data; MAD99 resolves to null)
    assert_rows(
        &query(
            "SELECT count(*) AS n, count(hotel_id) AS resolved, sum(CAST(is_anomaly AS INT)) AS flagged FROM flagged",
        )
        .await,
        &["n | resolved | flagged", "377 | 374 | 9"],
    );
    assert_rows(&query("SELECT count(*) AS n FROM rejected").await, &["n", "0"]);
    // the refund, LIS01's 2025-10-10 row and its first 2026-10-26 row (381 days later, first by
    // fingerprint of two), and the first report of each of the other six hotel codes
    assert_rows(
        &query(
            "SELECT hotel_code, day, channel, campaign, spend_eur, anomaly_flags, is_anomaly FROM flagged \
             WHERE is_anomaly ORDER BY hotel_code, day, natural_key_fingerprint",
        )
        .await,
        &[
            "hotel_code | day | channel | campaign | spend_eur | anomaly_flags | is_anomaly",
            "AMS01 | 2026-10-03 | google_ads | brand | 85.33 | [first_report_in_a_year] | true",
            "BCN01 | 2026-10-03 | tripadvisor | sponsored | 87.12 | [first_report_in_a_year] | true",
            "BER01 | 2026-10-03 | google_ads | brand | 19.36 | [first_report_in_a_year] | true",
            "BER01 | 2026-10-08 | meta | winter_sale | -35.20 | [negative_spend] | true",
            "LIS01 | 2025-10-10 | google_ads | brand | 14.28 | [first_report_in_a_year] | true",
            // sha256("1|LIS01|2026-10-26|meta|winter_sale") = c362..., before google_ads/brand's eb46...
            "LIS01 | 2026-10-26 | meta | winter_sale | 5.85 | [first_report_in_a_year] | true",
            "LON01 | 2026-10-03 | meta | retargeting | 64.00 | [first_report_in_a_year] | true",
            "MAD99 | 2026-10-14 | google_ads | brand | 23.10 | [first_report_in_a_year] | true",
            "PAR01 | 2026-10-03 | google_ads | brand | 51.46 | [first_report_in_a_year] | true",
        ],
    );
    assert_rows(
        &query(
            "SELECT day, anomaly_flags, is_anomaly FROM flagged WHERE hotel_code = 'LIS01' \
             ORDER BY day, natural_key_fingerprint LIMIT 4",
        )
        .await,
        &[
            "day | anomaly_flags | is_anomaly",
            "2025-10-10 | [first_report_in_a_year] | true",
            "2026-10-26 | [first_report_in_a_year] | true",
            "2026-10-26 | [] | false",
            "2026-10-27 | [] | false",
        ],
    );
    // the same first_seen rows by an independent SQL formulation over the flagged table
    assert_rows(
        &query(
            "SELECT count(*) AS disagreements FROM (SELECT anomaly_flags, \
             lag(day) OVER (PARTITION BY hotel_code ORDER BY day, natural_key_fingerprint) AS previous, day \
             FROM flagged) \
             WHERE array_has(anomaly_flags, 'first_report_in_a_year') \
             <> (previous IS NULL OR day >= previous + INTERVAL '365 days')",
        )
        .await,
        &["disagreements", "0"],
    );
}
