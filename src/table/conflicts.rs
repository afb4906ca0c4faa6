//! `audit.source_conflict_log` (docs/formats.md#auditsource_conflict_log): per build, one row per
//! conflict the table holds after it (those of the records it kept are carried from the
//! previous build's file), with every candidate, the candidate set's hash and what was taken.
//! The file is the build's `conflicts.parquet`, committed by the build's record like its data.
//!
//! The candidate set hash (`candidate_set_hash`) is recomputable: SHA-256 of the UTF-8 text
//! `field + "\n"`, then per candidate in source-name order `source + "\n"` and, per column of
//! the field (a group's in its order), `"-\n"` for a null or `len + ":" + text + "\n"` (`text`
//! the canonical text of docs/formats.md#canonical-text, `len` its length in bytes).

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int32Array, ListBuilder, RecordBatch, StringArray, StringBuilder, StructBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::hash::fp::{Fp, fp_of_hex};
use crate::table::lake::{Lake, layout};

/// The name of a build's conflict file in its folder.
pub const FILE: &str = "conflicts.parquet";

/// The file of `build_id`'s conflicts.
pub fn file(table: &str, build_id: &str) -> String {
    layout::silver_file(table, build_id, FILE)
}

/// One candidate of a conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub source: String,
    pub run_id: String,
    pub row_hash: String,
    /// The field's canonical text (a group's as a JSON object of its columns' texts); `None`
    /// for a null.
    pub value: Option<String>,
}

/// One row of the conflict log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictRow {
    pub fingerprint: String,
    pub field: String,
    /// `listed` (a field of `conflicts.fields` whose values differ) or `tie` (candidates at the
    /// deciding rank differ).
    pub kind: String,
    pub candidates: Vec<Candidate>,
    pub candidate_set_hash: String,
    /// `open`, or `decided` (a decision applies).
    pub status: String,
    /// The source whose value silver took (none for a rejected record).
    pub taken_source: Option<String>,
    pub decision_id: Option<String>,
    /// A decision on an earlier candidate set of this field, which no longer applies.
    pub stale_decision_id: Option<String>,
    /// The build that first logged this candidate set of the field.
    pub first_build_id: String,
    /// The rules version of the build that found it (`None`: the build writing it, whose row
    /// carries that version); a conflict kept with its row keeps its version.
    pub rules_version: Option<i32>,
}

impl ConflictRow {
    pub fn key(&self) -> Option<Fp> {
        fp_of_hex(&self.fingerprint)
    }
}

/// The hash of a candidate set (see the module documentation): `candidates` as `(source,
/// texts)`, each text the canonical text of one column of the field or `None` for a null.
pub fn candidate_set_hash(field: &str, candidates: &mut [(String, Vec<Option<String>>)]) -> String {
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = Sha256::new();
    h.update(field.as_bytes());
    h.update(b"\n");
    for (source, texts) in candidates.iter() {
        h.update(source.as_bytes());
        h.update(b"\n");
        for t in texts {
            match t {
                None => h.update(b"-\n"),
                Some(t) => {
                    h.update(format!("{}:", t.len()).as_bytes());
                    h.update(t.as_bytes());
                    h.update(b"\n");
                }
            }
        }
    }
    let digest: [u8; 32] = h.finalize().into();
    let mut out = [0u8; 64];
    crate::hash::hex_lower(&digest, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn candidate_fields() -> Fields {
    Fields::from(vec![
        Field::new("source", DataType::Utf8, true),
        Field::new("ingestion_run_id", DataType::Utf8, true),
        Field::new("row_hash", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
    ])
}

/// The columns of `audit.source_conflict_log`.
pub fn log_schema() -> SchemaRef {
    let text = |n: &str, nullable: bool| Field::new(n, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        text("table", false),
        text("build_id", false),
        Field::new("rules_version", DataType::Int32, false),
        text("natural_key_fingerprint", false),
        text("field", false),
        text("kind", false),
        Field::new(
            "candidates",
            DataType::List(Arc::new(Field::new("item", DataType::Struct(candidate_fields()), true))),
            true,
        ),
        text("candidate_set_hash", false),
        text("on_conflict", false),
        text("status", false),
        text("taken_source", true),
        text("decision_id", true),
        text("stale_decision_id", true),
        text("first_build_id", false),
    ]))
}

/// Who wrote a conflict file: the build and its rules.
pub struct Stamp<'a> {
    pub table: &'a str,
    pub build_id: &'a str,
    pub rules_version: i32,
    pub on_conflict: &'a str,
}

/// `rows` as a batch of [`log_schema`].
pub fn batch(stamp: &Stamp<'_>, rows: &[ConflictRow]) -> Result<RecordBatch> {
    let n = rows.len();
    let repeat = |v: &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(std::iter::repeat_n(v, n))) };
    let text =
        |f: &dyn Fn(&ConflictRow) -> &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(rows.iter().map(f))) };
    let opt =
        |f: &dyn Fn(&ConflictRow) -> Option<&str>| -> ArrayRef { Arc::new(StringArray::from_iter(rows.iter().map(f))) };
    let mut list = ListBuilder::new(StructBuilder::from_fields(candidate_fields(), n))
        .with_field(Arc::new(Field::new("item", DataType::Struct(candidate_fields()), true)));
    for r in rows {
        let s = list.values();
        for c in &r.candidates {
            let builder = |s: &mut StructBuilder, i: usize, v: Option<&str>| {
                if let Some(b) = s.field_builder::<StringBuilder>(i) {
                    b.append_option(v);
                }
            };
            builder(s, 0, Some(&c.source));
            builder(s, 1, Some(&c.run_id));
            builder(s, 2, Some(&c.row_hash));
            builder(s, 3, c.value.as_deref());
            s.append(true);
        }
        list.append(true);
    }
    let cols: Vec<ArrayRef> = vec![
        repeat(stamp.table),
        repeat(stamp.build_id),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.rules_version.unwrap_or(stamp.rules_version)),
        )),
        text(&|r| &r.fingerprint),
        text(&|r| &r.field),
        text(&|r| &r.kind),
        Arc::new(list.finish()),
        text(&|r| &r.candidate_set_hash),
        repeat(stamp.on_conflict),
        text(&|r| &r.status),
        opt(&|r| r.taken_source.as_deref()),
        opt(&|r| r.decision_id.as_deref()),
        opt(&|r| r.stale_decision_id.as_deref()),
        text(&|r| &r.first_build_id),
    ];
    Ok(RecordBatch::try_new(log_schema(), cols)?)
}

/// The rows of a batch of [`log_schema`].
pub fn rows_of(b: &RecordBatch) -> Result<Vec<ConflictRow>> {
    let bad = |what: &str| Error::RunFailed(format!("conflict file: column {what} is missing or mistyped"));
    let text = |name: &str| -> Result<&StringArray> {
        b.column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| bad(name))
    };
    let opt = |a: &StringArray, i: usize| a.is_valid(i).then(|| a.value(i).to_string());
    let (fp, field, kind, hash, status) = (
        text("natural_key_fingerprint")?,
        text("field")?,
        text("kind")?,
        text("candidate_set_hash")?,
        text("status")?,
    );
    let (taken, decision, stale, first) = (
        text("taken_source")?,
        text("decision_id")?,
        text("stale_decision_id")?,
        text("first_build_id")?,
    );
    let version = b
        .column_by_name("rules_version")
        .and_then(|c| c.as_primitive_opt::<datafusion::arrow::datatypes::Int32Type>())
        .ok_or_else(|| bad("rules_version"))?;
    let list = b
        .column_by_name("candidates")
        .and_then(|c| c.as_list_opt::<i32>())
        .ok_or_else(|| bad("candidates"))?;
    let mut out = Vec::with_capacity(b.num_rows());
    for i in 0..b.num_rows() {
        let mut candidates = Vec::new();
        if list.is_valid(i) {
            let items = list.value(i);
            let s = items.as_struct_opt().ok_or_else(|| bad("candidates"))?;
            let col = |k: usize| -> Result<&StringArray> {
                s.column(k)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| bad("candidates"))
            };
            let (src, run, rh, val) = (col(0)?, col(1)?, col(2)?, col(3)?);
            for j in 0..s.len() {
                candidates.push(Candidate {
                    source: src.value(j).to_string(),
                    run_id: run.value(j).to_string(),
                    row_hash: rh.value(j).to_string(),
                    value: opt(val, j),
                });
            }
        }
        out.push(ConflictRow {
            fingerprint: fp.value(i).to_string(),
            field: field.value(i).to_string(),
            kind: kind.value(i).to_string(),
            candidates,
            candidate_set_hash: hash.value(i).to_string(),
            status: status.value(i).to_string(),
            taken_source: opt(taken, i),
            decision_id: opt(decision, i),
            stale_decision_id: opt(stale, i),
            first_build_id: first.value(i).to_string(),
            rules_version: Some(version.value(i)),
        });
    }
    Ok(out)
}

/// The conflicts of build `build_id` of `table` (none when it wrote no conflict file).
pub async fn read(lake: &Lake, table: &str, build_id: &str) -> Result<Vec<ConflictRow>> {
    let rel = file(table, build_id);
    let Some(bytes) = lake.get(&rel).await? else {
        return Ok(Vec::new());
    };
    let reader = datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| Error::RunFailed(format!("{}: {e}", lake.url(&rel))))?
        .build()
        .map_err(|e| Error::RunFailed(format!("{}: {e}", lake.url(&rel))))?;
    let mut out = Vec::new();
    for b in reader {
        let b = b.map_err(|e| Error::RunFailed(format!("{}: {e}", lake.url(&rel))))?;
        out.extend(rows_of(&b)?);
    }
    Ok(out)
}

/// Counts of a build's conflicts, for its record.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub open: u64,
    pub decided: u64,
    /// Decisions that no longer apply (a candidate changed) on the records the build processed.
    pub stale: u64,
}

impl Counts {
    pub fn add(&mut self, row: &ConflictRow) {
        match row.status.as_str() {
            "decided" => self.decided += 1,
            _ => self.open += 1,
        }
    }
}
