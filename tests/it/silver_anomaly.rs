//! Anomaly flags compiled from rules (spike, first_seen, several on one row) checked row by row
//! on small tables, and marketing_spend v1 over the demo data.
//!
//! The expectations are computed by hand in the comments next to each row; the tests pin the
//! boundaries (exactly `min_history` earlier rows, a value equal to `factor × mean`, a gap of
//! exactly `gap_days`, ties broken by fingerprint, nulls taking no part).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Int32Array};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::prelude::SessionContext;
use ingot::engine::session::{DEFAULT_MEMORY_LIMIT, Workspace};
use ingot::silver::compile::{explain, flag, read_inputs, transform};
use ingot::spec::rules::RulesSet;
use ingot::spec::yaml::Problems;

use crate::silver_compile::*;
use crate::util::{TestLake, landing, repo};

/// `flag` with `anomalies` (YAML list items) over rows with the given columns; the first column
/// is `natural_key_fingerprint`. Sorted by fingerprint.
async fn flagged(anomalies: &str, given: Vec<(&str, ArrayRef)>) -> Vec<String> {
    let f = Fixture::new();
    let rules = f.rules(
        "metrics",
        &format!(
            r#"table: metrics
source: metrics
version: 1
anomalies:
{anomalies}"#
        ),
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
    let rules = f.rules(
        "metrics",
        r#"table: metrics
source: metrics
version: 1
"#,
    );
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
