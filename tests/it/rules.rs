//! Rules files: the repository's rules load; every problem of a bad rules file is reported at
//! once, located, with the columns that exist at that step; `ingot check` reports contracts and
//! rules together; `apply_steps` turns the steps into a DataFrame plan.
//!
//! Most tests read rules against two tiny contracts (`orders`, resolving `shop_id` from `shops`)
//! so that the column lists in the messages stay readable.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Date32Array, Decimal128Array, Int64Array, RecordBatch, StringArray, new_null_array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use ingot::silver::apply_steps;
use ingot::spec::contract::{ContractSet, FieldType};
use ingot::spec::rules::{Action, AnomalyKind, RuleSet, RulesSet, Step};
use ingot::spec::yaml::Problems;

use crate::util::{TestLake, assert_ok, repo, sha256_hex, stderr, stdout};

const ORDERS: &str = "source: orders
version: 1
format: csv
fields:
  - name: order_id
    type: string
    required: true
  - name: shop
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
    key: shop
    value: shop_id
";

const SHOPS: &str = "source: shops
version: 1
format: csv
fields:
  - name: shop
    type: string
    required: true
  - name: shop_id
    type: int64
natural_key:
  version: 1
  fields: [shop]
";

/// The bronze columns every source has after its contract fields.
const META: &str = "ingestion_run_id, file_hash, row_hash, natural_key_fingerprint, natural_key_version, \
                    contract_version, source_row_number, ingested_at, is_deleted, previous_natural_key_fingerprint";

fn write_contracts(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("orders.yaml"), ORDERS).unwrap();
    std::fs::write(dir.join("shops.yaml"), SHOPS).unwrap();
}

fn contracts() -> (tempfile::TempDir, ContractSet) {
    let dir = tempfile::tempdir().unwrap();
    write_contracts(dir.path());
    let mut problems = Problems::default();
    let set = ContractSet::load(dir.path(), &mut problems);
    assert!(problems.is_empty(), "{:?}", problems.items);
    (dir, set)
}

/// Every problem of `text` read as the file `path`, as `file:line:column: message`.
fn problems_of(path: &str, text: &str) -> Vec<String> {
    let (_dir, set) = contracts();
    let mut problems = Problems::default();
    let rules = RuleSet::from_str(Path::new(path), text, &set, &mut problems);
    assert!(rules.is_none(), "expected problems in:\n{text}");
    problems.items.iter().map(|p| p.to_string()).collect()
}

fn rules_of(path: &str, text: &str) -> RuleSet {
    let (_dir, set) = contracts();
    let mut problems = Problems::default();
    let rules = RuleSet::from_str(Path::new(path), text, &set, &mut problems);
    assert!(problems.is_empty(), "{:#?}", problems.items);
    rules.unwrap()
}

fn assert_lines(got: &[String], expected: &[String]) {
    assert_eq!(
        got,
        expected,
        "\ngot:\n{}\nexpected:\n{}",
        got.join("\n"),
        expected.join("\n")
    );
}

fn names(schema: &datafusion::common::DFSchema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

#[test]
fn repository_rules_load() {
    let mut problems = Problems::default();
    let contracts = ContractSet::load(&repo().join("contracts"), &mut problems);
    let rules = RulesSet::load(&repo().join("rules"), &contracts, &mut problems);
    assert!(problems.is_empty(), "{:#?}", problems.items);
    assert_eq!(
        rules.table_names(),
        vec!["bookings", "marketing_spend", "site_traffic", "web_sessions"]
    );
    let versions = |t: &str| rules.tables[t].keys().copied().collect::<Vec<_>>();
    assert_eq!(versions("bookings"), vec![1, 2]);
    assert_eq!(versions("marketing_spend"), vec![1]);
    assert_eq!(versions("site_traffic"), vec![1]);
    assert_eq!(versions("web_sessions"), vec![1]);

    let v2 = rules.latest("bookings").unwrap();
    assert_eq!(v2.version, 2);
    assert_eq!(v2.source, "bookings");
    let v1 = rules.get("bookings", 1).unwrap();
    let bytes = std::fs::read(repo().join("rules/bookings/v1.yaml")).unwrap();
    assert_eq!(v1.sha256, sha256_hex(&bytes));
    assert_eq!(
        v1.steps.iter().map(Step::kind).collect::<Vec<_>>(),
        vec!["set", "map", "set", "set", "drop", "filter"]
    );
    let maps = |r: &RuleSet| match &r.steps[1] {
        Step::Map {
            column,
            values,
            default,
        } => (column.name.clone(), values.clone(), default.clone()),
        other => panic!("{other:?}"),
    };
    let booking_com = ("booking.com".to_string(), "booking_com".to_string());
    let bcom = ("bcom".to_string(), "booking_com".to_string());
    assert_eq!(maps(v1), ("channel".into(), vec![booking_com.clone()], None));
    assert_eq!(maps(v2), ("channel".into(), vec![booking_com, bcom], None));
    match &v1.steps[5] {
        Step::Filter(f) => assert_eq!(f.sql, "upper(booking_ref) NOT LIKE 'TEST%'"),
        other => panic!("{other:?}"),
    }
    let validation = &v1.validate[0];
    assert_eq!(
        (
            validation.name.as_str(),
            validation.check.sql.as_str(),
            validation.reason.as_str(),
            validation.action
        ),
        (
            "stay_is_positive",
            "check_out > check_in",
            "check-out must be after check-in",
            Action::Reject
        )
    );
    // the resolve value is there from the first step; exported_at is dropped, nightly_rate added
    let mut expected: Vec<String> = [
        "booking_ref",
        "hotel_code",
        "guest_email",
        "channel",
        "booking_status",
        "check_in",
        "check_out",
        "nights",
        "amount",
        "currency",
        "notes",
    ]
    .map(String::from)
    .to_vec();
    expected.extend(META.split(", ").map(String::from));
    expected.extend(["hotel_id".to_string(), "nightly_rate".to_string()]);
    assert_eq!(names(&v1.output_schema), expected);
    assert_eq!(names(&v1.input_schema).last().map(String::as_str), Some("hotel_id"));

    let spend = rules.latest("marketing_spend").unwrap();
    assert_eq!(
        spend.rule_names().collect::<Vec<_>>(),
        vec!["clicks_within_impressions", "negative_spend", "first_report_in_a_year"]
    );
    match &spend.anomalies[1].kind {
        AnomalyKind::FirstSeen { by, order, gap_days } => {
            assert_eq!(
                by.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
                vec!["hotel_code"]
            );
            assert_eq!((order.name.as_str(), *gap_days), ("day", 365));
        }
        other => panic!("{other:?}"),
    }
    assert_spike(
        &rules.latest("web_sessions").unwrap().anomalies[1].kind,
        ("pageviews", "hotel_code", "session_started_at"),
        (28, 10.0, 7),
    );
    // the story's spike: the example of docs/guide.md#rules, on the daily export
    let traffic = rules.latest("site_traffic").unwrap();
    assert_eq!(
        traffic.rule_names().collect::<Vec<_>>(),
        vec!["conversions_within_sessions", "sessions_spike"]
    );
    assert_spike(
        &traffic.anomalies[0].kind,
        ("sessions", "hotel_code", "day"),
        (28, 10.0, 7),
    );
}

/// `kind` is a spike on `column` by the one column `by`, ordered by `order`, with `(window,
/// factor, min_history)`.
fn assert_spike(kind: &AnomalyKind, (col, by_col, order_col): (&str, &str, &str), params: (usize, f64, usize)) {
    match kind {
        AnomalyKind::Spike {
            column,
            by,
            order,
            window,
            factor,
            min_history,
        } => {
            assert_eq!(column.name, col);
            assert_eq!(by.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), vec![by_col]);
            assert_eq!(order.name, order_col);
            assert_eq!((*window, *factor, *min_history), params);
        }
        other => panic!("{other:?}"),
    }
}

const BAD: &str = r#"table: order
source: orders
version: 3
descripton: typo
steps:
  - set: shop_name
    expr: "upper(shopp)"
  - sett: x
    expr: "1"
  - rename: {note: remark}
  - filter: "note IS NOT NULL"
  - drop: [amt]
  - set: total
    expr: "amt * 2"
  - cast: {placed: datetime}
  - filter: "lower(shop)"
  - map: row_hash
    values: {a: b}
  - set: bad
    expr: "lower(shop"
  - set: shop
    exp: "1"
  - just text
validate:
  - name: positive
    check: "remark <> ''"
  - name: positive
    check: "placed > DATE '2020-01-01'"
    action: warn
anomalies:
  - name: positive
    when: "shop_id > 10"
  - name: spiky
    spike: {column: shop, by: [shop], order: placed, window: 0, factor: ten}
  - name: first
    first_seen: {by: [shop], order: order_id, gap_days: 365}
"#;

#[test]
fn every_problem_of_a_bad_rules_file_is_reported_at_once() {
    let got = problems_of("rules/orders/v2.yaml", BAD);
    let input = format!("order_id, shop, amt, placed, note, {META}, shop_id");
    let after_rename = format!("order_id, shop, amt, placed, remark, {META}, shop_id, shop_name");
    let after_drop = format!("order_id, shop, placed, remark, {META}, shop_id, shop_name");
    let f = "rules/orders/v2.yaml";
    let expected = vec![
        format!(
            "{f}:4:1: unknown key \"descripton\" in the rules file; valid keys are: table, source, sources, version, description, survivorship, conflicts, steps, validate, anomalies"
        ),
        format!("{f}:1:8: table \"order\" must equal the folder name \"orders\""),
        format!(
            "{f}:3:10: version 3 must equal N of the file name \"v2.yaml\" (2); add a new file v<N>.yaml for a new version"
        ),
        format!("{f}:7:11: unknown column \"shopp\"; columns at this step are: {input}"),
        format!("{f}:8:5: unknown step kind \"sett\"; valid kinds are: set, map, rename, cast, drop, filter"),
        // renamed away one step earlier
        format!("{f}:11:13: unknown column \"note\"; columns at this step are: {after_rename}"),
        // dropped one step earlier
        format!("{f}:14:11: unknown column \"amt\"; columns at this step are: {after_drop}"),
        format!(
            "{f}:15:20: unknown type \"datetime\" for column \"placed\"; valid types are: string, int32, int64, float64, decimal(p,s), boolean, date, timestamp (decimal precision 1..=38, 0 <= scale <= precision)"
        ),
        format!("{f}:16:13: filter must be a boolean expression; \"lower(shop)\" is string"),
        format!("{f}:17:10: column \"row_hash\" is a bronze column ingot maintains; steps may read it but not map it"),
        format!("{f}:20:11: invalid expression \"lower(shop\": SQL syntax error: Expected: ), found: EOF"),
        format!("{f}:22:5: unknown key \"exp\" in a set step; valid keys are: set, expr"),
        format!("{f}:21:5: set step for \"shop\" is missing \"expr\""),
        format!("{f}:23:5: a step must be a mapping such as \"- set: column\"; found a scalar"),
        format!(
            "{f}:27:11: duplicate rule name \"positive\" (first used at line 25); validations and anomalies need distinct names"
        ),
        format!("{f}:29:13: action must be one of: reject, fail; found \"warn\""),
        format!(
            "{f}:31:11: duplicate rule name \"positive\" (first used at line 25); validations and anomalies need distinct names"
        ),
        format!("{f}:34:21: spike column \"shop\" must be numeric; it is string"),
        format!("{f}:34:62: window must be an integer >= 1, found \"0\""),
        format!("{f}:34:73: factor must be a number > 0, found \"ten\""),
        format!("{f}:36:37: first_seen order \"order_id\" must be a date or timestamp column; it is string"),
    ];
    assert_lines(&got, &expected);
}

#[test]
fn unknown_column_lists_the_columns_at_that_step() {
    let text = r#"table: orders
source: orders
version: 2
steps:
  - drop: [note]
  - set: note_len
    expr: "length(note)"
  - filter: "amount > 0"
  - rename: {amt: amount}
validate:
  - name: has_amount
    check: "amt > 0"
anomalies:
  - name: by_note
    first_seen: {by: [note], order: placed, gap_days: 30}
"#;
    let f = "rules/orders/v2.yaml";
    // note_len stays known (with an unknown type) although its expression failed, so that the
    // later steps are not told it is missing too.
    let expected = vec![
        format!(
            "{f}:7:11: unknown column \"note\"; columns at this step are: order_id, shop, amt, placed, {META}, shop_id"
        ),
        format!(
            "{f}:8:13: unknown column \"amount\"; columns at this step are: order_id, shop, amt, placed, {META}, shop_id, note_len"
        ),
        format!(
            "{f}:12:12: unknown column \"amt\"; columns after the steps are: order_id, shop, amount, placed, {META}, shop_id, note_len"
        ),
        format!(
            "{f}:15:23: unknown column \"note\"; columns after the steps are: order_id, shop, amount, placed, {META}, shop_id, note_len"
        ),
    ];
    assert_lines(&problems_of(f, text), &expected);
}

/// Rules are deterministic: a function that reads the clock is refused wherever an expression
/// goes (a step, a check, an anomaly), inside other expressions too, each located.
#[test]
fn clock_functions_are_refused_in_steps_checks_and_anomalies() {
    let text = r#"table: orders
source: orders
version: 2
steps:
  - set: seen
    expr: "now()"
  - filter: "placed <= current_date"
  - set: late
    expr: "coalesce(placed, CAST(current_time() AS VARCHAR)) IS NULL"
validate:
  - name: not_future
    check: "placed <= now()"
anomalies:
  - name: old
    when: "date_part('year', current_date) - date_part('year', placed) > 1"
"#;
    let f = "rules/orders/v2.yaml";
    let why = "reads the clock: a rebuild must give the same rows whenever it runs (and an incremental \
               build the same as a full one); compare with a date of the data or a literal";
    let expected = vec![
        format!("{f}:6:11: invalid expression \"now()\": now() {why}"),
        format!("{f}:7:13: invalid expression \"placed <= current_date\": current_date() {why}"),
        format!(
            "{f}:9:11: invalid expression \"coalesce(placed, CAST(current_time() AS VARCHAR)) IS NULL\": current_time() {why}"
        ),
        format!("{f}:12:12: invalid expression \"placed <= now()\": now() {why}"),
        format!(
            "{f}:15:11: invalid expression \"date_part('year', current_date) - date_part('year', placed) > 1\": current_date() {why}"
        ),
    ];
    assert_lines(&problems_of(f, text), &expected);
}

#[test]
fn bad_expressions_are_located_with_datafusions_message() {
    let text = r#"table: orders
source: orders
version: 2
steps:
  - set: a
    expr: "lower(shop"
  - set: b
    expr: "shop + 1"
  - filter: "amt"
  - set: c
    expr: "sum(amt)"
  - set: d
    expr: "random()"
  - set: e
    expr: "upper(shop) AS loud"
  - set: f
    expr: "NULL"
  - set: g
    expr: "b || 'x'"
  - set: h
    expr: "uper(shop)"
validate:
  - name: v
    check: "amt * 2"
anomalies:
  - name: w
    when: "shop_id"
"#;
    let f = "rules/orders/v2.yaml";
    // g reads b, whose type is unknown after its problem: parsed, not type-checked, not reported.
    let expected = vec![
        format!("{f}:6:11: invalid expression \"lower(shop\": SQL syntax error: Expected: ), found: EOF"),
        format!(
            "{f}:8:11: invalid expression \"shop + 1\": Cannot coerce arithmetic expression Utf8 + Int64 to valid types"
        ),
        format!("{f}:9:13: filter must be a boolean expression; \"amt\" is decimal(10,2)"),
        format!(
            "{f}:11:11: invalid expression \"sum(amt)\": aggregate and window functions are not allowed: rules see one row at a time (for comparisons across rows use a spike or first_seen anomaly)"
        ),
        format!(
            "{f}:13:11: invalid expression \"random()\": volatile functions (such as random() or uuid()) are not allowed: a rebuild must give the same rows"
        ),
        format!(
            "{f}:15:11: invalid expression \"upper(shop) AS loud\": an alias (AS loud) is not allowed here; the column name comes from the rule"
        ),
        format!("{f}:17:11: expr \"NULL\" has no type; cast it, e.g. CAST(NULL AS VARCHAR)"),
        format!("{f}:21:11: invalid expression \"uper(shop)\": Invalid function 'uper'. Did you mean 'upper'?"),
        format!("{f}:24:12: check must be a boolean expression; \"amt * 2\" is decimal(31,2)"),
        format!("{f}:27:11: when must be a boolean expression; \"shop_id\" is int64"),
    ];
    assert_lines(&problems_of(f, text), &expected);
}

#[test]
fn columns_ingot_maintains_and_reserved_names_are_refused() {
    let text = r#"table: orders
source: orders
version: 2
steps:
  - set: row_hash
    expr: "'x'"
  - set: status
    expr: "'x'"
  - set: Total
    expr: "amt"
  - rename: {shop_id: sid}
  - rename: {shop: order_id}
  - rename: {amt: x, placed: x}
  - drop: [ingested_at, note, note]
  - cast: {placed: boolean, x: date}
  - map: x
    values: {"1": "2"}
  - map: shop
"#;
    let f = "rules/orders/v2.yaml";
    let expected = vec![
        format!("{f}:5:10: column \"row_hash\" is a bronze column ingot maintains; steps may read it but not set it"),
        format!(
            "{f}:7:10: column name \"status\" is reserved by ingot (a column of its bronze, silver or audit tables)"
        ),
        format!("{f}:9:10: column name \"Total\" must match [a-z_][a-z0-9_]{{0,62}}"),
        format!(
            "{f}:11:14: column \"shop_id\" is the value of resolve \"shop\" of contract \"orders\"; steps may read it but not rename it"
        ),
        format!(
            "{f}:12:20: cannot rename \"shop\" to \"order_id\": column \"order_id\" already exists at this step (drop or rename it first)"
        ),
        format!("{f}:13:30: two columns are renamed to \"x\""),
        format!(
            "{f}:14:12: column \"ingested_at\" is a bronze column ingot maintains; steps may read it but not drop it"
        ),
        format!("{f}:14:31: column \"note\" is dropped twice"),
        format!("{f}:15:20: cannot cast column \"placed\" from date to boolean"),
        format!("{f}:15:32: cannot cast column \"x\" from decimal(10,2) to date"),
        format!("{f}:16:10: map applies to string columns; \"x\" is date at this step (cast it first)"),
        format!("{f}:18:5: map step needs \"values\" (a mapping of old: new), \"default\", or both"),
    ];
    assert_lines(&problems_of(f, text), &expected);
}

#[test]
fn version_table_and_source_must_match() {
    let f = "rules/orders/v1.yaml";
    assert_lines(
        &problems_of(
            f,
            r#"table: orders
source: orders
version: 2
"#,
        ),
        &[format!(
            "{f}:3:10: version 2 must equal N of the file name \"v1.yaml\" (1); add a new file v<N>.yaml for a new version"
        )],
    );
    assert_lines(
        &problems_of(
            f,
            r#"table: shops
source: orders
version: 1
"#,
        ),
        &[format!(
            "{f}:1:8: table \"shops\" must equal the folder name \"orders\""
        )],
    );
    assert_lines(
        &problems_of(
            f,
            r#"table: orders
source: order
version: 1
"#,
        ),
        &[format!(
            "{f}:2:9: source \"order\" is not a known contract; sources are: orders, shops"
        )],
    );
    assert_lines(
        &problems_of(f, "description: no keys\n"),
        &[
            format!("{f}:1:1: missing required key \"table\" (the silver table name)"),
            format!(
                "{f}:1:1: missing required key \"source\" (the bronze source the table reads), or \"sources\" (a list of sources in precedence order)"
            ),
            format!("{f}:1:1: missing required key \"version\""),
        ],
    );
    let g = "rules/orders/version1.yaml";
    assert_lines(
        &problems_of(
            g,
            r#"table: orders
source: orders
version: 0
"#,
        ),
        &[
            format!(
                "{g}:1:1: rules file name \"version1.yaml\" must be v<N>.yaml, N being the version (v1.yaml, v2.yaml, ...)"
            ),
            format!("{g}:3:10: version must be an integer >= 1, found \"0\""),
        ],
    );
    let h = "rules/orders/v1.yaml";
    let got = problems_of(
        h,
        r#"table: orders
steps: [
"#,
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with(&format!("{h}:3:")) && got[0].contains("invalid YAML"),
        "{got:?}"
    );
}

#[test]
fn rule_names_are_unique_across_validate_and_anomalies() {
    let text = r#"table: orders
source: orders
version: 1
validate:
  - name: amt_known
    check: "amt IS NOT NULL"
  - name: amt_known
    check: "amt >= 0"
    action: fail
anomalies:
  - name: big
    when: "amt > 1000"
  - name: amt_known
    when: "amt < 1"
  - name: Big
    when: "amt > 10"
  - name: both
    when: "amt > 10"
    first_seen: {by: [shop], order: placed, gap_days: 30}
  - name: neither
"#;
    let f = "rules/orders/v1.yaml";
    let expected = vec![
        format!(
            "{f}:7:11: duplicate rule name \"amt_known\" (first used at line 5); validations and anomalies need distinct names"
        ),
        format!(
            "{f}:13:11: duplicate rule name \"amt_known\" (first used at line 5); validations and anomalies need distinct names"
        ),
        format!("{f}:15:11: rule name \"Big\" must match [a-z][a-z0-9_]{{0,62}}"),
        format!("{f}:17:5: anomaly \"both\" has more than one kind (when, first_seen); give one"),
        format!("{f}:20:5: anomaly \"neither\" needs one of: when, spike, first_seen"),
    ];
    assert_lines(&problems_of(f, text), &expected);
}

#[test]
fn a_valid_file_keeps_positions_and_types() {
    let text = r#"table: orders
source: orders
version: 1
steps:
  - rename: {amt: note, note: amt}
  - rename: {amt: remark, note: amt}
  - cast: {amt: float64}
  - map: shop
    default: other
validate:
  - name: has_shop
    check: "shop_id IS NOT NULL"
anomalies:
  - name: spend_spike
    spike: {column: amt, by: shop, order: placed, window: 5, factor: 2.5, min_history: 3}
"#;
    let r = rules_of("rules/orders/v1.yaml", text);
    assert_eq!(
        names(&r.output_schema),
        format!("order_id, shop, amt, placed, remark, {META}, shop_id")
            .split(", ")
            .map(String::from)
            .collect::<Vec<_>>()
    );
    let ty = |n: &str| {
        r.output_schema
            .field_with_unqualified_name(n)
            .unwrap()
            .data_type()
            .clone()
    };
    assert_eq!(ty("amt"), DataType::Float64);
    assert_eq!(ty("remark"), DataType::Utf8);
    match &r.steps[2] {
        Step::Cast(c) => assert_eq!(c[0].1, FieldType::Float64),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.validate[0].reason, "check failed: shop_id IS NOT NULL");
    assert_eq!(
        (
            r.validate[0].pos.line,
            r.validate[0].check.pos.line,
            r.validate[0].check.pos.column
        ),
        (11, 12, 12)
    );
    match &r.anomalies[0].kind {
        AnomalyKind::Spike {
            column,
            by,
            window,
            factor,
            min_history,
            ..
        } => {
            assert_eq!((column.pos.line, column.pos.column), (15, 21));
            assert_eq!(by.len(), 1);
            assert_eq!((*window, *factor, *min_history), (5, 2.5, 3));
        }
        other => panic!("{other:?}"),
    }
}

/// A rules tree: `files` are (path under rules/, text).
fn rules_tree(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let contracts = dir.path().join("contracts");
    write_contracts(&contracts);
    let rules = dir.path().join("rules");
    for (rel, text) in files {
        let p = rules.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    (dir, contracts, rules)
}

#[test]
fn a_rules_directory_is_loaded_by_table_and_version() {
    let orders = |v: u32, source: &str| format!("table: orders\nsource: {source}\nversion: {v}\n");
    let shops = |v: u32| format!("table: shops\nsource: shops\nversion: {v}\n");
    let (_dir, contracts_dir, rules_dir) = rules_tree(&[
        ("orders/v1.yaml", &orders(1, "orders")),
        ("orders/v2.yaml", &orders(2, "shops")),
        ("orders/v3.yaml", &orders(3, "orders")),
        ("orders/v3.yml", &orders(3, "orders")),
        ("orders/latest.yaml", &orders(4, "orders")),
        ("orders/README.md", "not a rules file"),
        ("shops/v2.yaml", &shops(2)),
        ("shops/v10.yaml", &shops(10)),
        ("stray.yaml", &shops(1)),
    ]);
    let mut problems = Problems::default();
    let contracts = ContractSet::load(&contracts_dir, &mut problems);
    let rules = RulesSet::load(&rules_dir, &contracts, &mut problems);
    let got: Vec<String> = problems.items.iter().map(|p| p.to_string()).collect();
    let r = rules_dir.display();
    assert_lines(
        &got,
        &[
            format!(
                "{r}/orders/v2.yaml:2:9: source \"shops\" differs from v1, which reads \"orders\"; every version of a table reads the same source"
            ),
            format!("{r}/orders/v3.yml:1:1: version 3 is already defined by {r}/orders/v3.yaml"),
            format!(
                "{r}/orders/latest.yaml:1:1: rules file name \"latest.yaml\" must be v<N>.yaml, N being the version (v1.yaml, v2.yaml, ...)"
            ),
            format!("{r}/stray.yaml:1:1: rules files belong in a folder per table: {r}/<table>/v<N>.yaml"),
        ],
    );
    assert_eq!(rules.table_names(), vec!["orders", "shops"]);
    assert_eq!(rules.tables["orders"].keys().copied().collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(rules.latest("shops").unwrap().version, 10);
    assert_eq!(rules.get("shops", 2).unwrap().version, 2);
    assert!(rules.get("shops", 3).is_none());
    assert_eq!(rules.select("orders", None).unwrap().version, 3);
    assert_eq!(
        rules.select("shops", Some(3)).unwrap_err().to_string(),
        "table \"shops\" has no rules version 3; versions are: v2, v10"
    );
    assert_eq!(
        rules.select("order", None).unwrap_err().to_string(),
        format!("no rules for table \"order\" in {r}; tables with rules: orders, shops")
    );

    // no rules directory: no tables, no problem
    let mut problems = Problems::default();
    let none = RulesSet::load(&rules_dir.join("missing"), &contracts, &mut problems);
    assert!(problems.is_empty() && none.tables.is_empty());
}

/// A test lake whose `--rules` is a copy of the repository's rules.
fn lake_with_rules() -> (TestLake, PathBuf) {
    let t = TestLake::new();
    let rules = t.dir.path().join("rules");
    for table in ["bookings", "marketing_spend", "site_traffic", "web_sessions"] {
        std::fs::create_dir_all(rules.join(table)).unwrap();
        for e in std::fs::read_dir(repo().join("rules").join(table)).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, rules.join(table).join(p.file_name().unwrap())).unwrap();
        }
    }
    (t, rules)
}

#[test]
fn check_command_reports_contract_and_rules_problems_and_exits_2() {
    let (t, rules) = lake_with_rules();
    let contract = t.contracts().join("web_sessions.yaml");
    let text = std::fs::read_to_string(&contract).unwrap();
    std::fs::write(&contract, text.replace("type: float64", "type: float")).unwrap();
    let v2 = rules.join("bookings/v2.yaml");
    let text = std::fs::read_to_string(&v2).unwrap();
    std::fs::write(&v2, text.replace("lower(trim(channel))", "lower(trim(chanel))")).unwrap();

    let out = t.command().arg("--rules").arg(&rules).arg("check").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    let (c, r) = (t.contracts().display().to_string(), rules.display().to_string());
    let bookings = format!(
        "booking_ref, hotel_code, guest_email, channel, booking_status, check_in, check_out, nights, amount, currency, notes, exported_at, {META}, hotel_id"
    );
    let expected = [
        format!(
            "{c}/web_sessions.yaml:35:11: unknown type \"float\" for field \"duration_s\"; valid types are: string, int32, int64, float64, decimal(p,s), boolean, date, timestamp (decimal precision 1..=38, 0 <= scale <= precision)"
        ),
        format!("{r}/bookings/v2.yaml:10:11: unknown column \"chanel\"; columns at this step are: {bookings}"),
        format!(
            "{r}/web_sessions/v1.yaml:13:9: source \"web_sessions\": its contract has problems (reported with the contract); the columns of this file cannot be checked until it is fixed"
        ),
        "3 problems found".to_string(),
    ];
    assert_lines(&stderr(&out).lines().map(String::from).collect::<Vec<_>>(), &expected);
}

#[test]
fn check_command_lists_rules_tables_with_their_latest_version() {
    let (t, rules) = lake_with_rules();
    let out = t.command().arg("--rules").arg(&rules).arg("check").output().unwrap();
    assert_ok(&out);
    assert_eq!(
        stdout(&out),
        format!(
            "ok: 5 contracts in {} (bookings, hotels, marketing_spend, site_traffic, web_sessions)\n\
             ok: 4 rules tables in {} (bookings v2, marketing_spend v1, site_traffic v1, web_sessions v1)\n",
            t.contracts().display(),
            rules.display()
        )
    );
    let out = t
        .command()
        .arg("--rules")
        .arg(t.dir.path().join("no-rules"))
        .arg("check")
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(
        stdout(&out).lines().nth(1),
        Some(format!("ok: no rules tables in {}", t.dir.path().join("no-rules").display()).as_str())
    );
}

#[tokio::test]
async fn apply_steps_builds_the_plan_of_every_step_kind() {
    let text = r#"table: orders
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
  - drop: [remark]
  - filter: "amount_x2 > 10 OR shop_id IS NULL"
"#;
    let rules = rules_of("rules/orders/v1.yaml", text);
    let schema: Arc<Schema> = Arc::new(Schema::new(
        rules
            .input_schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), f.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let n = 5;
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            match f.name().as_str() {
                "order_id" => Arc::new(StringArray::from(vec!["o1", "o2", "o3", "o4", "o5"])),
                "shop" => Arc::new(StringArray::from(vec![
                    Some(" ams"),
                    Some("BER "),
                    Some("par"),
                    None,
                    Some("ams"),
                ])),
                "amt" => Arc::new(
                    Decimal128Array::from(vec![Some(1250), Some(99), Some(10000), Some(300), Some(400)])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
                "placed" => Arc::new(Date32Array::from(vec![Some(20000); 5])),
                "note" => Arc::new(StringArray::from(vec![Some("a"); 5])),
                "shop_id" => Arc::new(Int64Array::from(vec![Some(1), Some(2), Some(3), None, Some(1)])),
                _ => new_null_array(f.data_type(), n),
            }
        })
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let ctx = SessionContext::new();
    ctx.register_table(
        "orders_current",
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap()),
    )
    .unwrap();
    let df = apply_steps(ctx.table("orders_current").await.unwrap(), &rules).unwrap();
    assert_eq!(
        df.schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>(),
        names(&rules.output_schema)
    );
    let df = df
        .select_columns(&["order_id", "shop", "amount", "amount_x2", "shop_id"])
        .unwrap()
        .sort_by(vec![datafusion::prelude::col("order_id")])
        .unwrap();
    let got = pretty_format_batches(&df.collect().await.unwrap()).unwrap().to_string();
    // o2 and o5 are filtered out (amount_x2 <= 10, shop known); o4 stays for its unknown shop, and
    // its null shop stays null despite the map's default
    let expected = "\
+----------+-------+--------+-----------+---------+
| order_id | shop  | amount | amount_x2 | shop_id |
+----------+-------+--------+-----------+---------+
| o1       | ams01 | 12.5   | 25.0      | 1       |
| o3       | other | 100.0  | 200.0     | 3       |
| o4       |       | 3.0    | 6.0       |         |
+----------+-------+--------+-----------+---------+";
    assert_eq!(got, expected, "\n{got}");

    // the input must have the columns of the rules' input schema
    let lacking = ctx.sql("SELECT order_id FROM orders_current").await.unwrap();
    let err = apply_steps(lacking, &rules).unwrap_err().to_string();
    assert!(
        err.starts_with("rules/orders/v1.yaml: the input lacks columns shop, amt, placed, note,"),
        "{err}"
    );
}
