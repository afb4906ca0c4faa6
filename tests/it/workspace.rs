//! The workspace's clock and id source, injected through the library: runs, their bronze rows,
//! builds and undos carry the time and the ids the workspace gives them, not the host's, so tests
//! fix time and ids instead of masking them (and can step the clock back).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Int64Type;
use ingot::engine::session::{ManualClock, SequentialIds, Workspace};
use ingot::ingest::{IngestOptions, ingest_file};
use ingot::silver::build::{BuildOptions, build};
use ingot::spec::contract::ContractSet;

use crate::util::{landing, repo};

/// 2026-01-01T00:00:00Z in microseconds.
const START: i64 = 1_767_225_600_000_000;
const SECOND: i64 = 1_000_000;

fn workspace(dir: &std::path::Path, clock: Arc<ManualClock>) -> Workspace {
    let lake = ingot::table::lake::Lake::open(&dir.join("lake").display().to_string()).unwrap();
    Workspace {
        contracts_dir: repo().join("contracts"),
        rules_dir: repo().join("rules"),
        landing_dir: dir.join("landing"),
        clock,
        ids: Arc::new(SequentialIds::new("id-")),
        ..Workspace::new(lake)
    }
}

/// `(text, micros)` of a query's first two columns, every row.
async fn rows(ws: &Workspace, sql: &str) -> Vec<(String, i64)> {
    rows_as_of(ws, sql, None).await
}

/// [`rows`] with `silver.*` as of a build id or a time (`ingot sql --as-of`).
async fn rows_as_of(ws: &Workspace, sql: &str, as_of: Option<&str>) -> Vec<(String, i64)> {
    let catalog = ingot::query::open_catalog(ws, as_of).await.unwrap();
    let batches = catalog.ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let text =
            datafusion::arrow::compute::cast(b.column(0), &datafusion::arrow::datatypes::DataType::Utf8).unwrap();
        let text = text.as_string::<i32>();
        let time =
            datafusion::arrow::compute::cast(b.column(1), &datafusion::arrow::datatypes::DataType::Int64).unwrap();
        let time = time.as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((
                text.value(i).to_string(),
                if time.is_null(i) { -1 } else { time.value(i) },
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_builds_and_undos_carry_the_workspaces_clock_and_ids() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(START, SECOND));
    let ws = workspace(dir.path(), clock.clone());
    let mut problems = ingot::spec::yaml::Problems::default();
    let contracts = ContractSet::load(&ws.contracts_dir, &mut problems);
    let contract = |s: &str| contracts.contracts.get(s).unwrap().clone();
    let opts = IngestOptions::default();

    let hotels = ingest_file(&ws, contract("hotels"), &landing("hotels/2026-11-01_hotels.csv"), &opts)
        .await
        .unwrap();
    assert_eq!(hotels.run_id, "id-000001");
    assert_eq!(hotels.started_at, START);
    // the clock steps back a day (an NTP step, a resumed VM): the next run says so
    clock.set(START - 86_400 * SECOND);
    let bookings = ingest_file(
        &ws,
        contract("bookings"),
        &landing("bookings/2026-11-01_bookings.csv"),
        &opts,
    )
    .await
    .unwrap();
    assert_eq!(bookings.run_id, "id-000002");
    assert_eq!(bookings.started_at, START - 86_400 * SECOND);
    assert!(bookings.finished_at > bookings.started_at && bookings.finished_at < START);

    let log = rows(
        &ws,
        "SELECT run_id, started_at FROM audit.ingestion_run_log ORDER BY run_id",
    )
    .await;
    assert_eq!(
        log,
        vec![
            ("id-000001".to_string(), START),
            ("id-000002".to_string(), START - 86_400 * SECOND)
        ]
    );
    // every bronze row of a run carries the run's id
    let stamped = rows(
        &ws,
        "SELECT ingestion_run_id, count(*) FROM bronze.bookings GROUP BY ingestion_run_id",
    )
    .await;
    assert_eq!(stamped, vec![("id-000002".to_string(), bookings.rows_written())]);

    clock.set(START + 3_600 * SECOND);
    let built = build(&ws, "bookings", &BuildOptions::default()).await.unwrap();
    assert_eq!(built.record.build_id, "id-000003");
    assert_eq!(built.record.started_at, START + 3_600 * SECOND);
    let silver = rows(
        &ws,
        "SELECT silver_build_id, count(*) FROM silver.bookings GROUP BY silver_build_id",
    )
    .await;
    assert_eq!(silver, vec![("id-000003".to_string(), built.table_rows as i64)]);

    clock.set(START + 7_200 * SECOND);
    ingot::ops::undo::undo(&ws, "id-000003").await.unwrap();
    let undone = rows(
        &ws,
        "SELECT build_id, rolled_back_at FROM audit.silver_build_log WHERE build_id = 'id-000003'",
    )
    .await;
    assert_eq!(undone.len(), 1);
    let at = undone[0].1;
    assert!(
        (START + 7_200 * SECOND..START + 7_300 * SECOND).contains(&at),
        "rolled back at {at}"
    );
}

/// The clock of a host steps back between two runs of one source (an NTP step, a resumed VM, a
/// second host whose clock is behind): the later run's versions still win, and its
/// `ingested_at` comes after the earlier run's, so `_current` equals that of a lake whose clock
/// ran forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_that_steps_back_does_not_reorder_a_sources_versions() {
    let mut currents = Vec::new();
    for step_back in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(START, SECOND));
        let ws = workspace(dir.path(), clock.clone());
        let mut problems = ingot::spec::yaml::Problems::default();
        let contracts = ContractSet::load(&ws.contracts_dir, &mut problems);
        let hotels = contracts.contracts.get("hotels").unwrap().clone();
        let opts = IngestOptions::default();
        let first = ingest_file(&ws, hotels.clone(), &landing("hotels/2026-11-01_hotels.csv"), &opts)
            .await
            .unwrap();
        if step_back {
            clock.set(START - 86_400 * SECOND);
        }
        let second = ingest_file(&ws, hotels, &landing("hotels/2026-11-03_hotels.csv"), &opts)
            .await
            .unwrap();
        assert_eq!((second.rows_inserted, second.rows_updated), (1, 2));
        assert!(
            second.started_at > first.started_at,
            "{} <= {}",
            second.started_at,
            first.started_at
        );
        if step_back {
            assert_eq!(
                second.started_at,
                first.started_at + 1,
                "the earliest time after the first run"
            );
        }
        let stamps = rows(
            &ws,
            "SELECT ingestion_run_id, max(ingested_at) FROM bronze.hotels GROUP BY ingestion_run_id ORDER BY 1",
        )
        .await;
        assert_eq!(
            stamps,
            [
                ("id-000001".to_string(), first.started_at),
                ("id-000002".to_string(), second.started_at)
            ]
        );
        let current = rows(
            &ws,
            "SELECT hotel_code || ' ' || row_hash || ' ' || ingestion_run_id, 0 FROM bronze.hotels_current ORDER BY 1",
        )
        .await;
        assert_eq!(current.iter().filter(|(r, _)| r.ends_with("id-000002")).count(), 3);
        currents.push(current);
    }
    assert_eq!(currents[0], currents[1]);
}

/// Builds of a table follow commit order too: a build made while the clock is a day behind still
/// finishes after the previous build, `--as-of` now shows it, and an undo is stamped after both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_that_steps_back_does_not_reorder_builds_or_as_of() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(START, SECOND));
    let ws = workspace(dir.path(), clock.clone());
    let mut problems = ingot::spec::yaml::Problems::default();
    let contracts = ContractSet::load(&ws.contracts_dir, &mut problems);
    let contract = |s: &str| contracts.contracts.get(s).unwrap().clone();
    let opts = IngestOptions::default();
    for (source, file) in [
        ("hotels", "hotels/2026-11-01_hotels.csv"),
        ("bookings", "bookings/2026-11-01_bookings.csv"),
    ] {
        ingest_file(&ws, contract(source), &landing(file), &opts).await.unwrap();
    }
    let first = build(&ws, "bookings", &BuildOptions::default()).await.unwrap().record;
    clock.set(START - 86_400 * SECOND);
    ingest_file(
        &ws,
        contract("bookings"),
        &landing("bookings/2026-11-03_bookings.csv"),
        &opts,
    )
    .await
    .unwrap();
    let second = build(&ws, "bookings", &BuildOptions::default()).await.unwrap().record;
    assert!(second.started_at > first.finished_at, "{second:?} after {first:?}");
    assert!(second.finished_at >= second.started_at);
    // as of the moment the second build finished, and as of now: the second build's table
    for at in [second.build_id.clone(), "2030-01-01".to_string()] {
        let ids: Vec<String> = rows_as_of(
            &ws,
            "SELECT DISTINCT silver_build_id, 0 FROM silver.bookings",
            Some(&at),
        )
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
        // the second build's table (a delta on the first: rows it kept carry the first's id)
        assert!(ids.contains(&second.build_id), "as of {at}: {ids:?}");
    }
    let undone = ingot::ops::undo::undo(&ws, &second.build_id).await.unwrap();
    let ingot::ops::undo::Undone::Build { record, .. } = undone else {
        panic!("not a build undo")
    };
    assert!(record.rolled_back_at.unwrap() > second.finished_at);
}
