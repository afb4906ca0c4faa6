//! Hash joins for joins with a provably small side.
//!
//! Sessions plan equi-joins as sort-merge joins ([`super::session`]): a sort spills, a hash
//! join's build side does not. But many joins have a side known to be small before it runs (the
//! slots of a source's current runs, joined onto its versions; a dimension of a hundred hotels),
//! and sorting both sides costs more than the rest of the query (a third of a `count(*)` of
//! `_current` at 10,000 runs). [`SmallSideHashJoin`] turns such a join into a hash join that
//! collects the small side (`PartitionMode::CollectLeft`) when that side has a proved **upper
//! bound** of at most [`SMALL_SIDE_ROWS`] rows and the rule's byte budget ([`max_rows`]: file
//! footers, `VALUES`, operators that never add rows, fetches, a join onto a side unique on its
//! keys; anything else is unbounded). It runs after `JoinSelection`, so no estimate swaps it back.
//!
//! Hazard: the byte bound counts 64 bytes per string; a side of longer strings can exceed the
//! budget by their excess, within [`SMALL_SIDE_ROWS`] rows.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{JoinType, Result};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// The most rows a side collected into a hash table may have.
pub const SMALL_SIDE_ROWS: usize = 1 << 20;

/// The rule (see the module documentation). `max_bytes` bounds the collected side's size.
#[derive(Debug)]
pub struct SmallSideHashJoin {
    pub max_bytes: usize,
}

impl SmallSideHashJoin {
    /// A budget of a sixteenth of the memory pool, at most 64 MiB.
    pub fn for_memory_limit(memory_limit: usize) -> SmallSideHashJoin {
        SmallSideHashJoin {
            max_bytes: (memory_limit / 16).min(64 << 20),
        }
    }

    /// Is a side of at most `rows` rows of `plan`'s schema small enough to collect?
    fn small(&self, plan: &Arc<dyn ExecutionPlan>, rows: usize) -> bool {
        rows <= SMALL_SIDE_ROWS && rows.saturating_mul(row_width(plan)) <= self.max_bytes
    }

    /// `join` as a hash join collecting its small side, if it has one.
    fn rewrite(&self, join: &SortMergeJoinExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        // the join types a collected hash join computes like a sort-merge join (Full joins and
        // mark joins are left alone)
        if !matches!(
            join.join_type(),
            JoinType::Inner
                | JoinType::Left
                | JoinType::Right
                | JoinType::LeftSemi
                | JoinType::RightSemi
                | JoinType::LeftAnti
                | JoinType::RightAnti
        ) {
            return Ok(None);
        }
        let (left, right) = (join.left(), join.right());
        let small = |side: &Arc<dyn ExecutionPlan>| max_rows(side).filter(|&rows| self.small(side, rows));
        let (build_left, build_right) = (small(left), small(right));
        // the smaller of the two bounded sides is collected
        let collect_left = match (build_left, build_right) {
            (Some(l), Some(r)) => l <= r,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return Ok(None),
        };
        let hash = HashJoinExec::try_new(
            left.clone(),
            right.clone(),
            join.on().to_vec(),
            join.filter().clone(),
            &join.join_type(),
            None,
            PartitionMode::CollectLeft,
            join.null_equality(),
            false,
        )?;
        Ok(Some(if collect_left {
            Arc::new(hash)
        } else {
            // the right side becomes the collected (left) one; the output keeps its columns' order
            hash.swap_inputs(PartitionMode::CollectLeft)?
        }))
    }
}

impl PhysicalOptimizerRule for SmallSideHashJoin {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<SortMergeJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            Ok(match self.rewrite(join)? {
                Some(hash) => Transformed::yes(hash),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "ingot_small_side_hash_join"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// An upper bound on the rows `plan` produces, when the plan proves one; `None` when it does not.
/// Proved from a file scan's row count from its footers (a pushed-down filter only removes rows),
/// a `VALUES`, operators that never add rows (filter, projection, sort, merge, repartition,
/// coalescing, limit), a union as a sum, an aggregate times its grouping sets, a semi or anti
/// join as its kept side, an inner join as one side when the other is an aggregate grouped by its
/// join keys, and any operator's fetch times its partitions. Other operators (another join, an
/// unnest, a window) leave it unbounded.
pub fn max_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    // an operator's fetch bounds each of its output partitions (a local limit, a partitioned
    // top-k sort, a scan's pushed-down limit), whatever its input
    let fetched = plan
        .fetch()
        .map(|f| f.saturating_mul(plan.output_partitioning().partition_count()));
    min_fetch(operator_rows(plan), fetched)
}

/// The bound an operator proves from its inputs, without its fetch.
fn operator_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let any: &dyn ExecutionPlan = plan.as_ref();
    if let Some(scan) = any.downcast_ref::<DataSourceExec>() {
        let stats = StatisticsContext::new().compute(any, &StatisticsArgs::new()).ok()?;
        return match stats.num_rows {
            Precision::Exact(n) => Some(n),
            // a file scan's count is inexact only because a pushed-down filter may remove rows
            Precision::Inexact(n) if scan.data_source().is::<FileScanConfig>() => Some(n),
            _ => None,
        };
    }
    if any.is::<PlaceholderRowExec>() {
        return Some(plan.output_partitioning().partition_count());
    }
    if any.is::<EmptyExec>() {
        return Some(0);
    }
    let only_child = || match plan.children().as_slice() {
        [child] => max_rows(child),
        _ => None,
    };
    if any.is::<FilterExec>()
        || any.is::<ProjectionExec>()
        || any.is::<RepartitionExec>()
        || any.is::<CoalescePartitionsExec>()
        || any.is::<CooperativeExec>()
    {
        return only_child();
    }
    if any.is::<SortExec>()
        || any.is::<SortPreservingMergeExec>()
        || any.is::<GlobalLimitExec>()
        || any.is::<LocalLimitExec>()
    {
        // their fetch is applied by the caller
        return only_child();
    }
    if any.is::<UnionExec>() {
        return plan
            .children()
            .iter()
            .try_fold(0usize, |sum, child| Some(sum.saturating_add(max_rows(child)?)));
    }
    if let Some(agg) = any.downcast_ref::<AggregateExec>() {
        if agg.group_expr().is_empty() {
            // one row, or one per partition for a partial aggregate
            return Some(match agg.mode() {
                AggregateMode::Partial => plan.output_partitioning().partition_count(),
                _ => 1,
            });
        }
        let sets = agg.group_expr().groups().len().max(1);
        return only_child().map(|rows| rows.saturating_mul(sets));
    }
    if let Some(join) = any.downcast_ref::<HashJoinExec>() {
        return join_rows(join.join_type(), join.left(), join.right(), join.on());
    }
    if let Some(join) = any.downcast_ref::<SortMergeJoinExec>() {
        return join_rows(&join.join_type(), join.left(), join.right(), join.on());
    }
    None
}

/// An upper bound on a join's rows: a semi or anti join keeps at most its preserved side's rows;
/// an inner join at most the rows of one side when the other side's join keys are unique (each
/// row then matches at most one row there).
fn join_rows(
    join_type: &JoinType,
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    on: &[(PhysicalExprRef, PhysicalExprRef)],
) -> Option<usize> {
    match join_type {
        JoinType::LeftSemi | JoinType::LeftAnti => max_rows(left),
        JoinType::RightSemi | JoinType::RightAnti => max_rows(right),
        JoinType::Inner => {
            let keys = |side: fn(&(PhysicalExprRef, PhysicalExprRef)) -> &PhysicalExprRef| -> Option<Vec<usize>> {
                on.iter()
                    .map(|pair| side(pair).downcast_ref::<Column>().map(Column::index))
                    .collect()
            };
            if keys(|(_, r)| r).is_some_and(|k| unique_on(right, &k)) {
                return max_rows(left);
            }
            if keys(|(l, _)| l).is_some_and(|k| unique_on(left, &k)) {
                return max_rows(right);
            }
            None
        }
        _ => None,
    }
}

/// Does `plan` produce each combination of the values of columns `keys` at most once? Proved
/// only from an aggregate grouped by a subset of them (in a mode whose output has one row per
/// group), seen through operators that keep or drop rows and map columns.
fn unique_on(plan: &Arc<dyn ExecutionPlan>, keys: &[usize]) -> bool {
    let node: &dyn ExecutionPlan = plan.as_ref();
    if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
        let exprs: Vec<_> = projection.projection_expr().iter().collect();
        let below: Option<Vec<usize>> = keys
            .iter()
            .map(|&k| exprs.get(k)?.expr.downcast_ref::<Column>().map(Column::index))
            .collect();
        return below.is_some_and(|b| unique_on(projection.input(), &b));
    }
    if let Some(filter) = node.downcast_ref::<FilterExec>() {
        let below: Option<Vec<usize>> = match filter.projection() {
            Some(p) => keys.iter().map(|&k| p.get(k).copied()).collect(),
            None => Some(keys.to_vec()),
        };
        return below.is_some_and(|b| unique_on(filter.input(), &b));
    }
    if node.is::<RepartitionExec>()
        || node.is::<CoalescePartitionsExec>()
        || node.is::<SortExec>()
        || node.is::<SortPreservingMergeExec>()
        || node.is::<CooperativeExec>()
        || node.is::<GlobalLimitExec>()
        || node.is::<LocalLimitExec>()
    {
        return match node.children().as_slice() {
            [child] => unique_on(child, keys),
            _ => false,
        };
    }
    if let Some(agg) = node.downcast_ref::<AggregateExec>() {
        let one_row_per_group = matches!(
            agg.mode(),
            AggregateMode::Final
                | AggregateMode::FinalPartitioned
                | AggregateMode::Single
                | AggregateMode::SinglePartitioned
        );
        let groups = agg.group_expr();
        // the group columns come first in the output
        return one_row_per_group
            && !groups.has_grouping_set()
            && !groups.is_empty()
            && (0..groups.expr().len()).all(|g| keys.contains(&g));
    }
    false
}

fn min_fetch(rows: Option<usize>, fetch: Option<usize>) -> Option<usize> {
    match (rows, fetch) {
        (Some(r), Some(f)) => Some(r.min(f)),
        (Some(r), None) => Some(r),
        (None, Some(f)) => Some(f),
        (None, None) => None,
    }
}

/// Bytes per row of `plan`'s output, for the size bound: a fixed-width column's width, 64 for a
/// string or binary value, 256 for a nested one, plus 8 per row for the hash table.
fn row_width(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let schema = plan.schema();
    8 + schema
        .fields()
        .iter()
        .map(|f| {
            let t = f.data_type();
            t.primitive_width().unwrap_or(if t.is_nested() { 256 } else { 64 })
        })
        .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// A session planning sort-merge joins like ingot's, with the rule when `rule` is given;
    /// tables `big` (`big_rows` rows, key `k` = i % 1000) and `small` (ten rows, keys 0..10,
    /// one of them twice).
    async fn session(rule: Option<SmallSideHashJoin>, big_rows: i64) -> SessionContext {
        let mut config = SessionConfig::new().with_target_partitions(4);
        config.options_mut().optimizer.prefer_hash_join = false;
        let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
        if let Some(rule) = rule {
            let at = rules
                .iter()
                .position(|r| r.name() == "join_selection")
                .map_or(0, |i| i + 1);
            rules.insert(at, Arc::new(rule));
        }
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_physical_optimizer_rules(rules)
            .build();
        let ctx = SessionContext::new_with_state(state);
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, false),
        ]));
        let table = |keys: Vec<i64>| -> MemTable {
            let values: Vec<String> = keys.iter().map(|k| format!("v{k}")).collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(keys)), Arc::new(StringArray::from(values))],
            )
            .unwrap();
            // in three partitions, so the plans repartition and merge
            let third = batch.num_rows() / 3;
            let parts = vec![
                vec![batch.slice(0, third)],
                vec![batch.slice(third, third)],
                vec![batch.slice(2 * third, batch.num_rows() - 2 * third)],
            ];
            MemTable::try_new(schema.clone(), parts).unwrap()
        };
        ctx.register_table("big", Arc::new(table((0..big_rows).map(|i| i % 1000).collect())))
            .unwrap();
        let mut small: Vec<i64> = (0..10).collect();
        small.push(3);
        ctx.register_table("small", Arc::new(table(small))).unwrap();
        ctx
    }

    /// The physical plan of `sql` and its sorted result.
    async fn run(ctx: &SessionContext, sql: &str) -> (String, String) {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let shown = displayable(plan.as_ref()).indent(false).to_string();
        let mut batches = df.collect().await.unwrap();
        batches.retain(|b| b.num_rows() > 0);
        let mut lines: Vec<String> = pretty_format_batches(&batches)
            .unwrap()
            .to_string()
            .lines()
            .map(str::to_string)
            .collect();
        lines.sort();
        (shown, lines.join("\n"))
    }

    const QUERIES: [&str; 6] = [
        // a table scan: bounded by its rows
        "SELECT b.k, b.v, s.v FROM big b JOIN small s ON b.k = s.k",
        "SELECT b.k, s.v FROM big b LEFT JOIN small s ON b.k = s.k",
        "SELECT s.k, b.v FROM small s LEFT JOIN big b ON b.k = s.k WHERE s.k > 2",
        "SELECT b.k FROM big b WHERE b.k IN (SELECT k FROM small)",
        "SELECT b.k FROM big b WHERE b.k NOT IN (SELECT k FROM small WHERE k IS NOT NULL)",
        // a join onto an aggregate grouped by the join key: at most the other side's rows
        "SELECT x.k, x.n, s.v FROM (SELECT k, count(*) AS n FROM small GROUP BY k) x \
         JOIN small s ON x.k = s.k JOIN big b ON b.k = x.k",
    ];

    #[tokio::test]
    async fn small_sides_are_collected_with_the_same_result() {
        let with = session(Some(SmallSideHashJoin { max_bytes: 64 << 20 }), 5000).await;
        let without = session(None, 5000).await;
        for sql in QUERIES {
            let (plan, rows) = run(&with, sql).await;
            let (before, expected) = run(&without, sql).await;
            assert!(
                before.contains("SortMergeJoin"),
                "{sql}: planned without sort-merge joins:\n{before}"
            );
            assert!(
                !plan.contains("SortMergeJoin"),
                "{sql}: a sort-merge join is left:\n{plan}"
            );
            assert!(plan.contains("HashJoinExec: mode=CollectLeft"), "{sql}:\n{plan}");
            assert_eq!(rows, expected, "{sql}: results differ");
            assert!(rows.lines().count() > 4, "{sql}: too few rows to compare:\n{rows}");
        }
    }

    #[tokio::test]
    async fn sides_over_the_byte_budget_or_unbounded_stay_sort_merge_joins() {
        // 11 rows of (8 + 8 + 64) bytes: over a budget of 800 bytes
        let tight = session(Some(SmallSideHashJoin { max_bytes: 800 }), 5000).await;
        let (plan, _) = run(&tight, QUERIES[0]).await;
        assert!(plan.contains("SortMergeJoin"), "collected over the budget:\n{plan}");
        // a side joined many-to-many has no proved bound: both sides are joins of big onto big
        let open = session(Some(SmallSideHashJoin { max_bytes: 64 << 20 }), 3000).await;
        let sql = "SELECT x.k FROM (SELECT a.k FROM big a JOIN big b ON a.k = b.k) x \
                   JOIN (SELECT c.k FROM big c JOIN big d ON c.k = d.k) y ON x.k = y.k";
        let plan = open.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        assert!(max_rows(&plan).is_none());
        let shown = displayable(plan.as_ref()).indent(false).to_string();
        assert!(shown.contains("SortMergeJoin"), "{shown}");
    }

    #[tokio::test]
    async fn bounds_are_proved_through_the_operators_that_never_add_rows() {
        let ctx = session(None, 5000).await;
        let bound = |sql: &'static str| {
            let ctx = ctx.clone();
            async move {
                let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
                max_rows(&plan)
            }
        };
        assert_eq!(bound("SELECT * FROM big").await, Some(5000));
        assert_eq!(bound("SELECT k FROM big WHERE k > 10 ORDER BY k").await, Some(5000));
        assert_eq!(bound("SELECT k FROM big LIMIT 7").await, Some(7));
        // a top-k sort per partition and the merge above it: at most the limit overall
        assert_eq!(bound("SELECT k FROM big ORDER BY k LIMIT 7").await, Some(7));
        assert_eq!(bound("SELECT k, count(*) FROM big GROUP BY k").await, Some(5000));
        assert_eq!(bound("SELECT count(*) FROM big").await, Some(1));
        assert_eq!(
            bound("SELECT k FROM big UNION ALL SELECT k FROM small").await,
            Some(5011)
        );
        // many-to-many: no bound
        assert_eq!(bound("SELECT a.k FROM small a JOIN small b ON a.k = b.k").await, None);
        // onto one row per key: the other side's rows
        assert_eq!(
            bound("SELECT a.k FROM big a JOIN (SELECT k, max(v) AS v FROM small GROUP BY k) b ON a.k = b.k").await,
            Some(5000)
        );
        // a window adds no rows but is not among the proved operators
        assert_eq!(bound("SELECT k, row_number() OVER (ORDER BY k) FROM small").await, None);
    }
}
