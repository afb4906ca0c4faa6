//! Where a DataFusion plan runs: in this process, or on the Ballista cluster named by
//! `--cluster df://HOST:PORT` / `INGOT_CLUSTER` (cargo feature `cluster`; see [`crate::engine::cluster`]
//! for what each command sends there).
//!
//! Plans are always made in the client's local session (its catalog, its UDFs); [`stream`] and
//! [`streams`] then run them either locally or — with a cluster — hand the same logical plan to a
//! Ballista session made from that local one, which sends it to the scheduler. A plan runs on the
//! cluster unless [`local_only`] finds a reason it cannot: a UDF that carries client state (the
//! silver build's key sets, [`LOCAL_ONLY_UDFS`]) or a table that is not a listing table or a view
//! (in-memory tables cannot be scanned on Ballista; ingot's tables over no files are sent as empty
//! relations, [`empty_scans_as_relations`]). Such plans run here, deterministically: the
//! same plan always runs in the same place. `INGOT_CLUSTER_TRACE=1` prints one line per plan
//! to stderr saying where it ran and why.
//!
//! Errors of a plan run on the cluster say which cluster, and name a UDF the cluster lacks.

use datafusion::catalog::TableProvider;
use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::view::ViewTable;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::{EmptyRelation, Expr, LogicalPlan};

use crate::error::{Error, Result};

/// UDFs that hold state of the client process (a build's key map and key sets, the slots of a
/// source's current runs): a plan calling one cannot be sent to a cluster (a build on a cluster
/// joins with key files instead, a catalog for a cluster carries the slots as a table).
pub const LOCAL_ONLY_UDFS: [&str; 4] = [
    "__ingot_pick",
    "__ingot_in_set",
    crate::engine::slots::SLOT_OF,
    "__ingot_pick_source",
];

/// Why `plan` must run in this process, if it must.
pub fn local_only(plan: &LogicalPlan) -> Option<String> {
    let mut reason = None;
    let _ = plan.apply_with_subqueries(|p| {
        let _ = p.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e
                    && LOCAL_ONLY_UDFS.contains(&f.name())
                {
                    reason = Some(format!("it calls {}, which holds this process's state", f.name()));
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        });
        if reason.is_some() {
            return Ok(TreeNodeRecursion::Stop);
        }
        if let LogicalPlan::TableScan(scan) = p {
            let why = match source_as_provider(&scan.source) {
                Ok(provider) => provider_local_only(provider.as_ref(), &scan.table_name.to_string()),
                Err(_) => Some(format!("table {} has no provider to send", scan.table_name)),
            };
            if why.is_some() {
                reason = why;
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    reason
}

fn provider_local_only(provider: &dyn TableProvider, name: &str) -> Option<String> {
    if provider.is::<ListingTable>() {
        return None;
    }
    if provider.is::<EmptyTable>() {
        return Some(format!("table {name} has no files and is read inside a view"));
    }
    if let Some(view) = provider.downcast_ref::<ViewTable>() {
        return local_only(view.logical_plan());
    }
    Some(format!(
        "table {name} is an in-memory table, which a cluster cannot scan"
    ))
}

/// `plan` with every scan of an [`EmptyTable`] (ingot's table over no files) replaced by an empty
/// relation of the scan's columns: the same rows (none), in a form a cluster can receive (table
/// providers other than listing tables and views cannot be sent). Scans inside views stay.
pub fn empty_scans_as_relations(plan: LogicalPlan) -> Result<LogicalPlan> {
    let out = plan.transform_up_with_subqueries(|p| {
        if let LogicalPlan::TableScan(scan) = &p
            && source_as_provider(&scan.source).is_ok_and(|t| t.is::<EmptyTable>())
        {
            return Ok(Transformed::yes(LogicalPlan::EmptyRelation(EmptyRelation {
                produce_one_row: false,
                schema: scan.projected_schema.clone(),
            })));
        }
        Ok(Transformed::no(p))
    })?;
    Ok(out.data)
}

fn trace(stage: &str, place: &str) {
    if std::env::var_os("INGOT_CLUSTER_TRACE").is_some_and(|v| !v.is_empty() && v != "0") {
        crate::tell!("cluster: {stage}: {place}");
    }
}

/// Run `df` (one stream of all its rows), on `cluster` when given and the plan can go there.
pub async fn stream(cluster: Option<&str>, df: DataFrame, stage: &str) -> Result<SendableRecordBatchStream> {
    match place(cluster, df, stage).await? {
        Placed::Here(df) => Ok(df.execute_stream().await?),
        Placed::Cluster(url, df) => remote::stream(&url, df).await,
    }
}

/// Run `df` with one stream per output partition. A plan run on a cluster returns one stream;
/// its batches are dealt round-robin to `target_partitions` streams, so that the consumers (a
/// build's part writers) still work in parallel.
pub async fn streams(cluster: Option<&str>, df: DataFrame, stage: &str) -> Result<Vec<SendableRecordBatchStream>> {
    let n = df.task_ctx().session_config().target_partitions().max(1);
    match place(cluster, df, stage).await? {
        Placed::Here(df) => Ok(df.execute_stream_partitioned().await?),
        Placed::Cluster(url, df) => Ok(deal(remote::stream(&url, df).await?, n)),
    }
}

/// `input`'s batches dealt round-robin to `n` streams (bounded channels: a slow consumer holds
/// the others back rather than letting batches pile up). An error ends the stream it is dealt to.
fn deal(mut input: SendableRecordBatchStream, n: usize) -> Vec<SendableRecordBatchStream> {
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;
    if n <= 1 {
        return vec![input];
    }
    let schema = input.schema();
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| tokio::sync::mpsc::channel(2)).unzip();
    tokio::spawn(async move {
        let mut i = 0usize;
        while let Some(item) = input.next().await {
            let failed = item.is_err();
            if senders[i % n].send(item).await.is_err() || failed {
                break;
            }
            i += 1;
        }
    });
    receivers
        .into_iter()
        .map(|rx| {
            let s = tokio_stream_from(rx);
            Box::pin(RecordBatchStreamAdapter::new(schema.clone(), s)) as SendableRecordBatchStream
        })
        .collect()
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

enum Placed {
    Here(DataFrame),
    Cluster(String, DataFrame),
}

async fn place(cluster: Option<&str>, df: DataFrame, stage: &str) -> Result<Placed> {
    let Some(url) = cluster else {
        return Ok(Placed::Here(df));
    };
    let (state, plan) = df.into_parts();
    let sendable = empty_scans_as_relations(plan.clone())?;
    if let Some(reason) = local_only(&sendable) {
        trace(stage, &format!("in this process: {reason}"));
        return Ok(Placed::Here(DataFrame::new(state, plan)));
    }
    let df = remote::rehome(url, DataFrame::new(state, sendable)).await?;
    trace(stage, &format!("on the cluster {url}"));
    Ok(Placed::Cluster(url.to_string(), df))
}

/// Check that the cluster at `url` answers (names the URL when it does not).
pub async fn check_cluster(url: &str) -> Result<()> {
    remote::check(url).await
}

#[cfg(feature = "cluster")]
mod remote {
    use futures::TryStreamExt;

    use super::*;
    use crate::engine::cluster::client::{check_reachable, explain_error, remote_state};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

    pub async fn rehome(url: &str, df: DataFrame) -> Result<DataFrame> {
        let (state, plan) = df.into_parts();
        let remote = remote_state(&state, url).await?;
        Ok(DataFrame::new(remote, plan))
    }

    pub async fn stream(url: &str, df: DataFrame) -> Result<SendableRecordBatchStream> {
        let s = df
            .execute_stream()
            .await
            .map_err(|e| Error::DataFusion(explain_error(url, e)))?;
        let url = url.to_string();
        let schema = s.schema();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            s.map_err(move |e| explain_error(&url, e)),
        )))
    }

    pub async fn check(url: &str) -> Result<()> {
        check_reachable(url).await
    }
}

#[cfg(not(feature = "cluster"))]
mod remote {
    use super::*;

    fn unsupported(url: &str) -> Error {
        Error::Invalid(format!(
            "--cluster {url}: this ingot was built without cluster support (cargo feature `cluster`)"
        ))
    }

    pub async fn rehome(url: &str, _df: DataFrame) -> Result<DataFrame> {
        Err(unsupported(url))
    }

    pub async fn stream(url: &str, _df: DataFrame) -> Result<SendableRecordBatchStream> {
        Err(unsupported(url))
    }

    pub async fn check(url: &str) -> Result<()> {
        Err(unsupported(url))
    }
}
