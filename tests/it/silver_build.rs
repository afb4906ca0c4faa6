//! `ingot build` and `ingot explain` through the real binary over the demo data: whole silver
//! rows against an independent SQL formulation over bronze, incremental against full builds,
//! no-op rebuilds, `--rebuild-where`, immutable rules versions, `fail` validations, and a crash at
//! every build failpoint followed by a re-run, compared with one clean build.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::util::{TestLake, assert_ok, assert_same_rows, landing, repo, stderr, stdout};

type Row = BTreeMap<String, Value>;

/// A copy of the repository's rules in the test directory (so a test may edit it).
fn copy_rules(t: &TestLake) -> PathBuf {
    let dir = t.dir.path().join("rules");
    for table in std::fs::read_dir(repo().join("rules")).unwrap() {
        let table = table.unwrap().path();
        let to = dir.join(table.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&table).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
    }
    dir
}

fn ingot(t: &TestLake, rules: &Path, args: &[&str]) -> Output {
    t.command().arg("--rules").arg(rules).args(args).output().unwrap()
}

fn build_ok(t: &TestLake, rules: &Path, args: &[&str]) -> String {
    let mut all = vec!["build"];
    all.extend_from_slice(args);
    let out = ingot(t, rules, &all);
    assert_ok(&out);
    stdout(&out)
}

fn ingest_all(t: &TestLake, files: &[&str]) {
    for f in files {
        let source = f.split('/').next().unwrap();
        t.ingest_ok(source, &landing(f));
    }
}

const DAY_ONE: &[&str] = &["hotels/2026-11-01_hotels.csv", "bookings/2026-11-01_bookings.csv"];
const MARKETING: &[&str] = &[
    "marketing_spend/2026-10-13_marketing_spend.csv",
    "marketing_spend/2026-10-23_marketing_spend.csv",
    "marketing_spend/2026-11-02_marketing_spend.csv.gz",
];

fn silver(t: &TestLake, table: &str) -> Vec<Row> {
    t.query(&format!(
        "SELECT * FROM silver.{table} ORDER BY natural_key_fingerprint"
    ))
}

fn without(rows: &[Row], column: &str) -> Vec<Row> {
    rows.iter()
        .map(|r| {
            let mut r = r.clone();
            r.remove(column);
            r
        })
        .collect()
}

fn builds(t: &TestLake) -> Vec<Row> {
    t.query("SELECT * FROM audit.silver_build_log ORDER BY \"table\", started_at")
}

/// The expected anomaly_flags of a row from boolean columns `flag_<name>` (removed), in order.
fn with_flags(rows: Vec<Row>, names: &[&str]) -> Vec<Row> {
    rows.into_iter()
        .map(|mut r| {
            let mut flags = Vec::new();
            for n in names {
                if r.remove(&format!("flag_{n}")) == Some(Value::Bool(true)) {
                    flags.push(Value::String(n.to_string()));
                }
            }
            r.insert("is_anomaly".into(), Value::Bool(!flags.is_empty()));
            r.insert("anomaly_flags".into(), Value::Array(flags));
            r
        })
        .collect()
}

/// bookings v2 by hand: resolve hotel_id (unique normalized code, else rejected), the steps, the
/// filter, the validation and the `when` anomaly.
const BOOKINGS_V2_SQL: &str = "
WITH h AS (
  SELECT normalize_text(hotel_code, 'trim,upper') AS k, count(*) AS n, min(hotel_id) AS hotel_id
  FROM bronze.hotels_current WHERE hotel_code IS NOT NULL GROUP BY 1
), r AS (
  SELECT b.*, h.hotel_id AS resolved FROM bronze.bookings_current b
  JOIN h ON normalize_text(b.hotel_code, 'trim,upper') = h.k AND h.n = 1
), s AS (
  SELECT booking_ref, hotel_code, lower(trim(guest_email)) AS guest_email,
    CASE lower(trim(channel)) WHEN 'booking.com' THEN 'booking_com' WHEN 'bcom' THEN 'booking_com'
      ELSE lower(trim(channel)) END AS channel,
    booking_status, check_in, check_out, nights, amount, currency, notes, resolved AS hotel_id,
    amount / nights AS nightly_rate, CAST(2 AS INT) AS rules_version,
    natural_key_fingerprint, row_hash, ingestion_run_id
  FROM r WHERE upper(booking_ref) NOT LIKE 'TEST%' AND check_out > check_in
)
SELECT *, nightly_rate > 300 IS TRUE AS flag_high_nightly_rate FROM s ORDER BY natural_key_fingerprint";

/// marketing_spend v1 by hand: hotel_id resolved or null, rename, click-through rate, the
/// validation, negative spend and first report in a year (ties by fingerprint, nulls apart).
const MARKETING_V1_SQL: &str = "
WITH h AS (
  SELECT normalize_text(hotel_code, 'trim,upper') AS k, count(*) AS n, min(hotel_id) AS hotel_id
  FROM bronze.hotels_current WHERE hotel_code IS NOT NULL GROUP BY 1
), s AS (
  SELECT m.hotel_code, m.day, m.channel, m.campaign, m.spend AS spend_eur, m.clicks, m.impressions,
    CASE WHEN h.n = 1 THEN h.hotel_id END AS hotel_id,
    CASE WHEN impressions > 0 THEN CAST(clicks AS DOUBLE) / CAST(impressions AS DOUBLE) END AS click_through_rate,
    CAST(1 AS INT) AS rules_version, m.natural_key_fingerprint, m.row_hash, m.ingestion_run_id
  FROM bronze.marketing_spend_current m LEFT JOIN h ON normalize_text(m.hotel_code, 'trim,upper') = h.k
  WHERE clicks IS NULL OR impressions IS NULL OR clicks <= impressions
), w AS (
  SELECT *, lag(day) OVER (PARTITION BY hotel_code, hotel_code IS NOT NULL AND day IS NOT NULL
    ORDER BY day, natural_key_fingerprint) AS previous FROM s
)
SELECT hotel_code, day, channel, campaign, spend_eur, clicks, impressions, hotel_id, click_through_rate,
  rules_version, natural_key_fingerprint, row_hash, ingestion_run_id,
  spend_eur < 0 IS TRUE AS flag_negative_spend,
  (hotel_code IS NOT NULL AND day IS NOT NULL AND (previous IS NULL OR day >= previous + INTERVAL '365 days')) IS TRUE
    AS flag_first_report_in_a_year
FROM w ORDER BY natural_key_fingerprint";

/// site_traffic v1 by hand: hotel_id resolved or null, pages per session, the validation, and the
/// sessions spike: the mean of up to 28 previous days of the hotel (ordered by day, then
/// fingerprint), at least 7 of them, rows with a null in hotel_code, day or sessions apart.
const TRAFFIC_V1_SQL: &str = "
WITH h AS (
  SELECT normalize_text(hotel_code, 'trim,upper') AS k, count(*) AS n, min(hotel_id) AS hotel_id
  FROM bronze.hotels_current WHERE hotel_code IS NOT NULL GROUP BY 1
), s AS (
  SELECT t.hotel_code, t.day, t.sessions, t.pageviews, t.conversions,
    CASE WHEN h.n = 1 THEN h.hotel_id END AS hotel_id,
    CASE WHEN sessions > 0 THEN CAST(pageviews AS DOUBLE) / CAST(sessions AS DOUBLE) END AS pages_per_session,
    CAST(1 AS INT) AS rules_version, t.natural_key_fingerprint, t.row_hash, t.ingestion_run_id
  FROM bronze.site_traffic_current t LEFT JOIN h ON normalize_text(t.hotel_code, 'trim,upper') = h.k
  WHERE conversions IS NULL OR sessions IS NULL OR conversions <= sessions
), w AS (
  SELECT *,
    count(*) OVER (PARTITION BY hotel_code, hotel_code IS NOT NULL AND day IS NOT NULL AND sessions IS NOT NULL
      ORDER BY day, natural_key_fingerprint ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS history,
    avg(sessions) OVER (PARTITION BY hotel_code, hotel_code IS NOT NULL AND day IS NOT NULL AND sessions IS NOT NULL
      ORDER BY day, natural_key_fingerprint ROWS BETWEEN 28 PRECEDING AND 1 PRECEDING) AS mean
  FROM s
)
SELECT hotel_code, day, sessions, pageviews, conversions, hotel_id, pages_per_session,
  rules_version, natural_key_fingerprint, row_hash, ingestion_run_id,
  (hotel_code IS NOT NULL AND day IS NOT NULL AND sessions IS NOT NULL
    AND history >= 7 AND mean > 0 AND sessions > 10 * mean) IS TRUE AS flag_sessions_spike
FROM w ORDER BY natural_key_fingerprint";

/// The story's spike, "a day with ten times the usual sessions", after the nightly job over the
/// demo data: silver.site_traffic equals its rules computed by hand in SQL, exactly one row is
/// flagged, AMS01 on 2026-10-30, and that row's counts are those of AMS01's sessions of the day
/// in bronze.web_sessions (the per-session export of the same sessions). Every other day the
/// two sources share agrees too, except for the sessions bronze rejected.
#[test]
fn the_sessions_spike_flags_exactly_the_day_with_ten_times_the_usual_sessions() {
    let t = TestLake::new();
    crate::nightly::copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
    assert_ok(&crate::nightly::nightly(&t));

    let got = silver(&t, "site_traffic");
    let want = with_flags(t.query(TRAFFIC_V1_SQL), &["sessions_spike"]);
    assert_eq!(want.len(), 210);
    assert_same_rows(&without(&got, "silver_build_id"), &want, "silver.site_traffic");

    // the flagged rows, whole, against AMS01's sessions of 2026-10-30 counted in bronze
    let flagged = t.query(
        "SELECT hotel_code, day, sessions, pageviews, conversions, anomaly_flags, is_anomaly \
         FROM silver.site_traffic WHERE is_anomaly OR cardinality(anomaly_flags) > 0 ORDER BY hotel_code, day",
    );
    let from_sessions = t.query(
        "SELECT hotel_code, day, count(*) AS sessions, sum(pageviews) AS pageviews, \
           sum(CASE WHEN converted THEN 1 ELSE 0 END) AS conversions, \
           make_array('sessions_spike') AS anomaly_flags, true AS is_anomaly \
         FROM bronze.web_sessions_current WHERE hotel_code = 'AMS01' AND day = DATE '2026-10-30' \
         GROUP BY hotel_code, day",
    );
    assert_eq!(from_sessions.len(), 1, "{from_sessions:?}");
    assert_eq!(flagged, from_sessions);

    // on every day web_sessions covers, the daily count is the number of sessions in bronze plus
    // the sessions bronze rejected (their raw JSON still names hotel and day)
    let differ = t.query(
        "WITH w AS (SELECT hotel_code, day, count(*) AS n FROM bronze.web_sessions_current GROUP BY 1, 2) \
         SELECT s.hotel_code, CAST(s.day AS VARCHAR) AS day, s.sessions - coalesce(w.n, 0) AS missing \
         FROM silver.site_traffic s LEFT JOIN w ON w.hotel_code = s.hotel_code AND w.day = s.day \
         WHERE s.day >= (SELECT min(day) FROM bronze.web_sessions) AND s.sessions <> coalesce(w.n, 0) \
         ORDER BY 1, 2",
    );
    let hotel_day =
        |hotel: &Value, day: &Value| (hotel.as_str().unwrap().to_string(), day.as_str().unwrap().to_string());
    let mut rejected: BTreeMap<(String, String), i64> = BTreeMap::new();
    for r in t.query("SELECT raw_payload FROM audit.row_failure_log WHERE source = 'web_sessions' AND layer = 'bronze'")
    {
        let raw: Value = serde_json::from_str(r["raw_payload"].as_str().unwrap()).unwrap();
        *rejected.entry(hotel_day(&raw["hotel_code"], &raw["day"])).or_default() += 1;
    }
    assert!(!rejected.is_empty());
    let differ: BTreeMap<(String, String), i64> = differ
        .iter()
        .map(|r| (hotel_day(&r["hotel_code"], &r["day"]), r["missing"].as_i64().unwrap()))
        .collect();
    assert_eq!(differ, rejected);
}

#[test]
fn a_full_build_equals_transform_and_flags_computed_independently_in_sql() {
    let t = TestLake::new();
    let rules = repo().join("rules");
    ingest_all(&t, DAY_ONE);
    ingest_all(
        &t,
        &[
            "bookings/2026-11-03_bookings.csv",
            "bookings/2026-11-04_bookings_corrected.csv",
        ],
    );
    ingest_all(&t, MARKETING);
    let said = build_ok(&t, &rules, &["bookings"]);
    assert!(said.contains("silver.bookings: full build with rules v2"), "{said}");
    build_ok(&t, &rules, &["marketing_spend"]);

    let got = silver(&t, "bookings");
    let build_id = builds(&t)[0]["build_id"].clone();
    assert!(got.iter().all(|r| r["silver_build_id"] == build_id));
    let want = with_flags(t.query(BOOKINGS_V2_SQL), &["high_nightly_rate"]);
    assert!(want.len() > 300, "{}", want.len());
    assert!(want.iter().any(|r| r["is_anomaly"] == Value::Bool(true)));
    assert!(want.iter().any(|r| r["channel"] == "booking_com"));
    assert_same_rows(&without(&got, "silver_build_id"), &want, "silver.bookings");

    let got = silver(&t, "marketing_spend");
    let want = with_flags(t.query(MARKETING_V1_SQL), &["negative_spend", "first_report_in_a_year"]);
    assert_eq!(want.len(), 377);
    assert_eq!(want.iter().filter(|r| r["is_anomaly"] == Value::Bool(true)).count(), 9);
    assert_same_rows(&without(&got, "silver_build_id"), &want, "silver.marketing_spend");

    // the build log reconciles and names the rules file's hash
    let log = builds(&t);
    let sha = crate::util::sha256_hex(&std::fs::read(rules.join("bookings/v2.yaml")).unwrap());
    assert_eq!(log[0]["table"], "bookings");
    assert_eq!(log[0]["rules_sha256"], sha.as_str());
    assert_eq!(log[0]["mode"], "full");
    assert_eq!(log[0]["status"], "succeeded");
    for r in &log {
        let n = |k: &str| r[k].as_i64().unwrap();
        assert_eq!(
            n("rows_read"),
            n("rows_written") + n("rows_filtered") + n("rows_rejected"),
            "{r:?}"
        );
    }
    assert_eq!(
        log[0]["rows_written"].as_i64().unwrap() as usize,
        silver(&t, "bookings").len()
    );
    assert_eq!(log[1]["rows_flagged"], 9);

    // silver rejections: one row per rejected record with layer, table, rule, version and payload
    let failures = t.query(
        "SELECT run_id, layer, source, \"table\", rule, rules_version, natural_key_fingerprint, raw_payload \
         FROM audit.row_failure_log WHERE layer = 'silver' ORDER BY natural_key_fingerprint",
    );
    let rejected: BTreeSet<String> = t
        .query(
            "SELECT natural_key_fingerprint FROM bronze.bookings_current WHERE check_out <= check_in \
             AND upper(booking_ref) NOT LIKE 'TEST%'",
        )
        .iter()
        .map(|r| r["natural_key_fingerprint"].as_str().unwrap().to_string())
        .collect();
    assert!(!rejected.is_empty());
    let logged: BTreeSet<String> = failures
        .iter()
        .filter(|f| f["rule"] == "stay_is_positive")
        .map(|f| f["natural_key_fingerprint"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(logged, rejected);
    for f in &failures {
        assert_eq!(f["run_id"], build_id);
        assert_eq!(f["layer"], "silver");
        assert_eq!(f["table"], "bookings");
        assert_eq!(f["rules_version"], 2);
        assert!(f["raw_payload"].as_str().unwrap().starts_with('{'), "{f:?}");
    }
    assert_eq!(
        failures.len() as i64,
        log[0]["rows_rejected"].as_i64().unwrap(),
        "{failures:?}"
    );
}

/// Rows keyed by fingerprint.
fn by_fp(rows: &[Row]) -> BTreeMap<String, Row> {
    rows.iter()
        .map(|r| (r["natural_key_fingerprint"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

#[test]
fn an_incremental_build_yields_the_rows_and_flags_of_a_full_build() {
    let t = TestLake::new();
    let rules = repo().join("rules");
    ingest_all(&t, DAY_ONE);
    build_ok(&t, &rules, &["bookings"]);
    let first = silver(&t, "bookings");
    let first_id = first[0]["silver_build_id"].clone();

    // a new export and a corrected re-delivery: only new and changed records are transformed
    ingest_all(
        &t,
        &[
            "bookings/2026-11-03_bookings.csv",
            "bookings/2026-11-04_bookings_corrected.csv",
        ],
    );
    let said = build_ok(&t, &rules, &["bookings"]);
    assert!(said.contains("incremental build"), "{said}");
    let incremental = silver(&t, "bookings");
    let log = builds(&t);
    let second_id = log[1]["build_id"].clone();
    assert_eq!(log[1]["mode"], "incremental");
    let new_runs: Vec<Row> =
        t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'bookings' ORDER BY started_at");
    let changed: BTreeSet<String> = t
        .query(&format!(
            "SELECT natural_key_fingerprint FROM bronze.bookings_current WHERE ingestion_run_id IN ('{}', '{}')",
            new_runs[1]["run_id"].as_str().unwrap(),
            new_runs[2]["run_id"].as_str().unwrap()
        ))
        .iter()
        .map(|r| r["natural_key_fingerprint"].as_str().unwrap().to_string())
        .collect();
    assert!(changed.len() > 5, "{changed:?}");
    assert_eq!(
        log[1]["rows_read"].as_i64().unwrap() as usize,
        changed.len(),
        "only new and changed records are read"
    );
    let before = by_fp(&first);
    for r in &incremental {
        let fp = r["natural_key_fingerprint"].as_str().unwrap();
        if changed.contains(fp) {
            assert_eq!(r["silver_build_id"], second_id, "{fp} was rebuilt");
        } else {
            assert_eq!(r["silver_build_id"], first_id, "{fp} was kept");
            // kept byte-for-byte (the flags are recomputed and equal here)
            assert_eq!(r, &before[fp], "{fp} kept");
        }
    }

    build_ok(&t, &rules, &["bookings", "--full"]);
    let full = silver(&t, "bookings");
    assert_same_rows(
        &without(&incremental, "silver_build_id"),
        &without(&full, "silver_build_id"),
        "incremental vs full after the re-delivery",
    );

    // the hotels change (a new surrogate id, a new hotel): every row's resolve may change, so the
    // incremental build processes every record and still equals a full build
    ingest_all(&t, &["hotels/2026-11-03_hotels.csv"]);
    build_ok(&t, &rules, &["bookings"]);
    let incremental = silver(&t, "bookings");
    build_ok(&t, &rules, &["bookings", "--full"]);
    let full = silver(&t, "bookings");
    assert_ne!(
        without(&incremental, "silver_build_id"),
        without(&before.into_values().collect::<Vec<_>>(), "silver_build_id")
    );
    assert_same_rows(
        &without(&incremental, "silver_build_id"),
        &without(&full, "silver_build_id"),
        "incremental vs full after the hotels change",
    );
}

#[test]
fn building_again_with_nothing_new_changes_nothing_but_adds_a_build_record() {
    let t = TestLake::new();
    let rules = repo().join("rules");
    ingest_all(&t, DAY_ONE);
    ingest_all(&t, MARKETING);
    for table in ["bookings", "marketing_spend"] {
        build_ok(&t, &rules, &[table]);
        let once = silver(&t, table);
        let failures_once = t.query("SELECT * FROM audit.row_failure_log ORDER BY run_id, natural_key_fingerprint");
        build_ok(&t, &rules, &[table]);
        assert_same_rows(&silver(&t, table), &once, table);
        assert_eq!(
            t.query("SELECT * FROM audit.row_failure_log ORDER BY run_id, natural_key_fingerprint"),
            failures_once
        );
    }
    let log = builds(&t);
    assert_eq!(log.len(), 4);
    for (i, mode) in [(0, "full"), (1, "incremental"), (2, "full"), (3, "incremental")] {
        assert_eq!(log[i]["mode"], mode);
        assert_eq!(log[i]["status"], "succeeded");
    }
    for i in [1, 3] {
        assert_eq!(log[i]["rows_read"], 0);
        assert_eq!(log[i]["rows_written"], 0);
        assert_eq!(log[i]["rows_flagged"], log[i - 1]["rows_flagged"]);
        // the table is the previous build's: its manifest names those files, it writes none
        let dir = t.lake().join(format!(
            "silver/{}/build_id={}",
            log[i]["table"].as_str().unwrap(),
            log[i]["build_id"].as_str().unwrap()
        ));
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, ["inputs.json", "manifest.json"], "{}", dir.display());
    }
}

#[test]
fn rebuild_where_rebuilds_only_matching_rows_and_leaves_the_others_byte_for_byte() {
    let t = TestLake::new();
    let rules = repo().join("rules");
    ingest_all(&t, DAY_ONE);
    build_ok(&t, &rules, &["bookings", "--rules-version", "1"]);
    ingest_all(&t, &["bookings/2026-11-04_bookings_corrected.csv"]);
    // the corrected records are rebuilt with v2, the others stay at v1
    build_ok(&t, &rules, &["bookings"]);
    let mixed = silver(&t, "bookings");
    let versions: BTreeSet<i64> = mixed.iter().map(|r| r["rules_version"].as_i64().unwrap()).collect();
    assert_eq!(versions, BTreeSet::from([1, 2]));
    assert!(mixed.iter().any(|r| r["channel"] == "bcom"), "v1 leaves bcom");

    let said = build_ok(&t, &rules, &["bookings", "--rebuild-where", "rules_version < 2"]);
    assert!(said.contains("rebuild"), "{said}");
    let rebuilt = silver(&t, "bookings");
    let before = by_fp(&mixed);
    for r in &rebuilt {
        assert_eq!(r["rules_version"], 2);
        let fp = r["natural_key_fingerprint"].as_str().unwrap();
        if before[fp]["rules_version"] == 2 {
            assert_eq!(r, &before[fp], "{fp}: not matching, must stay identical");
        }
    }
    assert!(!rebuilt.iter().any(|r| r["channel"] == "bcom"));
    // records v1 rejected have no silver row to keep: the first build with v2 (the incremental
    // one) processed them again, and rejected them again, now by v2
    let rejected_by = |build: usize| -> BTreeSet<String> {
        t.query(&format!(
            "SELECT natural_key_fingerprint FROM audit.row_failure_log WHERE layer = 'silver' \
             AND rule = 'stay_is_positive' AND run_id = '{}'",
            builds(&t)[build]["build_id"].as_str().unwrap()
        ))
        .iter()
        .map(|r| r["natural_key_fingerprint"].as_str().unwrap().to_string())
        .collect()
    };
    assert!(!rejected_by(0).is_empty());
    assert_eq!(rejected_by(0), rejected_by(1));
    let log = builds(&t);
    assert_eq!(log[2]["mode"], "rebuild");
    assert_eq!(log[2]["rebuild_filter"], "rules_version < 2");

    build_ok(&t, &rules, &["bookings", "--full"]);
    assert_same_rows(
        &without(&rebuilt, "silver_build_id"),
        &without(&silver(&t, "bookings"), "silver_build_id"),
        "rebuild vs full",
    );

    // only rules_version may be referenced
    let out = ingot(
        &t,
        &rules,
        &["build", "bookings", "--rebuild-where", "channel = 'bcom'"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("only rules_version"), "{}", stderr(&out));
}

#[test]
fn an_edited_rules_version_that_a_build_used_is_refused() {
    let t = TestLake::new();
    let rules = copy_rules(&t);
    ingest_all(&t, DAY_ONE);
    ingest_all(&t, MARKETING);
    build_ok(&t, &rules, &["marketing_spend"]);
    let before = silver(&t, "marketing_spend");
    let file = rules.join("marketing_spend/v1.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("when: \"spend_eur < 0\"", "when: \"spend_eur < 1\""),
    )
    .unwrap();
    let out = ingot(&t, &rules, &["build", "marketing_spend"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("immutable") && err.contains("v2.yaml"), "{err}");
    assert_eq!(silver(&t, "marketing_spend"), before);
    assert_eq!(builds(&t).len(), 1);
    // the change as a new version builds
    std::fs::write(
        rules.join("marketing_spend/v2.yaml"),
        std::fs::read_to_string(&file)
            .unwrap()
            .replace("version: 1", "version: 2"),
    )
    .unwrap();
    std::fs::write(&file, text).unwrap();
    let said = build_ok(&t, &rules, &["marketing_spend", "--full"]);
    assert!(said.contains("rules v2"), "{said}");
}

#[test]
fn a_fail_validation_fails_the_build_and_publishes_nothing() {
    let t = TestLake::new();
    let rules = copy_rules(&t);
    ingest_all(&t, DAY_ONE);
    ingest_all(&t, MARKETING);
    build_ok(&t, &rules, &["marketing_spend"]);
    let before = silver(&t, "marketing_spend");
    let failures_before = t.query("SELECT * FROM audit.row_failure_log ORDER BY run_id, natural_key_fingerprint");
    let v1 = std::fs::read_to_string(rules.join("marketing_spend/v1.yaml")).unwrap();
    let v2 = v1.replace("version: 1", "version: 2").replace(
        "validate:\n",
        "validate:\n  - name: no_refunds\n    check: \"spend_eur >= 0\"\n    action: fail\n",
    );
    assert_ne!(v1, v2.replace("version: 2", "version: 1"));
    std::fs::write(rules.join("marketing_spend/v2.yaml"), v2).unwrap();
    let out = ingot(&t, &rules, &["build", "marketing_spend", "--full"]);
    assert_eq!(out.status.code(), Some(1), "{}\n{}", stdout(&out), stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("FAILED") && said.contains("no_refunds") && said.contains("-35.2"),
        "{said}"
    );
    assert_eq!(silver(&t, "marketing_spend"), before);
    assert_eq!(
        t.query("SELECT * FROM audit.row_failure_log ORDER BY run_id, natural_key_fingerprint"),
        failures_before
    );
    let log = builds(&t);
    assert_eq!(log.len(), 2);
    assert_eq!(log[1]["status"], "failed");
    assert!(log[1]["error"].as_str().unwrap().contains("no_refunds"), "{:?}", log[1]);
}

#[test]
fn explain_prints_the_rules_steps_and_the_logical_plan() {
    let t = TestLake::new();
    let rules = repo().join("rules");
    let out = ingot(&t, &rules, &["explain", "bookings"]);
    assert_ok(&out);
    let text = stdout(&out);
    for want in [
        "silver.bookings with rules v2",
        "reads bronze.bookings_current",
        "resolve hotel: hotel_code -> hotels.hotel_id",
        "1. set channel = lower(trim(channel))",
        "2. map channel",
        "6. filter upper(booking_ref) NOT LIKE 'TEST%'",
        "stay_is_positive: check_out > check_in (reject)",
        "high_nightly_rate: when nightly_rate > 300",
        "-- silver.bookings (rules v2)",
        "Projection",
        "Filter",
        "-- rows rejected to audit.row_failure_log",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let out = ingot(&t, &rules, &["explain", "bookings", "--rules-version", "1"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("silver.bookings with rules v1"));
    let out = ingot(&t, &rules, &["explain", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    // a table with rules but no build is an empty table with the columns the rules produce
    let cols: Vec<String> = t
        .query(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'silver' \
             AND table_name = 'marketing_spend' ORDER BY ordinal_position",
        )
        .iter()
        .map(|r| r["column_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(cols.last().map(String::as_str), Some("silver_build_id"), "{cols:?}");
    assert!(cols.contains(&"spend_eur".to_string()) && cols.contains(&"anomaly_flags".to_string()));
    assert!(silver(&t, "marketing_spend").is_empty());
}

// ---- crashes ------------------------------------------------------------------------------------

/// Silver, the build log and the failure log, with run ids, build ids and clock values replaced
/// by stable names.
fn silver_snapshot(t: &TestLake) -> BTreeMap<String, Vec<Row>> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for (i, r) in t
        .query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at, run_id")
        .iter()
        .enumerate()
    {
        names.insert(r["run_id"].as_str().unwrap().into(), format!("run#{i}"));
    }
    let log = builds(t);
    for (i, r) in log.iter().enumerate() {
        names.insert(r["build_id"].as_str().unwrap().into(), format!("build#{i}"));
    }
    let norm = |rows: Vec<Row>| crate::util::normalize_rows(rows, &names);
    let mut out = BTreeMap::new();
    out.insert("silver.bookings".to_string(), norm(silver(t, "bookings")));
    out.insert("audit.silver_build_log".to_string(), norm(log));
    out.insert(
        "audit.row_failure_log".to_string(),
        norm(t.query(
            "SELECT * FROM audit.row_failure_log ORDER BY layer, run_id, natural_key_fingerprint, rule, source_row_number",
        )),
    );
    out
}

fn crash_seed(t: &TestLake, rules: &Path) {
    ingest_all(t, DAY_ONE);
    build_ok(t, rules, &["bookings"]);
    ingest_all(t, &["bookings/2026-11-04_bookings_corrected.csv"]);
}

#[test]
fn every_build_failpoint_crash_then_rerun_equals_one_clean_build() {
    let rules = repo().join("rules");
    let clean = |extra: bool| {
        let t = TestLake::new();
        crash_seed(&t, &rules);
        build_ok(&t, &rules, &["bookings"]);
        if extra {
            build_ok(&t, &rules, &["bookings"]);
        }
        silver_snapshot(&t)
    };
    let (clean_once, clean_then_noop) = (clean(false), clean(true));
    for point in ingot::table::failpoint::BUILD {
        let t = TestLake::new();
        crash_seed(&t, &rules);
        let before = silver_snapshot(&t);
        let out = t
            .command()
            .env("INGOT_FAILPOINT", point)
            .arg("--rules")
            .arg(&rules)
            .args(["build", "bookings"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{point}: the process should have crashed");
        assert!(
            stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: failpoint never reached: {}",
            stderr(&out)
        );
        let committed = *point == "build.after_commit";
        if !committed {
            assert_eq!(
                silver_snapshot(&t),
                before,
                "{point}: nothing of the crashed build may be visible"
            );
        }
        build_ok(&t, &rules, &["bookings"]);
        let want = if committed { &clean_then_noop } else { &clean_once };
        let got = silver_snapshot(&t);
        for (name, rows) in want {
            assert_same_rows(&got[name], rows, &format!("{point}: crash + re-run: {name}"));
        }
    }
}

/// One build of a table at a time: a second build while one stalls before its commit fails at
/// once, naming the holder. And should the stalled build lose its lock (taken over, as after its
/// TTL) while another build of the table commits, it must not publish: its commit slot is taken,
/// it exits 1, and silver is the other build's.
#[test]
fn a_stalled_build_whose_slot_was_taken_cannot_commit() {
    let t = TestLake::new();
    let rules = repo().join("rules");
    ingest_all(&t, DAY_ONE);
    let marker = t.dir.path().join("reached");
    let stalled = t
        .command()
        .env("INGOT_FAILPOINT", "build.before_commit:sleep:5000")
        .env("INGOT_FAILPOINT_MARKER", &marker)
        .arg("--rules")
        .arg(&rules)
        .args(["build", "bookings"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::util::wait_for_marker(&marker, "the stalled build");
    let second = t
        .command()
        .arg("--rules")
        .arg(&rules)
        .args(["build", "bookings", "--wait", "0"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("silver table \"bookings\" is being built or undone by"),
        "{}",
        stderr(&second)
    );
    std::fs::remove_file(t.lake().join("_locks/silver/bookings.lock")).unwrap();
    build_ok(&t, &rules, &["bookings"]);
    let published = silver(&t, "bookings");
    let out = stalled.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing of build"), "{}", stderr(&out));
    assert_eq!(builds(&t).len(), 1);
    assert_eq!(silver(&t, "bookings"), published);
}

/// Silver rows with run ids replaced by their position in the run log (two lakes fed the same
/// files in the same order then compare equal), without `silver_build_id`.
fn comparable_silver(t: &TestLake, table: &str) -> Vec<Row> {
    let names: BTreeMap<String, String> = t
        .query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at, run_id")
        .iter()
        .enumerate()
        .map(|(i, r)| (r["run_id"].as_str().unwrap().to_string(), format!("run#{i}")))
        .collect();
    without(&silver(t, table), "silver_build_id")
        .into_iter()
        .map(|mut r| {
            let id = r["ingestion_run_id"].as_str().unwrap().to_string();
            r.insert("ingestion_run_id".into(), Value::String(names[&id].clone()));
            r
        })
        .collect()
}

/// Random sequences of ingests (including a re-delivery of day one after its correction, which
/// returns records to an earlier version, and a hotels change under resolve) with incremental
/// builds (and now and then a rebuild of every version) at random points: each equals a full
/// build of a lake fed the same files. The lakes hold several bronze runs, so every build goes
/// through the record keys (current runs, previous state) rather than the one-run full path.
#[test]
fn incremental_builds_after_random_sequences_of_ingests_equal_full_builds() {
    let rules = repo().join("rules");
    for seed in [7u64, 42, 1234] {
        let inc = TestLake::new();
        let full = TestLake::new();
        // day one again, with other bytes: a new run that returns corrected records to v1
        let again = inc.dir.path().join("bookings_day1_again.csv");
        let mut bytes = std::fs::read(landing("bookings/2026-11-01_bookings.csv")).unwrap();
        bytes.extend_from_slice(b"\n");
        std::fs::write(&again, &bytes).unwrap();
        let mut files: Vec<(String, PathBuf)> = [
            "bookings/2026-11-01_bookings.csv",
            "bookings/2026-11-03_bookings.csv",
            "bookings/2026-11-04_bookings_corrected.csv",
            "hotels/2026-11-03_hotels.csv",
        ]
        .iter()
        .map(|f| (f.split('/').next().unwrap().to_string(), landing(f)))
        .collect();
        files.push(("bookings".into(), again));
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        // shuffle
        for i in (1..files.len()).rev() {
            let j = next() % (i + 1);
            files.swap(i, j);
        }
        for t in [&inc, &full] {
            t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
        }
        let mut steps = Vec::new();
        for (source, file) in &files {
            for t in [&inc, &full] {
                t.ingest_ok(source, file);
            }
            steps.push(source.clone());
            if next() % 3 != 0 {
                build_ok(&inc, &rules, &["bookings"]);
                // Now and then a rebuild of every version on top: the same rows again.
                if next() % 3 == 0 {
                    build_ok(&inc, &rules, &["bookings", "--rebuild-where", "rules_version >= 1"]);
                }
                build_ok(&full, &rules, &["bookings", "--full"]);
                assert_same_rows(
                    &comparable_silver(&inc, "bookings"),
                    &comparable_silver(&full, "bookings"),
                    &format!("seed {seed}, after {steps:?}"),
                );
            }
        }
        build_ok(&inc, &rules, &["bookings"]);
        build_ok(&full, &rules, &["bookings", "--full"]);
        assert_same_rows(
            &comparable_silver(&inc, "bookings"),
            &comparable_silver(&full, "bookings"),
            &format!("seed {seed}, at the end"),
        );
    }
}

#[test]
fn rebuild_where_also_reprocesses_the_records_a_matching_version_rejected_or_filtered() {
    let t = TestLake::new();
    let rules = repo().join("rules");
    ingest_all(&t, DAY_ONE);
    build_ok(&t, &rules, &["bookings", "--rules-version", "1"]);
    build_ok(&t, &rules, &["bookings", "--rebuild-where", "rules_version = 1"]);
    let log = builds(&t);
    for k in ["rows_read", "rows_written", "rows_filtered", "rows_rejected"] {
        assert_eq!(log[0][k], log[1][k], "{k}");
    }
    assert!(log[1]["rows_rejected"].as_i64().unwrap() > 0);
    let rejections = t.query(
        "SELECT natural_key_fingerprint, rule, rules_version FROM audit.row_failure_log \
         WHERE layer = 'silver' ORDER BY rules_version, natural_key_fingerprint",
    );
    let (v1, v2): (Vec<_>, Vec<_>) = rejections.iter().partition(|r| r["rules_version"] == 1);
    assert_eq!(
        v1.iter().map(|r| &r["natural_key_fingerprint"]).collect::<Vec<_>>(),
        v2.iter().map(|r| &r["natural_key_fingerprint"]).collect::<Vec<_>>()
    );
    assert!(silver(&t, "bookings").iter().all(|r| r["rules_version"] == 2));
}

/// Window anomalies (`first_seen`, `spike`) over kept and rebuilt rows: after each delivery the
/// incremental build's rows and flags equal a full build's, and kept rows whose history changed
/// get their flags recomputed.
#[test]
fn incremental_builds_recompute_window_flags_over_the_whole_table() {
    let rules = repo().join("rules");
    let inc = TestLake::new();
    let full = TestLake::new();
    for t in [&inc, &full] {
        ingest_all(t, DAY_ONE);
    }
    let deliveries: &[(&str, &[&str])] = &[
        ("marketing_spend", &MARKETING[..1]),
        ("marketing_spend", &MARKETING[1..]),
        ("web_sessions", &["web_sessions/2026-10-26_web_sessions.ndjson"]),
        ("web_sessions", &["web_sessions/2026-11-02_web_sessions.ndjson"]),
        ("site_traffic", &["site_traffic/2026-10-19_site_traffic.csv"]),
        ("site_traffic", &["site_traffic/2026-10-26_site_traffic.csv"]),
        ("site_traffic", &["site_traffic/2026-11-02_site_traffic.csv"]),
    ];
    for (table, files) in deliveries {
        for t in [&inc, &full] {
            ingest_all(t, files);
        }
        build_ok(&inc, &rules, &[table]);
        build_ok(&full, &rules, &[table, "--full"]);
        let got = comparable_silver(&inc, table);
        assert!(!got.is_empty());
        assert_same_rows(
            &got,
            &comparable_silver(&full, table),
            &format!("{table} after {files:?}"),
        );
    }
    let flagged = |table: &str| -> usize {
        inc.query(&format!("SELECT count(*) AS n FROM silver.{table} WHERE is_anomaly"))[0]["n"]
            .as_u64()
            .unwrap() as usize
    };
    assert_eq!(flagged("marketing_spend"), 9);
    assert!(flagged("web_sessions") > 0);
    assert_eq!(flagged("site_traffic"), 1);
}
