//! `ingot doctor`: check a lake's invariants and report every violation with its location (exit
//! code 1 when any is violated). What a lost file makes unreadable is not checked further.
//!
//! 1. **files**: each committed run that loaded data has its bronze file (and its failure file
//!    when it rejected rows); each table's current build has its snapshot, each succeeded build
//!    that rejected rows its failure file. Files no committed run or build owns are orphans (for
//!    `ingot gc`, not violations). Log objects that are no record or unreadable are `logs` ones.
//! 2. **counts**: run records reconcile (`rows_seen = inserted + updated + unchanged + failed`), a
//!    run's bronze file has `inserted + updated + deleted` rows and its failure file `rows_failed`;
//!    build records reconcile (`rows_read = written + filtered + rejected`) and a build's failure
//!    file has `rows_rejected` rows.
//! 3. **keys**: one row per fingerprint in each run and in `bronze.<source>_current`.
//! 4. **silver**: every fingerprint of `silver.<table>` is current in bronze (not after an undo).
//! 5. **rules**: the SHA-256 recorded by every succeeded build equals its rules file's.
//! 6. **caches**: log checkpoints and the key state an ingest would use equal the fold they cache.
//! 7. **delta**: a Delta table not behind the logs has exactly the files they committed.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::TableReference;
use datafusion::functions::string::expr_fn::concat;
use datafusion::functions_aggregate::count::count_all;
use datafusion::logical_expr::JoinType;
use datafusion::prelude::{DataFrame, col, lit};
use futures::StreamExt;
use sha2::Digest;

use crate::engine::catalog::{Catalog, latest_build};
use crate::engine::session::Workspace;
use crate::error::Result;
use crate::ops::gc::{Owner, owner_of};
use crate::silver::compile::current_table;
use crate::table::audit::{BuildRecord, BuildStatus, RunRecord, RunStatus};
use crate::table::lake::{Lake, layout};
use crate::table::silver::{FP, RUN_ID};

/// One violated invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `logs`, `caches`, `files`, `counts`, `keys`, `silver`, `rules` or `delta`.
    pub check: &'static str,
    /// Where: a lake path, `run <id>`, `build <id>`, a table or a rules file.
    pub location: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.check, self.location, self.message)
    }
}

#[derive(Debug, Clone, Default)]
pub struct DoctorReport {
    pub violations: Vec<Violation>,
    /// Files no committed run or build owns (for gc).
    pub orphans: Vec<String>,
    pub runs_checked: usize,
    pub builds_checked: usize,
    /// Runs held for review (a notice each, not a violation).
    pub held: Vec<RunRecord>,
    /// Delta tables behind the logs (a notice each: the next command of the source or table, or
    /// `ingot delta sync`, publishes what they lack).
    pub delta_lags: Vec<String>,
    /// Sources with runs in the log and no contract here: their rows are not counted or keyed
    /// (a notice each; another `--contracts` folder may have them).
    pub uncontracted: Vec<String>,
}

/// What the file checks found lost: the query checks skip it, as it cannot be read.
#[derive(Default)]
struct Damaged {
    /// Sources (by name) and silver tables (as `silver.<table>`) with a missing file.
    tables: BTreeSet<String>,
    /// Some failure file is missing: the failure counts are not checked.
    failures: bool,
    /// Sources with no contract here: they cannot be read, so they are not checked.
    uncontracted: BTreeSet<String>,
}

impl Damaged {
    fn has(&self, name: &str) -> bool {
        self.tables.contains(name) || self.uncontracted.contains(name)
    }
}

/// Row counts of a plan's two columns (key, count) as a map; null keys are left out.
async fn counts(df: DataFrame) -> Result<BTreeMap<String, i64>> {
    let mut stream = df.execute_stream().await?;
    let mut out = BTreeMap::new();
    while let Some(b) = stream.next().await {
        let b = b?;
        let keys = datafusion::arrow::compute::cast(b.column(0), &datafusion::arrow::datatypes::DataType::Utf8)?;
        let keys = keys.as_string::<i32>();
        let n = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            if keys.is_valid(i) {
                out.insert(keys.value(i).to_string(), n.value(i));
            }
        }
    }
    Ok(out)
}

/// `df` grouped by `keys` with the row count of each group as `n`.
fn count_by(df: DataFrame, keys: &[&str]) -> Result<DataFrame> {
    let keys = keys.iter().map(|k| col(*k)).collect();
    Ok(df.aggregate(keys, vec![count_all().alias("n")])?)
}

/// The groups of `keys` in `df` with more than one row, and their row count `n`.
fn repeated(df: DataFrame, keys: &[&str]) -> Result<DataFrame> {
    Ok(count_by(df, keys)?.filter(col("n").gt(lit(1i64)))?)
}

fn v(check: &'static str, location: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation {
        check,
        location: location.into(),
        message: message.into(),
    }
}

/// Run every check; see the module documentation.
pub async fn doctor(ws: &Workspace) -> Result<DoctorReport> {
    doctor_with(ws, false).await
}

/// [`doctor`]; with `verify` every committed file is also read whole and compared with the CRC-32
/// its commit recorded (`ingot doctor --verify`).
pub async fn doctor_with(ws: &Workspace, verify: bool) -> Result<DoctorReport> {
    let lake = &ws.lake;
    // 0. logs: objects that are not records, records no reader can parse (the logs cannot be read
    // while one is in a slot: then that is all doctor can say)
    let mut out: Vec<Violation> = crate::table::audit::stray_log_objects(lake)
        .await?
        .into_iter()
        .map(|(path, why)| v("logs", path, why))
        .collect();
    let logs = async {
        Ok::<_, crate::error::Error>((
            crate::table::audit::read_run_log(lake).await?,
            crate::table::audit::read_build_log(lake).await?,
        ))
    };
    let (all_runs, all_builds) = match logs.await {
        Ok(logs) => logs,
        Err(_) if !out.is_empty() => {
            return Ok(DoctorReport {
                violations: out,
                ..Default::default()
            });
        }
        Err(e) => return Err(e),
    };
    // 0b. caches: log checkpoints and key states that readers pass over or that differ from
    // what they summarize
    for (path, why) in crate::table::audit::checkpoint_problems(lake).await? {
        out.push(v("caches", path, why));
    }
    let sizes = crate::ops::scrub::listed_sizes(lake).await?;
    let present: BTreeSet<String> = sizes.keys().cloned().collect();
    let mut report = DoctorReport {
        orphans: orphans(&present, &all_runs, &all_builds),
        held: all_runs
            .iter()
            .filter(|r| r.status == RunStatus::Held)
            .cloned()
            .collect(),
        runs_checked: all_runs.len(),
        builds_checked: all_builds.len(),
        ..Default::default()
    };

    // 1. files; sources and tables with a lost file cannot be queried: their later checks are skipped.
    let mut damaged = Damaged::default();
    check_run_files(&all_runs, &present, &mut damaged, &mut out);
    let tables: BTreeSet<&str> = all_builds.iter().map(|b| b.table.as_str()).collect();
    check_silver_snapshots(lake, &tables, &all_builds, &present, &mut damaged, &mut out).await;
    check_build_failure_files(&all_builds, &present, &mut damaged, &mut out);
    // 1b. files that are not what their commits recorded (size, CRC-32, a Parquet footer)
    let sources: Vec<String> = crate::spec::contract::ContractSet::readable(&ws.contracts_dir)
        .into_keys()
        .collect();
    let committed = crate::ops::scrub::committed_files(lake, &all_runs, &all_builds, &sources).await?;
    for d in crate::ops::scrub::check(lake, &committed, &sizes, &all_runs, verify).await? {
        match &d.by {
            crate::ops::scrub::Committer::Run { source, data: true, .. } => {
                damaged.tables.insert(source.clone());
            }
            crate::ops::scrub::Committer::Run { data: false, .. } => damaged.failures = true,
            crate::ops::scrub::Committer::Build { table, .. } => {
                damaged.tables.insert(format!("silver.{table}"));
            }
            crate::ops::scrub::Committer::Segment { source } => {
                damaged.tables.insert(source.clone());
            }
            // a copy of a pull's records: the table reads its bronze file, not this
            crate::ops::scrub::Committer::Kept { .. } => {}
        }
        out.push(v(
            "files",
            d.rel.clone(),
            format!("damaged ({}): {}; {}", d.owner(), d.what, d.fix),
        ));
    }
    if damaged.tables.iter().any(|d| d.starts_with("silver.")) {
        // the catalog cannot open a table whose snapshot is gone
        out.dedup();
        report.violations = out;
        return Ok(report);
    }
    let catalog = crate::engine::catalog::open(ws).await?;
    damaged.uncontracted = all_runs
        .iter()
        .map(|r| r.source.to_string())
        .filter(|s| !catalog.contracts.contracts.contains_key(s))
        .collect();
    report.uncontracted = damaged.uncontracted.iter().cloned().collect();
    let runs = catalog.runs().await?;
    for contract in catalog.contracts.contracts.values() {
        if damaged.has(&contract.source) {
            continue;
        }
        if let Some((path, why)) = crate::ingest::keystate::check(ws, contract, runs).await? {
            out.push(v("caches", path, why));
        }
        if let Some((path, why)) = check_view_state(&catalog, lake, contract, runs).await? {
            out.push(v("caches", path, why));
        }
    }

    // 2. counts
    check_run_balances(runs, &mut out);
    let written = bronze_rows_per_run(&catalog, &damaged).await?;
    let failed = failure_rows_per_id(&catalog, &damaged).await?;
    check_run_row_counts(runs, &damaged, &written, &failed, &mut out);
    check_build_counts(&catalog.builds, &damaged, &failed, &mut out);
    // 3. keys
    check_bronze_keys(&catalog, &damaged, &mut out).await?;
    // 4. silver
    check_silver_current(ws, &catalog, &tables, &damaged, &mut out).await?;
    // 7. delta: every Delta table holds what the logs committed
    if crate::table::delta::enabled() {
        let findings = crate::table::delta::check(lake, &catalog.contracts.contracts)
            .await
            .unwrap_or_else(|e| {
                vec![crate::table::delta::Finding {
                    table: "delta".into(),
                    what: format!("cannot be checked: {e}"),
                    lags: false,
                }]
            });
        for f in findings {
            if f.lags {
                report.delta_lags.push(format!("{}: {}", f.table, f.what));
            } else {
                out.push(v(
                    "delta",
                    f.table,
                    format!("{} (`ingot delta sync` or `ingot doctor --fix` repairs it)", f.what),
                ));
            }
        }
    }
    // 5. rules files
    check_rules_files(ws, &catalog.builds, &mut out);
    out.dedup();
    report.violations = out;
    Ok(report)
}

/// Does the view state of `contract`'s segment manifest, brought up to date as a reader does,
/// give the runs the log gives? The current runs with the slots they rank by (a segment's from its
/// rows' slot column), the runs `bronze.<source>` shows, and the runs' recorded key.
async fn check_view_state(
    catalog: &Catalog,
    lake: &Lake,
    contract: &crate::spec::contract::Contract,
    runs: &[RunRecord],
) -> Result<Option<(String, String)>> {
    use crate::table::segments::{self, RunKeys};
    let source = &contract.source;
    let manifest = segments::read(lake, source).await?;
    let Some(state) = &manifest.state else {
        return Ok(None);
    };
    let path = segments::manifest_path(source, manifest.number);
    let fix = format!(
        "remove {} (a cache: readers then read the runs' own files, and the next compaction writes it again)",
        segments::folder(source)
    );
    match lake.get(&layout::run_record(source, state.through)).await? {
        Some(b) if crate::hash::sha256_hex(&b) == state.through_sha256 => {}
        _ => {
            return Ok(Some((
                path,
                format!(
                    "its view state was taken after a record slot {} no longer holds; readers pass it over",
                    state.through
                ),
            )));
        }
    }
    let later: Vec<RunRecord> = runs
        .iter()
        .filter(|r| r.source == *source && r.seq > state.through)
        .cloned()
        .collect();
    let Some(inputs) = state.advance(&later) else {
        return Ok(None);
    };
    // (run, slot) of every row group of the segments, from their slot column
    let mut held: BTreeSet<(String, i64)> = BTreeSet::new();
    if !manifest.segments.is_empty() {
        let stored: Vec<_> = manifest
            .segments
            .iter()
            .map(|s| crate::table::evolve::StoredRun::segment(lake, source, s))
            .collect();
        let df =
            crate::table::evolve::read_segments_slotted(&catalog.ctx, contract, &stored.iter().collect::<Vec<_>>())?
                .select(vec![col(RUN_ID), col(segments::SLOT)])?
                .distinct()?;
        let mut stream = df.execute_stream().await?;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let ids = batch.column(0).as_string::<i32>();
            let slots = batch.column(1).as_primitive::<Int64Type>();
            for i in 0..batch.num_rows() {
                held.insert((
                    ids.value(i).to_string(),
                    if slots.is_null(i) { -1 } else { slots.value(i) },
                ));
            }
        }
    }
    let undone: BTreeSet<&str> = inputs.undone.iter().map(String::as_str).collect();
    let first = inputs.first_slot as i64;
    let shown: BTreeSet<(&str, i64)> = held
        .iter()
        .map(|(r, s)| (r.as_str(), *s))
        .filter(|(r, _)| !undone.contains(r))
        .chain(inputs.own.iter().map(|o| (o.run.as_str(), o.slot as i64)))
        .collect();
    let current: BTreeSet<(&str, i64)> = shown.iter().copied().filter(|(_, s)| *s >= first).collect();
    let truth_shown: BTreeSet<&str> = crate::engine::catalog::bronze_runs(runs, source)
        .iter()
        .map(|r| r.run_id.as_str())
        .collect();
    let current_runs = crate::engine::catalog::current_runs(runs, source);
    let truth: BTreeSet<(&str, i64)> = current_runs.iter().map(|r| (r.run_id.as_str(), r.seq as i64)).collect();
    let shown_runs: BTreeSet<&str> = shown.iter().map(|(r, _)| *r).collect();
    let differ = |what: &str, extra: Vec<String>, missing: Vec<String>| {
        let list = |v: &[String]| v.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
        format!(
            "its view state {what}: {} more ({}) and {} fewer ({}) than the run log; readers would show that: {fix}",
            extra.len(),
            list(&extra),
            missing.len(),
            list(&missing)
        )
    };
    if shown_runs != truth_shown {
        let extra = shown_runs.difference(&truth_shown).map(|r| r.to_string()).collect();
        let missing = truth_shown.difference(&shown_runs).map(|r| r.to_string()).collect();
        return Ok(Some((
            path,
            differ("gives the runs of bronze.<source>", extra, missing),
        )));
    }
    if current != truth {
        let show = |(r, s): &(&str, i64)| format!("{r} at slot {s}");
        let extra = current.difference(&truth).map(show).collect();
        let missing = truth.difference(&current).map(show).collect();
        return Ok(Some((path, differ("ranks the current runs", extra, missing))));
    }
    let keys = current_runs.iter().fold(RunKeys::None, |k, r| {
        k.with(r.natural_key_definition.as_deref(), r.natural_key_version)
    });
    // mixed keys are only a slower plan, and a key kept after every current run was undone
    // groups no row; the same key the runs do not share would be a wrong one
    if inputs.key != RunKeys::Mixed && keys != RunKeys::None && inputs.key != keys {
        return Ok(Some((
            path,
            format!(
                "its view state says the current runs recorded the key {:?}, the run log {keys:?}: {fix}",
                inputs.key
            ),
        )));
    }
    Ok(None)
}

/// Files that belong to no committed run or succeeded build (not a violation: gc's to remove).
fn orphans(present: &BTreeSet<String>, all_runs: &[RunRecord], all_builds: &[BuildRecord]) -> Vec<String> {
    let runs: BTreeMap<&str, _> = all_runs.iter().map(|r| (r.run_id.as_str(), r)).collect();
    let builds: BTreeMap<&str, _> = all_builds.iter().map(|b| (b.build_id.as_str(), b)).collect();
    let committed = |rel: &str| match owner_of(rel) {
        Some(Owner::Run(id)) => runs.get(id.as_str()).is_some_and(|r| r.keeps_files()),
        Some(Owner::Build { build_id, .. }) => builds
            .get(build_id.as_str())
            .is_some_and(|b| b.status == BuildStatus::Succeeded),
        None => true,
    };
    present.iter().filter(|rel| !committed(rel)).cloned().collect()
}

/// Every run that committed data has its bronze file, and its failure file when it rejected rows;
/// so does a held run (it could not be published without them). Held runs are notices of
/// [`DoctorReport::held`], never violations.
fn check_run_files(
    all_runs: &[RunRecord],
    present: &BTreeSet<String>,
    damaged: &mut Damaged,
    out: &mut Vec<Violation>,
) {
    for r in all_runs {
        if r.has_data() && !present.contains(&layout::bronze_data(&r.source, &r.run_id)) {
            damaged.tables.insert(r.source.to_string());
            out.push(v(
                "files",
                layout::bronze_data(&r.source, &r.run_id),
                format!(
                    "missing: run {} of {} committed {} written rows",
                    r.run_id,
                    r.source,
                    r.rows_written()
                ),
            ));
        }
        let held = r.status == RunStatus::Held;
        if held && r.rows_written() > 0 && !present.contains(&layout::bronze_data(&r.source, &r.run_id)) {
            out.push(v(
                "files",
                layout::bronze_data(&r.source, &r.run_id),
                format!(
                    "missing: held run {} of {} wrote {} rows; it cannot be published (`ingot discard {}`)",
                    r.run_id,
                    r.source,
                    r.rows_written(),
                    r.run_id
                ),
            ));
        }
        if held && r.rows_failed > 0 && !present.contains(&layout::failures(&r.run_id)) {
            out.push(v(
                "files",
                layout::failures(&r.run_id),
                format!(
                    "missing: held run {} of {} wrote {} failure rows; it cannot be published (`ingot discard {}`)",
                    r.run_id, r.source, r.rows_failed, r.run_id
                ),
            ));
        }
        if r.has_failures() && !present.contains(&layout::failures(&r.run_id)) {
            damaged.failures = true;
            out.push(v(
                "files",
                layout::failures(&r.run_id),
                format!(
                    "missing: run {} of {} committed {} failure rows",
                    r.run_id, r.source, r.rows_failed
                ),
            ));
        }
    }
}

/// Every file of each table's current build (its manifest and snapshot) is present.
async fn check_silver_snapshots(
    lake: &Lake,
    tables: &BTreeSet<&str>,
    all_builds: &[BuildRecord],
    present: &BTreeSet<String>,
    damaged: &mut Damaged,
    out: &mut Vec<Violation>,
) {
    for table in tables {
        let Some(b) = latest_build(all_builds, table) else {
            continue;
        };
        match crate::silver::build::build_files(lake, table, &b.build_id).await {
            Ok(files) => {
                for rel in files.into_iter().filter(|f| !present.contains(f)) {
                    damaged.tables.insert(format!("silver.{table}"));
                    out.push(v(
                        "files",
                        rel,
                        format!("missing: a file of build {}, current for silver.{table}", b.build_id),
                    ));
                }
            }
            Err(e) => {
                damaged.tables.insert(format!("silver.{table}"));
                out.push(v("files", layout::silver_manifest(table, &b.build_id), e.to_string()));
            }
        }
    }
}

/// Every succeeded build that rejected rows has its failure file.
fn check_build_failure_files(
    all_builds: &[BuildRecord],
    present: &BTreeSet<String>,
    damaged: &mut Damaged,
    out: &mut Vec<Violation>,
) {
    for b in all_builds
        .iter()
        .filter(|b| b.status == BuildStatus::Succeeded && b.rows_rejected > 0)
    {
        if !present.contains(&layout::silver_failures(&b.build_id)) {
            damaged.failures = true;
            out.push(v(
                "files",
                layout::silver_failures(&b.build_id),
                format!(
                    "missing: build {} of silver.{} committed {} rejections",
                    b.build_id, b.table, b.rows_rejected
                ),
            ));
        }
    }
}

/// Every run record reconciles: `rows_seen = inserted + updated + unchanged + failed`.
fn check_run_balances(runs: &[RunRecord], out: &mut Vec<Violation>) {
    for r in runs.iter().filter(|r| r.status != RunStatus::Failed) {
        let sum = r.rows_inserted + r.rows_updated + r.rows_unchanged + r.rows_failed;
        if r.rows_seen != sum {
            out.push(v(
                "counts",
                format!("run {}", r.run_id),
                format!(
                    "rows_seen {} != inserted {} + updated {} + unchanged {} + failed {} = {sum}",
                    r.rows_seen, r.rows_inserted, r.rows_updated, r.rows_unchanged, r.rows_failed
                ),
            ));
        }
    }
}

/// Rows of `bronze.<source>` per run, over every source with all its files.
async fn bronze_rows_per_run(catalog: &Catalog, damaged: &Damaged) -> Result<BTreeMap<String, i64>> {
    let mut written = BTreeMap::new();
    for source in catalog.contracts.contracts.keys().filter(|s| !damaged.has(s)) {
        let bronze = catalog
            .ctx
            .table(TableReference::partial("bronze", source.as_str()))
            .await?;
        written.extend(counts(count_by(bronze, &[RUN_ID])?).await?);
    }
    Ok(written)
}

/// Rows of the failure log per run or build id (none when a failure file is missing).
async fn failure_rows_per_id(catalog: &Catalog, damaged: &Damaged) -> Result<BTreeMap<String, i64>> {
    if damaged.failures {
        return Ok(BTreeMap::new());
    }
    let log = catalog
        .ctx
        .table(TableReference::partial("audit", "row_failure_log"))
        .await?;
    counts(count_by(log, &["run_id"])?).await
}

/// Every loaded run's bronze file has `inserted + updated + deleted` rows and its failure file
/// `rows_failed`.
fn check_run_row_counts(
    runs: &[RunRecord],
    damaged: &Damaged,
    written: &BTreeMap<String, i64>,
    failed: &BTreeMap<String, i64>,
    out: &mut Vec<Violation>,
) {
    for r in runs.iter().filter(|r| r.status.is_loaded()) {
        let want = r.rows_written();
        let have = written.get(r.run_id.as_str()).copied().unwrap_or(0);
        if !damaged.has(&r.source) && have != want {
            out.push(v(
                "counts",
                layout::bronze_data(&r.source, &r.run_id),
                format!(
                    "has {have} rows; run {} recorded inserted + updated + deleted = {want}",
                    r.run_id
                ),
            ));
        }
        let have = failed.get(r.run_id.as_str()).copied().unwrap_or(0);
        if !damaged.failures && have != r.rows_failed {
            out.push(v(
                "counts",
                layout::failures(&r.run_id),
                format!(
                    "has {have} failure rows; run {} recorded rows_failed = {}",
                    r.run_id, r.rows_failed
                ),
            ));
        }
    }
}

/// Every succeeded build reconciles (`rows_read = written + filtered + rejected`) and its failure
/// file has `rows_rejected` rows.
fn check_build_counts(
    builds: &[BuildRecord],
    damaged: &Damaged,
    failed: &BTreeMap<String, i64>,
    out: &mut Vec<Violation>,
) {
    for b in builds.iter().filter(|b| b.status == BuildStatus::Succeeded) {
        let sum = b.rows_written + b.rows_filtered + b.rows_rejected;
        if b.rows_read != sum {
            out.push(v(
                "counts",
                format!("build {}", b.build_id),
                format!(
                    "rows_read {} != written {} + filtered {} + rejected {} = {sum}",
                    b.rows_read, b.rows_written, b.rows_filtered, b.rows_rejected
                ),
            ));
        }
        let have = failed.get(&b.build_id).copied().unwrap_or(0);
        if !damaged.failures && have != b.rows_rejected {
            out.push(v(
                "counts",
                layout::silver_failures(&b.build_id),
                format!(
                    "has {have} failure rows; build {} recorded rows_rejected = {}",
                    b.build_id, b.rows_rejected
                ),
            ));
        }
    }
}

/// No run wrote two rows with one fingerprint, and `bronze.<source>_current` has one row per
/// fingerprint.
async fn check_bronze_keys(catalog: &Catalog, damaged: &Damaged, out: &mut Vec<Violation>) -> Result<()> {
    for source in catalog.contracts.contracts.keys().filter(|s| !damaged.has(s)) {
        let bronze = catalog
            .ctx
            .table(TableReference::partial("bronze", source.as_str()))
            .await?;
        let per_run =
            repeated(bronze, &[RUN_ID, FP])?.select(vec![concat(vec![col(RUN_ID), lit(" "), col(FP)]), col("n")])?;
        for (key, n) in counts(per_run).await?.iter().take(10) {
            let (run, fp) = key.split_once(' ').unwrap_or((key.as_str(), ""));
            out.push(v(
                "keys",
                format!("bronze.{source}, run {run}"),
                format!("fingerprint {fp} written {n} times by one run"),
            ));
        }
        let current = catalog.ctx.table(current_table(source)).await?;
        for (fp, n) in counts(repeated(current, &[FP])?).await?.iter().take(10) {
            out.push(v(
                "keys",
                format!("bronze.{source}_current"),
                format!("fingerprint {fp} has {n} current rows"),
            ));
        }
    }
    Ok(())
}

/// Every fingerprint of each table's current build is current in its source's bronze.
async fn check_silver_current(
    ws: &Workspace,
    catalog: &Catalog,
    tables: &BTreeSet<&str>,
    damaged: &Damaged,
    out: &mut Vec<Violation>,
) -> Result<()> {
    const CURRENT_FP: &str = "__ingot_current_fp";
    for table in tables {
        let Some(b) = latest_build(&catalog.builds, table) else {
            continue;
        };
        let Some(rules) = table_rules(ws, catalog, table, b.rules_version) else {
            continue;
        };
        let sources: Vec<String> = match &rules.sources {
            Some(src) => src.entries.iter().map(|e| e.source.clone()).collect(),
            None => vec![rules.source.clone()],
        };
        if sources.iter().any(|s| damaged.has(s)) {
            continue;
        }
        // a table with several sources: the keys of every source, each as the table keys it
        let mut current: Option<datafusion::dataframe::DataFrame> = None;
        let keyed = match &rules.sources {
            Some(_) => {
                let inputs =
                    crate::silver::sources::read_source_inputs(&catalog.ctx, &catalog.contracts, &rules).await?;
                let mut out = Vec::with_capacity(inputs.len());
                for input in &inputs {
                    out.push(input.keyed(input.current.clone())?);
                }
                out
            }
            None => vec![catalog.ctx.table(current_table(&rules.source)).await?],
        };
        for rows in keyed {
            let keys = rows.select(vec![col(FP).alias(CURRENT_FP)])?;
            current = Some(match current {
                None => keys,
                Some(df) => df.union(keys)?,
            });
        }
        let Some(current) = current else { continue };
        let source = sources.iter().map(String::as_str).collect::<Vec<_>>().join(", bronze.");
        let not_current = catalog
            .ctx
            .table(TableReference::partial("silver", *table))
            .await?
            .join_on(current, JoinType::LeftAnti, [col(FP).eq(col(CURRENT_FP))])?;
        let missing = counts(count_by(not_current, &[FP])?).await?;
        if !missing.is_empty() {
            let some: Vec<&str> = missing.keys().take(3).map(String::as_str).collect();
            out.push(v(
                "silver",
                format!("silver.{table}"),
                format!(
                    "{} fingerprints are not current in bronze.{source} (e.g. {}); rebuild with `ingot build {table}`",
                    missing.len(),
                    some.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// The SHA-256 recorded by every succeeded build equals its rules file's.
fn check_rules_files(ws: &Workspace, builds: &[BuildRecord], out: &mut Vec<Violation>) {
    for b in builds.iter().filter(|b| b.status == BuildStatus::Succeeded) {
        let path = ws.rules_dir.join(&b.table).join(format!("v{}.yaml", b.rules_version));
        match std::fs::read(&path) {
            Ok(bytes) => {
                let sha: String = sha2::Sha256::digest(&bytes)
                    .iter()
                    .map(|x| format!("{x:02x}"))
                    .collect();
                if sha != b.rules_sha256 {
                    out.push(v(
                        "rules",
                        path.display().to_string(),
                        format!(
                            "sha256 {sha} differs from {} recorded by build {}: a used rules version was edited; \
                             restore it and put the change in a new version",
                            b.rules_sha256, b.build_id
                        ),
                    ));
                }
            }
            Err(e) => out.push(v(
                "rules",
                path.display().to_string(),
                format!("cannot read the rules file build {} used: {e}", b.build_id),
            )),
        }
    }
}

/// The rules version `version` of `table` (its newest when that one is gone).
fn table_rules(
    ws: &Workspace,
    catalog: &Catalog,
    table: &str,
    version: i32,
) -> Option<std::sync::Arc<crate::spec::rules::RuleSet>> {
    let mut ignored = crate::spec::yaml::Problems::default();
    let rules = crate::spec::rules::RulesSet::load(&ws.rules_dir, &catalog.contracts, &mut ignored);
    rules
        .tables
        .get(table)
        .and_then(|v| v.get(&version).or_else(|| v.values().next_back()))
        .cloned()
}
