//! `ingot run`, the nightly job: ingest every new landing file, then build every silver table
//! whose inputs changed.
//!
//! A landing file is *new* unless a run of its source already has the same file name and file
//! hash, with a status other than `failed` (a file that failed for its content is retried only
//! after the contract version changes; one that failed for a passing cause, class `transient`,
//! is retried by the next job). Files are ingested per source in sorted order, one run each, so a
//! re-sent copy under another name is recorded as `skipped_duplicate_file` once. A table is built
//! (incrementally) when this job loaded data into its source or one of its `resolve` lookups, when
//! it has no succeeded build with its latest rules version yet, or when its latest build no longer
//! shows the committed state of its inputs, whatever changed them (a manual ingest, undo, replay or
//! rekey, a build that was killed or failed): the job heals. Running the job twice in a row
//! changes no data the second time. A source with a held run (docs/operations.md#held-runs) loads
//! no further files until the run is published or discarded: they wait, so that versions commit
//! in file order. The landing folder can be local or `s3://` ([`crate::ingest::landing`]). Every
//! API source is pulled once a job, before the landing files, several at once ([`PullPlan`]).

use std::collections::BTreeSet;
use std::path::Path;

use crate::engine::catalog::Catalog;
use crate::engine::session::Workspace;
use crate::error::{Error, Result};
use crate::ingest::landing::{Input, Skipped, landing_files};
use crate::ingest::{IngestOptions, ingest_input};
use crate::silver::build::{BuildOptions, Built, build};
use crate::spec::contract::ContractSet;
use crate::spec::rules::RulesSet;
use crate::spec::yaml::Problems;
use crate::table::audit::{BuildStatus, RunRecord, RunStatus, read_build_log, read_run_log};

/// What one nightly job did.
#[derive(Debug, Default)]
pub struct NightlyReport {
    pub runs: Vec<RunRecord>,
    pub builds: Vec<Built>,
    /// Landing files found already loaded (not ingested again).
    pub already_loaded: usize,
    /// Why each table was built, in build order.
    pub reasons: Vec<(String, String)>,
    /// Landing files ingested again after a run of theirs failed for a passing cause, and why.
    pub retried: Vec<(String, String)>,
    /// Every run held for review at the end of the job (earlier ones and this job's), oldest first.
    pub held: Vec<RunRecord>,
    /// New landing files not ingested because their source has a held run: (file, held run id).
    pub waiting: Vec<(String, String)>,
    /// Entries of the landing folders passed over: symbolic links leading out of the landing
    /// folder (or nowhere), with where they point.
    pub skipped: Vec<Skipped>,
}

impl NightlyReport {
    /// Did any run or build fail?
    pub fn failed(&self) -> bool {
        self.runs.iter().any(|r| r.status == RunStatus::Failed)
            || self.builds.iter().any(|b| b.record.status == BuildStatus::Failed)
    }

    /// Is any run held for review (and waiting for `ingot publish` or `ingot discard`)?
    pub fn held(&self) -> bool {
        !self.held.is_empty()
    }
}

fn file_name(path: &str) -> &str {
    Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or(path)
}

/// Has a run of this source already taken this file (same name and hash)?
async fn already_loaded(runs: &[RunRecord], source: &str, contract_version: i32, input: &Input) -> Result<bool> {
    let name = input.file_name();
    let bytes = input.size()? as i64;
    let candidates: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| {
            r.source == source
                && file_name(&r.file_path) == name
                && r.file_bytes == bytes
                && (r.status != RunStatus::Failed
                    || (r.contract_version == contract_version && !r.failed_transiently()))
        })
        .collect();
    if candidates.is_empty() {
        return Ok(false);
    }
    let hash = input.digest().await?;
    Ok(candidates.iter().any(|r| r.file_hash.as_deref() == Some(hash.as_str())))
}

/// How `ingot run` pulls its API sources.
#[derive(Debug, Clone, Copy)]
pub struct PullPlan {
    /// At most this many sources pulled at once (0: none, `ingot run --no-pull`). The memory
    /// limit is shared: each pull gets `--memory-limit / jobs`.
    pub jobs: usize,
}

impl Default for PullPlan {
    fn default() -> PullPlan {
        PullPlan {
            jobs: DEFAULT_PULL_JOBS,
        }
    }
}

/// API sources pulled at once by default (`ingot run --pull-jobs`).
pub const DEFAULT_PULL_JOBS: usize = 4;

/// Run the nightly job. `opts` are used for every ingest and pull; `pull`: how the API sources
/// are pulled, all of them before the first landing file is read.
pub async fn run(
    ws: &Workspace,
    opts: &IngestOptions,
    pull: PullPlan,
    mut on_step: impl FnMut(&str),
) -> Result<NightlyReport> {
    let mut problems = Problems::default();
    let contracts = ContractSet::load(&ws.contracts_dir, &mut problems);
    let rules = RulesSet::load(&ws.rules_dir, &contracts, &mut problems);
    if !problems.is_empty() {
        return Err(Error::Config(problems.items));
    }
    let mut report = NightlyReport::default();
    let runs = read_run_log(&ws.lake).await?;
    let mut loaded_sources: BTreeSet<String> = BTreeSet::new();
    report.held = runs.iter().filter(|r| r.status == RunStatus::Held).cloned().collect();
    if pull.jobs > 0 {
        pull_all(
            ws,
            opts,
            pull.jobs,
            &contracts,
            &runs,
            &mut report,
            &mut loaded_sources,
            &mut on_step,
        )
        .await?;
    }
    for (source, contract) in &contracts.contracts {
        let found = landing_files(&ws.landing_dir, source).await?;
        report.skipped.extend(found.skipped);
        // an API source is pulled, not read from a landing folder: its files there are passed over
        if contract.format == crate::spec::contract::Format::Api {
            report.skipped.extend(found.inputs.iter().map(|input| Skipped {
                path: input.display(),
                reason: format!(
                    "source \"{source}\" is format: api: it is pulled (`ingot pull {source}`), not read from \
                     the landing folder"
                ),
            }));
            continue;
        }
        for input in found.inputs {
            if already_loaded(&runs, source, contract.version as i32, &input).await? {
                report.already_loaded += 1;
                continue;
            }
            if let Some(held) = report.held.iter().find(|r| r.source == *source) {
                report.waiting.push((input.display(), held.run_id.to_string()));
                continue;
            }
            if let Some(prev) = runs
                .iter()
                .rev()
                .find(|r| r.source == *source && r.failed_transiently() && file_name(&r.file_path) == input.file_name())
            {
                report.retried.push((
                    input.display(),
                    format!(
                        "run {} failed for a passing cause: {}",
                        prev.run_id,
                        prev.error.as_deref().unwrap_or("")
                    ),
                ));
            }
            on_step(&format!("ingest {source} {}", input.display()));
            let record = ingest_input(ws, contract.clone(), &input, opts).await?;
            if record.has_data() {
                loaded_sources.insert(source.clone());
            }
            if record.status == RunStatus::Held {
                report.held.push(record.clone());
            }
            report.runs.push(record);
        }
    }
    let builds = read_build_log(&ws.lake).await?;
    // one catalog for every table's staleness check (silver tables never read each other)
    let mut catalog = None;
    for table in rules.table_names() {
        let Some(latest) = rules.latest(table) else { continue };
        let contract = contracts.contracts.get(&latest.source);
        let inputs_changed = loaded_sources.contains(&latest.source)
            || contract.is_some_and(|c| c.resolve.iter().any(|r| loaded_sources.contains(&r.lookup)));
        let built_with_latest = builds
            .iter()
            .any(|b| b.table == table && b.status == BuildStatus::Succeeded && b.rules_version == latest.version);
        let why = if inputs_changed {
            Some("this job loaded data into its inputs".to_string())
        } else if !built_with_latest {
            Some(format!("no succeeded build with rules v{} yet", latest.version))
        } else {
            if catalog.is_none() {
                catalog = Some(crate::engine::catalog::open(ws).await?);
            }
            match &catalog {
                Some(c) => stale(ws, c, table).await?,
                None => None,
            }
        };
        let Some(why) = why else { continue };
        on_step(&format!("build silver.{table}"));
        report.reasons.push((table.to_string(), why));
        report.builds.push(build(ws, table, &BuildOptions::default()).await?);
    }
    Ok(report)
}

/// Pull every API source once, at most `jobs` at a time (each under its own source lock, with
/// its share of the memory limit), and add the runs to `report` in source order. A source with a
/// held run waits. Every pull started is finished before an infrastructure error of one of them
/// is returned, so none is left holding its lock.
#[allow(clippy::too_many_arguments)]
async fn pull_all(
    ws: &Workspace,
    opts: &IngestOptions,
    jobs: usize,
    contracts: &ContractSet,
    runs: &[RunRecord],
    report: &mut NightlyReport,
    loaded_sources: &mut BTreeSet<String>,
    on_step: &mut impl FnMut(&str),
) -> Result<()> {
    use futures::StreamExt as _;
    let mut todo = Vec::new();
    for (source, contract) in &contracts.contracts {
        if contract.format != crate::spec::contract::Format::Api {
            continue;
        }
        if let Some(held) = report.held.iter().find(|r| r.source == *source) {
            report.waiting.push((format!("pull {source}"), held.run_id.to_string()));
            continue;
        }
        if let Some(prev) = runs
            .iter()
            .rev()
            .find(|r| r.source == *source && r.pull.is_some() && r.replay_of.is_none())
            .filter(|r| r.failed_transiently())
        {
            report.retried.push((
                format!("pull {source}"),
                format!(
                    "run {} failed for a passing cause: {}",
                    prev.run_id,
                    prev.error.as_deref().unwrap_or("")
                ),
            ));
        }
        todo.push(contract.clone());
    }
    if todo.is_empty() {
        return Ok(());
    }
    let jobs = jobs.clamp(1, todo.len());
    let names: Vec<&str> = todo.iter().map(|c| c.source.as_str()).collect();
    on_step(&format!("pull {}", names.join(", ")));
    let shared = Workspace {
        memory_limit: (ws.memory_limit / jobs).max(1),
        ..ws.clone()
    };
    // one spinner line for them all: bars of pulls at once would write over each other
    let opts = IngestOptions {
        progress: opts.progress && jobs == 1,
        ..opts.clone()
    };
    let done: Vec<Result<RunRecord>> = futures::stream::iter(todo)
        .map(|contract| crate::ingest::pull::pull(&shared, contract, &opts))
        .buffered(jobs)
        .collect()
        .await;
    let mut first_error = None;
    for record in done {
        match record {
            Ok(record) => {
                if record.has_data() {
                    loaded_sources.insert(record.source.to_string());
                }
                if record.status == RunStatus::Held {
                    report.held.push(record.clone());
                }
                report.runs.push(record);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Why `table`'s latest succeeded build no longer shows the committed state of its inputs (an
/// ingest, undo, replay or rekey outside this job, a build that was killed or failed), if it does
/// not: what a build now would do, from its dry run.
async fn stale(ws: &Workspace, catalog: &Catalog, table: &str) -> Result<Option<String>> {
    let opts = BuildOptions::default();
    let plan = match crate::silver::build::load_rules(ws, catalog, table, None) {
        Ok(rules) => crate::silver::build::plan_summary(ws, catalog, &rules, &opts).await,
        Err(e) => Err(e),
    };
    let plan = match plan {
        Ok(plan) => plan,
        // a table whose build would be refused (edited rules, a broken lookup contract) does not
        // stop the job over the others: warned, not built
        Err(e @ (Error::Invalid(_) | Error::Config(_))) => {
            crate::tell!("warning: silver.{table} not checked for changes: {e}");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if plan.kind == "unchanged" || (plan.process == 0 && plan.removed == 0 && plan.previous_build.is_some()) {
        return Ok(None);
    }
    let mut why = format!(
        "its latest build does not show the committed state of its inputs: {} record{} to process, {} to remove",
        plan.process,
        if plan.process == 1 { "" } else { "s" },
        plan.removed
    );
    if let Some(r) = &plan.reason {
        why.push_str(&format!(" ({r})"));
    }
    Ok(Some(why))
}
