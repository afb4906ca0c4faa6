//! `__ingot_slot_of(ingestion_run_id)`: the commit slot of a source's current run, null for any
//! other run. A catalog whose plans run in this process ranks the versions of
//! `bronze.<source>_current` with it instead of joining a table of slots onto them: the runs'
//! slots are in memory already, and a lookup per row costs less than grouping and joining a row
//! per run of the history (the plan a cluster gets still carries the slots as a table, see
//! [`crate::engine::catalog::bronze_views`]). Rows of one run lie together in a file, so the last
//! run looked up is compared first and most rows are decided without hashing.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Builder};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::exec_err;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use crate::table::text::Text;

/// The slot of each run id the UDF knows.
pub type Slots = hashbrown::HashMap<Text, i64>;

/// The UDF over `slots`.
pub fn slot_of_udf(slots: Slots) -> ScalarUDF {
    ScalarUDF::from(SlotOf {
        slots: Arc::new(slots),
        signature: Signature::string(1, Volatility::Immutable),
    })
}

/// The name the UDF has in plans.
pub const SLOT_OF: &str = "__ingot_slot_of";

/// The UDF of [`slot_of_udf`]; equal to another only over the same map.
struct SlotOf {
    slots: Arc<Slots>,
    signature: Signature,
}

impl std::fmt::Debug for SlotOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotOf").field("runs", &self.slots.len()).finish()
    }
}

impl PartialEq for SlotOf {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.slots, &other.slots)
    }
}

impl Eq for SlotOf {}

impl Hash for SlotOf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.slots) as usize).hash(state);
    }
}

impl SlotOf {
    /// The slots of `ids` (each `None` when null), rows of one run decided by one lookup.
    fn lookup<'a>(&self, n: usize, ids: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
        let mut out = Int64Builder::with_capacity(n);
        let mut last: Option<(&str, Option<i64>)> = None;
        for id in ids {
            let Some(id) = id else {
                out.append_null();
                continue;
            };
            let slot = match last {
                Some((was, slot)) if was == id => slot,
                _ => {
                    let slot = self.slots.get(id).copied();
                    last = Some((id, slot));
                    slot
                }
            };
            out.append_option(slot);
        }
        Arc::new(out.finish())
    }
}

impl ScalarUDFImpl for SlotOf {
    fn name(&self) -> &str {
        SLOT_OF
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return exec_err!("{SLOT_OF} takes 1 argument");
        };
        let array = arg.to_array(args.number_rows)?;
        let n = array.len();
        let out = match array.data_type() {
            DataType::Utf8 => self.lookup(n, array.as_string::<i32>().iter()),
            DataType::LargeUtf8 => self.lookup(n, array.as_string::<i64>().iter()),
            DataType::Utf8View => self.lookup(n, array.as_string_view().iter()),
            other => return exec_err!("{SLOT_OF} takes a run id (text), not {other}"),
        };
        Ok(ColumnarValue::Array(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray, StringViewArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::config::ConfigOptions;

    fn call(udf: &ScalarUDF, array: ArrayRef) -> Int64Array {
        let n = array.len();
        let args = ScalarFunctionArgs {
            args: vec![ColumnarValue::Array(array.clone())],
            arg_fields: vec![Arc::new(Field::new("r", array.data_type().clone(), true))],
            number_rows: n,
            return_field: Arc::new(Field::new("s", DataType::Int64, true)),
            config_options: Arc::new(ConfigOptions::default()),
        };
        match udf.invoke_with_args(args) {
            Ok(ColumnarValue::Array(a)) => a.as_primitive::<datafusion::arrow::datatypes::Int64Type>().clone(),
            other => panic!("unexpected result {other:?}"),
        }
    }

    #[test]
    fn runs_get_their_slots_and_other_runs_and_nulls_get_null_whatever_the_order() {
        let udf = slot_of_udf(Slots::from_iter([(Text::from("a"), 3), (Text::from("b"), 7)]));
        let ids = [
            Some("a"),
            Some("a"),
            Some("x"),
            None,
            Some("b"),
            Some("a"),
            Some("x"),
            Some("b"),
        ];
        let want = Int64Array::from(vec![Some(3), Some(3), None, None, Some(7), Some(3), None, Some(7)]);
        assert_eq!(call(&udf, Arc::new(StringArray::from(ids.to_vec()))), want);
        assert_eq!(call(&udf, Arc::new(StringViewArray::from(ids.to_vec()))), want);
    }
}
