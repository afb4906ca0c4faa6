//! `ingot doctor`: check a lake's invariants and report every violation with its location.
//!
//! Checks, in order:
//!
//! 1. **files**: every committed run that loaded data has its bronze file (and its failure file
//!    when it rejected rows); every succeeded build still current or in retention has its
//!    snapshot; files that belong to no committed run or build are listed as orphans (not a
//!    violation: `ingot gc` removes them after its grace period).
//! 2. **counts**: every run record reconciles (`rows_seen = inserted + updated + unchanged +
//!    failed`), its bronze file has `inserted + updated + deleted` rows (new versions and
//!    tombstones) and its failure file `rows_failed` rows; every build record reconciles
//!    (`rows_read = written + filtered + rejected`) and its
//!    failure file has `rows_rejected` rows.
//! 3. **keys**: no run wrote two rows with one fingerprint, and `bronze.<source>_current` has one
//!    row per fingerprint.
//! 4. **silver**: every fingerprint of `silver.<table>` is in `bronze.<source>_current` (a table
//!    not rebuilt since an undo fails this until its next build).
//! 5. **rules**: the SHA-256 recorded by every succeeded build equals its rules file's.
//!
//! Exit code 1 when anything is violated, 0 otherwise.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Int64Type;
use futures::StreamExt;
use sha2::Digest;

use crate::engine::catalog::{Catalog, latest_build};
use crate::engine::session::Workspace;
use crate::error::Result;
use crate::ops::gc::{Owner, owner_of};
use crate::table::audit::{BuildStatus, RunStatus};
use crate::table::lake::layout;

/// One violated invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `files`, `counts`, `keys`, `silver` or `rules`.
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
}

/// Row counts of a query's two columns (`key`, `n`) as a map.
async fn counts(catalog: &Catalog, sql: &str) -> Result<BTreeMap<String, i64>> {
    let df = catalog.ctx.sql(sql).await?;
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

fn v(check: &'static str, location: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation {
        check,
        location: location.into(),
        message: message.into(),
    }
}

/// Run every check; see the module documentation.
pub async fn doctor(ws: &Workspace) -> Result<DoctorReport> {
    let lake = &ws.lake;
    let all_runs = crate::table::audit::read_run_log(lake).await?;
    let all_builds = crate::table::audit::read_build_log(lake).await?;
    let mut report = DoctorReport {
        runs_checked: all_runs.len(),
        builds_checked: all_builds.len(),
        ..Default::default()
    };
    let mut out = Vec::new();

    // 1. files
    let mut present: BTreeSet<String> = BTreeSet::new();
    for prefix in ["bronze", "audit/row_failure_log", "silver"] {
        for meta in lake.list(prefix).await? {
            if let Some(rel) = lake.relative(&meta.location) {
                present.insert(rel);
            }
        }
    }
    let runs: BTreeMap<&str, _> = all_runs.iter().map(|r| (r.run_id.as_str(), r)).collect();
    let builds: BTreeMap<&str, _> = all_builds.iter().map(|b| (b.build_id.as_str(), b)).collect();
    for rel in &present {
        let committed = match owner_of(rel) {
            Some(Owner::Run(id)) => runs.get(id.as_str()).is_some_and(|r| r.status.is_loaded()),
            Some(Owner::Build { build_id, .. }) => builds
                .get(build_id.as_str())
                .is_some_and(|b| b.status == BuildStatus::Succeeded),
            None => true,
        };
        if !committed {
            report.orphans.push(rel.clone());
        }
    }
    // Sources and tables with a lost file cannot be queried: their SQL checks are skipped.
    let mut damaged: BTreeSet<String> = BTreeSet::new();
    let mut failures_damaged = false;
    for r in &all_runs {
        if r.has_data() && !present.contains(&layout::bronze_data(&r.source, &r.run_id)) {
            damaged.insert(r.source.clone());
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
        if r.has_failures() && !present.contains(&layout::failures(&r.run_id)) {
            failures_damaged = true;
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
    let tables: BTreeSet<&str> = all_builds.iter().map(|b| b.table.as_str()).collect();
    for table in &tables {
        if let Some(b) = latest_build(&all_builds, table) {
            match crate::silver::build::build_files(lake, table, &b.build_id).await {
                Ok(files) => {
                    for rel in files.into_iter().filter(|f| !present.contains(f)) {
                        damaged.insert(format!("silver.{table}"));
                        out.push(v(
                            "files",
                            rel,
                            format!("missing: a file of build {}, current for silver.{table}", b.build_id),
                        ));
                    }
                }
                Err(e) => {
                    damaged.insert(format!("silver.{table}"));
                    out.push(v("files", layout::silver_manifest(table, &b.build_id), e.to_string()));
                }
            }
        }
    }

    for b in all_builds
        .iter()
        .filter(|b| b.status == BuildStatus::Succeeded && b.rows_rejected > 0)
    {
        if !present.contains(&layout::silver_failures(&b.build_id)) {
            failures_damaged = true;
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
    if damaged.iter().any(|d| d.starts_with("silver.")) {
        // the catalog cannot open a table whose snapshot is gone
        out.dedup();
        report.violations = out;
        return Ok(report);
    }
    let catalog = crate::engine::catalog::open(ws).await?;

    // 2. counts
    for r in catalog.runs.iter().filter(|r| r.status != RunStatus::Failed) {
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
    let mut written: BTreeMap<String, i64> = BTreeMap::new();
    for source in catalog.contracts.contracts.keys().filter(|s| !damaged.contains(*s)) {
        written.extend(
            counts(
                &catalog,
                &format!("SELECT ingestion_run_id, count(*) FROM bronze.{source} GROUP BY ingestion_run_id"),
            )
            .await?,
        );
    }
    let failed = if failures_damaged {
        BTreeMap::new()
    } else {
        counts(
            &catalog,
            "SELECT run_id, count(*) FROM audit.row_failure_log GROUP BY run_id",
        )
        .await?
    };
    for r in catalog.runs.iter().filter(|r| r.status.is_loaded()) {
        let want = r.rows_written();
        let have = written.get(&r.run_id).copied().unwrap_or(0);
        if !damaged.contains(&r.source) && have != want {
            out.push(v(
                "counts",
                layout::bronze_data(&r.source, &r.run_id),
                format!(
                    "has {have} rows; run {} recorded inserted + updated + deleted = {want}",
                    r.run_id
                ),
            ));
        }
        let have = failed.get(&r.run_id).copied().unwrap_or(0);
        if !failures_damaged && have != r.rows_failed {
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
    for b in catalog.builds.iter().filter(|b| b.status == BuildStatus::Succeeded) {
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
        if !failures_damaged && have != b.rows_rejected {
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

    // 3. keys
    for source in catalog.contracts.contracts.keys().filter(|s| !damaged.contains(*s)) {
        let dup = counts(
            &catalog,
            &format!(
                "SELECT concat(ingestion_run_id, ' ', natural_key_fingerprint), count(*) FROM bronze.{source} \
                 GROUP BY ingestion_run_id, natural_key_fingerprint HAVING count(*) > 1"
            ),
        )
        .await?;
        for (key, n) in dup.iter().take(10) {
            let (run, fp) = key.split_once(' ').unwrap_or((key.as_str(), ""));
            out.push(v(
                "keys",
                format!("bronze.{source}, run {run}"),
                format!("fingerprint {fp} written {n} times by one run"),
            ));
        }
        let dup = counts(
            &catalog,
            &format!(
                "SELECT natural_key_fingerprint, count(*) FROM bronze.{source}_current \
                 GROUP BY natural_key_fingerprint HAVING count(*) > 1"
            ),
        )
        .await?;
        for (fp, n) in dup.iter().take(10) {
            out.push(v(
                "keys",
                format!("bronze.{source}_current"),
                format!("fingerprint {fp} has {n} current rows"),
            ));
        }
    }

    // 4. silver: every fingerprint is current in bronze
    for table in &tables {
        let Some(b) = latest_build(&catalog.builds, table) else {
            continue;
        };
        let Some(source) = silver_source(ws, &catalog, table, b.rules_version) else {
            continue;
        };
        if damaged.contains(&source) {
            continue;
        }
        let missing = counts(
            &catalog,
            &format!(
                "SELECT s.natural_key_fingerprint, count(*) FROM silver.{table} s \
                 LEFT ANTI JOIN bronze.{source}_current c ON s.natural_key_fingerprint = c.natural_key_fingerprint \
                 GROUP BY s.natural_key_fingerprint"
            ),
        )
        .await?;
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

    // 5. rules files
    for b in catalog.builds.iter().filter(|b| b.status == BuildStatus::Succeeded) {
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
    out.dedup();
    report.violations = out;
    Ok(report)
}

/// The bronze source of `table`'s rules version `version` (from its rules file).
fn silver_source(ws: &Workspace, catalog: &Catalog, table: &str, version: i32) -> Option<String> {
    let mut ignored = crate::spec::yaml::Problems::default();
    let rules = crate::spec::rules::RulesSet::load(&ws.rules_dir, &catalog.contracts, &mut ignored);
    rules
        .tables
        .get(table)
        .and_then(|v| v.get(&version).or_else(|| v.values().next_back()))
        .map(|r| r.source.clone())
}
