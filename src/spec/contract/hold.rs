//! The contract key `hold`: the gates that hold a suspicious run for review instead of
//! publishing it (docs/guide.md#hold-gates, docs/operations.md#held-runs).
//!
//! `max_delete_fraction` (full deliveries only; default 0.5, `off` or 1 disables) and
//! `row_count: {min_ratio_of_median, window}`. Every bad value is a located problem naming what
//! would be valid, like every other contract key.

use super::read::ContractReader;
use super::{Delivery, Hold, RowCountGate};
use crate::spec::yaml::{MapNode, Node, scalar_int, scalar_str};

const HOLD_KEYS: &[&str] = &["max_delete_fraction", "row_count"];
const ROW_COUNT_KEYS: &[&str] = &["min_ratio_of_median", "window"];

impl ContractReader<'_> {
    /// `hold`, given the contract's delivery (`None` when that key itself was invalid).
    pub(super) fn read_hold(&mut self, node: Option<&Node>, delivery: Option<Delivery>) -> Option<Hold> {
        let mut hold = Hold::default_for(delivery.unwrap_or(Delivery::Incremental));
        let Some(node) = node else { return Some(hold) };
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "hold", HOLD_KEYS, self.problems)?;
        let mut ok = true;
        if let Some(n) = map.get("max_delete_fraction") {
            if delivery == Some(Delivery::Incremental) {
                self.err(
                    n.pos,
                    "hold.max_delete_fraction applies to delivery: full only (an incremental delivery never deletes)",
                );
                ok = false;
            } else {
                match self.fraction(n, "hold.max_delete_fraction", true, true) {
                    Some(f) => hold.max_delete_fraction = f,
                    None => ok = false,
                }
            }
        }
        if let Some(n) = map.get("row_count") {
            match self.read_row_count(n) {
                Some(g) => hold.row_count = Some(g),
                None => ok = false,
            }
        }
        ok.then_some(hold)
    }

    fn read_row_count(&mut self, node: &Node) -> Option<RowCountGate> {
        let file = self.doc.file.clone();
        let map = MapNode::new(&file, node, "hold.row_count", ROW_COUNT_KEYS, self.problems)?;
        let ratio = match map.get("min_ratio_of_median") {
            None => {
                self.err(
                    map.pos,
                    "hold.row_count is missing \"min_ratio_of_median\" (a number > 0 and <= 1, e.g. 0.5: hold a \
                     run with fewer than half the median rows of the recent runs)",
                );
                None
            }
            Some(n) => self
                .fraction(n, "hold.row_count.min_ratio_of_median", false, false)
                .flatten(),
        };
        let window = match map.get("window") {
            None => Some(RowCountGate::DEFAULT_WINDOW),
            Some(n) => {
                scalar_int(&file, n, "hold.row_count.window", 1, self.problems).map(|w| w.min(u32::MAX as i64) as u32)
            }
        };
        Some(RowCountGate {
            min_ratio_of_median: ratio?,
            window: window?,
        })
    }

    /// A number in [0, 1] (`zero`: 0 allowed), or `off` when `off_ok` (then `Some(None)`).
    fn fraction(&mut self, n: &Node, what: &str, zero: bool, off_ok: bool) -> Option<Option<f64>> {
        let file = self.doc.file.clone();
        let s = scalar_str(&file, n, what, self.problems)?;
        if off_ok && s == "off" {
            return Some(None);
        }
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v <= 1.0 && (v > 0.0 || (zero && v == 0.0)) => Some(Some(v)),
            _ => {
                let range = if zero {
                    "between 0 and 1"
                } else {
                    "greater than 0 and at most 1"
                };
                let off = if off_ok { ", or off" } else { "" };
                self.err(n.pos, format!("{what} must be a number {range}{off}; found \"{s}\""));
                None
            }
        }
    }
}
