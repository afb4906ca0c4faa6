//! The hold gates of a run (contract key `hold`, docs/operations.md#held-runs): after the pass,
//! before the commit, decide whether the run is published or held for review.
//!
//! A held run commits its record with status `held` and the reasons in `held_reason`; its data
//! and failure files are written as for any run but no reader names them until `ingot publish`.
//! Hazard: the gates only see this run and the committed log; they are skipped for replays
//! (which never delete and hold only failed rows) and with `ingot ingest --no-hold`.

use crate::ingest::pass::Stats;
use crate::spec::contract::{Contract, Delivery};
use crate::table::audit::RunRecord;

/// Why the run should be held (empty: publish it). `runs`: the source's committed records in
/// commit order, before this run.
pub fn hold_reasons(contract: &Contract, record: &RunRecord, stats: &Stats, runs: &[&RunRecord]) -> Vec<String> {
    let mut out = Vec::new();
    let full = contract.delivery == Delivery::Full;
    if full && stats.deleted > 0 && stats.unreadable_keys > 0 {
        out.push(format!(
            "{} rejected record{} of this full delivery ha{} no readable natural key, so the run cannot tell \
             which records {} and would delete {} (first: {})",
            stats.unreadable_keys,
            plural(stats.unreadable_keys),
            if stats.unreadable_keys == 1 { "s" } else { "ve" },
            if stats.unreadable_keys == 1 {
                "it holds"
            } else {
                "they hold"
            },
            stats.deleted,
            stats.first_unreadable.as_deref().unwrap_or("?"),
        ));
    }
    if let Some(limit) = contract.hold.max_delete_fraction
        && full
        && stats.current > 0
        && stats.deleted as f64 > limit * stats.current as f64
    {
        out.push(format!(
            "it would delete {} of the {} current records ({:.1}%), more than hold.max_delete_fraction {limit}",
            stats.deleted,
            stats.current,
            100.0 * stats.deleted as f64 / stats.current as f64,
        ));
    }
    if let Some(gate) = contract.hold.row_count {
        let recent: Vec<i64> = runs
            .iter()
            .rev()
            .filter(|r| r.status.is_loaded() && r.replay_of.is_none() && !r.is_rekey())
            .take(gate.window as usize)
            .map(|r| r.rows_seen)
            .collect();
        if let Some(median) = median(recent.clone())
            && (record.rows_seen as f64) < gate.min_ratio_of_median * median
        {
            out.push(format!(
                "it has {} rows, fewer than hold.row_count.min_ratio_of_median {} x the median {} of the last {} \
                 committed run{} of {}",
                record.rows_seen,
                gate.min_ratio_of_median,
                median,
                recent.len(),
                plural(recent.len() as u64),
                contract.source,
            ));
        }
    }
    out
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The median of `values` (the mean of the two middle ones for an even count); `None` if empty.
fn median(mut values: Vec<i64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2] as f64
    } else {
        (values[n / 2 - 1] as f64 + values[n / 2] as f64) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_of_odd_and_even_counts() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![7]), Some(7.0));
        assert_eq!(median(vec![100, 1, 50]), Some(50.0));
        assert_eq!(median(vec![10, 40, 20, 30]), Some(25.0));
    }
}
