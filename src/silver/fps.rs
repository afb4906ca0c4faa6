//! Reading the fingerprint column of bronze runs in tasks of their own, so that the task filling a
//! build's key map does only that: each group of runs (one source's) is read by one task, run
//! after run in the order given, its keys decoded there. Batches of one group arrive in order;
//! groups interleave. An error ends its group's task and is the last item that group sends.

use datafusion::arrow::array::{Array, BooleanArray, RecordBatch};
use datafusion::common::runtime::SpawnedTask;
use datafusion::dataframe::DataFrame;
use futures::StreamExt;
use tokio::sync::mpsc::Receiver;

use crate::error::{Error, Result};
use crate::hash::fp::{Fp, for_each_fp};
use crate::spec::columns::FINGERPRINT;

/// One run to read: its index (as the caller counts runs), what to call it in an error, and its
/// rows as two columns, the key and `is_deleted`.
pub struct Run {
    pub run: u32,
    pub what: String,
    pub rows: DataFrame,
}

/// One batch of a run: its decoded keys and tombstone flags.
pub struct Fps {
    /// The index of the group it came from.
    pub group: usize,
    pub run: u32,
    pub fps: Vec<Fp>,
    pub deleted: Option<BooleanArray>,
}

impl Fps {
    fn of(group: usize, run: u32, b: &RecordBatch, what: &str) -> Result<Fps> {
        let mut fps = Vec::with_capacity(b.num_rows());
        let mut missing = false;
        for_each_fp(b.column(0), |_, fp| match fp {
            Some(fp) => fps.push(fp),
            None => missing = true,
        })?;
        if missing {
            return Err(Error::RunFailed(format!("{what} has a row without {FINGERPRINT}")));
        }
        Ok(Fps {
            group,
            run,
            fps,
            deleted: b.column(1).as_any().downcast_ref::<BooleanArray>().cloned(),
        })
    }

    /// Is row `row` a tombstone?
    pub fn is_deleted(&self, row: usize) -> bool {
        self.deleted.as_ref().is_some_and(|d| d.is_valid(row) && d.value(row))
    }
}

/// The readers of `groups` (a task each; dropping the tasks stops them) and what they send.
pub fn read(cluster: Option<&str>, groups: Vec<Vec<Run>>) -> (Receiver<Result<Fps>>, Vec<SpawnedTask<()>>) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Fps>>(4 * groups.len().max(1));
    let mut tasks = Vec::with_capacity(groups.len());
    for (group, runs) in groups.into_iter().enumerate() {
        let (tx, cluster) = (tx.clone(), cluster.map(str::to_string));
        tasks.push(SpawnedTask::spawn(async move {
            for Run { run, what, rows } in runs {
                let mut stream =
                    match crate::engine::exec::stream(cluster.as_deref(), rows, "build: bronze fingerprints").await {
                        Ok(st) => st,
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    };
                while let Some(b) = stream.next().await {
                    let out = b.map_err(Error::from).and_then(|b| Fps::of(group, run, &b, &what));
                    let failed = out.is_err();
                    if tx.send(out).await.is_err() || failed {
                        return;
                    }
                }
            }
        }));
    }
    (rx, tasks)
}
