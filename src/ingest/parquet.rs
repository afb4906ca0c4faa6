//! Parquet loader: columns are matched by name and cast to the contract types.
//!
//! A value that does not survive the cast (`safe` cast gives null where the source was not null)
//! rejects its row with `type:<field>`; the raw payload of a rejected row is the source row as
//! JSON. Schema problems (a required field absent, an unknown column with `unknown_fields:
//! reject`) fail the run before anything is written.

use std::fs::File;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, new_null_array};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};

use crate::error::{Error, Result};
use crate::ingest::Loader;
use crate::ingest::columns::match_columns;
use crate::ingest::sink::{ParsedBatch, RowRejection, key_part_problem};
use crate::spec::contract::{Contract, Field, FieldType};
use crate::spec::types::{ColumnBuilder, Rejection, Value, check_value, parse_value, shown};

pub struct ParquetLoader {
    reader: ParquetRecordBatchReader,
    contract: Arc<Contract>,
    /// For each contract field, its column index in the file.
    field_column: Vec<Option<usize>>,
    ignored: Vec<String>,
    row_number: u64,
    display: String,
    norm: String,
    scratch: String,
    keep_raw: bool,
}

impl ParquetLoader {
    pub fn open(
        contract: Arc<Contract>,
        file: File,
        display: String,
        batch_size: usize,
        keep_raw: bool,
    ) -> Result<ParquetLoader> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(file)
            .map_err(|e| Error::RunFailed(format!("{display}: not a readable Parquet file: {e}")))?;
        let schema = builder.schema().clone();
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let map = match_columns(&contract, &names, &format!("{display}: Parquet schema"))?;
        let (field_column, unknown) = (map.field_column, map.ignored);
        let reader = builder
            .with_batch_size(batch_size)
            .build()
            .map_err(|e| Error::RunFailed(format!("{display}: {e}")))?;
        Ok(ParquetLoader {
            reader,
            contract,
            field_column,
            ignored: unknown,
            row_number: 0,
            display: display.clone(),
            norm: String::new(),
            scratch: String::new(),
            keep_raw,
        })
    }

    /// Cast a typed column to the field's type; a value that does not survive the cast exactly
    /// (rounded, truncated or out of range) rejects its row.
    fn cast_losslessly(
        &self,
        src: &ArrayRef,
        f: &Field,
        name: &str,
        first: &mut [Option<Rejection>],
    ) -> Result<ArrayRef> {
        let target = f.ty.arrow_type();
        if src.data_type() == &target {
            return Ok(src.clone());
        }
        let opts = CastOptions {
            safe: true,
            ..Default::default()
        };
        let cannot = |e: datafusion::arrow::error::ArrowError| {
            Error::RunFailed(format!(
                "{}: column {name} ({}) cannot be read as {} ({}): {e}",
                self.display,
                src.data_type(),
                f.ty.name(),
                f.name
            ))
        };
        let typed = cast_with_options(src, &target, &opts).map_err(cannot)?;
        let back = cast_with_options(&typed, src.data_type(), &opts).map_err(cannot)?;
        let differs = datafusion::arrow::compute::kernels::cmp::distinct(&back, src).map_err(cannot)?;
        let formatter = ArrayFormatter::try_new(src.as_ref(), &FormatOptions::default()).map_err(cannot)?;
        for (row, slot) in first.iter_mut().enumerate() {
            if src.is_valid(row) && (typed.is_null(row) || differs.value(row)) && slot.is_none() {
                *slot = Some(Rejection::new(
                    format!("type:{}", f.name),
                    format!(
                        "{}: {} value {} cannot be stored as {} without loss",
                        f.name,
                        src.data_type(),
                        shown(&formatter.value(row).to_string()),
                        f.ty.name()
                    ),
                ));
            }
        }
        Ok(typed)
    }

    fn convert(&mut self, batch: RecordBatch) -> Result<ParsedBatch> {
        let n = batch.num_rows();
        let mut columns = Vec::with_capacity(self.contract.fields.len());
        let mut first: Vec<Option<Rejection>> = vec![None; n];
        let mut key_ok = vec![true; n];
        let opts = CastOptions {
            safe: true,
            ..Default::default()
        };
        let contract = self.contract.clone();
        let composite = contract.natural_key.fields.len() > 1;
        for (i, f) in contract.fields.iter().enumerate() {
            let target = f.ty.arrow_type();
            let typed: ArrayRef = match self.field_column[i] {
                None => new_null_array(&target, n),
                Some(j) => {
                    let src = batch.column(j);
                    let name = batch.schema().field(j).name().clone();
                    if matches!(
                        src.data_type(),
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                    ) {
                        // Text columns go through the same parser as CSV (formats, strictness).
                        let text = cast_with_options(src, &DataType::Utf8, &opts)
                            .map_err(|e| Error::RunFailed(format!("{}: column {name}: {e}", self.display)))?;
                        let text = text.as_string::<i32>();
                        let mut b = ColumnBuilder::new(f.ty, n);
                        for (row, slot) in first.iter_mut().enumerate() {
                            if text.is_null(row) {
                                b.append_null();
                                continue;
                            }
                            match parse_value(f, text.value(row)) {
                                Ok(v) => b.append(&v),
                                Err(r) => {
                                    b.append_null();
                                    slot.get_or_insert(r);
                                }
                            }
                        }
                        b.finish()?
                    } else {
                        self.cast_losslessly(src, f, &name, &mut first)?
                    }
                }
            };
            let is_key = contract.natural_key.fields.contains(&i);
            for row in 0..n {
                let rej = match value_at(&typed, f, row) {
                    None if typed.is_null(row) && f.required => Some(Rejection::new(
                        format!("required:{}", f.name),
                        format!("{}: required value is missing", f.name),
                    )),
                    None => None,
                    Some(v) => check_value(f, &v, &mut self.norm, &mut self.scratch),
                };
                let rej = match rej {
                    // a non-string part is only checked for null (its text is never empty, has no `|`)
                    None if is_key => {
                        let text = match value_at(&typed, f, row) {
                            None => None,
                            Some(Value::Str(t)) => Some(t),
                            Some(_) => Some(""),
                        };
                        key_part_problem(f, text, composite, &mut self.norm, &mut self.scratch)
                    }
                    other => other,
                };
                if is_key
                    && (typed.is_null(row)
                        && (f.required
                            || first[row]
                                .as_ref()
                                .is_some_and(|r| r.rule == format!("type:{}", f.name))))
                {
                    key_ok[row] = false;
                }
                if first[row].is_none() {
                    first[row] = rej;
                }
            }
            columns.push(typed);
        }
        let mut rejections = Vec::new();
        let mut valid = Vec::with_capacity(n);
        let start = self.row_number;
        for (row, rej) in first.into_iter().enumerate() {
            valid.push(rej.is_none());
            if let Some(r) = rej {
                rejections.push(RowRejection {
                    index: row,
                    row_number: start + row as u64 + 1,
                    rule: r.rule,
                    reason: r.reason,
                    raw_payload: row_as_json(&batch, row),
                    key_ok: key_ok[row],
                });
            }
        }
        self.row_number += n as u64;
        let row_numbers = Arc::new(Int64Array::from_iter_values(
            (start + 1..=start + n as u64).map(|r| r as i64),
        ));
        let valid = if rejections.is_empty() {
            None
        } else {
            Some(BooleanArray::from(valid))
        };
        let raw = self
            .keep_raw
            .then(|| (0..n).map(|r| Some(row_as_json(&batch, r))).collect());
        Ok(ParsedBatch {
            columns,
            row_numbers,
            valid,
            rejections,
            raw,
            texts: None,
            bytes_read: 0,
        })
    }
}

/// The value of a typed column at `row`, for the checks.
fn value_at<'a>(array: &'a ArrayRef, field: &Field, row: usize) -> Option<Value<'a>> {
    if array.is_null(row) {
        return None;
    }
    Some(match field.ty {
        FieldType::String => Value::Str(array.as_string::<i32>().value(row)),
        FieldType::Int32 => Value::Int(array.as_primitive::<Int32Type>().value(row) as i64),
        FieldType::Int64 => Value::Int(array.as_primitive::<Int64Type>().value(row)),
        FieldType::Float64 => Value::Float(array.as_primitive::<Float64Type>().value(row)),
        FieldType::Decimal { .. } => Value::Decimal(array.as_primitive::<Decimal128Type>().value(row)),
        FieldType::Boolean => Value::Bool(array.as_boolean().value(row)),
        FieldType::Date => Value::Date(array.as_primitive::<Date32Type>().value(row)),
        FieldType::Timestamp => Value::Timestamp(array.as_primitive::<TimestampMicrosecondType>().value(row)),
    })
}

/// One source row rendered as a JSON object (the raw payload of a rejected Parquet row).
pub fn row_as_json(batch: &RecordBatch, row: usize) -> String {
    let slice = batch.slice(row, 1);
    let mut buf = Vec::new();
    {
        let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut buf);
        if w.write(&slice).and_then(|_| w.finish()).is_err() {
            return format!("<row {row} could not be rendered as JSON>");
        }
    }
    String::from_utf8_lossy(trim_nl(&buf)).into_owned()
}

fn trim_nl(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\n").unwrap_or(b)
}

impl Loader for ParquetLoader {
    fn next_batch(&mut self) -> Result<Option<ParsedBatch>> {
        match self.reader.next() {
            None => Ok(None),
            Some(batch) => {
                let batch = batch.map_err(|e| Error::RunFailed(format!("{}: {e}", self.display)))?;
                Ok(Some(self.convert(batch)?))
            }
        }
    }

    fn ignored_columns(&self) -> Vec<String> {
        self.ignored.clone()
    }
}
