//! Bronze runs written under older contracts, read under the current one (docs/formats.md#contract-evolution).
//!
//! Every run records the fields it was written under (`contract_fields` in the run log). A run
//! reads under the current contract by name: a field renamed with `renamed_from` from its old
//! column, a field added since as null, a dropped one not at all, a widened type (int32 to int64,
//! a decimal's precision up) cast, any other type change only when the field says
//! `older_values: cast` (`TRY_CAST`), else the source is refused, naming the runs. A run's
//! `row_hash` stays what it covered when written; where that differs from what the current
//! contract covers ([`StoredRun::rehash`]), change detection recomputes it from the stored values.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field as ArrowField, Schema};
use datafusion::common::Column;
use datafusion::logical_expr::{Expr, cast, try_cast};
use datafusion::prelude::{DataFrame, SessionContext};

use crate::error::{Error, Result};
use crate::spec::contract::{Contract, Field, FieldType};
use crate::table::audit::RunRecord;
use crate::table::lake::{Lake, layout};
use crate::table::parquet::table_over;

/// What a row hash computed under `contract` from stored values depends on: every field's name,
/// type, `volatile`, normalize steps, `renamed_from` and `older_values` (16 hex digits of their
/// SHA-256). Names the cache of recomputed row hashes ([`crate::table::lake::layout::row_hash_cache`]).
pub fn hash_layout(contract: &Contract) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for f in &contract.fields {
        let steps: Vec<&str> = f.normalize.iter().map(|s| s.name()).collect();
        h.update(format!(
            "{} {} {} [{}] {:?} {}\n",
            f.name,
            f.ty.name(),
            f.volatile,
            steps.join(","),
            f.renamed_from,
            f.cast_older
        ));
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What a copy of a run's stored rows conformed to `contract` depends on: every field's name,
/// type, `renamed_from` and `older_values` (16 hex digits of their SHA-256). Names the folder of
/// the conformed copies a `bronze/<source>` Delta table publishes ([`crate::table::delta::conform`]).
pub fn conform_key(contract: &Contract) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for f in &contract.fields {
        h.update(format!(
            "{} {} {:?} {}\n",
            f.name,
            f.ty.name(),
            f.renamed_from,
            f.cast_older
        ));
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Does a reader by column name read a run recorded with `definition` exactly as `contract`
/// does (every current field under its own name and type, or absent)? Runs recorded before
/// fields were recorded (`None`) do.
pub fn reads_as_stored(contract: &Contract, definition: Option<&str>) -> bool {
    StoredRun::probe(contract, definition).plain(contract)
}

/// One field of a run's recorded `contract_fields`.
#[derive(Debug, Clone, PartialEq)]
pub struct PastField {
    pub name: String,
    pub ty: FieldType,
    pub volatile: bool,
}

/// Parse a `contract_fields` value (`name type[ volatile]`, `, ` between); `None` if malformed.
pub fn parse_fields(definition: &str) -> Option<Vec<PastField>> {
    definition
        .split(", ")
        .map(|entry| {
            let mut parts = entry.split(' ');
            let name = parts.next()?.to_string();
            let ty = FieldType::parse(parts.next()?)?;
            let volatile = match parts.next() {
                None => false,
                Some("volatile") => true,
                Some(_) => return None,
            };
            Some(PastField { name, ty, volatile })
        })
        .collect()
}

/// A committed bronze file and the fields it was written under (`None`: recorded before runs
/// kept them; read as the current contract's).
#[derive(Debug, Clone)]
pub struct StoredRun {
    pub run_id: String,
    pub source: String,
    pub url: String,
    definition: Option<String>,
    past: Option<Vec<PastField>>,
}

/// Can a value stored as `old` be read as `new` without loss?
fn widens(old: FieldType, new: FieldType) -> bool {
    match (old, new) {
        (a, b) if a == b => true,
        (FieldType::Int32, FieldType::Int64) => true,
        (
            FieldType::Decimal {
                precision: p0,
                scale: s0,
            },
            FieldType::Decimal {
                precision: p1,
                scale: s1,
            },
        ) => s0 == s1 && p1 >= p0,
        _ => false,
    }
}

impl StoredRun {
    pub fn new(lake: &Lake, run: &RunRecord) -> StoredRun {
        StoredRun::of_run(lake, &run.source, &run.run_id, run.contract_fields.as_deref())
    }

    /// A run of `contract`'s source recorded with `definition`, without a file: for what is
    /// decided by the recorded fields alone.
    fn probe(contract: &Contract, definition: Option<&str>) -> StoredRun {
        StoredRun {
            run_id: String::new(),
            source: contract.source.clone(),
            url: String::new(),
            definition: definition.map(str::to_string),
            past: definition.and_then(parse_fields),
        }
    }

    /// The own file of run `run_id` of `source`, recorded with `definition`.
    pub fn of_run(lake: &Lake, source: &str, run_id: &str, definition: Option<&str>) -> StoredRun {
        StoredRun {
            run_id: run_id.to_string(),
            source: source.to_string(),
            url: lake.url(&layout::bronze_data(source, run_id)),
            definition: definition.map(str::to_string),
            past: definition.and_then(parse_fields),
        }
    }

    /// A segment of runs ([`crate::table::segments`]): read like one run of its recorded fields.
    pub fn segment(lake: &Lake, source: &str, segment: &crate::table::segments::Segment) -> StoredRun {
        StoredRun {
            run_id: segment.id.clone(),
            source: source.to_string(),
            url: lake.url(&segment.file),
            definition: segment.definition.clone(),
            past: segment.definition.as_deref().and_then(parse_fields),
        }
    }

    /// The stored field each current field reads from (`None`: added since, or unknown).
    fn sources<'a>(&'a self, contract: &Contract) -> Vec<Option<&'a PastField>> {
        let Some(past) = &self.past else {
            return vec![None; contract.fields.len()];
        };
        let by_name = |n: &str| past.iter().find(|p| p.name == n);
        contract
            .fields
            .iter()
            .map(|f| by_name(&f.name).or_else(|| f.renamed_from.as_deref().and_then(by_name)))
            .collect()
    }

    /// Does the run's stored `row_hash` differ from what the current contract computes for the same
    /// record? It does not when the non-volatile fields, in order, are the run's non-volatile
    /// fields (renamed or not) with types that write the same canonical text.
    pub fn rehash(&self, contract: &Contract) -> bool {
        let Some(past) = &self.past else {
            return false;
        };
        let sources = self.sources(contract);
        let now: Vec<(Option<&PastField>, &Field)> = contract
            .fields
            .iter()
            .zip(sources)
            .filter(|(f, _)| !f.volatile)
            .map(|(f, s)| (s, f))
            .collect();
        let then: Vec<&PastField> = past.iter().filter(|p| !p.volatile).collect();
        now.len() != then.len()
            || now.iter().zip(&then).any(|((s, f), p)| {
                s.is_none_or(|s| s.name != p.name) || p.ty.key_name() != f.ty.key_name() || !widens(p.ty, f.ty)
            })
    }

    /// The current fields whose stored type this run cannot be read as (neither a widening nor
    /// allowed by `older_values: cast`): `(field, stored type)`.
    pub fn unreadable<'a>(&self, contract: &'a Contract) -> Vec<(&'a str, FieldType)> {
        contract
            .fields
            .iter()
            .zip(self.sources(contract))
            .filter_map(|(f, s)| {
                s.filter(|p| !widens(p.ty, f.ty) && !f.cast_older)
                    .map(|p| (f.name.as_str(), p.ty))
            })
            .collect()
    }

    /// Is the file read exactly as the current contract's columns (names and types)?
    fn plain(&self, contract: &Contract) -> bool {
        self.past.is_none()
            || self
                .sources(contract)
                .iter()
                .zip(&contract.fields)
                .all(|(s, f)| s.is_none_or(|p| p.name == f.name && p.ty == f.ty))
    }
}

/// The committed files of `runs` (of `contract`'s source), refusing a source whose runs cannot be
/// read under the contract (a type change that is no widening, without `older_values: cast`).
pub fn stored_runs(lake: &Lake, contract: &Contract, runs: &[&RunRecord]) -> Result<Vec<StoredRun>> {
    check_readable(contract, runs)?;
    Ok(own_files(lake, runs))
}

/// The check of [`stored_runs`] alone, without the files' locations (what the catalog makes when
/// it opens, before any table is built). Runs mostly share a definition: each distinct one is
/// parsed and checked once, so the check costs a lookup per run.
pub fn check_readable(contract: &Contract, runs: &[&RunRecord]) -> Result<()> {
    let problems = unreadable_by_field(
        contract,
        runs.iter().map(|r| (r.contract_fields.as_deref(), r.run_id.as_str())),
    );
    if problems.is_empty() {
        return Ok(());
    }
    let messages: Vec<String> = problems
        .into_iter()
        .map(|((field, ty), ids)| unreadable_message(contract, field, &ty, &ids))
        .collect();
    Err(Error::Invalid(messages.join("; ")))
}

/// Can `contract` read every one of `stored` (`(recorded fields, run or segment id)`)?
pub fn all_readable<'a>(contract: &'a Contract, stored: impl IntoIterator<Item = (Option<&'a str>, &'a str)>) -> bool {
    unreadable_by_field(contract, stored).is_empty()
}

/// The runs (`(recorded fields, run id)`) whose stored values `contract` cannot read, by field and
/// stored type, in the order given; each distinct definition is parsed and checked once.
fn unreadable_by_field<'a>(
    contract: &'a Contract,
    runs: impl IntoIterator<Item = (Option<&'a str>, &'a str)>,
) -> BTreeMap<(&'a str, String), Vec<&'a str>> {
    let mut per_definition: HashMap<Option<&str>, Vec<(&str, FieldType)>> = HashMap::new();
    let mut by_field: BTreeMap<(&str, String), Vec<&str>> = BTreeMap::new();
    // runs in a row mostly share their definition: compared with the previous one's, it is
    // looked up (hashed whole) only when it changes
    let mut previous: Option<(Option<&str>, bool)> = None;
    for (definition, id) in runs {
        if let Some((d, clean)) = previous
            && d == definition
            && clean
        {
            continue;
        }
        let problems = per_definition
            .entry(definition)
            .or_insert_with(|| StoredRun::probe(contract, definition).unreadable(contract));
        previous = Some((definition, problems.is_empty()));
        for (field, ty) in problems.iter() {
            by_field.entry((*field, ty.name())).or_default().push(id);
        }
    }
    by_field
}

/// The runs' own bronze files (each distinct definition parsed once).
fn own_files(lake: &Lake, runs: &[&RunRecord]) -> Vec<StoredRun> {
    let mut parsed: HashMap<Option<&str>, Option<Vec<PastField>>> = HashMap::new();
    runs.iter()
        .map(|r| {
            let definition = r.contract_fields.as_deref();
            let past = parsed
                .entry(definition)
                .or_insert_with(|| definition.and_then(parse_fields))
                .clone();
            StoredRun {
                run_id: r.run_id.to_string(),
                source: r.source.to_string(),
                url: lake.url(&layout::bronze_data(&r.source, &r.run_id)),
                definition: r.contract_fields.as_deref().map(str::to_string),
                past,
            }
        })
        .collect()
}

/// The files holding the rows of `runs` (of `contract`'s source, checked as by [`stored_runs`]):
/// the segments of `manifest` that hold any of them, and the own files of the others; and the
/// runs those segments also hold that are not among `runs` (undone since: a reader of the files
/// leaves their rows out). Only the runs no segment holds get a file location, so a long history
/// held in a few segments costs a lookup per run.
pub fn stored_files(
    lake: &Lake,
    contract: &Contract,
    runs: &[&RunRecord],
    manifest: &crate::table::segments::Manifest,
) -> Result<(Vec<StoredRun>, Vec<String>)> {
    check_readable(contract, runs)?;
    if manifest.segments.is_empty() {
        return Ok((own_files(lake, runs), Vec::new()));
    }
    // one lookup per run a segment holds: each of `runs` is found by its position, so which of
    // them a segment covers is a flag, not a second set
    let wanted: hashbrown::HashMap<&str, usize> =
        runs.iter().enumerate().map(|(i, r)| (r.run_id.as_str(), i)).collect();
    let mut covered = vec![false; runs.len()];
    let mut segments = Vec::new();
    let mut excluded: Vec<String> = Vec::new();
    let mut others: Vec<&str> = Vec::new();
    for seg in &manifest.segments {
        let mut holds_any = false;
        others.clear();
        for r in &seg.runs {
            match wanted.get(r.as_str()) {
                Some(&i) => {
                    covered[i] = true;
                    holds_any = true;
                }
                None => others.push(r),
            }
        }
        if holds_any {
            excluded.extend(others.iter().map(|r| r.to_string()));
            segments.push(StoredRun::segment(lake, &contract.source, seg));
        }
    }
    excluded.sort();
    excluded.dedup();
    let rest: Vec<&RunRecord> = runs
        .iter()
        .zip(&covered)
        .filter(|(_, c)| !**c)
        .map(|(r, _)| *r)
        .collect();
    segments.extend(own_files(lake, &rest));
    Ok((segments, excluded))
}

/// One message per field whose stored values some runs cannot be read as, naming the runs:
/// `(field, message)`.
pub fn unreadable_runs<'a>(contract: &'a Contract, stored: &'a [StoredRun]) -> Vec<(&'a str, String)> {
    unreadable_by_field(
        contract,
        stored.iter().map(|s| (s.definition.as_deref(), s.run_id.as_str())),
    )
    .into_iter()
    .map(|((field, ty), runs)| (field, unreadable_message(contract, field, &ty, &runs)))
    .collect()
}

/// What [`unreadable_runs`] and [`check_readable`] say of `field`, stored as `ty` by `runs`.
fn unreadable_message(contract: &Contract, field: &str, ty: &str, runs: &[&str]) -> String {
    let f = contract.field_index(field).map(|i| &contract.fields[i]);
    format!(
        "{source}: field \"{field}\" is {now} in {path}, but run{s} {runs} stored it as {ty}, which cannot be \
         read as {now} without loss. Keep the type (or widen it: int32 to int64, a decimal's precision up), \
         or add `older_values: cast` to the field to read those runs with TRY_CAST (null where a value does \
         not convert)",
        source = contract.source,
        now = f.map(|f| f.ty.name()).unwrap_or_default(),
        path = contract.path.display(),
        s = if runs.len() > 1 { "s" } else { "" },
        runs = runs.join(", "),
    )
}

fn column(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

/// The rows of `stored` (runs of `contract`'s source) in `contract`'s bronze schema: one listing
/// table per distinct set of recorded fields, renamed and cast into the current columns, unioned.
pub fn read_stored(ctx: &SessionContext, contract: &Contract, stored: &[&StoredRun]) -> Result<DataFrame> {
    read_stored_with(ctx, contract, stored, None)
}

/// [`read_stored`] of segments, with their rows' slot column ([`crate::table::segments::SLOT`])
/// after the bronze columns.
pub fn read_segments_slotted(ctx: &SessionContext, contract: &Contract, stored: &[&StoredRun]) -> Result<DataFrame> {
    read_stored_with(ctx, contract, stored, Some(crate::table::segments::slot_field()))
}

fn read_stored_with(
    ctx: &SessionContext,
    contract: &Contract,
    stored: &[&StoredRun],
    extra: Option<ArrowField>,
) -> Result<DataFrame> {
    let mut schema = contract.bronze_schema();
    if let Some(f) = &extra {
        schema = crate::table::parquet::with_field(&schema, f.clone());
    }
    let mut groups: BTreeMap<Option<&str>, Vec<&StoredRun>> = BTreeMap::new();
    for s in stored {
        let key = if s.plain(contract) {
            None
        } else {
            s.definition.as_deref()
        };
        groups.entry(key).or_default().push(s);
    }
    let mut frames = Vec::new();
    for (key, runs) in &groups {
        let files: Vec<String> = runs.iter().map(|r| r.url.clone()).collect();
        let Some(first) = runs.first().filter(|_| key.is_some()) else {
            frames.push(ctx.read_table(table_over(files, schema.clone())?)?);
            continue;
        };
        let sources = first.sources(contract);
        let mut fields: Vec<ArrowField> = Vec::new();
        let mut select: Vec<Expr> = Vec::new();
        for (f, s) in contract.fields.iter().zip(&sources) {
            let ty = f.ty.arrow_type();
            match s {
                Some(p) => {
                    fields.push(ArrowField::new(&p.name, p.ty.arrow_type(), true));
                    let c = column(&p.name);
                    let read = if p.ty == f.ty {
                        c
                    } else if widens(p.ty, f.ty) {
                        cast(c, ty)
                    } else {
                        try_cast(c, ty)
                    };
                    select.push(read.alias(&f.name));
                }
                None => {
                    fields.push(ArrowField::new(&f.name, ty, true));
                    select.push(column(&f.name));
                }
            }
        }
        for m in crate::spec::columns::meta_fields().into_iter().chain(extra.clone()) {
            select.push(column(m.name()));
            fields.push(m);
        }
        let table = table_over(files, Arc::new(Schema::new(fields)))?;
        frames.push(ctx.read_table(table)?.select(select)?);
    }
    let mut frames = frames.into_iter();
    let Some(mut out) = frames.next() else {
        return Ok(ctx.read_table(table_over(Vec::new(), schema)?)?);
    };
    for f in frames {
        out = out.union(f)?;
    }
    Ok(out)
}
