//! How a table keys one source's bronze rows ([`keyed`]): as they are, in the source's
//! `key_namespace`, or through its `shared_key` resolves: a record of a namespaced source whose
//! key an identifier map (a lookup source) maps to a key of the shared namespace is keyed as the
//! sources of that namespace key it, so the two meet; the others keep their namespaced key.
//!
//! Invariant: the map is one-to-one. A lookup key held by more than one lookup row, a null
//! value, and a value (after the shared key part's `normalize`) that more than one lookup key
//! maps to are no mapping, so two records of one source never share a key. The map reads only
//! the record's key fields, so every version of a record (tombstones too) is keyed alike.

use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::functions_aggregate::expr_fn::{count, min};
use datafusion::logical_expr::{Expr, JoinType, ScalarUDF, lit, when};

use crate::error::{Error, Result};
use crate::silver::compile::{Lookups, columns, field_of, normalized};
use crate::spec::columns::FINGERPRINT;
use crate::spec::contract::{Contract, Field};
use crate::spec::rules::sources::SourceEntry;
use crate::table::silver::c;

/// One part of a shared key: the source's key field it maps from and the one-to-one map
/// (lookup key after normalize → the shared part's value after its normalize).
#[derive(Clone)]
struct Part {
    from: String,
    from_field: Field,
    map: DataFrame,
}

/// A source's `shared_key`: its parts and the shared namespace's key version.
#[derive(Clone)]
pub struct SharedKey {
    version: i64,
    parts: Vec<Part>,
}

/// The shared key of `entry` (whose contract is `contract`, its lookups `lookups`), `None` when
/// it declares none. `target`: the contract of the table's first entry without a namespace.
pub fn shared_key_of(
    entry: &SourceEntry,
    contract: &Contract,
    lookups: &Lookups,
    target: Option<&Contract>,
) -> Result<Option<SharedKey>> {
    if entry.shared_key.is_empty() {
        return Ok(None);
    }
    let target = target.ok_or_else(|| {
        Error::Invalid(format!(
            "source \"{}\" has a shared_key, but every source of the table has a key_namespace",
            entry.source
        ))
    })?;
    let mut parts = Vec::with_capacity(entry.shared_key.len());
    for (i, name) in entry.shared_key.iter().enumerate() {
        let r = contract.resolve.iter().find(|r| r.name == *name).ok_or_else(|| {
            Error::Invalid(format!(
                "shared_key: \"{name}\" is not a resolve of \"{}\"",
                entry.source
            ))
        })?;
        let lookup = lookups
            .get(&r.lookup)
            .ok_or_else(|| Error::Internal(format!("shared_key \"{name}\": lookup \"{}\" not read", r.lookup)))?;
        let part = target
            .natural_key
            .fields
            .get(i)
            .and_then(|f| target.fields.get(*f))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "shared_key of \"{}\" has more parts than the shared key",
                    entry.source
                ))
            })?;
        let (rk, rv, n, m, rv2) = (
            format!("__ingot_shared_{i}_key"),
            format!("__ingot_shared_{i}_value"),
            format!("__ingot_shared_{i}_rows"),
            format!("__ingot_shared_{i}_keys"),
            format!("__ingot_shared_{i}_other"),
        );
        let key_field = field_of(&lookup.contract, &r.key)?;
        // one lookup row per key, with a value
        let unique = lookup
            .rows
            .clone()
            .select(vec![
                normalized(c(&r.key), key_field).alias(&rk),
                normalized(c(&r.value), part).alias(&rv),
            ])?
            .filter(c(&rk).is_not_null())?
            .aggregate(vec![c(&rk)], vec![count(lit(1)).alias(&n), min(c(&rv)).alias(&rv)])?
            .filter(c(&n).eq(lit(1i64)).and(c(&rv).is_not_null()))?
            .select(vec![c(&rk), c(&rv)])?;
        // ... and one key per value
        let values = unique
            .clone()
            .aggregate(vec![c(&rv)], vec![count(lit(1)).alias(&m)])?
            .filter(c(&m).eq(lit(1i64)))?
            .select(vec![c(&rv).alias(&rv2)])?;
        let map = unique
            .join_on(values, JoinType::Inner, [c(&rv).eq(c(&rv2))])?
            .select(vec![c(&rk), c(&rv)])?;
        parts.push(Part {
            from: r.from.clone(),
            from_field: field_of(contract, &r.from)?.clone(),
            map,
        });
    }
    Ok(Some(SharedKey {
        version: target.natural_key.version,
        parts,
    }))
}

/// `rows` (a source's bronze rows) with [`FINGERPRINT`] replaced by the table's key for them:
/// unchanged without a namespace; `namespaced_fingerprint(namespace, fingerprint)` with one;
/// with a `shared_key`, the shared namespace's fingerprint of the mapped values where every part
/// maps, else the namespaced one. The other columns are kept as they are.
pub fn keyed(rows: DataFrame, namespace: Option<&str>, shared: Option<&SharedKey>) -> Result<DataFrame> {
    let Some(ns) = namespace else {
        return Ok(rows);
    };
    let udf = Arc::new(crate::hash::namespace::namespaced_fingerprint_udf());
    let own = udf.call(vec![lit(ns), c(FINGERPRINT)]);
    let Some(shared) = shared else {
        return Ok(rows.with_column(FINGERPRINT, own)?);
    };
    let keep = columns(&rows);
    let mut df = rows;
    let mut values = Vec::with_capacity(shared.parts.len() + 1);
    values.push(lit(shared.version));
    let mut mapped: Option<Expr> = None;
    for (i, p) in shared.parts.iter().enumerate() {
        let (from, rk, rv) = (
            format!("__ingot_shared_{i}_from"),
            format!("__ingot_shared_{i}_key"),
            format!("__ingot_shared_{i}_value"),
        );
        df = df.with_column(&from, normalized(c(&p.from), &p.from_field))?.join_on(
            p.map.clone(),
            JoinType::Left,
            [c(&from).eq(c(&rk))],
        )?;
        values.push(c(&rv));
        let has = c(&rv).is_not_null();
        mapped = Some(match mapped {
            None => has,
            Some(all) => all.and(has),
        });
    }
    let fingerprint = Arc::new(ScalarUDF::from(crate::hash::udf::NaturalKeyFingerprint::new()));
    let key = match mapped {
        Some(all) => when(all, fingerprint.call(values)).otherwise(own)?,
        None => own,
    };
    let cols: Vec<Expr> = keep
        .into_iter()
        .map(|(name, e)| {
            if name == FINGERPRINT {
                key.clone().alias(FINGERPRINT)
            } else {
                e
            }
        })
        .collect();
    Ok(df.select(cols)?)
}
