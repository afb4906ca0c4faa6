//! `to_json_row(struct)`: one row as JSON object text, the `raw_payload` of a silver rejection.
//!
//! The argument is a struct (build it with `named_struct('a', a, 'b', b, ...)`); each row becomes
//! one JSON object with the struct's fields as keys, in order, nulls written as `null` (so a
//! missing key never has to be told apart from a null value). Values are encoded by arrow-json,
//! the encoder bronze uses for Parquet rows: numbers and decimals as JSON numbers (`12.50`),
//! strings, dates and timestamps as strings. A null struct gives a null.
//!
//! Hazard: the UDF is not one of the session's hashing UDFs; [`crate::silver::compile::transform`]
//! registers it in the session it is given so that the plans it builds resolve by name (for
//! `ingot sql`, serialization and, later, a cluster).

use std::sync::Arc;

use datafusion::arrow::array::{Array, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::arrow::json::writer::{EncoderOptions, make_encoder};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// The `to_json_row` UDF.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ToJsonRow {
    signature: Signature,
}

impl ToJsonRow {
    pub const NAME: &'static str = "to_json_row";

    pub fn new() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl Default for ToJsonRow {
    fn default() -> Self {
        Self::new()
    }
}

/// The UDF, for registering in a session.
pub fn to_json_row_udf() -> ScalarUDF {
    ScalarUDF::from(ToJsonRow::new())
}

/// `to_json_row(named_struct(name1, e1, ...))` over `(name, expr)` pairs: the column names are
/// string literals (data), never SQL text. No columns give the literal `{}`.
pub fn to_json_row(columns: Vec<(String, Expr)>) -> Expr {
    if columns.is_empty() {
        return datafusion::prelude::lit("{}");
    }
    let mut args = Vec::with_capacity(columns.len() * 2);
    for (name, e) in columns {
        args.push(datafusion::prelude::lit(name));
        args.push(e);
    }
    let row = datafusion::functions::core::expr_fn::named_struct(args);
    Arc::new(to_json_row_udf()).call(vec![row])
}

impl ScalarUDFImpl for ToJsonRow {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [DataType::Struct(_)] => Ok(DataType::Utf8),
            [other] => plan_err!("to_json_row: the argument must be a struct (named_struct(...)), got {other}"),
            _ => plan_err!("to_json_row takes 1 argument, got {}", arg_types.len()),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let types: Vec<DataType> = args.arg_fields.iter().map(|f| f.data_type().clone()).collect();
        let ty = self.return_type(&types)?;
        let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
        Ok(Arc::new(Field::new(self.name(), ty, nullable)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return exec_err!("to_json_row takes 1 argument, got {}", args.args.len());
        };
        let scalar = matches!(arg, ColumnarValue::Scalar(_));
        let array = arg.to_array(args.number_rows)?;
        if !matches!(array.data_type(), DataType::Struct(_)) {
            return exec_err!("to_json_row: the argument must be a struct, got {}", array.data_type());
        }
        let field: FieldRef = Arc::new(Field::new("row", array.data_type().clone(), true));
        let options = EncoderOptions::default().with_explicit_nulls(true);
        let mut encoder = make_encoder(&field, array.as_ref(), &options)?;
        let mut out = StringBuilder::with_capacity(array.len(), array.len() * 64);
        let mut buf = Vec::with_capacity(256);
        for row in 0..array.len() {
            if array.is_null(row) {
                out.append_null();
                continue;
            }
            buf.clear();
            encoder.encode(row, &mut buf);
            match std::str::from_utf8(&buf) {
                Ok(s) => out.append_value(s),
                Err(e) => return exec_err!("to_json_row: encoder wrote invalid UTF-8: {e}"),
            }
        }
        let result = Arc::new(out.finish());
        if scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(result.as_ref(), 0)?))
        } else {
            Ok(ColumnarValue::Array(result))
        }
    }
}
