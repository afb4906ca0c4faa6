//! The hashing SQL functions: `row_hash(v1, ..., vn)`,
//! `natural_key_fingerprint(version, v1, ..., vn)`, `canonical_text(x)` and
//! `normalize_text(x, 'step,step')`, as DataFusion `ScalarUDFImpl`s over the kernels of
//! [`crate::hash`].
//!
//! Role: make the exact bronze formulas available in every `SessionContext` (and later in
//! other registries, e.g. Ballista) so analysts can recompute and join on them.
//!
//! Hazards:
//! * Types are checked at planning (`coerce_types`) and again when invoked, so an
//!   unsupported argument is an error naming the function, the argument and the type, never
//!   a silent null. `coerce_types` keeps every supported type as it is: casting a value
//!   before hashing would change its canonical text.
//! * All-scalar calls return a scalar; otherwise scalars are expanded to the batch size.
//! * `normalize_text` needs its step list as a string literal; unknown step names are a
//!   planning error when the literal is visible to the planner, an execution error otherwise.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::{DataFusionError, ScalarValue, exec_datafusion_err, exec_err, plan_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::canonical::{CanonicalColumn, SUPPORTED_TYPES, check_supported};
use super::normalize::{normalize_array, parse_steps};
use super::{KeyVersion, Utf8Output, fingerprint_columns, row_hash_columns};

/// `row_hash(v1, ..., vn)`: the row hash (docs/formats.md#hashes) of the arguments, in order.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RowHash {
    signature: Signature,
}

/// `natural_key_fingerprint(version, v1, ..., vn)`: the fingerprint (docs/formats.md#hashes). `version` is
/// any integer (normally a literal); the fields must already be normalized.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NaturalKeyFingerprint {
    signature: Signature,
}

/// `canonical_text(x)`: the canonical text of a value, null for null.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CanonicalText {
    signature: Signature,
}

/// `normalize_text(x, 'trim,lower')`: apply contract `normalize` steps to a string.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NormalizeText {
    signature: Signature,
}

macro_rules! impl_new {
    ($($name:ident),*) => {$(
        impl $name {
            /// The UDF with its (user-defined, immutable) signature.
            pub fn new() -> Self {
                Self { signature: Signature::user_defined(Volatility::Immutable) }
            }
        }
        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    )*};
}
impl_new!(RowHash, NaturalKeyFingerprint, CanonicalText, NormalizeText);

impl ScalarUDFImpl for RowHash {
    fn name(&self) -> &str {
        "row_hash"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        check_hashable(self.name(), arg_types, 0)?;
        Ok(arg_types.to_vec())
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, _args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(utf8_field(self.name(), false))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let all_scalar = all_scalars(&args.args);
        let num_rows = if all_scalar { 1 } else { args.number_rows };
        let arrays = to_arrays(&args.args, num_rows)?;
        let columns = columns_for(self.name(), &arrays, 0)?;
        finish(row_hash_columns(&columns, num_rows)?, all_scalar)
    }
}

impl ScalarUDFImpl for NaturalKeyFingerprint {
    fn name(&self) -> &str {
        "natural_key_fingerprint"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let Some((version, fields)) = arg_types.split_first() else {
            return plan_err!("natural_key_fingerprint(version, v1, ..., vn) needs at least the version");
        };
        if !(version.is_integer() || version.is_null()) {
            return plan_err!("natural_key_fingerprint: argument 1 (version) must be an integer, got {version}");
        }
        check_hashable(self.name(), fields, 1)?;
        let mut coerced = Vec::with_capacity(arg_types.len());
        coerced.push(DataType::Int64);
        coerced.extend_from_slice(fields);
        Ok(coerced)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, _args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(utf8_field(self.name(), false))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let Some((version, fields)) = args.args.split_first() else {
            return exec_err!("natural_key_fingerprint needs at least the version argument");
        };
        let all_scalar = all_scalars(&args.args);
        let num_rows = if all_scalar { 1 } else { args.number_rows };
        let arrays = to_arrays(fields, num_rows)?;
        let columns = columns_for(self.name(), &arrays, 1)?;
        let result = match version {
            ColumnarValue::Scalar(scalar) => {
                fingerprint_columns(KeyVersion::Constant(scalar_version(scalar)?), &columns, num_rows)?
            }
            ColumnarValue::Array(array) => {
                let versions = cast(array, &DataType::Int64)?;
                let versions = versions
                    .as_primitive_opt::<Int64Type>()
                    .ok_or_else(|| exec_datafusion_err!("natural_key_fingerprint: version did not cast to Int64"))?;
                fingerprint_columns(KeyVersion::PerRow(versions), &columns, num_rows)?
            }
        };
        finish(result, all_scalar)
    }
}

impl ScalarUDFImpl for CanonicalText {
    fn name(&self) -> &str {
        "canonical_text"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.len() != 1 {
            return plan_err!("canonical_text(x) takes 1 argument, got {}", arg_types.len());
        }
        check_hashable(self.name(), arg_types, 0)?;
        Ok(arg_types.to_vec())
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
        Ok(utf8_field(self.name(), nullable))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let all_scalar = all_scalars(&args.args);
        let arrays = to_arrays(&args.args, if all_scalar { 1 } else { args.number_rows })?;
        let [array] = arrays.as_slice() else {
            return exec_err!("canonical_text(x) takes 1 argument, got {}", arrays.len());
        };
        let column = columns_for(self.name(), std::slice::from_ref(array), 0)?;
        let mut out = Utf8Output::with_capacity(array.len(), array.len() * 16);
        for row in 0..array.len() {
            if column[0].write(row, out.values_mut()) {
                out.end_value()?;
            } else {
                out.push_null()?;
            }
        }
        finish(out.finish()?, all_scalar)
    }
}

impl ScalarUDFImpl for NormalizeText {
    fn name(&self) -> &str {
        "normalize_text"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [text, steps] = arg_types else {
            return plan_err!(
                "normalize_text(x, 'step,step') takes 2 arguments, got {}",
                arg_types.len()
            );
        };
        Ok(vec![coerce_string(text, 1)?, coerce_string(steps, 2)?])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        // Validate the step list at planning when the planner can see the literal.
        if let Some(Some(steps)) = args.scalar_arguments.get(1) {
            steps_from_scalar(steps)?;
        }
        let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
        Ok(utf8_field(self.name(), nullable))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [text, steps] = args.args.as_slice() else {
            return exec_err!(
                "normalize_text(x, 'step,step') takes 2 arguments, got {}",
                args.args.len()
            );
        };
        let ColumnarValue::Scalar(steps) = steps else {
            return exec_err!("normalize_text: argument 2 (steps) must be a string literal");
        };
        let steps = steps_from_scalar(steps)?;
        match text {
            ColumnarValue::Array(array) => Ok(ColumnarValue::Array(normalize_array(&steps, array.as_ref())?)),
            ColumnarValue::Scalar(scalar) => {
                let array = normalize_array(&steps, scalar.to_array_of_size(1)?.as_ref())?;
                finish(array, true)
            }
        }
    }
}

/// A `Utf8` return field.
fn utf8_field(name: &str, nullable: bool) -> FieldRef {
    Arc::new(Field::new(name, DataType::Utf8, nullable))
}

/// Check that every argument type has a canonical text; `offset` is the number of
/// arguments before `arg_types` (for 1-based argument numbers in the message).
fn check_hashable(function: &str, arg_types: &[DataType], offset: usize) -> Result<()> {
    for (i, dt) in arg_types.iter().enumerate() {
        if check_supported(dt).is_err() {
            return Err(unsupported_argument(function, i + 1 + offset, dt));
        }
    }
    Ok(())
}

/// The error for an argument without canonical text.
fn unsupported_argument(function: &str, position: usize, dt: &DataType) -> DataFusionError {
    plan_datafusion_err!(
        "{function}: argument {position} has unsupported type {dt}; supported types are: {SUPPORTED_TYPES}"
    )
}

/// Downcast every argument array, with errors naming the function and argument.
fn columns_for<'a>(function: &str, arrays: &'a [ArrayRef], offset: usize) -> Result<Vec<CanonicalColumn<'a>>> {
    let column = |(i, array): (usize, &'a ArrayRef)| {
        CanonicalColumn::new(array.as_ref())
            .map_err(|_| unsupported_argument(function, i + 1 + offset, array.data_type()))
    };
    arrays.iter().enumerate().map(column).collect()
}

/// Whether every argument is a scalar (then the result is a scalar too).
fn all_scalars(args: &[ColumnarValue]) -> bool {
    args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)))
}

/// Convert arguments to arrays of `len` rows (scalars are repeated).
fn to_arrays(args: &[ColumnarValue], len: usize) -> Result<Vec<ArrayRef>> {
    args.iter().map(|a| a.to_array(len)).collect()
}

/// Wrap a result array: a scalar when every input was a scalar.
fn finish(result: ArrayRef, all_scalar: bool) -> Result<ColumnarValue> {
    if all_scalar {
        Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?))
    } else {
        Ok(ColumnarValue::Array(result))
    }
}

/// The fingerprint version from a scalar argument of any integer type.
fn scalar_version(scalar: &ScalarValue) -> Result<i64> {
    match scalar.cast_to(&DataType::Int64)? {
        ScalarValue::Int64(Some(v)) => Ok(v),
        ScalarValue::Int64(None) => exec_err!("natural_key_fingerprint: version is null"),
        other => exec_err!(
            "natural_key_fingerprint: argument 1 (version) must be an integer, got {}",
            other.data_type()
        ),
    }
}

/// Coerce a `normalize_text` argument to a string type: strings stay, `NULL` becomes
/// `Utf8`, a dictionary of strings is unpacked; anything else is an error.
fn coerce_string(dt: &DataType, position: usize) -> Result<DataType> {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Ok(dt.clone()),
        DataType::Null => Ok(DataType::Utf8),
        DataType::Dictionary(_, values)
            if matches!(**values, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) =>
        {
            Ok((**values).clone())
        }
        other => plan_err!(
            "normalize_text: argument {position} must be a string (Utf8, LargeUtf8 or \
             Utf8View), got {other}; normalize steps apply to strings only"
        ),
    }
}

/// Parse the step list of `normalize_text` from its literal.
fn steps_from_scalar(scalar: &ScalarValue) -> Result<Vec<super::NormalizeStep>> {
    match scalar.try_as_str() {
        Some(Some(list)) => parse_steps(list),
        Some(None) => exec_err!("normalize_text: argument 2 (steps) must not be NULL"),
        None => exec_err!(
            "normalize_text: argument 2 (steps) must be a string literal, got {}",
            scalar.data_type()
        ),
    }
}
