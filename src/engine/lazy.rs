//! The catalog's tables that read the run log, opened lazily. `bronze.<source>` and
//! `bronze.<source>_current` are built when a query first names them (the source's run log read
//! through its checkpoint, its runs checked against the contract, its segment manifest read, its
//! files listed into views); `audit.ingestion_run_log` and `audit.row_failure_log` read every
//! source's log when a query first names them. So a query pays only for the sources it reads,
//! and `SELECT 1` reads no log at all. Each source's log is read once per catalog ([`RunLogs`]),
//! so every table over a source sees the same runs; built tables are kept for the life of the
//! catalog, which `ingot serve` reuses until the lake changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use crate::spec::contract::Contract;
use crate::table::audit::{BuildRecord, RunRecord, SourceRuns};
use crate::table::lake::{Lake, layout};

/// A catalog's run log, read source by source when a table first needs it, each source once.
pub struct RunLogs {
    lake: Lake,
    sources: tokio::sync::Mutex<HashMap<String, Arc<SourceRuns>>>,
    all: tokio::sync::OnceCell<AllRuns>,
}

/// Every source's runs, as [`RunLogs::all`] gives them.
#[derive(Debug)]
pub struct AllRuns {
    /// By source (by name), then slot.
    pub records: Vec<RunRecord>,
    /// `(source, through)` of the sources read from a checkpoint.
    pub checkpoints: Vec<(String, u64)>,
}

impl RunLogs {
    pub fn new(lake: &Lake) -> RunLogs {
        RunLogs {
            lake: lake.clone(),
            sources: tokio::sync::Mutex::new(HashMap::new()),
            all: tokio::sync::OnceCell::new(),
        }
    }

    /// The runs of `source`, read through its checkpoint the first time.
    pub async fn source(&self, source: &str) -> crate::error::Result<Arc<SourceRuns>> {
        let mut read = self.sources.lock().await;
        if let Some(s) = read.get(source) {
            return Ok(s.clone());
        }
        let s = Arc::new(crate::table::audit::read_source_state(&self.lake, source).await?);
        read.insert(source.to_string(), s.clone());
        Ok(s)
    }

    /// Fails when a run-log checkpoint that tables of this catalog were planned over is gone
    /// (superseded and removed: see [`crate::table::log::READER_GRACE`]). A listing of a missing
    /// file is empty, so a statement over it would miss those runs without an error.
    pub async fn check_checkpoints(&self) -> crate::error::Result<()> {
        let read: Vec<(String, u64)> = self
            .sources
            .lock()
            .await
            .iter()
            .filter_map(|(s, r)| Some((s.clone(), r.checkpoint?)))
            .collect();
        for (source, through) in read {
            let rel = layout::log_checkpoint(layout::RUN_LOG, &source, through);
            if self.lake.size_of(&rel).await?.is_none() {
                return Err(crate::error::Error::Invalid(format!(
                    "{rel} was removed after this session read {source}'s run log through it (newer checkpoints \
                     replaced it, or `ingot gc` ran): its tables would miss runs; start the session again to read \
                     the lake as it is now"
                )));
            }
        }
        Ok(())
    }

    /// The runs of every source of the lake (those read before as they were read then).
    pub async fn all(&self) -> crate::error::Result<&AllRuns> {
        self.all
            .get_or_try_init(|| async {
                let mut records = Vec::new();
                let mut checkpoints = Vec::new();
                for source in self.lake.list_dirs(layout::RUN_LOG).await? {
                    let s = self.source(&source).await?;
                    records.extend(s.records.iter().cloned());
                    if let Some(through) = s.checkpoint {
                        checkpoints.push((source, through));
                    }
                }
                Ok(AllRuns { records, checkpoints })
            })
            .await
    }
}

impl std::fmt::Debug for RunLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLogs").finish_non_exhaustive()
    }
}

/// The `bronze` schema: one pair of views per source with a contract.
pub struct BronzeSchema {
    /// A context of its own, only to build the views' plans (no cycle with the catalog's).
    ctx: SessionContext,
    lake: Lake,
    contracts: BTreeMap<String, Arc<Contract>>,
    logs: Arc<RunLogs>,
    built: Mutex<HashMap<String, Arc<dyn TableProvider>>>,
    /// The catalog's plans run in this process.
    local: bool,
}

impl std::fmt::Debug for BronzeSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BronzeSchema")
            .field("sources", &self.contracts.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl BronzeSchema {
    /// `local`: the catalog's plans run in this process (no `--cluster`), so the views may hold
    /// what they need in memory ([`crate::engine::catalog::bronze_views`]).
    pub fn new(
        lake: &Lake,
        contracts: BTreeMap<String, Arc<Contract>>,
        logs: Arc<RunLogs>,
        local: bool,
    ) -> BronzeSchema {
        BronzeSchema {
            ctx: SessionContext::new(),
            lake: lake.clone(),
            contracts,
            logs,
            built: Mutex::new(HashMap::new()),
            local,
        }
    }

    /// The two views of `contract`'s source, over its runs (refused when the contract cannot read
    /// them: a type change that is no widening, without `older_values: cast`).
    async fn build(
        &self,
        contract: &Contract,
    ) -> crate::error::Result<(Arc<dyn TableProvider>, Arc<dyn TableProvider>)> {
        // the manifest once: in this process its view state gives the views when it can be used
        let manifest = crate::table::segments::read(&self.lake, &contract.source).await?;
        if self.local
            && let Some(views) =
                crate::engine::catalog::bronze_views_from_state(&self.ctx, &self.lake, contract, &manifest).await?
        {
            return Ok(views);
        }
        // the views' file lists check the runs against the contract
        let runs = self.logs.source(&contract.source).await?;
        crate::engine::catalog::bronze_views(
            &self.ctx,
            &self.lake,
            contract,
            (&runs.records, runs.checkpoint),
            &manifest,
            self.local,
        )
    }

    /// The source a table name stands for, and whether it is the `_current` view.
    fn source_of<'a>(&self, name: &'a str) -> Option<(&'a str, bool)> {
        if self.contracts.contains_key(name) {
            return Some((name, false));
        }
        let source = name.strip_suffix("_current")?;
        self.contracts.contains_key(source).then_some((source, true))
    }
}

#[async_trait]
impl SchemaProvider for BronzeSchema {
    fn table_names(&self) -> Vec<String> {
        self.contracts
            .keys()
            .flat_map(|s| [s.clone(), format!("{s}_current")])
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        let Some((source, current)) = self.source_of(name) else {
            return Ok(None);
        };
        if let Some(t) = self.built.lock().map_err(poisoned)?.get(name) {
            return Ok(Some(t.clone()));
        }
        let contract = &self.contracts[source];
        let (everything, now) = self.build(contract).await.map_err(external)?;
        let mut built = self.built.lock().map_err(poisoned)?;
        built.insert(source.to_string(), everything.clone());
        built.insert(format!("{source}_current"), now.clone());
        Ok(Some(if current { now } else { everything }))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.source_of(name).is_some()
    }
}

/// The audit schema: `audit.silver_build_log` (the build log is read when the catalog opens, for
/// `silver`), and `audit.ingestion_run_log` and `audit.row_failure_log`, built when a query first
/// names them.
pub struct AuditSchema {
    ctx: SessionContext,
    lake: Lake,
    logs: Arc<RunLogs>,
    builds: Arc<Vec<BuildRecord>>,
    build_log: Arc<dyn TableProvider>,
    built: Mutex<HashMap<String, Arc<dyn TableProvider>>>,
}

impl std::fmt::Debug for AuditSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSchema").finish_non_exhaustive()
    }
}

/// The tables of the audit schema.
pub const AUDIT_TABLES: [&str; 5] = [
    "ingestion_run_log",
    "row_failure_log",
    "silver_build_log",
    "source_conflict_log",
    "source_conflict_decision_log",
];

impl AuditSchema {
    pub fn new(
        lake: &Lake,
        logs: Arc<RunLogs>,
        builds: Arc<Vec<BuildRecord>>,
        build_log: Arc<dyn TableProvider>,
    ) -> AuditSchema {
        AuditSchema {
            ctx: SessionContext::new(),
            lake: lake.clone(),
            logs,
            builds,
            build_log,
            built: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl SchemaProvider for AuditSchema {
    fn table_names(&self) -> Vec<String> {
        AUDIT_TABLES.iter().map(|t| t.to_string()).collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        if name == "silver_build_log" {
            return Ok(Some(self.build_log.clone()));
        }
        if !AUDIT_TABLES.contains(&name) {
            return Ok(None);
        }
        if let Some(t) = self.built.lock().map_err(poisoned)?.get(name) {
            return Ok(Some(t.clone()));
        }
        let table = match name {
            "source_conflict_log" => crate::engine::catalog::conflict_table(&self.lake, &self.builds),
            "source_conflict_decision_log" => crate::engine::catalog::decision_table(&self.lake).await,
            "ingestion_run_log" => {
                let all = self.logs.all().await.map_err(external)?;
                crate::engine::catalog::run_log_table(&self.ctx, &self.lake, all)
            }
            _ => {
                let all = self.logs.all().await.map_err(external)?;
                crate::engine::catalog::failure_table(&self.lake, &all.records, &self.builds)
            }
        }
        .map_err(external)?;
        self.built
            .lock()
            .map_err(poisoned)?
            .insert(name.to_string(), table.clone());
        Ok(Some(table))
    }

    fn table_exist(&self, name: &str) -> bool {
        AUDIT_TABLES.contains(&name)
    }
}

fn external(e: crate::error::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

fn poisoned<T>(_: std::sync::PoisonError<T>) -> DataFusionError {
    DataFusionError::Internal("a catalog schema's table cache was poisoned by a panic".into())
}
