//! Arrow schemas as Delta schemas (`schemaString`): every column nullable, dictionaries and
//! string views as their value type, timestamps in UTC as `timestamp`.

use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The Delta schema of `schema` plus `extra` columns (name, Delta type) at the end, as the JSON
/// a `metaData` action carries.
pub fn schema_string(schema: &Schema, extra: &[(&str, &str)]) -> Result<String> {
    let mut fields: Vec<Value> = schema.fields().iter().map(|f| field(f)).collect::<Result<_>>()?;
    for (name, ty) in extra {
        fields.push(json!({"name": name, "type": ty, "nullable": true, "metadata": {}}));
    }
    Ok(json!({"type": "struct", "fields": fields}).to_string())
}

fn field(f: &Field) -> Result<Value> {
    Ok(json!({
        "name": f.name(),
        "type": data_type(f.name(), f.data_type())?,
        "nullable": true,
        "metadata": {},
    }))
}

fn data_type(name: &str, t: &DataType) -> Result<Value> {
    Ok(match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => json!("string"),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
            json!("binary")
        }
        DataType::Boolean => json!("boolean"),
        DataType::Int8 => json!("byte"),
        DataType::Int16 => json!("short"),
        DataType::Int32 => json!("integer"),
        DataType::Int64 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Date32 | DataType::Date64 => json!("date"),
        DataType::Timestamp(TimeUnit::Microsecond | TimeUnit::Millisecond | TimeUnit::Second, Some(tz))
            if tz.eq_ignore_ascii_case("UTC") || tz.as_ref() == "+00:00" =>
        {
            json!("timestamp")
        }
        DataType::Decimal128(p, s) if *s >= 0 && *p <= 38 => json!(format!("decimal({p},{s})")),
        DataType::Dictionary(_, value) => data_type(name, value)?,
        DataType::List(item) | DataType::LargeList(item) | DataType::ListView(item) => json!({
            "type": "array",
            "elementType": data_type(name, item.data_type())?,
            "containsNull": true,
        }),
        DataType::Map(entries, _) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(Error::Invalid(format!(
                    "column \"{name}\": a map whose entries are not a struct"
                )));
            };
            let (Some(k), Some(v)) = (kv.first(), kv.get(1)) else {
                return Err(Error::Invalid(format!(
                    "column \"{name}\": a map without keys and values"
                )));
            };
            json!({
                "type": "map",
                "keyType": data_type(name, k.data_type())?,
                "valueType": data_type(name, v.data_type())?,
                "valueContainsNull": true,
            })
        }
        DataType::Struct(fields) => json!({
            "type": "struct",
            "fields": fields.iter().map(|f| field(f)).collect::<Result<Vec<_>>>()?,
        }),
        other => {
            return Err(Error::Invalid(format!(
                "column \"{name}\" has type {other}, which a Delta table cannot hold (string, binary, boolean, \
                 8- to 64-bit integers, float, double, date, UTC timestamps in microseconds, decimal up to 38 digits, \
                 lists, maps and structs of these)"
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_ingot_type_has_a_delta_type_and_others_are_named() {
        let schema = Schema::new(vec![
            Field::new("s", DataType::Utf8, false),
            Field::new("i", DataType::Int32, true),
            Field::new("l", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(10, 2), true),
            Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("day", DataType::Date32, true),
            Field::new(
                "flags",
                DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                true,
            ),
            Field::new(
                "run",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
        ]);
        let s: Value = serde_json::from_str(&schema_string(&schema, &[("commit_seq", "long")]).unwrap()).unwrap();
        let types: Vec<Value> = s["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["type"].clone())
            .collect();
        assert_eq!(
            types,
            vec![
                json!("string"),
                json!("integer"),
                json!("long"),
                json!("decimal(10,2)"),
                json!("timestamp"),
                json!("date"),
                json!({"type": "array", "elementType": "string", "containsNull": true}),
                json!("string"),
                json!("long"),
            ]
        );
        assert!(
            s["fields"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f["nullable"] == json!(true))
        );
        let naive = Schema::new(vec![Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        )]);
        let e = schema_string(&naive, &[]).unwrap_err().to_string();
        assert!(e.contains("column \"at\"") && e.contains("UTC timestamps"), "{e}");
    }
}
