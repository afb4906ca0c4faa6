//! `audit.source_conflict_decision_log`: a person's decision on one conflict (`ingot resolve`, for a table fed by several sources),
//! committed like a build record into its table's log folder, and withdrawn (`ingot undo <id>`)
//! by a copy with `withdrawn_at` set in a later slot. A build applies a decision only while the
//! conflict's candidate set hash is the one decided on; otherwise it is stale and the conflict
//! is open again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::Result;
use crate::hash::fp::{Fp, fp_of_hex};
use crate::spec::columns::timestamp_type;
use crate::table::audit::{opt_ts_array, str_array, ts_array};
use crate::table::lake::Lake;
use crate::table::log::{LogColumns, Record, read_checkpointed};

/// The log's folder (one subfolder per table).
pub const DIR: &str = "audit/source_conflict_decision_log";

/// One decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRecord {
    pub decision_id: String,
    pub table: String,
    pub fingerprint: String,
    /// The field (or group) decided.
    pub field: String,
    /// The source whose value the field takes.
    pub take: String,
    /// The candidate set decided on.
    pub candidate_set_hash: String,
    pub reason: String,
    pub decided_by: String,
    pub decided_at: i64,
    pub withdrawn_at: Option<i64>,
    /// Its slot in the table's folder.
    pub seq: u64,
}

pub fn log_schema() -> SchemaRef {
    let text = |n: &str| Field::new(n, DataType::Utf8, false);
    Arc::new(Schema::new(vec![
        text("decision_id"),
        text("table"),
        text("natural_key_fingerprint"),
        text("field"),
        text("take_source"),
        text("candidate_set_hash"),
        text("reason"),
        text("decided_by"),
        Field::new("decided_at", timestamp_type(), false),
        Field::new("withdrawn_at", timestamp_type(), true),
    ]))
}

impl Record for DecisionRecord {
    const DIR: &'static str = DIR;
    const LOG: &'static str = "conflict decision log";

    fn schema() -> SchemaRef {
        log_schema()
    }

    fn parse(c: &LogColumns<'_>) -> Result<Vec<Self>> {
        let mut out = Vec::with_capacity(c.batch.num_rows());
        for r in 0..c.batch.num_rows() {
            out.push(DecisionRecord {
                decision_id: c.text("decision_id", r)?,
                table: c.text("table", r)?,
                fingerprint: c.text("natural_key_fingerprint", r)?,
                field: c.text("field", r)?,
                take: c.text("take_source", r)?,
                candidate_set_hash: c.text("candidate_set_hash", r)?,
                reason: c.text("reason", r)?,
                decided_by: c.text("decided_by", r)?,
                decided_at: c.ts("decided_at")?.value(r),
                withdrawn_at: c.opt_ts("withdrawn_at", r)?,
                seq: 0,
            });
        }
        Ok(out)
    }

    fn to_batch(&self) -> Result<RecordBatch> {
        let cols: Vec<ArrayRef> = vec![
            str_array(Some(&self.decision_id)),
            str_array(Some(&self.table)),
            str_array(Some(&self.fingerprint)),
            str_array(Some(&self.field)),
            str_array(Some(&self.take)),
            str_array(Some(&self.candidate_set_hash)),
            str_array(Some(&self.reason)),
            str_array(Some(&self.decided_by)),
            ts_array(self.decided_at),
            opt_ts_array(self.withdrawn_at),
        ];
        Ok(RecordBatch::try_new(log_schema(), cols)?)
    }

    fn id(&self) -> &str {
        &self.decision_id
    }

    fn seq(&self) -> u64 {
        self.seq
    }

    fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }
}

/// Every decision record of `table` (withdrawn ones included), in slot order.
pub async fn read_decisions(lake: &Lake, table: &str) -> Result<Vec<DecisionRecord>> {
    let mut all = read_checkpointed::<DecisionRecord>(lake, table).await?.records;
    all.retain(|d| d.table == table);
    Ok(all)
}

/// The decisions in force (not withdrawn), by record and field; the latest wins when a field
/// was decided twice.
#[derive(Debug, Default, Clone)]
pub struct Decisions {
    pub by_key: HashMap<(Fp, String), DecisionRecord>,
    /// The records decided (a lookup of a field asks here first, without making a key).
    decided: HashSet<Fp>,
}

impl Decisions {
    pub fn of(records: &[DecisionRecord]) -> Decisions {
        let mut by_key = HashMap::new();
        for d in records.iter().filter(|d| d.withdrawn_at.is_none()) {
            if let Some(fp) = fp_of_hex(&d.fingerprint) {
                by_key.insert((fp, d.field.clone()), d.clone());
            }
        }
        let decided = by_key.keys().map(|(fp, _)| *fp).collect();
        Decisions { by_key, decided }
    }

    pub fn get(&self, fp: Fp, field: &str) -> Option<&DecisionRecord> {
        if !self.decided.contains(&fp) {
            return None;
        }
        self.by_key.get(&(fp, field.to_string()))
    }

    /// The ids in force, sorted (what a build records it applied).
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.by_key.values().map(|d| d.decision_id.clone()).collect();
        ids.sort();
        ids
    }
}

/// Commit `record` into its table's slot `record.seq`, create-if-absent (a later record there
/// means another decision or withdrawal committed meanwhile: run the command again).
pub async fn commit_decision(lake: &Lake, record: &DecisionRecord, failpoint: &str) -> Result<u64> {
    crate::table::commit::put_committed(lake, &record.table, record, failpoint, || {
        format!(
            "another decision on silver.{} committed while decision {} was being recorded; nothing was \
             recorded: run the same command again",
            record.table, record.decision_id
        )
    })
    .await
}

/// The next slot of `table`'s decision log.
pub fn next_seq(records: &[DecisionRecord]) -> u64 {
    records.iter().map(|d| d.seq).max().unwrap_or(0) + 1
}
