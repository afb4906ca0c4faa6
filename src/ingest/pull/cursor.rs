//! The incremental cursor of a pull: the largest `cursor_field` value a run loaded, kept in the
//! run's own record (`pull_cursor`, the field's canonical text), so a failed, held or undone run
//! never moves it (docs/operations.md#api-pulls).

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Decimal128Array, Int32Array, Int64Array, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{Date32Type, Decimal128Type, Int32Type, Int64Type, TimestampMicrosecondType};

use crate::spec::contract::api::Lookback;
use crate::spec::contract::{Field, FieldType};
use crate::spec::types::{Value, parse_value};

/// A cursor value: integers, decimals (unscaled), dates (days) and timestamps (µs) as a number,
/// strings as text (compared as byte strings).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cursor {
    Number(i128),
    Text(String),
}

impl Cursor {
    /// A stored or configured cursor text under the field's type (`None`: not a value of it).
    pub fn parse(field: &Field, text: &str) -> Option<Cursor> {
        Some(match parse_value(field, text).ok()? {
            Value::Str(s) => Cursor::Text(s.to_string()),
            Value::Int(v) => Cursor::Number(v as i128),
            Value::Decimal(v) => Cursor::Number(v),
            Value::Date(d) => Cursor::Number(d as i128),
            Value::Timestamp(t) => Cursor::Number(t as i128),
            Value::Float(_) | Value::Bool(_) => return None,
        })
    }

    /// The canonical text of the value (what `pull_cursor` keeps and the request sends).
    pub fn text(&self, field: &Field) -> String {
        let array: ArrayRef = match (self, field.ty) {
            (Cursor::Text(s), _) => return s.clone(),
            (Cursor::Number(v), FieldType::Int32) => std::sync::Arc::new(Int32Array::from(vec![*v as i32])),
            (Cursor::Number(v), FieldType::Int64) => std::sync::Arc::new(Int64Array::from(vec![*v as i64])),
            (Cursor::Number(v), FieldType::Decimal { precision, scale }) => std::sync::Arc::new(
                Decimal128Array::from(vec![*v])
                    .with_precision_and_scale(precision, scale)
                    .unwrap_or_else(|_| Decimal128Array::from(vec![*v])),
            ),
            (Cursor::Number(v), FieldType::Date) => std::sync::Arc::new(Date32Array::from(vec![*v as i32])),
            (Cursor::Number(v), FieldType::Timestamp) => {
                std::sync::Arc::new(TimestampMicrosecondArray::from(vec![*v as i64]).with_timezone("UTC"))
            }
            (Cursor::Number(v), _) => return v.to_string(),
        };
        let mut buf = Vec::new();
        crate::hash::canonical::write_canonical(array.as_ref(), 0, &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The value to send: `lookback` earlier (a date by whole days, rounded up), so the pull
    /// re-reads an overlap that loads as unchanged.
    pub fn minus(&self, field: &Field, lookback: Option<Lookback>) -> Cursor {
        match (self, lookback) {
            (Cursor::Number(v), Some(Lookback::Number(n))) => Cursor::Number(v.saturating_sub(n)),
            (Cursor::Number(v), Some(Lookback::Time(d))) => {
                let back = match field.ty {
                    FieldType::Date => (d.as_secs() as i128 + 86_399) / 86_400,
                    _ => d.as_micros() as i128,
                };
                Cursor::Number(v.saturating_sub(back))
            }
            _ => self.clone(),
        }
    }
}

/// The largest value of a typed cursor column among the rows `valid` keeps (all when `None`).
pub fn column_max(column: &dyn Array, valid: Option<&BooleanArray>) -> Option<Cursor> {
    let keep = |i: usize| column.is_valid(i) && valid.is_none_or(|v| v.value(i));
    let n = column.len();
    macro_rules! max_of {
        ($t:ty) => {{
            let a = column.as_primitive::<$t>();
            (0..n)
                .filter(|&i| keep(i))
                .map(|i| a.value(i) as i128)
                .max()
                .map(Cursor::Number)
        }};
    }
    use datafusion::arrow::datatypes::DataType as D;
    match column.data_type() {
        D::Int32 => max_of!(Int32Type),
        D::Int64 => max_of!(Int64Type),
        D::Decimal128(..) => max_of!(Decimal128Type),
        D::Date32 => max_of!(Date32Type),
        D::Timestamp(..) => max_of!(TimestampMicrosecondType),
        D::Utf8 => {
            let a: &StringArray = column.as_string::<i32>();
            (0..n)
                .filter(|&i| keep(i))
                .map(|i| a.value(i))
                .max()
                .map(|s| Cursor::Text(s.to_string()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn field(ty: FieldType) -> Field {
        Field {
            name: "updated_at".into(),
            ty,
            required: false,
            normalize: vec![],
            format: None,
            min: None,
            max: None,
            allowed: None,
            pattern: None,
            volatile: false,
            may_be_missing: false,
            source_name: None,
            renamed_from: None,
            cast_older: false,
            description: None,
        }
    }

    #[test]
    fn cursors_round_trip_through_their_canonical_text_and_step_back_by_the_lookback() {
        let ts = field(FieldType::Timestamp);
        let c = Cursor::parse(&ts, "2026-11-01T10:00:00+01:00").unwrap();
        assert_eq!(c.text(&ts), "2026-11-01T09:00:00Z");
        let back = c.minus(&ts, Some(Lookback::Time(Duration::from_secs(3600))));
        assert_eq!(back.text(&ts), "2026-11-01T08:00:00Z");
        assert_eq!(Cursor::parse(&ts, &back.text(&ts)), Some(back));
        let d = field(FieldType::Date);
        let c = Cursor::parse(&d, "2026-03-01").unwrap();
        assert_eq!(
            c.minus(&d, Some(Lookback::Time(Duration::from_secs(3600)))).text(&d),
            "2026-02-28"
        );
        let n = field(FieldType::Int64);
        let c = Cursor::parse(&n, "9007199254740993").unwrap();
        assert_eq!(c.minus(&n, Some(Lookback::Number(2))).text(&n), "9007199254740991");
        let dec = field(FieldType::Decimal {
            precision: 12,
            scale: 2,
        });
        assert_eq!(Cursor::parse(&dec, "12.5").unwrap().text(&dec), "12.50");
    }

    #[test]
    fn the_column_max_passes_over_rejected_and_null_rows() {
        let a = Int64Array::from(vec![Some(3), None, Some(9), Some(5)]);
        let valid = BooleanArray::from(vec![true, true, false, true]);
        assert_eq!(column_max(&a, Some(&valid)), Some(Cursor::Number(5)));
        assert_eq!(column_max(&a, None), Some(Cursor::Number(9)));
        let s = StringArray::from(vec!["b", "a"]);
        assert_eq!(column_max(&s, None), Some(Cursor::Text("b".into())));
    }
}
