//! The survivorship pass ([`Pass`]) as a partition of the build's plan: the merged rows of the
//! records with several candidates come out while the rest of the plan runs (beside the part
//! writers of the records with one candidate), not in a phase of their own before it. What the
//! pass found (conflicts, stale decisions) is kept once its stream ends.
//!
//! The candidates come in any order and meet ([`Meet`]); a record is decided when its last one
//! arrives. A plan may run its input more than once (window anomalies read it before the
//! writers do): each run decides again, the same rows (the pass is deterministic), and the
//! first run that ends keeps what it found.
//!
//! Memory: the waiting candidates, and the sort that takes them when they do not fit, are held
//! in a pool of their own, a share of the build's reserved before the writers take theirs
//! (writers cannot spill: beside them a sort could be left nothing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{FairSpillPool, MemoryConsumer, MemoryLimit, MemoryReservation};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::SessionContext;
use futures::TryStreamExt;

use super::conflicts::ConflictRow;
use super::decisions::Decisions;
use super::meet::{Meet, SortRest};
use super::survive::{FirstSeen, Held, Pass};
use super::{RANK, SOURCE};
use crate::error::{Error, Result};
use crate::hash::fp::Fp;
use crate::silver::keys::Keys;
use crate::spec::columns::FINGERPRINT;
use crate::spec::rules::sources::Sources;
use crate::table::silver::c;

/// What a finished pass found.
pub struct Found {
    pub conflicts: Vec<ConflictRow>,
    /// Decisions that no longer apply to the records decided.
    pub stale: u64,
}

/// The candidates of the records with several and what their pass reads; see the module
/// documentation.
pub struct Survivors {
    input: DataFrame,
    /// The session the pass's memory and its sort run in (a pool of its own).
    own: SessionState,
    /// The build pool's share the sort's own pool stands for (held while the build runs).
    _share: MemoryReservation,
    keys: Arc<Keys>,
    src: Arc<Sources>,
    candidates: SchemaRef,
    merged: SchemaRef,
    decisions: Arc<Decisions>,
    held: Arc<HashMap<Fp, Held>>,
    first_seen: Arc<FirstSeen>,
    build_id: String,
    found: Mutex<Option<Found>>,
}

impl std::fmt::Debug for Survivors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Survivors").field("build_id", &self.build_id).finish()
    }
}

impl Survivors {
    /// `input`: the candidates of the records with several (in any order), `keys` counts them.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        input: DataFrame,
        keys: Arc<Keys>,
        src: Arc<Sources>,
        candidates: SchemaRef,
        decisions: Arc<Decisions>,
        held: Arc<HashMap<Fp, Held>>,
        first_seen: Arc<FirstSeen>,
        build_id: &str,
    ) -> Result<Arc<Survivors>> {
        let (own, share) = own_pool(input.clone().into_parts().0)?;
        Ok(Arc::new(Survivors {
            merged: super::merged_schema(&src),
            input,
            own,
            _share: share,
            keys,
            src,
            candidates,
            decisions,
            held,
            first_seen,
            build_id: build_id.to_string(),
            found: Mutex::new(None),
        }))
    }

    /// The merged rows ([`super::merged_schema`]), decided as the stream is read.
    pub fn stream(self: &Arc<Self>) -> SendableRecordBatchStream {
        let job = self.clone();
        let rows = futures::stream::once(async move {
            let pass = Pass::new(
                job.src.clone(),
                job.candidates.clone(),
                job.decisions.clone(),
                job.held.clone(),
                job.first_seen.clone(),
                &job.build_id,
            )?;
            // in this process, on a cluster too (docs/guide.md#several-sources): as a Ballista
            // job the survivorship sort did not finish
            let input = crate::engine::exec::stream(None, job.input.clone(), "build: survivorship").await?;
            let reservation = MemoryConsumer::new("silver survivorship")
                .with_can_spill(true)
                .register(&job.own.runtime_env().memory_pool);
            let keys = job.keys.clone();
            let want = Box::new(move |fp| keys.get(&fp).map_or(0, |e| keys.candidates(e)));
            let meet = Meet::new(pass, want, input, sort_rest(job.own.clone()), reservation, budget());
            Ok::<_, Error>(futures::stream::try_unfold(
                (meet, job, false),
                |(mut meet, job, done)| async move {
                    if done {
                        return Ok(None);
                    }
                    if let Some(out) = meet.next().await? {
                        return Ok(Some((out, (meet, job, false))));
                    }
                    if let Some(n) = meet.sorted {
                        crate::tell!(
                            "build: the candidates of the records with several sources did not fit in the \
                         survivorship's memory: {n} of them and the rest were sorted instead (raise \
                         --memory-limit to keep them in memory)"
                        );
                    }
                    let pass = meet.pass();
                    job.keep(Found {
                        conflicts: std::mem::take(&mut pass.conflicts),
                        stale: pass.counts.stale,
                    });
                    Ok(None)
                },
            ))
        })
        .try_flatten()
        .map_err(|e: Error| DataFusionError::External(Box::new(e)));
        Box::pin(RecordBatchStreamAdapter::new(self.merged.clone(), rows))
    }

    /// The merged rows as a table of one partition, for a plan in this process.
    pub fn table(self: &Arc<Self>) -> Result<Arc<dyn TableProvider>> {
        let part: Arc<dyn PartitionStream> = Arc::new(Partition(self.clone()));
        Ok(Arc::new(StreamingTable::try_new(self.merged.clone(), vec![part])?))
    }

    fn keep(&self, found: Found) {
        if let Ok(mut slot) = self.found.lock()
            && slot.is_none()
        {
            *slot = Some(found);
        }
    }

    /// What the first pass that ended found (taken), or an error if none ended.
    pub fn found(&self) -> Result<Found> {
        self.found
            .lock()
            .ok()
            .and_then(|mut slot| slot.take())
            .ok_or_else(|| Error::Internal("the survivorship pass of the build did not finish".into()))
    }
}

/// A quarter of the build's pool (halved while the pool has less free, down to 32 MiB, which it
/// takes even past the limit), reserved there, and `state` set to run in a pool of that size, a
/// quarter of it kept for merging what a sort spilled.
fn own_pool(mut state: SessionState) -> Result<(SessionState, MemoryReservation)> {
    const MIN: usize = 32 << 20;
    // one sort over the coalesced input, not one per partition and a merge: that merge's
    // memory cannot spill, and the sorts would have taken the pool
    state.config_mut().options_mut().optimizer.repartition_sorts = false;
    let runtime = state.runtime_env().clone();
    let pool = runtime.memory_pool.clone();
    let share = MemoryConsumer::new("silver survivorship share").register(&pool);
    let mut want = match pool.memory_limit() {
        MemoryLimit::Finite(limit) => (limit / 4).max(MIN),
        _ => 256 << 20,
    };
    while want > MIN && share.try_grow(want).is_err() {
        want /= 2;
    }
    if share.size() == 0 {
        share.grow(MIN);
    }
    let options = state.config_mut().options_mut();
    options.execution.sort_spill_reservation_bytes =
        options.execution.sort_spill_reservation_bytes.min(share.size() / 4);
    let own = RuntimeEnvBuilder::from_runtime_env(&runtime)
        .with_memory_pool(Arc::new(FairSpillPool::new(share.size())))
        .build_arc()?;
    let state = SessionStateBuilder::new_from_existing(state)
        .with_runtime_env(own)
        .build();
    Ok((state, share))
}

/// What the waiting candidates may hold besides the pool: `INGOT_SURVIVORSHIP_MEMORY` (e.g.
/// `64K`; tests use it to take the sort), else no more than the pool.
fn budget() -> usize {
    std::env::var("INGOT_SURVIVORSHIP_MEMORY")
        .ok()
        .and_then(|s| crate::engine::session::parse_size(&s).ok())
        .unwrap_or(usize::MAX)
}

/// The sort a [`Meet`] falls back to: candidates by key, rank and source name, in `own`.
pub(super) fn sort_rest(own: SessionState) -> SortRest {
    Box::new(move |rows: SendableRecordBatchStream| {
        Box::pin(async move {
            let schema = rows.schema();
            let part: Arc<dyn PartitionStream> = Arc::new(Once(Mutex::new(Some(rows)), schema.clone()));
            let table = StreamingTable::try_new(schema, vec![part])?;
            let sorted = SessionContext::new_with_state(own)
                .read_table(Arc::new(table))?
                .sort(vec![
                    // the 16-byte key sorts as the hex text does, compared without reading text
                    Arc::new(crate::hash::fp::fp128_udf())
                        .call(vec![c(FINGERPRINT)])
                        .sort(true, false),
                    c(RANK).sort(true, false),
                    c(SOURCE).sort(true, false),
                ])?;
            crate::engine::exec::stream(None, sorted, "build: survivorship sort").await
        })
    })
}

/// A stream as a partition read once.
struct Once(Mutex<Option<SendableRecordBatchStream>>, SchemaRef);

impl std::fmt::Debug for Once {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Once")
    }
}

impl PartitionStream for Once {
    fn schema(&self) -> &SchemaRef {
        &self.1
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        match self.0.lock().ok().and_then(|mut s| s.take()) {
            Some(s) => s,
            None => super::tee::failed(
                self.1.clone(),
                Error::Internal("the candidates of the survivorship sort were read twice".into()),
            ),
        }
    }
}

/// [`Survivors`] as the one partition of a [`StreamingTable`].
#[derive(Debug)]
struct Partition(Arc<Survivors>);

impl PartitionStream for Partition {
    fn schema(&self) -> &SchemaRef {
        &self.0.merged
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        self.0.stream()
    }
}
