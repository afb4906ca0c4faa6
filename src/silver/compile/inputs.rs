//! What a build reads: the source's `_current` rows and those of the sources its contract's
//! `resolve` entries look up.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};
use crate::spec::contract::{Contract, ContractSet};
use crate::spec::rules::RuleSet;

/// The current rows of a lookup source and its contract (for the key's `normalize` steps).
#[derive(Clone)]
pub struct Lookup {
    pub contract: Arc<Contract>,
    /// Typically `bronze.<lookup>_current`.
    pub rows: DataFrame,
}

/// Lookups by source name.
pub type Lookups = BTreeMap<String, Lookup>;

/// What a build of one rules version reads.
pub struct Inputs {
    pub contract: Arc<Contract>,
    /// `bronze.<source>_current`.
    pub input: DataFrame,
    pub lookups: Lookups,
}

/// `bronze.<source>_current` as a table reference (never parsed from text).
pub fn current_table(source: &str) -> TableReference {
    TableReference::partial("bronze", format!("{source}_current"))
}

/// The contract of `source`, which `rules` read; an error names the sources there are.
pub fn contract_of(contracts: &ContractSet, rules: &RuleSet, source: &str) -> Result<Arc<Contract>> {
    contracts.contracts.get(source).cloned().ok_or_else(|| {
        Error::Invalid(format!(
            "{}: source \"{source}\" has no loadable contract; sources are: {}",
            rules.path.display(),
            contracts.names().join(", ")
        ))
    })
}

/// The current rows of every source `contract`'s `resolve` entries look up, with their
/// contracts.
pub async fn lookups_of(
    ctx: &SessionContext,
    contracts: &ContractSet,
    rules: &RuleSet,
    contract: &Contract,
) -> Result<Lookups> {
    let mut lookups = Lookups::new();
    for r in &contract.resolve {
        if !lookups.contains_key(&r.lookup) {
            let lookup = Lookup {
                contract: contract_of(contracts, rules, &r.lookup)?,
                rows: ctx.table(current_table(&r.lookup)).await?,
            };
            lookups.insert(r.lookup.clone(), lookup);
        }
    }
    Ok(lookups)
}

/// The source's and its lookups' `_current` views from a session opened by [`crate::engine::catalog::open`].
pub async fn read_inputs(ctx: &SessionContext, contracts: &ContractSet, rules: &RuleSet) -> Result<Inputs> {
    if let Some(src) = rules.sources.as_deref() {
        // several sources: the merged rows' shape, under the first source's contract without
        // its lookups (each source resolves its own candidates)
        let inputs = crate::silver::sources::read_source_inputs(ctx, contracts, rules).await?;
        let first = inputs
            .first()
            .ok_or_else(|| Error::Internal(format!("{}: no sources", rules.path.display())))?;
        return Ok(Inputs {
            contract: crate::silver::sources::merged_contract(first),
            input: crate::silver::sources::planned_rows(src, &inputs)?,
            lookups: Lookups::new(),
        });
    }
    let contract = contract_of(contracts, rules, &rules.source)?;
    let input = ctx.table(current_table(&rules.source)).await?;
    let lookups = lookups_of(ctx, contracts, rules, &contract).await?;
    Ok(Inputs {
        contract,
        input,
        lookups,
    })
}
