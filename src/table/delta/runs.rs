//! The Delta tables a run's commit changes: `bronze/<source>` (the data files of the source's
//! loaded runs), `audit/ingestion_run_log` (every source's latest record per run, partitioned
//! by `commit_seq`, the record's slot) and the runs' part of `audit/row_failure_log`.
//!
//! Every record a source commits is one commit in each of the three (an empty one where the
//! table does not change), with `txn` (`ingot:run:<source>`, slot), so a table's `txn` says
//! exactly which slots it has. When it is behind, the table is compared whole with the source's
//! log and repaired in one commit ([`sync_source`]).

use std::collections::{BTreeSet, HashMap};

use deltalake_core::kernel::{Add, Remove};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use object_store::{ObjectMeta, ObjectStoreExt};
use serde_json::Value;

use super::conform::{Conform, copy_path};
use super::log::{self, Change, Outcome, Shape, Table};
use super::schema::schema_string;
use super::{COMMIT_SEQ, Finding, roots, run_app};
use crate::error::{Error, Result};
use crate::spec::contract::Contract;
use crate::table::audit::{RunRecord, failure_log_schema, read_source_runs, run_log_schema};
use crate::table::lake::{Lake, layout};

/// The three tables a run's commit changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Bronze,
    RunLog,
    Failures,
}

pub const KINDS: [Kind; 3] = [Kind::Bronze, Kind::RunLog, Kind::Failures];

impl Kind {
    pub fn root(&self, source: &str) -> String {
        match self {
            Kind::Bronze => roots::bronze(source),
            Kind::RunLog => roots::RUN_LOG.to_string(),
            Kind::Failures => roots::FAILURE_LOG.to_string(),
        }
    }
}

/// A file of a Delta table as ingot's logs want it: its path in the table, rows, partition.
#[derive(Debug, Clone)]
pub(crate) struct Want {
    pub path: String,
    pub rows: Option<i64>,
    pub commit_seq: Option<u64>,
}

/// The bronze data file of a run, in `bronze/<source>`.
fn bronze_file(run_id: &str) -> String {
    format!("run_id={run_id}/part-00000.parquet")
}

/// A record's file, in `audit/ingestion_run_log`.
fn record_file(source: &str, seq: u64) -> String {
    format!("{source}/{seq:010}.parquet")
}

/// A run's failure file, in `audit/row_failure_log`.
fn failure_file(run_id: &str) -> String {
    format!("run_id={run_id}/part-00000.parquet")
}

/// What `kind` holds of a run whose latest record is `r` (a bronze table published under
/// `conform`: the run's conformed copy where it has one).
pub(crate) fn wants(kind: Kind, r: &RunRecord, conform: Option<&Conform>) -> Option<Want> {
    match kind {
        Kind::Bronze => r.has_data().then(|| Want {
            path: match conform {
                Some(c) => c.path(r, bronze_file(&r.run_id)),
                None => bronze_file(&r.run_id),
            },
            rows: Some(r.rows_written()),
            commit_seq: None,
        }),
        Kind::RunLog => Some(Want {
            path: record_file(&r.source, r.seq),
            rows: Some(1),
            commit_seq: Some(r.seq),
        }),
        Kind::Failures => r.has_failures().then(|| Want {
            path: failure_file(&r.run_id),
            rows: Some(r.rows_failed),
            commit_seq: None,
        }),
    }
}

/// The `add` of `want` in the table at `root`, with the file's size and time from `meta`.
pub(crate) fn add_of(want: &Want, meta: &ObjectMeta) -> Add {
    let mut partition_values = HashMap::new();
    if let Some(seq) = want.commit_seq {
        partition_values.insert(COMMIT_SEQ.to_string(), Some(seq.to_string()));
    }
    Add {
        path: want.path.clone(),
        partition_values,
        size: meta.size as i64,
        modification_time: meta.last_modified.timestamp_millis(),
        data_change: true,
        stats: want.rows.map(|n| serde_json::json!({ "numRecords": n }).to_string()),
        ..Default::default()
    }
}

fn remove_of(want: &Want) -> Remove {
    let mut partition_values = HashMap::new();
    if let Some(seq) = want.commit_seq {
        partition_values.insert(COMMIT_SEQ.to_string(), Some(seq.to_string()));
    }
    Remove {
        path: want.path.clone(),
        data_change: true,
        deletion_timestamp: Some(chrono::Utc::now().timestamp_millis()),
        extended_file_metadata: Some(false),
        partition_values: Some(partition_values),
        ..Default::default()
    }
}

/// The shape of `kind`'s table: bronze's the contract's bronze schema when published under it
/// (`conform`), else from the contract fields its latest run was written under (`records`, in
/// commit order); the logs' from their schemas.
pub(crate) async fn shape(
    lake: &Lake,
    kind: Kind,
    source: &str,
    records: &[&RunRecord],
    conform: Option<&Conform<'_>>,
) -> Result<Option<Shape>> {
    let (schema, partition_columns) = match (kind, conform) {
        (Kind::Bronze, Some(c)) => (schema_string(&c.contract.bronze_schema(), &[])?, vec![]),
        (Kind::Bronze, None) => match bronze_schema(lake, source, records).await? {
            Some(s) => (s, vec![]),
            None => return Ok(None),
        },
        (Kind::RunLog, _) => (
            schema_string(&run_log_schema(), &[(COMMIT_SEQ, "long")])?,
            vec![COMMIT_SEQ.to_string()],
        ),
        (Kind::Failures, _) => (schema_string(&failure_log_schema(), &[])?, vec![]),
    };
    Ok(Some(Shape {
        schema,
        partition_columns,
        deletion_vectors: false,
        conformed: conform.map(|c| c.key.clone()),
    }))
}

/// `bronze.<source>`'s schema as of the latest of `records` that recorded its contract fields
/// (or, for a run from before they were recorded, its file's); `None` when no run says.
async fn bronze_schema(lake: &Lake, source: &str, records: &[&RunRecord]) -> Result<Option<String>> {
    for r in records.iter().rev() {
        if let Some(fields) = r
            .contract_fields
            .as_deref()
            .and_then(crate::table::evolve::parse_fields)
        {
            let mut arrow: Vec<datafusion::arrow::datatypes::Field> = fields
                .iter()
                .map(|f| datafusion::arrow::datatypes::Field::new(&f.name, f.ty.arrow_type(), true))
                .collect();
            arrow.extend(crate::spec::columns::meta_fields());
            let schema = datafusion::arrow::datatypes::Schema::new(arrow);
            return schema_string(&schema, &[]).map(Some);
        }
        if r.has_data() {
            let schema = crate::table::parquet::footer_schema(lake, &layout::bronze_data(source, &r.run_id)).await?;
            return schema_string(&schema, &[]).map(Some);
        }
    }
    Ok(None)
}

/// After `record` was committed (superseding `previous`, the latest record of its run before it):
/// one commit in each of the run's Delta tables (best effort, see [`super::warn`]). `contract`:
/// the source's, when the command has a readable one (bronze is published conformed to it,
/// [`super::conform`]).
pub async fn after_commit(lake: &Lake, record: &RunRecord, previous: Option<&RunRecord>, contract: Option<&Contract>) {
    if !super::enabled() {
        return;
    }
    // four tables, four logs: committed side by side; a recomputation of the current versions
    // waits for bronze, whose files (conformed copies) it names
    let current = async {
        let (bronze, appended) = futures::future::join(
            publish(lake, Kind::Bronze, record, previous, contract),
            super::current::append(lake, record, previous, contract),
        )
        .await;
        let current = match (&bronze, appended) {
            (_, Ok(true)) => Ok(()),
            (Ok(()), Ok(false)) => super::current::sync(lake, &record.source, false, contract)
                .await
                .map(|_| ()),
            // bronze lags: so does the current table, until the next command
            (Err(_), Ok(false)) => Ok(()),
            (_, Err(e)) => Err(e),
        };
        (bronze, current)
    };
    let (done, (bronze, current)) = futures::future::join(
        futures::future::join_all(
            [Kind::RunLog, Kind::Failures].map(|kind| publish(lake, kind, record, previous, contract)),
        ),
        current,
    )
    .await;
    let mut results: Vec<(String, Result<()>)> = vec![
        (Kind::Bronze.root(&record.source), bronze),
        (super::roots::current(&record.source), current),
    ];
    for (kind, result) in [Kind::RunLog, Kind::Failures].iter().zip(done) {
        results.push((kind.root(&record.source), result));
    }
    for (root, result) in results {
        if let Err(e) = result {
            super::warn(&format!("{root} after run {} of {}", record.run_id, record.source), &e);
        }
    }
}

async fn publish(
    lake: &Lake,
    kind: Kind,
    record: &RunRecord,
    previous: Option<&RunRecord>,
    contract: Option<&Contract>,
) -> Result<()> {
    let root = kind.root(&record.source);
    let t = Table::new(lake, &root);
    let conform = conform_of(kind, contract, &[record]);
    let Some(shape) = shape(lake, kind, &record.source, &[record], conform.as_ref()).await? else {
        // a bronze table with no schema yet (no run has data): nothing to publish until one has
        return Ok(());
    };
    let now = wants(kind, record, conform.as_ref());
    let before = previous.and_then(|p| wants(kind, p, conform.as_ref()));
    let mut adds = Vec::new();
    let mut removes = Vec::new();
    let same = matches!((&now, &before), (Some(a), Some(b)) if a.path == b.path);
    if !same {
        if let Some(w) = &now {
            if let Some(c) = &conform
                && c.copies(record)
                && !lake.exists(&format!("{root}/{}", w.path)).await?
            {
                c.write(lake, record, format!("{root}/{}", w.path)).await?;
            }
            let meta = head(lake, &root, &w.path).await?;
            adds.push(add_of(w, &meta));
        }
        if let Some(w) = &before {
            removes.push(remove_of(w));
        }
    }
    let change = Change {
        app: run_app(&record.source),
        slot: record.seq as i64,
        operation: operation(&adds, &removes),
        adds,
        removes,
        info: info(record),
    };
    if log::append(t, &shape, change).await? == Outcome::Lagging {
        sync_source(lake, kind, &record.source, false, contract).await?;
    }
    Ok(())
}

/// How `kind`'s table publishes `runs` under `contract`: conformed to it for bronze, when it
/// can read them all ([`Conform::new`]).
pub(crate) fn conform_of<'a>(kind: Kind, contract: Option<&'a Contract>, runs: &[&RunRecord]) -> Option<Conform<'a>> {
    match kind {
        Kind::Bronze => contract.and_then(|c| Conform::new(c, runs)),
        Kind::RunLog | Kind::Failures => None,
    }
}

/// Write the conformed copies of `runs` that `files` (the table's listing) lacks, four at a time,
/// and add them to `files`.
async fn write_copies(
    lake: &Lake,
    root: &str,
    conform: &Conform<'_>,
    runs: &[RunRecord],
    files: &mut HashMap<String, ObjectMeta>,
) -> Result<()> {
    use futures::StreamExt;
    let missing: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| r.has_data() && conform.copies(r) && !files.contains_key(&copy_path(&conform.key, &r.run_id)))
        .collect();
    let mut missing = missing.into_iter();
    let mut writing = futures::stream::FuturesUnordered::new();
    loop {
        while writing.len() < 4
            && let Some(r) = missing.next()
        {
            writing.push(write_copy(lake, root, conform, r));
        }
        let Some(done) = writing.next().await else {
            return Ok(());
        };
        let (rel, meta) = done?;
        files.insert(rel, meta);
    }
}

/// Write run `r`'s conformed copy into the table at `root`; its path in the table and object.
async fn write_copy(lake: &Lake, root: &str, conform: &Conform<'_>, r: &RunRecord) -> Result<(String, ObjectMeta)> {
    let rel = copy_path(&conform.key, &r.run_id);
    conform.write(lake, r, format!("{root}/{rel}")).await?;
    let meta = head(lake, root, &rel).await?;
    Ok((rel, meta))
}

/// The Delta operation a commit of these adds and removes is.
pub(crate) fn operation(adds: &[Add], removes: &[Remove]) -> DeltaOperation {
    if removes.is_empty() || !adds.is_empty() {
        DeltaOperation::Write {
            mode: SaveMode::Append,
            partition_by: None,
            predicate: None,
        }
    } else {
        DeltaOperation::Delete { predicate: None }
    }
}

fn info(record: &RunRecord) -> HashMap<String, Value> {
    HashMap::from([(
        "ingot".to_string(),
        serde_json::json!({
            "log": "ingestion_run_log",
            "source": record.source.as_str(),
            "slot": record.seq,
            "run_id": record.run_id.as_str(),
            "status": record.status.as_str(),
        }),
    )])
}

/// The object at `rel` (in the table at `root`), which must exist: the table names it.
pub(crate) async fn head(lake: &Lake, root: &str, rel: &str) -> Result<ObjectMeta> {
    let full = format!("{root}/{rel}");
    match lake.store.head(&lake.path(&full)).await {
        Ok(m) => Ok(m),
        Err(e) => Err(Error::RunFailed(format!(
            "{}: cannot publish a file that is not there: {e}",
            lake.url(&full)
        ))),
    }
}

/// Every object under `root`, by its path in the table.
pub(crate) async fn listing(lake: &Lake, root: &str) -> Result<HashMap<String, ObjectMeta>> {
    let prefix = format!("{root}/");
    let mut out = HashMap::new();
    for meta in lake.list(root).await? {
        if let Some(rel) = lake.relative(&meta.location)
            && let Some(inside) = rel.strip_prefix(&prefix)
            && !inside.starts_with("_delta_log/")
        {
            out.insert(inside.to_string(), meta);
        }
    }
    Ok(out)
}

/// What `kind` must hold of `source`, from its log.
fn desired(kind: Kind, runs: &[RunRecord], conform: Option<&Conform>) -> Vec<Want> {
    runs.iter().filter_map(|r| wants(kind, r, conform)).collect()
}

/// Which files of `kind`'s table are the source's: all of bronze; its folder of the run log;
/// its runs' failure files.
fn owner(kind: Kind, source: &str, runs: &[RunRecord]) -> Box<dyn Fn(&str) -> bool + Send + Sync> {
    match kind {
        Kind::Bronze => Box::new(|_| true),
        Kind::RunLog => {
            let prefix = format!("{source}/");
            Box::new(move |p: &str| p.starts_with(&prefix))
        }
        Kind::Failures => {
            let ids: BTreeSet<String> = runs.iter().map(|r| failure_file(&r.run_id)).collect();
            Box::new(move |p: &str| ids.contains(p))
        }
    }
}

/// Make `kind`'s table hold exactly what the source's log says (bronze conformed to `contract`,
/// the source's, when there is a readable one), in one commit with `txn` at the log's last slot
/// (no commit when it does). Unless `thorough`, a table whose `txn` has the last slot, published
/// under the same conformed copies, is taken as up to date without reading it. Returns the
/// version committed, if any.
pub async fn sync_source(
    lake: &Lake,
    kind: Kind,
    source: &str,
    thorough: bool,
    contract: Option<&Contract>,
) -> Result<Option<i64>> {
    let runs = read_source_runs(lake, source).await?;
    let Some(last) = runs.iter().map(|r| r.seq).max() else {
        return Ok(None);
    };
    let root = kind.root(source);
    let refs: Vec<&RunRecord> = runs.iter().collect();
    let conform = conform_of(kind, contract, &refs);
    let key = conform.as_ref().map(|c| c.key.as_str());
    if !thorough && log::has_slot(Table::new(lake, &root), &run_app(source), last as i64, key).await? {
        return Ok(None);
    }
    let Some(shape) = shape(lake, kind, source, &refs, conform.as_ref()).await? else {
        return Ok(None);
    };
    let mut files = listing(lake, &root).await?;
    if let Some(c) = &conform {
        write_copies(lake, &root, c, &runs, &mut files).await?;
    }
    let mut adds = Vec::new();
    for w in desired(kind, &runs, conform.as_ref()) {
        let meta = files.get(&w.path).ok_or_else(|| {
            Error::RunFailed(format!(
                "{}: named by the run log of {source} but missing (`ingot doctor` says more)",
                lake.url(&format!("{root}/{}", w.path))
            ))
        })?;
        adds.push(add_of(&w, meta));
    }
    let change = Change {
        app: run_app(source),
        slot: last as i64,
        operation: DeltaOperation::Write {
            mode: SaveMode::Overwrite,
            partition_by: None,
            predicate: None,
        },
        adds,
        removes: Vec::new(),
        info: HashMap::from([(
            "ingot".to_string(),
            serde_json::json!({"log": "ingestion_run_log", "source": source, "slot": last, "sync": true}),
        )]),
    };
    let owns = owner(kind, source, &runs);
    log::replace(Table::new(lake, &root), &shape, change, &*owns).await
}

/// The sources of the lake (folders of the run log).
pub(crate) async fn sources(lake: &Lake) -> Result<Vec<String>> {
    lake.list_dirs(layout::RUN_LOG).await
}

/// Is the bronze table `l` published under `conform` (else a finding: it lags, the next commit
/// of the source publishes it so), and are the conformed copies it names there (else a finding)?
async fn conformed_as(
    l: &log::Loaded,
    conform: Option<&Conform<'_>>,
    source: &str,
    root: &str,
    want: &BTreeSet<String>,
    lake: &Lake,
    out: &mut Vec<Finding>,
) -> Result<bool> {
    let has = l
        .metadata
        .get("configuration")
        .and_then(|c| c.get(super::conform::CONFORMED_TO))
        .and_then(Value::as_str);
    let key = conform.map(|c| c.key.as_str());
    if has != key {
        let now = match conform {
            Some(c) => format!("conformed to {}", c.contract.path.display()),
            None => format!("as stored ({source} has no contract that reads every run)"),
        };
        let then = match has {
            Some(k) => format!("conformed to another contract (copies {k})"),
            None => "as its runs stored their columns".to_string(),
        };
        out.push(Finding::lag(
            root,
            format!("published {then}, not {now} (its next commit publishes it so)"),
        ));
        return Ok(false);
    }
    if let Some(key) = key {
        let copies = format!("{}/{key}/", super::conform::CONFORMED);
        if want.iter().any(|p| p.starts_with(&copies)) {
            let files = listing(lake, root).await?;
            for p in want
                .iter()
                .filter(|p| p.starts_with(&copies) && !files.contains_key(*p))
            {
                out.push(Finding::wrong(
                    root,
                    format!("{p}: a conformed copy the table names is missing (`ingot delta sync` writes it again)"),
                ));
            }
        }
    }
    Ok(true)
}

/// [`sync_source`] for every source and table, bronze conformed to the source's contract in
/// `contracts`; what was repaired, for people.
pub async fn sync_all(lake: &Lake, contracts: &super::Contracts) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for source in sources(lake).await? {
        let contract = contracts.get(&source).map(|c| &**c);
        for kind in KINDS {
            if let Some(v) = sync_source(lake, kind, &source, true, contract).await? {
                out.push(format!(
                    "{}: {source}'s runs published as version {v}",
                    kind.root(&source)
                ));
            }
        }
        // derived from the files: one that does not read (`ingot doctor` names it) leaves the
        // table as it was, and the other tables are still synced
        match super::current::sync(lake, &source, true, contract).await {
            Ok(Some(v)) => out.push(format!(
                "{}: {source}'s current versions published as version {v}",
                super::roots::current(&source)
            )),
            Ok(None) => {}
            Err(e) => out.push(format!("{}: not published: {e}", super::roots::current(&source))),
        }
    }
    Ok(out)
}

/// Every difference between the run tables and the run log (bronze conformed to the source's
/// contract in `contracts`).
pub async fn check_all(lake: &Lake, contracts: &super::Contracts) -> Result<Vec<Finding>> {
    let mut out = Vec::new();
    let sources = sources(lake).await?;
    let mut shared: HashMap<Kind, Option<log::Loaded>> = HashMap::new();
    for kind in [Kind::RunLog, Kind::Failures] {
        if let Some(l) = super::load_checked(lake, &kind.root(""), &mut out).await {
            shared.insert(kind, l);
        }
    }
    for source in &sources {
        let runs = read_source_runs(lake, source).await?;
        let Some(last) = runs.iter().map(|r| r.seq).max() else {
            continue;
        };
        for kind in KINDS {
            let root = kind.root(source);
            let own;
            let loaded = match kind {
                Kind::Bronze => match super::load_checked(lake, &root, &mut out).await {
                    Some(l) => {
                        own = l;
                        own.as_ref()
                    }
                    None => continue,
                },
                _ => match shared.get(&kind) {
                    Some(l) => l.as_ref(),
                    // unreadable, said above
                    None => continue,
                },
            };
            let refs: Vec<&RunRecord> = runs.iter().collect();
            let conform = conform_of(kind, contracts.get(source).map(|c| &**c), &refs);
            let want: BTreeSet<String> = desired(kind, &runs, conform.as_ref())
                .into_iter()
                .map(|w| w.path)
                .collect();
            if kind == Kind::Bronze && want.is_empty() && loaded.is_none() {
                continue;
            }
            if kind == Kind::Bronze
                && let Some(l) = loaded
                && !conformed_as(l, conform.as_ref(), source, &root, &want, lake, &mut out).await?
            {
                continue;
            }
            let owns = owner(kind, source, &runs);
            let expected = super::Expected {
                owner: source,
                log: "run",
                app: run_app(source),
                last,
                state: format!("{source}'s committed runs"),
                want,
            };
            let have = |l: &log::Loaded| {
                l.files
                    .iter()
                    .map(|v| v.path().to_string())
                    .filter(|p| owns(p))
                    .collect()
            };
            super::compare(&root, loaded, expected, have, &mut out).await?;
        }
        let contract = contracts.get(source).map(|c| &**c);
        super::current::check(lake, source, &runs, last, contract, &mut out).await?;
    }
    Ok(out)
}
