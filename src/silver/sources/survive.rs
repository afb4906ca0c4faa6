//! Survivorship of the records with several candidates, over their candidates sorted by
//! fingerprint, rank and source name: one merged row per record ([`super::merged_schema`]) and
//! its conflicts ([`ConflictRow`]). Values are never copied one by one: each output column is
//! one `interleave` of the input columns at the winners' positions.
//!
//! Per field (or group), the candidates with a value are ordered by the field's rule:
//! `precedence` by (rank, `order_by` latest first, source name, `row_hash`), `most_recent` by
//! (its column latest first, rank, source name, `row_hash`), `only` takes its source. A
//! conflict is a field of `conflicts.fields` whose values differ, or (`same_precedence:
//! conflict`) candidates equal on rank and order column whose values differ. A decision whose
//! candidate set hash matches takes its source; `hold` takes the source that won the field in
//! the previous build.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListBuilder, RecordBatch, StringArray, StringBuilder, StructBuilder, new_null_array,
};
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::compute::{cast, interleave};
use datafusion::arrow::datatypes::{DataType, Int32Type, SchemaRef};
use datafusion::arrow::row::{RowConverter, Rows, SortField};

use super::conflicts::{Candidate, ConflictRow, Counts, candidate_set_hash};
use super::decisions::Decisions;
use super::{RANK, SOURCE};
use crate::error::{Error, Result};
use crate::hash::canonical::CanonicalColumn;
use crate::hash::fp::{Fp, for_each_fp};
use crate::spec::columns::{FINGERPRINT, meta_fields};
use crate::spec::rules::sources::{OnConflict, Rule, SamePrecedence, Sources, field_source_fields};

/// What the previous build took for a record: its first contributing source and the fields
/// another source gave (`field_sources`).
#[derive(Debug, Clone, Default)]
pub struct Held {
    pub primary: String,
    pub fields: Vec<(String, String)>,
}

impl Held {
    fn source_of(&self, field: &str) -> &str {
        self.fields
            .iter()
            .find(|(f, _)| f == field)
            .map_or(self.primary.as_str(), |(_, s)| s.as_str())
    }
}

/// How a unit is ordered.
enum Order {
    Precedence,
    MostRecent(usize),
    Only(String),
}

struct Unit {
    name: String,
    cols: Vec<usize>,
    order: Order,
    listed: bool,
}

/// One input batch with what the pass compares on.
struct Prepared {
    batch: RecordBatch,
    /// Per survivorship column: row-format encodings (equal values, equal bytes).
    eq: Vec<Rows>,
    /// Per order column: encodings that sort latest first, nulls last.
    order: Vec<Rows>,
    fps: Vec<Fp>,
    source: StringArray,
    rank: Vec<i32>,
    row_hash: StringArray,
    run: StringArray,
    /// The candidate's `resolve` rejection (rule, reason), null when it resolved.
    reject_rule: StringArray,
    reject_reason: StringArray,
}

/// A candidate: (prepared batch, row).
pub(super) type At = (usize, usize);

/// The survivorship pass; see the module documentation.
pub struct Pass {
    src: Arc<Sources>,
    schema: SchemaRef,
    out_schema: SchemaRef,
    units: Vec<Unit>,
    order_cols: Vec<usize>,
    order_by: Option<usize>,
    eq_conv: Vec<RowConverter>,
    order_conv: Vec<RowConverter>,
    decisions: Arc<Decisions>,
    held: Arc<HashMap<Fp, Held>>,
    /// First build of the candidate sets the previous build logged, by (record, field, hash).
    first_seen: Arc<FirstSeen>,
    build_id: String,
    /// The batches candidates are read from (0: the null row); a slot whose candidates were all
    /// decided and flushed holds the null row again ([`Pass::release`]).
    live: Vec<Arc<Prepared>>,
    /// The merged rows decided since the last [`Pass::flush`].
    rows: Vec<Merged>,
    /// Their candidates ([`Merged::members`]).
    members: Vec<At>,
    /// Per merged row and survivorship column, the candidate its value comes from (`None`:
    /// null): row `k`'s are `froms[k * width..][..width]`.
    froms: Vec<Option<At>>,
    /// A unit's candidates with a value (reused from record to record).
    scratch: Vec<At>,
    pub counts: Counts,
    pub conflicts: Vec<ConflictRow>,
}

/// The merged row of one record, besides the picked columns ([`Pass::froms`]).
struct Merged {
    /// Its candidates in [`Pass::members`], in rank and source order.
    members: std::ops::Range<usize>,
    primary: At,
    /// The units (by index) another source than the primary one won, and their winners.
    field_sources: Vec<(usize, At)>,
    /// The units (by index) in open conflict.
    conflict_fields: Vec<usize>,
    reject: Option<String>,
    /// A candidate's `resolve` rejection, which rejects the record (rule, reason).
    rejected_by: Option<(String, String)>,
}

/// The first build of each candidate set a build logged, by (record, field, candidate set hash).
pub type FirstSeen = HashMap<(Fp, String, String), String>;

impl Pass {
    pub fn new(
        src: Arc<Sources>,
        schema: SchemaRef,
        decisions: Arc<Decisions>,
        held: Arc<HashMap<Fp, Held>>,
        first_seen: Arc<FirstSeen>,
        build_id: &str,
    ) -> Result<Pass> {
        let index = |name: &str| -> Result<usize> { Ok(schema.index_of(name)?) };
        let mut order_cols: Vec<usize> = Vec::new();
        let mut order_slot = |col: usize| -> usize {
            match order_cols.iter().position(|c| *c == col) {
                Some(i) => i,
                None => {
                    order_cols.push(col);
                    order_cols.len() - 1
                }
            }
        };
        let order_by = match &src.survivorship.order_by {
            Some(o) => Some(order_slot(index(o)?)),
            None => None,
        };
        let mut units = Vec::new();
        for (name, cols) in src.units() {
            let order = match src.rule_of(&name) {
                Rule::Precedence => Order::Precedence,
                Rule::MostRecent(col) => Order::MostRecent(order_slot(index(col)?)),
                Rule::Only(s) => Order::Only(s.clone()),
            };
            units.push(Unit {
                listed: src.conflicts.fields.contains(&name),
                cols: cols.iter().map(|c| index(c)).collect::<Result<_>>()?,
                name,
                order,
            });
        }
        let field = |i: usize| schema.field(i).data_type().clone();
        let eq_conv = (0..src.columns.len())
            .map(|i| RowConverter::new(vec![SortField::new(field(i))]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let latest_first = SortOptions {
            descending: true,
            nulls_first: false,
        };
        let order_conv = order_cols
            .iter()
            .map(|i| RowConverter::new(vec![SortField::new_with_options(field(*i), latest_first)]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let out_schema = super::merged_schema(&src);
        let mut pass = Pass {
            src,
            schema: schema.clone(),
            out_schema,
            units,
            order_cols,
            order_by,
            eq_conv,
            order_conv,
            decisions,
            held,
            first_seen,
            build_id: build_id.to_string(),
            live: Vec::new(),
            rows: Vec::new(),
            members: Vec::new(),
            froms: Vec::new(),
            scratch: Vec::new(),
            counts: Counts::default(),
            conflicts: Vec::new(),
        };
        // batch 0: one all-null row, the source of a null no candidate gives
        let nulls: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), 1))
            .collect();
        let null_batch = RecordBatch::try_new(schema, nulls)?;
        let p = pass.prepare(null_batch, true)?;
        pass.live.push(Arc::new(p));
        Ok(pass)
    }

    fn prepare(&self, batch: RecordBatch, null_row: bool) -> Result<Prepared> {
        let text = |name: &str| -> Result<StringArray> {
            let col = batch.column(self.schema.index_of(name)?);
            Ok(cast(col, &DataType::Utf8)?.as_string::<i32>().clone())
        };
        let mut fps = Vec::with_capacity(batch.num_rows());
        if !null_row {
            let fp_col = batch.column(self.schema.index_of(FINGERPRINT)?);
            let mut missing = false;
            for_each_fp(fp_col, |_, fp| match fp {
                Some(fp) => fps.push(fp),
                None => missing = true,
            })?;
            if missing {
                return Err(Error::RunFailed(format!("a candidate without {FINGERPRINT}")));
            }
        }
        let rank_col = cast(batch.column(self.schema.index_of(RANK)?), &DataType::Int32)?;
        let rank = rank_col
            .as_primitive::<Int32Type>()
            .iter()
            .map(|r| r.unwrap_or(i32::MAX))
            .collect();
        let eq = (0..self.src.columns.len())
            .map(|i| self.eq_conv[i].convert_columns(&[batch.column(i).clone()]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let order = self
            .order_cols
            .iter()
            .zip(&self.order_conv)
            .map(|(i, conv)| conv.convert_columns(&[batch.column(*i).clone()]))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Prepared {
            source: text(SOURCE)?,
            row_hash: text("row_hash")?,
            run: text("ingestion_run_id")?,
            reject_rule: text(super::CAND_RULE)?,
            reject_reason: text(super::CAND_REASON)?,
            rank,
            fps,
            eq,
            order,
            batch,
        })
    }

    /// Feed one sorted batch; returns the merged rows of the records it completed.
    pub fn push(&mut self, batch: RecordBatch, pending: &mut Vec<At>) -> Result<Option<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        let b = self.add(batch)?;
        for r in 0..self.live[b].batch.num_rows() {
            if let Some(&first) = pending.first()
                && self.fp(first) != self.live[b].fps[r]
            {
                self.decide(pending)?;
                pending.clear();
            }
            pending.push((b, r));
        }
        let out = self.flush()?;
        self.retain(pending);
        Ok(out)
    }

    /// The last record's merged row.
    pub fn finish(&mut self, pending: &mut Vec<At>) -> Result<Option<RecordBatch>> {
        if !pending.is_empty() {
            self.decide(pending)?;
            pending.clear();
        }
        self.flush()
    }

    /// Prepare `batch` (candidates in any order) and keep it: its index in [`Pass::live`].
    pub(super) fn add(&mut self, batch: RecordBatch) -> Result<usize> {
        let p = self.prepare(batch, false)?;
        self.live.push(Arc::new(p));
        Ok(self.live.len() - 1)
    }

    pub(super) fn rows_in(&self, b: usize) -> usize {
        self.live[b].batch.num_rows()
    }

    /// Bytes batch `b` holds (its columns and what the pass made of them).
    pub(super) fn size_of(&self, b: usize) -> usize {
        let p = &self.live[b];
        p.batch.get_array_memory_size()
            + p.eq.iter().chain(&p.order).map(Rows::size).sum::<usize>()
            + p.fps.capacity() * std::mem::size_of::<Fp>()
            + p.rank.capacity() * std::mem::size_of::<i32>()
    }

    /// Batch `b` is no longer read (its candidates decided, their rows flushed).
    pub(super) fn release(&mut self, b: usize) {
        if b != 0 {
            self.live[b] = self.live[0].clone();
        }
    }

    /// Order a record's candidates as the sorted input has them: by rank, then source name.
    pub(super) fn order_group(&self, group: &mut [At]) {
        group.sort_by(|a, b| {
            self.rank(*a)
                .cmp(&self.rank(*b))
                .then_with(|| self.source(*a).cmp(self.source(*b)))
        });
    }

    /// The candidates at `ats` copied into batches of `schema` (at most `size` rows each), the
    /// live batches given up (only the null row stays): call after a flush.
    pub(super) fn take_out(&mut self, ats: &[At], schema: &SchemaRef, size: usize) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for chunk in ats.chunks(size.max(1)) {
            let mut cols = Vec::with_capacity(schema.fields().len());
            for c in 0..schema.fields().len() {
                let arrays: Vec<&dyn Array> = self.live.iter().map(|p| p.batch.column(c).as_ref()).collect();
                cols.push(interleave(&arrays, chunk)?);
            }
            out.push(RecordBatch::try_new(schema.clone(), cols)?);
        }
        self.live.truncate(1);
        Ok(out)
    }

    pub(super) fn fp(&self, at: At) -> Fp {
        self.live[at.0].fps[at.1]
    }

    fn has_value(&self, unit: &Unit, at: At) -> bool {
        let b = &self.live[at.0].batch;
        unit.cols.iter().any(|c| b.column(*c).is_valid(at.1))
    }

    fn same_values(&self, unit: &Unit, a: At, b: At) -> bool {
        unit.cols
            .iter()
            .all(|c| self.live[a.0].eq[*c].row(a.1) == self.live[b.0].eq[*c].row(b.1))
    }

    fn rank(&self, at: At) -> i32 {
        self.live[at.0].rank[at.1]
    }

    fn source(&self, at: At) -> &str {
        self.live[at.0].source.value(at.1)
    }

    fn order_key(&self, slot: usize, at: At) -> datafusion::arrow::row::Row<'_> {
        self.live[at.0].order[slot].row(at.1)
    }

    /// The deciding part of the order (rank and order column): equal means a tie.
    fn deciding(&self, order: &Order, a: At, b: At) -> Ordering {
        let by_order = |slot: Option<usize>| match slot {
            Some(s) => self.order_key(s, a).cmp(&self.order_key(s, b)),
            None => Ordering::Equal,
        };
        match order {
            Order::Precedence => self.rank(a).cmp(&self.rank(b)).then_with(|| by_order(self.order_by)),
            Order::MostRecent(s) => by_order(Some(*s)).then_with(|| self.rank(a).cmp(&self.rank(b))),
            Order::Only(_) => Ordering::Equal,
        }
    }

    fn full_order(&self, order: &Order, a: At, b: At) -> Ordering {
        self.deciding(order, a, b)
            .then_with(|| self.source(a).cmp(self.source(b)))
            .then_with(|| {
                self.live[a.0]
                    .row_hash
                    .value(a.1)
                    .cmp(self.live[b.0].row_hash.value(b.1))
            })
    }

    /// The canonical texts of `unit`'s columns at `at` (`None`: null).
    fn texts(&self, unit: &Unit, at: At) -> Result<Vec<Option<String>>> {
        let b = &self.live[at.0].batch;
        let mut buf = Vec::new();
        let mut out = Vec::with_capacity(unit.cols.len());
        for c in &unit.cols {
            buf.clear();
            let col = CanonicalColumn::new(b.column(*c).as_ref())?;
            out.push(
                col.write(at.1, &mut buf)
                    .then(|| String::from_utf8_lossy(&buf).into_owned()),
            );
        }
        Ok(out)
    }

    /// The conflict log's value of `unit` at `at`.
    fn value_text(&self, unit: &Unit, texts: &[Option<String>]) -> Option<String> {
        if unit.cols.len() == 1 {
            return texts[0].clone();
        }
        let mut obj = serde_json::Map::new();
        for (c, t) in unit.cols.iter().zip(texts) {
            let v = t.clone().map_or(serde_json::Value::Null, serde_json::Value::String);
            obj.insert(self.schema.field(*c).name().clone(), v);
        }
        Some(serde_json::Value::Object(obj).to_string())
    }

    /// Decide one record from its candidates (sorted by rank, then source name).
    pub(super) fn decide(&mut self, group: &[At]) -> Result<()> {
        let primary = group[0];
        let fp = self.fp(primary);
        let on_conflict = self.src.conflicts.on_conflict;
        let from_at = self.froms.len();
        self.froms.resize(from_at + self.src.columns.len(), None);
        let mut field_sources = Vec::new();
        let mut conflict_fields = Vec::new();
        let mut new_conflicts: Vec<ConflictRow> = Vec::new();
        let units = std::mem::take(&mut self.units);
        let mut with = std::mem::take(&mut self.scratch);
        for (u, unit) in units.iter().enumerate() {
            with.clear();
            with.extend(group.iter().copied().filter(|a| self.has_value(unit, *a)));
            if let Order::Only(s) = &unit.order {
                with.retain(|a| self.source(*a) == s);
            }
            with.sort_by(|a, b| self.full_order(&unit.order, *a, *b));
            let mut winner = with.first().copied();
            let differs = |set: &[At]| set.windows(2).any(|w| !self.same_values(unit, w[0], w[1]));
            // the candidates tied with the winner: a prefix of the sorted ones
            let tied = match winner {
                Some(w) => with
                    .iter()
                    .take_while(|a| self.deciding(&unit.order, w, **a) == Ordering::Equal)
                    .count(),
                None => 0,
            };
            let tie = !matches!(unit.order, Order::Only(_))
                && self.src.conflicts.same_precedence == SamePrecedence::Conflict
                && differs(&with[..tied]);
            let listed = unit.listed && differs(&with);
            let decision = self.decisions.get(fp, &unit.name);
            if tie || listed {
                let mut set = Vec::with_capacity(group.len());
                let mut candidates = Vec::with_capacity(group.len());
                for a in group {
                    let texts = self.texts(unit, *a)?;
                    candidates.push(Candidate {
                        source: self.source(*a).to_string(),
                        run_id: self.live[a.0].run.value(a.1).to_string(),
                        row_hash: self.live[a.0].row_hash.value(a.1).to_string(),
                        value: self.value_text(unit, &texts),
                    });
                    set.push((self.source(*a).to_string(), texts));
                }
                candidates.sort_by(|a, b| a.source.cmp(&b.source));
                let hash = candidate_set_hash(&unit.name, &mut set);
                let taken = decision.filter(|d| d.candidate_set_hash == hash).and_then(|d| {
                    group
                        .iter()
                        .copied()
                        .find(|a| self.source(*a) == d.take)
                        .map(|a| (d, a))
                });
                let (status, decision_id, stale) = match (taken, decision) {
                    (Some((d, at)), _) => {
                        winner = Some(at);
                        ("decided", Some(d.decision_id.clone()), None)
                    }
                    (None, d) => {
                        if d.is_some() {
                            self.counts.stale += 1;
                        }
                        conflict_fields.push(u);
                        if on_conflict == OnConflict::Hold
                            && let Some(h) = self.held.get(&fp)
                            && let Some(at) = with
                                .iter()
                                .copied()
                                .find(|a| self.source(*a) == h.source_of(&unit.name))
                        {
                            winner = Some(at);
                        }
                        ("open", None, d.map(|d| d.decision_id.clone()))
                    }
                };
                let first = self
                    .first_seen
                    .get(&(fp, unit.name.clone(), hash.clone()))
                    .cloned()
                    .unwrap_or_else(|| self.build_id.clone());
                let rejected = status == "open" && matches!(on_conflict, OnConflict::Reject | OnConflict::Fail);
                let hex = self.live[primary.0]
                    .batch
                    .column(self.schema.index_of(FINGERPRINT)?)
                    .as_string_opt::<i32>()
                    .map(|a| a.value(primary.1).to_string())
                    .unwrap_or_default();
                new_conflicts.push(ConflictRow {
                    fingerprint: hex,
                    field: unit.name.clone(),
                    kind: if listed { "listed" } else { "tie" }.into(),
                    candidates,
                    candidate_set_hash: hash,
                    status: status.into(),
                    taken_source: (!rejected)
                        .then(|| winner.map(|w| self.source(w).to_string()))
                        .flatten(),
                    decision_id,
                    stale_decision_id: stale,
                    first_build_id: first,
                    rules_version: None,
                });
            } else if decision.is_some() {
                // decided, but the candidates no longer conflict: the decision is moot
                self.counts.stale += 1;
            }
            if let Some(w) = winner
                && self.source(w) != self.source(primary)
            {
                field_sources.push((u, w));
            }
            for c in &unit.cols {
                self.froms[from_at + *c] = winner;
            }
        }
        self.scratch = with;
        let reject = (!conflict_fields.is_empty() && matches!(on_conflict, OnConflict::Reject | OnConflict::Fail))
            .then(|| {
                let names: Vec<String> = conflict_fields.iter().map(|u| units[*u].name.clone()).collect();
                self.reject_reason(&names, &new_conflicts)
            });
        self.units = units;
        for c in &new_conflicts {
            self.counts.add(c);
        }
        self.conflicts.extend(new_conflicts);
        let rejected_by = group.iter().find_map(|a| {
            let p = &self.live[a.0];
            p.reject_rule.is_valid(a.1).then(|| {
                (
                    p.reject_rule.value(a.1).to_string(),
                    p.reject_reason.value(a.1).to_string(),
                )
            })
        });
        let start = self.members.len();
        self.members.extend_from_slice(group);
        self.rows.push(Merged {
            rejected_by,
            members: start..self.members.len(),
            primary,
            field_sources,
            conflict_fields,
            reject,
        });
        Ok(())
    }

    fn reject_reason(&self, fields: &[String], rows: &[ConflictRow]) -> String {
        let detail: Vec<String> = rows
            .iter()
            .filter(|r| r.status == "open")
            .map(|r| {
                let values: Vec<String> = r
                    .candidates
                    .iter()
                    .map(|c| format!("{} {}", c.source, c.value.as_deref().unwrap_or("null")))
                    .collect();
                format!("{}: {}", r.field, values.join(" vs "))
            })
            .collect();
        format!(
            "conflicting values across sources in {} ({}); see audit.source_conflict_log, decide with `ingot resolve`",
            fields.join(", "),
            detail.join("; ")
        )
    }

    /// The merged rows decided since the last flush.
    pub(super) fn flush(&mut self) -> Result<Option<RecordBatch>> {
        if self.rows.is_empty() {
            return Ok(None);
        }
        let rows = std::mem::take(&mut self.rows);
        let n_data = self.src.columns.len();
        let (members, froms) = (std::mem::take(&mut self.members), std::mem::take(&mut self.froms));
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(self.out_schema.fields().len());
        let column_of = |c: usize, picks: &[At]| -> Result<ArrayRef> {
            let arrays: Vec<&dyn Array> = self.live.iter().map(|p| p.batch.column(c).as_ref()).collect();
            Ok(interleave(&arrays, picks)?)
        };
        for c in 0..n_data {
            let picks: Vec<At> = (0..rows.len())
                .map(|k| froms[k * n_data + c].unwrap_or((0, 0)))
                .collect();
            cols.push(column_of(c, &picks)?);
        }
        let mut contributing = ListBuilder::new(StringBuilder::new());
        let mut fields =
            ListBuilder::new(StructBuilder::from_fields(field_source_fields(), rows.len())).with_field(Arc::new(
                datafusion::arrow::datatypes::Field::new("item", DataType::Struct(field_source_fields()), true),
            ));
        let mut conflict_fields = ListBuilder::new(StringBuilder::new());
        let mut state_run = StringBuilder::with_capacity(rows.len(), rows.len() * 40);
        let mut by_name: Vec<At> = Vec::new();
        let mut id = String::new();
        for m in &rows {
            let group = &members[m.members.clone()];
            for a in group {
                contributing.values().append_value(self.source(*a));
            }
            contributing.append(true);
            // the record's version: its candidates' runs in source-name order, joined by `+`
            by_name.clear();
            by_name.extend_from_slice(group);
            by_name.sort_by(|a, b| self.source(*a).cmp(self.source(*b)));
            id.clear();
            for a in &by_name {
                if !id.is_empty() {
                    id.push('+');
                }
                id.push_str(self.live[a.0].run.value(a.1));
            }
            state_run.append_value(&id);
            for (u, w) in &m.field_sources {
                let entry = fields.values();
                for (i, v) in [self.units[*u].name.as_str(), self.source(*w)].into_iter().enumerate() {
                    if let Some(b) = entry.field_builder::<StringBuilder>(i) {
                        b.append_value(v);
                    }
                }
                entry.append(true);
            }
            fields.append(true);
            for u in &m.conflict_fields {
                conflict_fields.values().append_value(&self.units[*u].name);
            }
            conflict_fields.append(!m.conflict_fields.is_empty());
        }
        cols.push(Arc::new(contributing.finish()));
        cols.push(Arc::new(fields.finish()));
        cols.push(Arc::new(conflict_fields.finish()));
        let primaries: Vec<At> = rows.iter().map(|m| m.primary).collect();
        for k in 0..meta_fields().len() {
            cols.push(column_of(n_data + k, &primaries)?);
        }
        cols.push(Arc::new(state_run.finish()));
        cols.push(Arc::new(StringArray::from_iter(
            rows.iter().map(|m| m.reject.as_deref()),
        )));
        let by = |f: fn(&(String, String)) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter(
                rows.iter().map(|m| m.rejected_by.as_ref().map(f)),
            ))
        };
        cols.push(by(|r| r.0.as_str()));
        cols.push(by(|r| r.1.as_str()));
        let mut fixed = Vec::with_capacity(cols.len());
        for (a, f) in cols.into_iter().zip(self.out_schema.fields()) {
            fixed.push(if a.data_type() == f.data_type() {
                a
            } else {
                cast(&a, f.data_type())?
            });
        }
        Ok(Some(RecordBatch::try_new(self.out_schema.clone(), fixed)?))
    }

    /// Keep the batches the pending record's candidates are in (and the null row); renumber.
    fn retain(&mut self, pending: &mut [At]) {
        let keep: Vec<usize> = {
            let mut k: Vec<usize> = pending.iter().map(|a| a.0).collect();
            k.sort_unstable();
            k.dedup();
            k
        };
        let old = std::mem::take(&mut self.live);
        let mut map = HashMap::new();
        for (i, p) in old.into_iter().enumerate() {
            if i == 0 || keep.contains(&i) {
                map.insert(i, self.live.len());
                self.live.push(p);
            }
        }
        for a in pending.iter_mut() {
            a.0 = map.get(&a.0).copied().unwrap_or(0);
        }
    }
}
