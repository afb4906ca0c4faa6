//! The `bronze` schema of the catalog, opened lazily: `bronze.<source>` and
//! `bronze.<source>_current` are built when a query first names them (the source's segment
//! manifest read, its files listed into views), so a query pays only for the sources it reads.
//! Built views are kept for the life of the catalog, which `ingot serve` reuses until the lake
//! changes. The run log is read when the catalog opens (checkpointed, so that is cheap), and the
//! checks that need no file (runs a contract cannot read) are made then too.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use crate::spec::contract::Contract;
use crate::table::audit::RunRecord;
use crate::table::lake::Lake;

/// The `bronze` schema: one pair of views per source with a contract.
pub struct BronzeSchema {
    /// A context of its own, only to build the views' plans (no cycle with the catalog's).
    ctx: SessionContext,
    lake: Lake,
    contracts: BTreeMap<String, Arc<Contract>>,
    runs: Arc<Vec<RunRecord>>,
    /// The slot each source's run log was read through from its checkpoint.
    checkpoints: HashMap<String, u64>,
    built: Mutex<HashMap<String, Arc<dyn TableProvider>>>,
}

impl std::fmt::Debug for BronzeSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BronzeSchema")
            .field("sources", &self.contracts.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl BronzeSchema {
    pub fn new(
        lake: &Lake,
        contracts: BTreeMap<String, Arc<Contract>>,
        runs: Arc<Vec<RunRecord>>,
        checkpoints: HashMap<String, u64>,
    ) -> BronzeSchema {
        BronzeSchema {
            ctx: SessionContext::new(),
            lake: lake.clone(),
            contracts,
            runs,
            checkpoints,
            built: Mutex::new(HashMap::new()),
        }
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
        let (everything, now) = crate::engine::catalog::bronze_views(
            &self.ctx,
            &self.lake,
            contract,
            &self.runs,
            self.checkpoints.get(source).copied(),
        )
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let mut built = self.built.lock().map_err(poisoned)?;
        built.insert(source.to_string(), everything.clone());
        built.insert(format!("{source}_current"), now.clone());
        Ok(Some(if current { now } else { everything }))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.source_of(name).is_some()
    }
}

fn poisoned<T>(_: std::sync::PoisonError<T>) -> DataFusionError {
    DataFusionError::Internal("the bronze schema's table cache was poisoned by a panic".into())
}
