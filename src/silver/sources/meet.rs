//! The candidates of the records with several, met without a sort: they arrive in any order,
//! and a record is decided by the [`Pass`] as soon as its last candidate arrives (the key map
//! knows how many it has). A record that gets fewer (a source's own steps filtered one out) is
//! decided when the input ends; one that gets a candidate after it was decided fails the build
//! (never two rows for one record).
//!
//! Memory: the batches of candidates still waiting are held, copied together when most of what
//! they hold was decided, and charged to a reservation. When it cannot grow, the waiting
//! candidates and the rest of the input go through a sort that spills, and the pass goes on over
//! its sorted rows; either way each record is decided once from all of its candidates.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use super::survive::{At, Pass};
use crate::error::{Error, Result};
use crate::hash::fp::{Fp, FpBuild};

/// Decided rows are sent on once this many have gathered (or the input ended).
const OUT_ROWS: usize = 8192;

/// A record's candidates so far, or `None` once it was decided.
type Waiting = Option<(Vec<At>, usize)>;

/// How many candidates a record has (the key map's count).
pub type Want = Box<dyn Fn(Fp) -> usize + Send>;

/// Turns the rest of the input (after the waiting candidates) into sorted candidates.
pub type SortRest = Box<
    dyn FnOnce(SendableRecordBatchStream) -> futures::future::BoxFuture<'static, Result<SendableRecordBatchStream>>
        + Send,
>;

enum Input {
    /// Candidates in any order, met here.
    Meeting(SendableRecordBatchStream),
    /// Candidates sorted by record (after the reservation could not grow).
    Sorted(SendableRecordBatchStream),
    Done,
}

/// The pass over candidates in any order; see the module documentation.
pub struct Meet {
    pass: Pass,
    want: Want,
    input: Input,
    sort: Option<SortRest>,
    waiting: HashMap<Fp, Waiting, FpBuild>,
    /// Per live batch: its candidates still waiting, and its bytes.
    held: Vec<(usize, usize)>,
    /// Decided records not yet flushed.
    unflushed: usize,
    reservation: MemoryReservation,
    /// What the waiting candidates may hold, at most (the reservation may stop them first).
    budget: usize,
    /// The sorted input's record so far.
    group: Vec<At>,
    /// Times the waiting candidates were copied together.
    pub compactions: usize,
    /// Candidates that went through the sort (with [`Meet::sorted`], they had not fit).
    pub sorted: Option<usize>,
}

impl Meet {
    pub fn new(
        pass: Pass,
        want: Want,
        input: SendableRecordBatchStream,
        sort: SortRest,
        reservation: MemoryReservation,
        budget: usize,
    ) -> Meet {
        Meet {
            pass,
            want,
            input: Input::Meeting(input),
            sort: Some(sort),
            waiting: HashMap::default(),
            held: vec![(0, 0)],
            unflushed: 0,
            reservation,
            budget,
            group: Vec::new(),
            compactions: 0,
            sorted: None,
        }
    }

    /// The pass, once [`Meet::next`] returned `None`.
    pub fn pass(&mut self) -> &mut Pass {
        &mut self.pass
    }

    /// The next merged rows, `None` at the end.
    pub async fn next(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            match &mut self.input {
                Input::Meeting(input) => match input.next().await {
                    Some(b) => {
                        if let Some(out) = self.meet(b?).await? {
                            return Ok(Some(out));
                        }
                    }
                    None => {
                        self.input = Input::Done;
                        return self.last();
                    }
                },
                Input::Sorted(input) => match input.next().await {
                    Some(b) => {
                        let b = self.check_sorted(b?)?;
                        if let Some(out) = self.pass.push(b, &mut self.group)? {
                            return Ok(Some(out));
                        }
                    }
                    None => {
                        self.input = Input::Done;
                        return self.pass.finish(&mut self.group);
                    }
                },
                Input::Done => return Ok(None),
            }
        }
    }

    async fn meet(&mut self, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        let b = self.pass.add(batch)?;
        self.held.push((0, self.pass.size_of(b)));
        for r in 0..self.pass.rows_in(b) {
            let fp = self.pass.fp((b, r));
            let ready = match self.waiting.entry(fp) {
                Slot::Occupied(mut e) => match e.get_mut() {
                    None => return Err(twice(fp)),
                    Some((ats, want)) if ats.len() + 1 < *want => {
                        ats.push((b, r));
                        self.held[b].0 += 1;
                        None
                    }
                    Some(_) => {
                        let (mut ats, _) = e.insert(None).unwrap_or_default();
                        for a in &ats {
                            self.held[a.0].0 -= 1;
                        }
                        ats.push((b, r));
                        Some(ats)
                    }
                },
                Slot::Vacant(e) => {
                    let want = (self.want)(fp);
                    if want > 1 {
                        let mut ats = Vec::with_capacity(want);
                        ats.push((b, r));
                        e.insert(Some((ats, want)));
                        self.held[b].0 += 1;
                        None
                    } else {
                        e.insert(None);
                        Some(vec![(b, r)])
                    }
                }
            };
            if let Some(mut ats) = ready {
                self.decide(&mut ats)?;
            }
        }
        let over = !self.fits();
        let out = if self.unflushed >= OUT_ROWS || (over && self.unflushed > 0) {
            self.flush()?
        } else {
            None
        };
        if over {
            self.fit().await?;
        }
        Ok(out)
    }

    fn decide(&mut self, ats: &mut [At]) -> Result<()> {
        self.pass.order_group(ats);
        self.pass.decide(ats)?;
        self.unflushed += 1;
        Ok(())
    }

    /// The decided rows, and the batches nothing waits on any more given up.
    fn flush(&mut self) -> Result<Option<RecordBatch>> {
        let out = self.pass.flush()?;
        self.unflushed = 0;
        for b in 1..self.held.len() {
            if self.held[b].0 == 0 && self.held[b].1 > 0 {
                self.pass.release(b);
                self.held[b].1 = 0;
            }
        }
        Ok(out)
    }

    fn live_bytes(&self) -> usize {
        self.held.iter().map(|h| h.1).sum()
    }

    /// Does what is live fit (the reservation grown or shrunk to it)?
    fn fits(&mut self) -> bool {
        let live = self.live_bytes();
        live <= self.budget && self.reservation.try_resize(live).is_ok()
    }

    /// Hold what is live within the reservation (after a flush): copy the waiting candidates
    /// together when most of what is held was decided, else sort the rest.
    async fn fit(&mut self) -> Result<()> {
        if self.fits() {
            return Ok(());
        }
        let Input::Meeting(input) = &self.input else {
            return Ok(());
        };
        let schema = input.schema();
        let ats = self.waiting_ats();
        let held = self.live_bytes();
        let batches = self.pass.take_out(&ats, &schema, OUT_ROWS)?;
        self.held.truncate(1);
        let copied: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
        if copied * 2 < held {
            // most of it was decided: the waiting candidates fit once copied together
            let mut at = Vec::with_capacity(ats.len());
            for batch in batches {
                let b = self.pass.add(batch)?;
                self.held.push((self.pass.rows_in(b), self.pass.size_of(b)));
                at.extend((0..self.pass.rows_in(b)).map(|r| (b, r)));
            }
            self.renumber(&at);
            self.compactions += 1;
            if self.fits() {
                return Ok(());
            }
            let ats = self.waiting_ats();
            let batches = self.pass.take_out(&ats, &schema, OUT_ROWS)?;
            self.held.truncate(1);
            return self.sort_the_rest(batches, schema).await;
        }
        self.sort_the_rest(batches, schema).await
    }

    /// Every waiting candidate, in map order.
    fn waiting_ats(&self) -> Vec<At> {
        self.waiting
            .values()
            .flatten()
            .flat_map(|(a, _)| a.iter().copied())
            .collect()
    }

    /// The waiting candidates are now at `at` (in [`Meet::waiting_ats`]'s order).
    fn renumber(&mut self, at: &[At]) {
        let mut next = at.iter();
        for (ats, _) in self.waiting.values_mut().flatten() {
            for a in ats.iter_mut() {
                if let Some(n) = next.next() {
                    *a = *n;
                }
            }
        }
    }

    /// The waiting candidates (`batches`) and the rest of the input to the sort.
    async fn sort_the_rest(&mut self, batches: Vec<RecordBatch>, schema: SchemaRef) -> Result<()> {
        let Input::Meeting(rest) = std::mem::replace(&mut self.input, Input::Done) else {
            return Ok(());
        };
        let sort = self
            .sort
            .take()
            .ok_or_else(|| Error::Internal("the survivorship sort was started twice".into()))?;
        self.sorted = Some(batches.iter().map(RecordBatch::num_rows).sum());
        self.waiting.retain(|_, w| w.is_none());
        self.reservation.free();
        let first = futures::stream::iter(batches.into_iter().map(Ok));
        let all = Box::pin(RecordBatchStreamAdapter::new(schema, first.chain(rest)));
        self.input = Input::Sorted(sort(all).await?);
        Ok(())
    }

    /// Sorted input: no record decided while meeting comes again.
    fn check_sorted(&self, batch: RecordBatch) -> Result<RecordBatch> {
        if self.waiting.is_empty() {
            return Ok(batch);
        }
        let col = batch.column(batch.schema().index_of(crate::table::silver::FP)?);
        let mut seen = None;
        crate::hash::fp::for_each_fp(col, |_, fp| {
            if let Some(fp) = fp
                && seen.is_none()
                && self.waiting.contains_key(&fp)
            {
                seen = Some(fp);
            }
        })?;
        match seen {
            Some(fp) => Err(twice(fp)),
            None => Ok(batch),
        }
    }

    /// The input ended: records with fewer candidates than the key map counts are decided with
    /// those they got (in key order, so the output does not depend on the map's).
    fn last(&mut self) -> Result<Option<RecordBatch>> {
        let mut left: Vec<(Fp, Vec<At>)> = self
            .waiting
            .iter_mut()
            .filter_map(|(fp, w)| w.take().map(|(ats, _)| (*fp, ats)))
            .collect();
        left.sort_unstable_by_key(|(fp, _)| *fp);
        for (_, mut ats) in left {
            self.pass.order_group(&mut ats);
            self.pass.decide(&ats)?;
        }
        self.unflushed = 0;
        let out = self.pass.flush()?;
        self.reservation.free();
        Ok(out)
    }
}

fn twice(fp: Fp) -> Error {
    Error::Internal(format!(
        "record {fp:032x}… got a candidate after it was decided (the key map counts fewer than the \
         sources hold)"
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, new_null_array};
    use datafusion::arrow::compute::concat_batches;
    use datafusion::arrow::datatypes::{DataType, SchemaRef};
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use datafusion::prelude::SessionContext;

    use super::Meet;
    use crate::hash::fp::{Fp, fp_of_hex};
    use crate::silver::sources::decisions::Decisions;
    use crate::silver::sources::survive::Pass;
    use crate::silver::sources::{RANK, SOURCE, candidate_schema};
    use crate::spec::columns::FINGERPRINT;
    use crate::spec::rules::sources::{Conflicts, Sources, Survivorship};

    const N: i64 = 2_000;

    fn sources() -> Arc<Sources> {
        Arc::new(Sources {
            entries: Vec::new(),
            columns: vec![("v".into(), DataType::Utf8), ("w".into(), DataType::Int64)],
            survivorship: Survivorship::default(),
            conflicts: Conflicts {
                fields: vec!["v".into()],
                ..Conflicts::default()
            },
            pos: Default::default(),
        })
    }

    fn key(i: i64) -> String {
        format!("{:032x}{}", (i as u128) * 0x9e37_79b9_7f4a_7c15, "0".repeat(32))
    }

    /// Record `i`'s candidate from source a (rank 1) or b (rank 2): b's `v` differs where
    /// `i % 3 == 0` (a conflict), a has no `w` where `i % 4 == 0` (b's is taken).
    fn candidates(schema: &SchemaRef, rows: &[(i64, bool)]) -> RecordBatch {
        let cols: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                let text = |g: &dyn Fn(i64, bool) -> String| {
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|(i, b)| g(*i, *b)))) as ArrayRef
                };
                match f.name().as_str() {
                    "v" => text(&|i, b| {
                        if b && i % 3 == 0 {
                            format!("b{i}")
                        } else {
                            format!("a{i}")
                        }
                    }),
                    "w" => Arc::new(Int64Array::from_iter(
                        rows.iter()
                            .map(|(i, b)| (*b || i % 4 != 0).then_some(i * 10 + *b as i64)),
                    )),
                    "ingestion_run_id" => text(&|_, b| format!("run-{}", if b { "b" } else { "a" })),
                    "row_hash" => text(&|i, b| format!("{}{i:063}", b as u8)),
                    FINGERPRINT => text(&|i, _| key(i)),
                    SOURCE => text(&|_, b| if b { "b" } else { "a" }.to_string()),
                    RANK => Arc::new(Int32Array::from_iter_values(rows.iter().map(|(_, b)| 1 + *b as i32))),
                    _ => new_null_array(f.data_type(), rows.len()),
                }
            })
            .collect();
        RecordBatch::try_new(schema.clone(), cols).unwrap()
    }

    /// Batches of 50 candidates: a's and b's of most records side by side, b's of every tenth
    /// record at the end (they wait the longest).
    fn arrivals(schema: &SchemaRef) -> Vec<RecordBatch> {
        let mut rows: Vec<(i64, bool)> = Vec::new();
        for i in 0..N {
            rows.push((i, false));
            if i % 10 != 0 {
                rows.push((i, true));
            }
        }
        rows.extend((0..N).filter(|i| i % 10 == 0).map(|i| (i, true)));
        rows.chunks(50).map(|c| candidates(schema, c)).collect()
    }

    fn want(fp: Fp) -> usize {
        if (0..N).any(|i| fp_of_hex(&key(i)) == Some(fp)) {
            2
        } else {
            0
        }
    }

    /// The merged rows (each as text, sorted) and conflicts (record, field, hash, taken) of one
    /// meet within `budget`, and its meet.
    async fn run(batches: Vec<RecordBatch>, budget: usize) -> crate::error::Result<(Vec<String>, Vec<String>, Meet)> {
        let src = sources();
        let schema = candidate_schema(&src);
        let pass = Pass::new(
            src,
            schema.clone(),
            Arc::new(Decisions::default()),
            Arc::new(HashMap::new()),
            Arc::new(HashMap::new()),
            "build-1",
        )?;
        let input = Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(batches.into_iter().map(Ok)),
        ));
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let reservation = MemoryConsumer::new("test").register(&pool);
        let sort = super::super::stream::sort_rest(SessionContext::new().state());
        let mut meet = Meet::new(pass, Box::new(want), input, sort, reservation, budget);
        let mut out = Vec::new();
        while let Some(b) = meet.next().await? {
            out.push(b);
        }
        let merged = concat_batches(&out[0].schema(), &out)?;
        let options = FormatOptions::default().with_null("∅");
        let cols: Vec<ArrayFormatter> = merged
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<_, _>>()?;
        let mut rows: Vec<String> = (0..merged.num_rows())
            .map(|r| {
                cols.iter()
                    .map(|c| c.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect();
        rows.sort();
        let mut conflicts: Vec<String> = meet
            .pass()
            .conflicts
            .iter()
            .map(|c| {
                format!(
                    "{} {} {} {:?}",
                    c.fingerprint, c.field, c.candidate_set_hash, c.taken_source
                )
            })
            .collect();
        conflicts.sort();
        Ok((rows, conflicts, meet))
    }

    #[tokio::test]
    async fn the_same_rows_whether_met_in_memory_copied_together_or_sorted() {
        let schema = candidate_schema(&sources());
        let (rows, conflicts, meet) = run(arrivals(&schema), usize::MAX).await.unwrap();
        assert_eq!((meet.compactions, meet.sorted), (0, None));
        assert_eq!(rows.len(), N as usize);
        assert_eq!(conflicts.len(), (0..N).filter(|i| i % 3 == 0).count());
        // record 4: a's v (precedence), b's w (a has none), both sources contributing
        let four = rows.iter().find(|r| r.starts_with("a4|")).unwrap();
        assert!(four.starts_with("a4|41|[a, b]|[{field: w, source: b}]|"), "{four}");
        let three = rows.iter().find(|r| r.starts_with("a3|")).unwrap();
        assert!(three.starts_with("a3|30|[a, b]|[]|[v]|run-a|"), "{three}");
        assert!(three.ends_with("|run-a+run-b|∅|∅|∅"), "{three}");

        // a budget the live batches outgrow while most of what they hold is decided: copied
        let (copied, copied_c, meet) = run(arrivals(&schema), 150_000).await.unwrap();
        assert!(
            meet.compactions > 0 && meet.sorted.is_none(),
            "{} {:?}",
            meet.compactions,
            meet.sorted
        );
        assert_eq!(copied, rows);
        assert_eq!(copied_c, conflicts);

        // no budget at all: the sort takes the waiting candidates and the rest
        let (sorted, sorted_c, meet) = run(arrivals(&schema), 0).await.unwrap();
        assert!(meet.sorted.is_some(), "the sort was not taken");
        assert_eq!(sorted, rows);
        assert_eq!(sorted_c, conflicts);
    }

    #[tokio::test]
    async fn a_candidate_after_its_record_was_decided_fails_and_a_missing_one_waits_for_the_end() {
        let schema = candidate_schema(&sources());
        let again = vec![
            candidates(&schema, &[(1, false), (1, true)]),
            candidates(&schema, &[(1, true)]),
        ];
        let e = run(again, usize::MAX).await.err().unwrap().to_string();
        assert!(e.contains("got a candidate after it was decided"), "{e}");
        // sorted, the same: the record decided before the sort is not decided again
        let again = vec![
            candidates(&schema, &[(1, false), (1, true), (2, false)]),
            candidates(&schema, &[(1, true)]),
        ];
        let e = run(again, 0).await.err().unwrap().to_string();
        assert!(e.contains("got a candidate after it was decided"), "{e}");
        // record 2 has one of its two candidates: decided at the end, from a alone
        let (rows, _, _) = run(
            vec![candidates(&schema, &[(2, false), (5, true), (5, false)])],
            usize::MAX,
        )
        .await
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().any(|r| r.starts_with("a2|20|[a]|")), "{rows:?}");
    }
}
