//! The survivorship pass ([`Pass`]) as a partition of the build's plan: the merged rows of the
//! records with several candidates come out while the rest of the plan runs (beside the part
//! writers of the records with one candidate), not in a phase of their own before it. What the
//! pass found (conflicts, stale decisions) is kept once its stream ends.
//!
//! A plan may run its input more than once (window anomalies read it before the writers do):
//! each run sorts and decides again, the same rows (the pass is deterministic), and the first
//! run that ends keeps what it found.
//!
//! Memory: the sort runs in a pool of its own, a share of the build's reserved before the
//! writers take theirs (writers cannot spill: beside them a sort could be left nothing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{FairSpillPool, MemoryConsumer, MemoryLimit, MemoryReservation};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::{StreamExt, TryStreamExt};

use super::conflicts::ConflictRow;
use super::decisions::Decisions;
use super::survive::{FirstSeen, Held, Pass};
use crate::error::{Error, Result};
use crate::hash::fp::Fp;
use crate::spec::rules::sources::Sources;

/// What a finished pass found.
pub struct Found {
    pub conflicts: Vec<ConflictRow>,
    /// Decisions that no longer apply to the records decided.
    pub stale: u64,
}

/// The candidates of the records with several (sorted by key, rank and source) and what their
/// pass reads; see the module documentation.
pub struct Survivors {
    sorted: DataFrame,
    /// The build pool's share the sort's own pool stands for (held while the build runs).
    _share: MemoryReservation,
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
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sorted: DataFrame,
        src: Arc<Sources>,
        candidates: SchemaRef,
        decisions: Arc<Decisions>,
        held: Arc<HashMap<Fp, Held>>,
        first_seen: Arc<FirstSeen>,
        build_id: &str,
    ) -> Result<Arc<Survivors>> {
        let (sorted, share) = own_pool(sorted)?;
        Ok(Arc::new(Survivors {
            merged: super::merged_schema(&src),
            sorted,
            _share: share,
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
            // job this sort did not finish
            let input = crate::engine::exec::stream(None, job.sorted.clone(), "build: survivorship").await?;
            Ok::<_, Error>(futures::stream::try_unfold(
                (input, pass, Vec::new(), false, job),
                |(mut input, mut pass, mut pending, done, job)| async move {
                    if done {
                        return Ok(None);
                    }
                    while let Some(b) = input.next().await {
                        if let Some(out) = pass.push(b?, &mut pending)? {
                            return Ok(Some((out, (input, pass, pending, false, job))));
                        }
                    }
                    let last = pass.finish(&mut pending)?;
                    job.keep(Found {
                        conflicts: std::mem::take(&mut pass.conflicts),
                        stale: pass.counts.stale,
                    });
                    Ok(last.map(|out| (out, (input, pass, pending, true, job))))
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
/// takes even past the limit), reserved there, and `df` set to run in a pool of that size, a
/// quarter of it kept for merging what the sort spilled.
fn own_pool(df: DataFrame) -> Result<(DataFrame, MemoryReservation)> {
    const MIN: usize = 32 << 20;
    let (mut state, plan) = df.into_parts();
    // one sort over the coalesced input, not one per partition and a merge: that merge's
    // memory cannot spill, and the sorts would have taken the pool
    state.config_mut().options_mut().optimizer.repartition_sorts = false;
    let runtime = state.runtime_env().clone();
    let pool = runtime.memory_pool.clone();
    let share = MemoryConsumer::new("silver survivorship sort").register(&pool);
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
    Ok((DataFrame::new(state, plan), share))
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
