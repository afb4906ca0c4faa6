//! Silver plans (`ingot::silver::compile`): resolve, every step kind and validations of
//! docs/guide.md#rules, over small MemTables and compared whole (every column of every row,
//! sorted). The fixtures here serve the anomaly tests too (silver_anomaly.rs).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Date32Array, Decimal128Array, Float64Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, new_null_array,
};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::Column;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;
use ingot::silver::compile::{FAILURE_COLUMNS, FILTERED_COLUMNS, Lookup, Lookups, Transformed, resolve, transform};
use ingot::spec::contract::{Contract, ContractSet};
use ingot::spec::rules::RuleSet;
use ingot::spec::yaml::Problems;

pub(crate) const ORDERS: &str = "source: orders
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

pub(crate) const SHOPS: &str = "source: shops
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
pub(crate) const METRICS: &str = "source: metrics
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

pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    contracts: ContractSet,
}

impl Fixture {
    pub(crate) fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [("orders", ORDERS), ("shops", SHOPS), ("metrics", METRICS)] {
            std::fs::write(dir.path().join(format!("{name}.yaml")), text).unwrap();
        }
        let mut problems = Problems::default();
        let contracts = ContractSet::load(dir.path(), &mut problems);
        assert!(problems.is_empty(), "{:#?}", problems.items);
        Fixture { _dir: dir, contracts }
    }

    pub(crate) fn contract(&self, source: &str) -> Arc<Contract> {
        self.contracts.contracts[source].clone()
    }

    pub(crate) fn rules(&self, table: &str, text: &str) -> RuleSet {
        let mut problems = Problems::default();
        let path = format!("rules/{table}/v1.yaml");
        let rules = RuleSet::from_str(Path::new(&path), text, &self.contracts, &mut problems);
        assert!(problems.is_empty(), "{:#?}", problems.items);
        rules.unwrap()
    }
}

pub(crate) fn strings(v: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(v.to_vec()))
}

pub(crate) fn ints(v: &[Option<i64>]) -> ArrayRef {
    Arc::new(Int64Array::from(v.to_vec()))
}

pub(crate) fn floats(v: &[Option<f64>]) -> ArrayRef {
    Arc::new(Float64Array::from(v.to_vec()))
}

/// Decimal(10,2) from hundredths.
pub(crate) fn cents(v: &[Option<i128>]) -> ArrayRef {
    Arc::new(
        Decimal128Array::from(v.to_vec())
            .with_precision_and_scale(10, 2)
            .unwrap(),
    )
}

/// Dates from `YYYY-MM-DD` text.
pub(crate) fn dates(v: &[Option<&str>]) -> ArrayRef {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap();
    Arc::new(Date32Array::from(
        v.iter()
            .map(|d| d.map(|d| (d.parse::<chrono::NaiveDate>().unwrap() - epoch).num_days() as i32))
            .collect::<Vec<_>>(),
    ))
}

/// UTC timestamps (microseconds) from RFC 3339 text.
pub(crate) fn timestamps(v: &[Option<&str>]) -> ArrayRef {
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
pub(crate) fn mem(ctx: &SessionContext, schema: SchemaRef, given: Vec<(&str, ArrayRef)>) -> DataFrame {
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
pub(crate) fn bronze(ctx: &SessionContext, contract: &Contract, mut given: Vec<(&str, ArrayRef)>) -> DataFrame {
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
pub(crate) async fn rows(df: DataFrame, sort: &[&str]) -> Vec<String> {
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

pub(crate) fn assert_rows(got: &[String], expected: &[&str]) {
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
pub(crate) fn shops(ctx: &SessionContext, f: &Fixture) -> Lookups {
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

pub(crate) async fn run(f: &Fixture, rules: &RuleSet, input: DataFrame, ctx: &SessionContext) -> Transformed {
    let lookups = shops(ctx, f);
    transform(ctx, rules, &f.contract("orders"), input, &lookups).unwrap()
}

pub(crate) const NO_RULES: &str = r#"table: orders
source: orders
version: 3
"#;

#[tokio::test]
pub(crate) async fn resolve_matches_after_normalize_and_rejects_or_nulls_what_is_missing() {
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
pub(crate) async fn every_step_kind_runs_end_to_end_and_filtered_rows_are_counted_by_their_filter() {
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
pub(crate) async fn validations_reject_or_fail_with_the_first_failing_rule_and_null_fails() {
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
