//! List columns made per batch, not per row: `__ingot_repeat(value, column)` (a literal on every
//! row) and `__ingot_flags(names, fire, ...)` (per row, the names whose condition holds). What
//! they replace costs a row-by-row copy: DataFusion expands a list literal with a `take` of one
//! list per row, and `CASE` over lists zips them row by row. Both are stateless (their values
//! are arguments), so a plan that holds them can run on a cluster.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray, UInt32Array};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility, lit,
};

/// `value` (a list literal) on every row of `like`'s batch.
pub fn repeat(value: ScalarValue, like: Expr) -> Expr {
    Arc::new(repeat_udf()).call(vec![lit(value), like])
}

/// Per row, the `names` whose `fires` (boolean, one per name) are true, in order.
pub fn flags(names: &[&str], fires: Vec<Expr>) -> Expr {
    let values: Vec<ScalarValue> = names.iter().map(|n| ScalarValue::Utf8(Some(n.to_string()))).collect();
    let names = ScalarValue::List(ScalarValue::new_list_nullable(&values, &DataType::Utf8));
    let mut args = vec![lit(names)];
    args.extend(fires);
    Arc::new(flags_udf()).call(args)
}

pub fn repeat_udf() -> ScalarUDF {
    ScalarUDF::from(Repeat {
        signature: Signature::any(2, Volatility::Immutable),
    })
}

pub fn flags_udf() -> ScalarUDF {
    ScalarUDF::from(Flags {
        signature: Signature::variadic_any(Volatility::Immutable),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Repeat {
    signature: Signature,
}

impl ScalarUDFImpl for Repeat {
    fn name(&self) -> &str {
        "__ingot_repeat"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [t, _] => Ok(t.clone()),
            _ => plan_err!("__ingot_repeat takes 2 arguments"),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        match args.arg_fields {
            [f, _] => Ok(Arc::new(Field::new(
                self.name(),
                f.data_type().clone(),
                f.is_nullable(),
            ))),
            _ => plan_err!("__ingot_repeat takes 2 arguments"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        match args.args.first() {
            Some(ColumnarValue::Scalar(ScalarValue::List(one))) if one.len() == 1 && one.is_valid(0) => {
                let field = match one.data_type() {
                    DataType::List(f) => f.clone(),
                    t => return exec_err!("__ingot_repeat of {t}"),
                };
                let values = one.value(0);
                let (k, n) = (values.len(), args.number_rows);
                let at = UInt32Array::from_iter_values((0..n).flat_map(|_| 0..k as u32));
                let all = take(&values, &at, None)?;
                let out = ListArray::try_new(field, OffsetBuffer::from_lengths(std::iter::repeat_n(k, n)), all, None)?;
                Ok(ColumnarValue::Array(Arc::new(out)))
            }
            Some(ColumnarValue::Scalar(s)) => Ok(ColumnarValue::Array(s.to_array_of_size(args.number_rows)?)),
            Some(ColumnarValue::Array(a)) => Ok(ColumnarValue::Array(a.clone())),
            None => exec_err!("__ingot_repeat takes 2 arguments"),
        }
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Flags {
    signature: Signature,
}

impl ScalarUDFImpl for Flags {
    fn name(&self) -> &str {
        "__ingot_flags"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(t @ DataType::List(_)) => Ok(t.clone()),
            _ => plan_err!("__ingot_flags takes a list of names, then one condition per name"),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        match args.arg_fields.first() {
            Some(f) if matches!(f.data_type(), DataType::List(_)) => {
                Ok(Arc::new(Field::new(self.name(), f.data_type().clone(), false)))
            }
            _ => plan_err!("__ingot_flags takes a list of names, then one condition per name"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let Some(ColumnarValue::Scalar(ScalarValue::List(names))) = args.args.first() else {
            return exec_err!("__ingot_flags takes a list of names first");
        };
        let field = match names.data_type() {
            DataType::List(f) => f.clone(),
            t => return exec_err!("__ingot_flags of {t}"),
        };
        let names = names.value(0);
        if args.args.len() != names.len() + 1 {
            return exec_err!(
                "__ingot_flags: {} names but {} conditions",
                names.len(),
                args.args.len() - 1
            );
        }
        let fires: Vec<ArrayRef> = args.args[1..].iter().map(|f| f.to_array(n)).collect::<Result<_>>()?;
        let fires: Vec<_> = fires
            .iter()
            .map(|f| match f.as_boolean_opt() {
                Some(b) => Ok(b),
                None => exec_err!("__ingot_flags: a condition of type {}", f.data_type()),
            })
            .collect::<Result<_>>()?;
        let mut at: Vec<u32> = Vec::new();
        let mut lengths = Vec::with_capacity(n);
        for row in 0..n {
            let before = at.len();
            for (j, f) in fires.iter().enumerate() {
                if f.is_valid(row) && f.value(row) {
                    at.push(j as u32);
                }
            }
            lengths.push(at.len() - before);
        }
        let values = take(&names, &UInt32Array::from(at), None)?;
        let out = ListArray::try_new(field, OffsetBuffer::from_lengths(lengths), values, None)?;
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}
