//! `bronze.<source>_current`: which versions of a source's current runs are current, as a
//! DataFusion plan over their files ([`latest_versions`]). Versions rank by the commit slot of
//! their run ([`Ranks`]: a lookup, a column, or a join onto a table of slots); only the versions of
//! runs that updated or deleted records can supersede another ([`superseding`]), so a source
//! that only ever received new records is a scan, and one with a few updates an anti join onto
//! those few rows collected into a hash table. The catalog ([`crate::engine::catalog`]) builds the
//! view from the run log or a segment manifest's view state.
//!
//! Hazard: the shortcut rests on change detection's classes (a row for a current record is
//! always an `Updated` one); a run that wrote a current record's new version without counting it
//! in `rows_updated` would leave two current versions, which `ingot doctor` reports (check `keys`).

use datafusion::logical_expr::{JoinType, LogicalPlanBuilder};
use datafusion::prelude::{DataFrame, Expr, SessionContext, col, lit};

use crate::error::Result;
use crate::spec::contract::Contract;
use crate::table::audit::RunRecord;
use crate::table::evolve::{read_stored, stored_files};
use crate::table::lake::Lake;

/// Which versions of `current` (a source's current runs) can supersede another: only those of
/// runs that updated or deleted records ([`crate::table::versions::supersedes`]). A run writes a row
/// for a key whose version is current only as an update (change detection says `Updated`), and a
/// key stops being current only by an update or a tombstone; a row for a key that is not current
/// (a new key, or one deleted before) supersedes nothing that still counts, unless an undo of the
/// deleting run brought an older version back (`reinserts_before`: the runs with new records
/// before that undo rank too). So with no such run every version is current, and with a few,
/// the few rows they wrote are all the ranking needs.
pub(super) fn superseding(
    ctx: &SessionContext,
    lake: &Lake,
    contract: &Contract,
    current: &[&RunRecord],
    reinserts_before: Option<u64>,
    manifest: &crate::table::segments::Manifest,
) -> Result<Superseding> {
    let by: Vec<&RunRecord> = current
        .iter()
        .copied()
        .filter(|r| crate::table::versions::supersedes(r, reinserts_before))
        .collect();
    if by.is_empty() {
        return Ok(Superseding::Nothing);
    }
    let (files, excluded) = stored_files(lake, contract, &by, manifest)?;
    let mut rows = read_stored(ctx, contract, &files.iter().collect::<Vec<_>>())?;
    // segments hold the rows of other runs too: keep those of `by` (whichever list is shorter)
    if !excluded.is_empty() {
        rows = if excluded.len() <= by.len() {
            rows.filter(col("ingestion_run_id").in_list(excluded.into_iter().map(lit).collect(), true))?
        } else {
            let ids = by.iter().map(|r| lit(r.run_id.to_string())).collect();
            rows.filter(col("ingestion_run_id").in_list(ids, false))?
        };
    }
    Ok(Superseding::By(rows))
}

/// What can supersede a version of a source ([`superseding`]).
pub(super) enum Superseding {
    /// Nothing: no current run updated or deleted a record, every version is current.
    Nothing,
    /// The versions of the runs that updated or deleted records, read from their own files.
    By(DataFrame),
    /// Any version (what the view state does not tell).
    Any,
}

/// The latest version of every record: of `versions` (rows of a source's current runs, as
/// [`current_runs`] gives them), per fingerprint the one whose run `slots` ranks highest (rows of
/// runs it does not name left out), tombstones left out: `bronze.<source>_current`. Versions rank
/// by the commit slot of the run that wrote them (a run holds one row per fingerprint), never by
/// a clock.
///
/// What is ranked depends on `superseding`. With nothing superseding, the view is a scan of the
/// versions less the tombstones. With the versions of the updating runs, it is the versions
/// without those a later one of theirs supersedes: an anti join onto the highest slot per key of
/// those few rows (a narrow aggregate, collected into a hash table when provably small: see
/// [`crate::engine::joins`]), which streams the wide side, memory flat whatever its size. With
/// any version superseding, the highest slot per key is an aggregate over every version's
/// `(key, slot)` and the rows are those that match it (a semi join). Ranking with `row_number()
/// OVER (PARTITION BY fingerprint)` would cost per record and read every column before a filter
/// can apply; here a filter on the view's columns (`WHERE id = 7`) reaches the scan of the wide
/// side. Every operator stays within the memory pool (aggregates spill, joins are sort-merge
/// joins or hash joins with a side proved small).
pub(super) fn latest_versions(
    versions: DataFrame,
    slots: Ranks,
    keys: &KeyColumns,
    superseding: Superseding,
) -> Result<DataFrame> {
    use datafusion::common::Column;
    let fp = "natural_key_fingerprint";
    let current = |df: DataFrame| -> Result<DataFrame> {
        Ok(df
            .filter(col(crate::table::bronze::IS_DELETED).is_not_true())?
            .drop_columns(&[RUN, SLOT])?)
    };
    match (&superseding, &slots) {
        (_, Ranks::Join(None)) => return Ok(versions), // no current run: no rows
        // every row of the files is a current version
        (Superseding::Nothing, Ranks::Lookup { others: false, .. }) => return current(versions),
        _ => {}
    }
    let ranked = rank(versions, &slots)?;
    let (latest_of, semi) = match superseding {
        Superseding::Nothing => return current(ranked),
        Superseding::By(rows) => (rank(rows, &slots)?, false),
        Superseding::Any => (ranked.clone(), true),
    };
    // the plain key fields ride along as grouping columns: equal for every version of a
    // fingerprint, they let a filter on them reach both sides; when every key field is plain they
    // stand for the fingerprint, and the narrow side reads no fingerprint ([`KeyColumns`])
    let latest_key = |i: usize| format!("__ingot_latest_k{i}");
    let (mut narrow, mut group, mut left, mut right) = (vec![col(SLOT)], vec![], vec![], vec![]);
    if !keys.whole {
        narrow.push(col(fp).alias(LATEST_FP));
        group.push(col(LATEST_FP));
        left.push(Column::from_name(fp));
        right.push(Column::from_name(LATEST_FP));
    }
    for (i, k) in keys.plain.iter().enumerate() {
        narrow.push(Expr::Column(Column::from_name(k)).alias(latest_key(i)));
        group.push(Expr::Column(Column::from_name(latest_key(i))));
        left.push(Column::from_name(k));
        right.push(Column::from_name(latest_key(i)));
    }
    let latest = latest_of.select(narrow)?.aggregate(
        group,
        vec![datafusion::functions_aggregate::expr_fn::max(col(SLOT)).alias(LATEST_SLOT)],
    )?;
    let (session, plan) = ranked.into_parts();
    // a fingerprint (a key part) is never null in bronze; if one were, its versions would still rank
    let nulls = datafusion::common::NullEquality::NullEqualsNull;
    let plan = if semi {
        // every version: keep those whose slot is their key's highest
        left.push(Column::from_name(SLOT));
        right.push(Column::from_name(LATEST_SLOT));
        LogicalPlanBuilder::from(plan).join_detailed(
            latest.logical_plan().clone(),
            JoinType::LeftSemi,
            (left, right),
            None,
            nulls,
        )?
    } else {
        // the updating runs' versions: drop those a later one of them supersedes
        LogicalPlanBuilder::from(plan).join_detailed(
            latest.logical_plan().clone(),
            JoinType::LeftAnti,
            (left, right),
            Some(col(SLOT).lt(col(LATEST_SLOT))),
            nulls,
        )?
    };
    current(DataFrame::new(session, plan.build()?))
}

/// `versions` with the slot of each one's run ([`SLOT`]), rows of runs `slots` does not name left
/// out (no run at all: as they are, no rows).
fn rank(versions: DataFrame, slots: &Ranks) -> Result<DataFrame> {
    Ok(match slots {
        Ranks::Join(None) | Ranks::Column => versions,
        Ranks::Join(Some(slots)) => {
            versions.join(slots.clone(), JoinType::Inner, &["ingestion_run_id"], &[RUN], None)?
        }
        Ranks::Lookup { slot_of, others } => {
            let ranked = versions.with_column(SLOT, slot_of.call(vec![col("ingestion_run_id")]))?;
            if *others {
                ranked.filter(col(SLOT).is_not_null())?
            } else {
                ranked
            }
        }
    })
}

/// The natural-key fields every version of a fingerprint holds the same value of, which the
/// current view groups versions by beside (or, when they are the whole key, instead of) the
/// fingerprint, so that a filter on them reaches the ranking side too (a point query on the key
/// reads the versions of that key only, not every version's fingerprint).
///
/// When every current run recorded the contract's key definition (`natural_key_definition`; a
/// contract edited since, a rename included, gives none) under one key version: the key fields
/// without `normalize` steps (bronze keeps a value as it arrived, so `" 7"` and `"7"` under
/// `trim` share a fingerprint) whose canonical text is one typed value and back (not `float64`:
/// `0` and `-0` group apart). A tombstone carries its key's fields; a key part is never null.
#[derive(Debug, Default)]
pub(super) struct KeyColumns {
    plain: Vec<String>,
    /// Every key field is plain: equal keys are equal fingerprints and back.
    whole: bool,
}

impl KeyColumns {
    pub(super) fn of(contract: &Contract, current: &[&RunRecord]) -> KeyColumns {
        let keys = current.iter().fold(crate::table::segments::RunKeys::None, |k, r| {
            k.with(r.natural_key_definition.as_deref(), r.natural_key_version)
        });
        KeyColumns::from_keys(contract, &keys)
    }

    /// The key columns of current runs that recorded `keys`.
    pub(super) fn from_keys(contract: &Contract, keys: &crate::table::segments::RunKeys) -> KeyColumns {
        let crate::table::segments::RunKeys::Same(Some(recorded), _) = keys else {
            return KeyColumns::default();
        };
        if *recorded != contract.key_definition() {
            return KeyColumns::default();
        }
        let fields: Vec<&crate::spec::contract::Field> = contract
            .natural_key
            .fields
            .iter()
            .map(|&i| &contract.fields[i])
            .collect();
        let plain: Vec<String> = fields
            .iter()
            .filter(|f| f.normalize.is_empty() && f.ty != crate::spec::contract::FieldType::Float64)
            .map(|f| f.name.clone())
            .collect();
        KeyColumns {
            whole: !plain.is_empty() && plain.len() == fields.len(),
            plain,
        }
    }
}

/// How [`latest_versions`] learns each version's slot: a join onto a table of `(run, slot)` (none:
/// no current run), or a lookup in the runs this process read ([`crate::engine::slots`]), null
/// for a run that is not current: `others` says whether the files hold rows of such runs, which
/// the view must then leave out.
pub(super) enum Ranks {
    Join(Option<DataFrame>),
    /// The versions carry their slot in a column [`SLOT`] already (rows of current runs only).
    Column,
    Lookup {
        slot_of: datafusion::logical_expr::ScalarUDF,
        others: bool,
    },
}

pub(super) const RUN: &str = "__ingot_run";
pub(super) use crate::table::log::SLOT;
const LATEST_FP: &str = "__ingot_latest_fp";
const LATEST_SLOT: &str = "__ingot_latest_slot";
