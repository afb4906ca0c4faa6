//! One read of a source's candidates for both of their paths: each batch is split by a set of
//! keys (the records with several candidates), the rows in the set go to a [`Sink`] that the
//! survivorship sort reads, the others stay in the plan ([`Tee::rows`]). Without it those
//! candidates are read twice (once for each path).
//!
//! A tee is read once: a second execution of a partition, or of the sink, is an error, never
//! rows counted twice. The sink ends when every partition of every tee has sent its last batch;
//! a partition dropped before its end (an error, a cancelled build) ends the sink with an error
//! rather than with the rows it had. Memory: the sink's queue holds what its reader has not yet
//! taken (that reader, the sort, runs beside the partitions and spills).

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::{filter_record_batch, not};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::error::{Error, Result};
use crate::hash::fp::{FpSet, Heads, in_set_mask};
use crate::table::silver::FP;

enum Msg {
    Rows(RecordBatch),
    /// A partition sent its last rows.
    End,
}

/// Where the tees send the rows in the set; read once, as one partition ([`Sink::table`]).
pub struct Sink {
    schema: SchemaRef,
    set: Arc<FpSet>,
    heads: Arc<Heads>,
    tx: Mutex<Option<UnboundedSender<Msg>>>,
    rx: Mutex<Option<UnboundedReceiver<Msg>>>,
    /// Partitions that send to the sink.
    senders: Mutex<usize>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").field("keys", &self.set.len()).finish()
    }
}

impl Sink {
    /// A sink of rows in `schema`'s columns (every one nullable here) whose key is in `set`.
    pub fn new(schema: SchemaRef, set: Arc<FpSet>) -> Arc<Sink> {
        let (tx, rx) = unbounded_channel();
        let fields: Vec<_> = schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        Arc::new(Sink {
            schema: Arc::new(datafusion::arrow::datatypes::Schema::new(fields)),
            heads: Arc::new(Heads::of(set.iter())),
            set,
            tx: Mutex::new(Some(tx)),
            rx: Mutex::new(Some(rx)),
            senders: Mutex::new(0),
        })
    }

    /// `df` (rows in the sink's schema) split: its rows not in the set, as a table of
    /// `df`'s partitions, while those in it go to the sink. `df` is planned here, once.
    pub async fn tee(self: &Arc<Self>, df: DataFrame) -> Result<Arc<dyn TableProvider>> {
        let plan = df.create_physical_plan().await?;
        let schema = plan.schema();
        let same = |a: &SchemaRef, b: &SchemaRef| {
            a.fields().len() == b.fields().len()
                && a.fields()
                    .iter()
                    .zip(b.fields())
                    .all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
        };
        if !same(&schema, &self.schema) {
            return Err(Error::Internal(format!(
                "a tee's rows have columns {schema} but its sink {}",
                self.schema
            )));
        }
        let fp = self.schema.index_of(FP)?;
        let n = plan.properties().partitioning.partition_count();
        let tx = self
            .tx
            .lock()
            .ok()
            .and_then(|t| t.clone())
            .ok_or_else(|| Error::Internal("a tee was planned after its sink was read".into()))?;
        *self.senders.lock().map_err(|_| Error::Internal("sink lock".into()))? += n;
        let parts: Vec<Arc<dyn PartitionStream>> = (0..n)
            .map(|partition| {
                Arc::new(Part {
                    plan: plan.clone(),
                    schema: schema.clone(),
                    partition,
                    fp,
                    sink: self.clone(),
                    tx: Mutex::new(Some(tx.clone())),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        Ok(Arc::new(StreamingTable::try_new(schema, parts)?))
    }

    /// The rows the tees send, as a table of one partition that ends when they all ended.
    pub fn table(self: &Arc<Self>) -> Result<Arc<dyn TableProvider>> {
        let part: Arc<dyn PartitionStream> = Arc::new(Out(self.clone()));
        Ok(Arc::new(StreamingTable::try_new(self.schema.clone(), vec![part])?))
    }

    fn stream(&self) -> Result<SendableRecordBatchStream> {
        // every tee is planned before the plan that reads the sink runs: no sender is made now
        drop(self.tx.lock().ok().and_then(|mut t| t.take()));
        let rx = self
            .rx
            .lock()
            .ok()
            .and_then(|mut r| r.take())
            .ok_or_else(|| Error::Internal("the rows of a tee's sink were read twice".into()))?;
        let expect = *self.senders.lock().map_err(|_| Error::Internal("sink lock".into()))?;
        let rows = futures::stream::unfold((rx, 0usize), move |(mut rx, mut ended)| async move {
            loop {
                match rx.recv().await {
                    Some(Msg::Rows(b)) => return Some((Ok(b), (rx, ended))),
                    Some(Msg::End) => ended += 1,
                    None if ended == expect => return None,
                    None => {
                        let e = Error::RunFailed(format!(
                            "the build's split of candidates ended early ({ended} of {expect} parts read)"
                        ));
                        return Some((Err(DataFusionError::External(Box::new(e))), (rx, expect)));
                    }
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), rows)))
    }
}

/// The sink's rows as the one partition of a [`StreamingTable`].
#[derive(Debug)]
struct Out(Arc<Sink>);

impl PartitionStream for Out {
    fn schema(&self) -> &SchemaRef {
        &self.0.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        match self.0.stream() {
            Ok(s) => s,
            Err(e) => failed(self.0.schema.clone(), e),
        }
    }
}

/// One partition of a tee: its input's partition, the rows in the set sent to the sink.
struct Part {
    plan: Arc<dyn ExecutionPlan>,
    /// The plan's (the sink's columns, perhaps other nullability).
    schema: SchemaRef,
    partition: usize,
    fp: usize,
    sink: Arc<Sink>,
    tx: Mutex<Option<UnboundedSender<Msg>>>,
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeePart").field("partition", &self.partition).finish()
    }
}

impl PartitionStream for Part {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let Some(tx) = self.tx.lock().ok().and_then(|mut t| t.take()) else {
            return failed(schema, Error::Internal("a partition of a tee was read twice".into()));
        };
        let input = match self.plan.execute(self.partition, ctx) {
            Ok(s) => s,
            Err(e) => return failed(schema, e.into()),
        };
        let (sink, fp) = (self.sink.clone(), self.fp);
        let rows = futures::stream::unfold((input, Some(tx)), move |(mut input, tx)| {
            let sink = sink.clone();
            async move {
                let tx = tx?;
                loop {
                    let Some(b) = input.next().await else {
                        // the last rows: only now does the sink count this partition ended
                        let _ = tx.send(Msg::End);
                        return None;
                    };
                    match split(&sink, fp, &tx, b) {
                        Ok(b) if b.num_rows() == 0 => continue,
                        Ok(b) => return Some((Ok(b), (input, Some(tx)))),
                        // its sender dropped without its end: the sink fails too
                        Err(e) => return Some((Err(DataFusionError::External(Box::new(e))), (input, None))),
                    }
                }
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, rows))
    }
}

/// `b`'s rows in the sink's set sent there; the others returned.
fn split(
    sink: &Sink,
    fp: usize,
    tx: &UnboundedSender<Msg>,
    b: datafusion::error::Result<RecordBatch>,
) -> Result<RecordBatch> {
    let b = b?;
    let mask = in_set_mask(&sink.set, &sink.heads, b.column(fp))?;
    if mask.true_count() == 0 {
        return Ok(b);
    }
    // the reader is gone only when the build has failed already
    let rows = filter_record_batch(&b, &mask)?;
    let _ = tx.send(Msg::Rows(RecordBatch::try_new(
        sink.schema.clone(),
        rows.columns().to_vec(),
    )?));
    Ok(filter_record_batch(&b, &not(&mask)?)?)
}

/// A stream that fails with `e` when read.
pub(super) fn failed(schema: SchemaRef, e: Error) -> SendableRecordBatchStream {
    let e = DataFusionError::External(Box::new(e));
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::once(async move { Err(e) }),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

    use super::Sink;
    use crate::hash::fp::{FpSet, fp_of_hex};
    use crate::table::silver::FP;

    fn key(i: i64) -> String {
        format!("{i:032x}{}", "0".repeat(32))
    }

    /// Rows 0..n over `parts` partitions: (key, value).
    fn table(n: i64, parts: usize) -> (Arc<Schema>, MemTable) {
        let schema = Arc::new(Schema::new(vec![
            Field::new(FP, DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let per = (n as usize).div_ceil(parts) as i64;
        let batches: Vec<Vec<RecordBatch>> = (0..parts as i64)
            .map(|p| {
                let ids: Vec<i64> = (p * per..((p + 1) * per).min(n)).collect();
                let keys: Vec<String> = ids.iter().map(|i| key(*i)).collect();
                vec![
                    RecordBatch::try_new(
                        schema.clone(),
                        vec![Arc::new(StringArray::from(keys)), Arc::new(Int64Array::from(ids))],
                    )
                    .unwrap(),
                ]
            })
            .collect();
        (schema.clone(), MemTable::try_new(schema, batches).unwrap())
    }

    fn values(batches: &[RecordBatch]) -> Vec<i64> {
        let mut out: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let a = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
                a.values().to_vec()
            })
            .collect();
        out.sort();
        out
    }

    #[tokio::test]
    async fn every_row_goes_down_one_path_once() {
        let ctx = SessionContext::new();
        let (schema, mem) = table(1000, 3);
        let set: FpSet = (0..1000)
            .filter(|i| i % 7 == 3)
            .map(|i| fp_of_hex(&key(i)).unwrap())
            .collect();
        let sink = Sink::new(schema, Arc::new(set));
        let rest = ctx
            .read_table(sink.tee(ctx.read_table(Arc::new(mem)).unwrap()).await.unwrap())
            .unwrap();
        let held = ctx.read_table(sink.table().unwrap()).unwrap();
        // the rest read first: the sink keeps what its reader has not taken
        let rest = values(&rest.collect().await.unwrap());
        let held = values(&held.collect().await.unwrap());
        assert_eq!(rest, (0..1000).filter(|i| i % 7 != 3).collect::<Vec<_>>());
        assert_eq!(held, (0..1000).filter(|i| i % 7 == 3).collect::<Vec<_>>());
        // a second read is an error, not the rows again
        let again = ctx.read_table(sink.table().unwrap()).unwrap().collect().await;
        assert!(again.unwrap_err().to_string().contains("read twice"));
    }

    #[tokio::test]
    async fn the_sink_fails_when_a_part_is_dropped_before_its_end() {
        let ctx = SessionContext::new();
        let (schema, mem) = table(100, 2);
        let set: FpSet = (0..100).map(|i| fp_of_hex(&key(i)).unwrap()).collect();
        let sink = Sink::new(schema, Arc::new(set));
        let rest = ctx
            .read_table(sink.tee(ctx.read_table(Arc::new(mem)).unwrap()).await.unwrap())
            .unwrap();
        let held = sink.table().unwrap();
        // the tee's plan is dropped unread: its parts never end
        drop(rest);
        let got = ctx.read_table(held).unwrap().collect().await;
        let e = got.unwrap_err().to_string();
        assert!(e.contains("ended early (0 of 2 parts read)"), "{e}");
    }
}
