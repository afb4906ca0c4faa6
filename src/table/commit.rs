//! The commit of a run or a build: its record put create-if-absent into the next slot of its
//! log ([`crate::table::log`]), a checkpoint when one is due, then the Delta tables that follow
//! the log ([`crate::table::delta`]). A put that finds its slot taken publishes nothing.

use crate::error::{Error, Result};
use crate::spec::contract::Contract;
use crate::table::audit::{BuildRecord, RunRecord};
use crate::table::lake::Lake;
use crate::table::log::{Record, checkpoint_after, put_record};
use crate::table::parquet::parquet_bytes;

/// Commit a run: its record goes into the source's slot `record.seq`, create-if-absent (or the
/// next slot past objects no reader can parse); the slot taken is returned. If the slot is taken
/// by a record, another run of the source committed since this one started: nothing of this run
/// is published. `contract`: the source's, which bronze's Delta table is published under.
pub async fn commit_run(lake: &Lake, record: &RunRecord, contract: Option<&Contract>) -> Result<u64> {
    commit_run_record(lake, record, None, "ingest.before_commit", contract).await
}

/// [`commit_run`] of a record superseding `previous` (an undo, publish or discard), with the
/// failpoint hit before the put; then the Delta tables follow ([`crate::table::delta::runs`]),
/// bronze's conformed to `contract` when the command has a readable one.
pub async fn commit_run_record(
    lake: &Lake,
    record: &RunRecord,
    previous: Option<&RunRecord>,
    failpoint: &str,
    contract: Option<&Contract>,
) -> Result<u64> {
    let slot = put_committed(lake, &record.source, record, failpoint, || {
        format!(
            "another command on \"{}\" committed while run {} was being recorded (its lock had been taken \
             over); nothing of run {} was published: run the same command again",
            record.source, record.run_id, record.run_id
        )
    })
    .await?;
    crate::table::delta::runs::after_commit(lake, &in_slot(record, slot), previous, contract).await;
    Ok(slot)
}

/// Commit a build: its record goes into the table's slot `record.seq`, create-if-absent. If the
/// slot is taken, another build of the table committed since this one started: nothing of this
/// build is published.
pub async fn commit_build(lake: &Lake, record: &BuildRecord) -> Result<u64> {
    commit_build_record(lake, record, None, "build.before_commit").await
}

/// [`commit_build`] of a record superseding `previous` (an undo), with the failpoint hit before
/// the put; then the Delta tables follow ([`crate::table::delta::builds`]).
pub async fn commit_build_record(
    lake: &Lake,
    record: &BuildRecord,
    previous: Option<&BuildRecord>,
    failpoint: &str,
) -> Result<u64> {
    let slot = put_committed(lake, &record.table, record, failpoint, || {
        format!(
            "another build of \"{}\" committed while build {} was being recorded; nothing of build {} \
             was published: run the same command again",
            record.table, record.build_id, record.build_id
        )
    })
    .await?;
    crate::table::delta::builds::after_commit(lake, &in_slot(record, slot), previous).await;
    Ok(slot)
}

/// `record` as committed into `slot` (a copy only when the put moved past an unreadable object).
fn in_slot<T: Record + Clone>(record: &T, slot: u64) -> std::borrow::Cow<'_, T> {
    if record.seq() == slot {
        return std::borrow::Cow::Borrowed(record);
    }
    let mut moved = record.clone();
    moved.set_seq(slot);
    std::borrow::Cow::Owned(moved)
}

/// Put `record` into its slot of `name`'s log, create-if-absent, with `failpoint` hit before the
/// put, then a checkpoint when one is due; the slot taken (a later one when the slot holds an
/// object no reader can parse), or [`Error::Locked`] saying `taken()` when a record holds it.
pub(crate) async fn put_committed<T: Record>(
    lake: &Lake,
    name: &str,
    record: &T,
    failpoint: &str,
    taken: impl FnOnce() -> String,
) -> Result<u64> {
    let bytes = parquet_bytes(&record.to_batch()?)?;
    crate::table::failpoint::hit(failpoint)?;
    let Some(slot) = put_record::<T>(lake, name, record.seq(), bytes).await? else {
        return Err(Error::Locked(taken()));
    };
    checkpoint_after::<T>(lake, name, slot).await?;
    Ok(slot)
}
