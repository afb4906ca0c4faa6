//! The `anomalies:` section: `when`, `spike` and `first_seen`, checked against the columns
//! after the steps; exactly one kind per anomaly.

use datafusion::arrow::datatypes::DataType;

use super::{At, Reader};
use crate::spec::rules::columns::{Columns, is_string, type_name};
use crate::spec::rules::{Anomaly, AnomalyKind, DEFAULT_MIN_HISTORY, Ident};
use crate::spec::yaml::{Kind, Node, Problems, scalar_int, scalar_str};

const ANOMALY_KEYS: &[&str] = &["name", "when", "spike", "first_seen"];
const SPIKE_KEYS: &[&str] = &["column", "by", "order", "window", "factor", "min_history"];
const FIRST_SEEN_KEYS: &[&str] = &["by", "order", "gap_days"];

impl Reader<'_> {
    /// One `anomalies:` entry: a name and exactly one kind.
    pub(super) fn read_anomaly(&mut self, item: &Node, cols: Option<&Columns>) -> Option<Anomaly> {
        let map = self.map_node(item, "an anomaly", ANOMALY_KEYS)?;
        let name = self.rule_name(&map, "an anomaly");
        let label = name.clone().unwrap_or_default();
        let kinds: Vec<&str> = AnomalyKind::NAMES
            .iter()
            .copied()
            .filter(|k| map.get(k).is_some())
            .collect();
        let kind = match kinds.as_slice() {
            ["when"] => self
                .expr(map.get("when")?, "when", cols, At::End, true)
                .map(|(e, _)| AnomalyKind::When(e)),
            ["spike"] => self.read_spike(map.get("spike")?, cols),
            ["first_seen"] => self.read_first_seen(map.get("first_seen")?, cols),
            [] => {
                self.err(
                    map.pos,
                    format!("anomaly \"{label}\" needs one of: {}", AnomalyKind::NAMES.join(", ")),
                );
                None
            }
            many => {
                self.err(
                    map.pos,
                    format!(
                        "anomaly \"{label}\" has more than one kind ({}); give one",
                        many.join(", ")
                    ),
                );
                None
            }
        };
        Some(Anomaly {
            name: name?,
            kind: kind?,
            pos: map.pos,
        })
    }

    /// `by:` columns (a list, or one name).
    fn read_by(&mut self, node: &Node, cols: Option<&Columns>) -> Option<Vec<Ident>> {
        let items: Vec<&Node> = match &node.kind {
            Kind::Seq(items) => items.iter().collect(),
            Kind::Scalar { .. } if !node.is_null() => vec![node],
            _ => {
                self.err(
                    node.pos,
                    format!("by must be a list of columns, found {}", node.kind_name()),
                );
                return None;
            }
        };
        let before = self.problems.items.len();
        let mut out: Vec<Ident> = Vec::new();
        for item in items {
            if let Some(id) = self.column_ref(item, "a by column", cols, At::End) {
                if out.iter().any(|o| o.name == id.name) {
                    self.err(id.pos, format!("column \"{}\" is listed twice in by", id.name));
                    continue;
                }
                out.push(id);
            }
        }
        (self.problems.items.len() == before).then_some(out)
    }

    fn typed_ref(
        &mut self,
        node: &Node,
        what: &str,
        cols: Option<&Columns>,
        ok: fn(&DataType) -> bool,
        expected: &str,
    ) -> Option<Ident> {
        let id = self.column_ref(node, what, cols, At::End)?;
        if let Some(ty) = cols.and_then(|c| c.get(&id.name)).and_then(|c| c.ty.clone())
            && !ok(&ty)
        {
            self.err(
                id.pos,
                format!("{what} \"{}\" must be {expected}; it is {}", id.name, type_name(&ty)),
            );
            return None;
        }
        Some(id)
    }

    fn read_spike(&mut self, node: &Node, cols: Option<&Columns>) -> Option<AnomalyKind> {
        let file = self.file;
        let map = self.map_node(node, "spike", SPIKE_KEYS)?;
        let before = self.problems.items.len();
        let need = |key: &str, problems: &mut Problems| {
            let n = map.get(key);
            if n.is_none() {
                problems.push(file, map.pos, format!("spike is missing \"{key}\""));
            }
            n
        };
        let column_n = need("column", self.problems);
        let by_n = need("by", self.problems);
        let order_n = need("order", self.problems);
        let window_n = need("window", self.problems);
        let factor_n = need("factor", self.problems);
        let column = column_n.and_then(|n| self.typed_ref(n, "spike column", cols, DataType::is_numeric, "numeric"));
        let by = by_n.and_then(|n| self.read_by(n, cols));
        let order = order_n.and_then(|n| {
            self.typed_ref(
                n,
                "spike order",
                cols,
                is_orderable,
                "a number, date, timestamp or string",
            )
        });
        let window = window_n.and_then(|n| scalar_int(file, n, "window", 1, self.problems));
        let factor = factor_n.and_then(|n| {
            let s = scalar_str(file, n, "factor", self.problems)?;
            match s.trim().parse::<f64>() {
                Ok(f) if f.is_finite() && f > 0.0 => Some(f),
                _ => {
                    self.err(n.pos, format!("factor must be a number > 0, found \"{s}\""));
                    None
                }
            }
        });
        let min_history = match map.get("min_history") {
            None => Some(DEFAULT_MIN_HISTORY),
            Some(n) => scalar_int(file, n, "min_history", 1, self.problems).and_then(|v| usize::try_from(v).ok()),
        };
        if self.problems.items.len() > before {
            return None;
        }
        Some(AnomalyKind::Spike {
            column: column?,
            by: by?,
            order: order?,
            window: usize::try_from(window?).ok()?,
            factor: factor?,
            min_history: min_history?,
        })
    }

    fn read_first_seen(&mut self, node: &Node, cols: Option<&Columns>) -> Option<AnomalyKind> {
        let file = self.file;
        let map = self.map_node(node, "first_seen", FIRST_SEEN_KEYS)?;
        let before = self.problems.items.len();
        let need = |key: &str, problems: &mut Problems| {
            let n = map.get(key);
            if n.is_none() {
                problems.push(file, map.pos, format!("first_seen is missing \"{key}\""));
            }
            n
        };
        let by_n = need("by", self.problems);
        let order_n = need("order", self.problems);
        let gap_n = need("gap_days", self.problems);
        let by = by_n.and_then(|n| self.read_by(n, cols));
        let order = order_n
            .and_then(|n| self.typed_ref(n, "first_seen order", cols, is_date_like, "a date or timestamp column"));
        let gap_days = gap_n.and_then(|n| scalar_int(file, n, "gap_days", 1, self.problems));
        if self.problems.items.len() > before {
            return None;
        }
        Some(AnomalyKind::FirstSeen {
            by: by?,
            order: order?,
            gap_days: gap_days?,
        })
    }
}

fn is_orderable(t: &DataType) -> bool {
    t.is_numeric() || t.is_temporal() || is_string(t)
}

fn is_date_like(t: &DataType) -> bool {
    matches!(t, DataType::Date32 | DataType::Date64 | DataType::Timestamp(..))
}
