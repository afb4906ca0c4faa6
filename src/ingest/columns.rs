//! Matching an input's column names (a CSV header, a Parquet schema) to contract fields.
//!
//! Problems here fail the run before anything is written, each naming the file (and line) and
//! what would have been valid: a duplicate column, a nameless column, a column not in the contract
//! under `unknown_fields: reject`, a declared field missing (unless it says `missing: null`).

use crate::error::{Error, Result};
use crate::spec::contract::{Contract, UnknownFields};

/// How the input's columns map to the contract's fields.
#[derive(Debug, Default)]
pub struct ColumnMap {
    /// For each input column, the contract field it feeds.
    pub column_field: Vec<Option<usize>>,
    /// For each contract field, the input column it comes from.
    pub field_column: Vec<Option<usize>>,
    /// Input columns dropped under `unknown_fields: ignore`.
    pub ignored: Vec<String>,
}

fn quoted(names: &[impl AsRef<str>]) -> String {
    names
        .iter()
        .map(|n| format!("\"{}\"", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Match `names` (in input order) against the contract. `at` locates the header in messages,
/// e.g. `data/x.csv:1`.
pub fn match_columns(contract: &Contract, names: &[String], at: &str) -> Result<ColumnMap> {
    let mut map = ColumnMap {
        field_column: vec![None; contract.fields.len()],
        ..Default::default()
    };
    let mut unknown = Vec::new();
    for (j, name) in names.iter().enumerate() {
        match contract.input_index(name) {
            Some(i) if map.field_column[i].is_some() => {
                return Err(Error::RunFailed(format!(
                    "{at}: column \"{name}\" appears twice (columns {} and {})",
                    map.field_column[i].map(|c| c + 1).unwrap_or(0),
                    j + 1
                )));
            }
            Some(i) => {
                map.field_column[i] = Some(j);
                map.column_field.push(Some(i));
            }
            None if name.is_empty() => {
                return Err(Error::RunFailed(format!(
                    "{at}: column {} has no name (a trailing delimiter?); the columns are: {}",
                    j + 1,
                    names.join(", ")
                )));
            }
            None => {
                unknown.push(name.clone());
                map.column_field.push(None);
            }
        }
    }
    if !unknown.is_empty() {
        match contract.unknown_fields {
            UnknownFields::Reject => {
                return Err(Error::RunFailed(format!(
                    "{at}: column{} {} not in contract {} (unknown_fields: reject); contract fields are: {}. \
                     Add the column to the contract or set unknown_fields: ignore",
                    if unknown.len() > 1 { "s" } else { "" },
                    quoted(&unknown),
                    contract.path.display(),
                    contract.input_names().join(", ")
                )));
            }
            UnknownFields::Ignore => map.ignored = unknown,
        }
    }
    // Declared fields the input lacks (a required field can never say `missing: null`); the
    // required ones are named first, on their own.
    let absent: Vec<&crate::spec::contract::Field> = contract
        .fields
        .iter()
        .zip(&map.field_column)
        .filter(|(f, c)| !f.may_be_missing && c.is_none())
        .map(|(f, _)| f)
        .collect();
    let missing: Vec<&str> = absent.iter().filter(|f| f.required).map(|f| f.input_name()).collect();
    if !missing.is_empty() {
        return Err(Error::RunFailed(format!(
            "{at}: required column{} {} missing; the columns are: {}",
            if missing.len() > 1 { "s" } else { "" },
            quoted(&missing),
            names.join(", ")
        )));
    }
    let absent: Vec<&str> = absent.iter().map(|f| f.input_name()).collect();
    if !absent.is_empty() {
        let renamed = if map.ignored.is_empty() {
            String::new()
        } else {
            format!(
                "; the file has column{} the contract does not declare: {} (renamed upstream? then give \
                 the field `source_name: <its new name>`, or rename the field in the contract and add \
                 `renamed_from: {}` to it, so the runs loaded before read under the new name)",
                if map.ignored.len() > 1 { "s" } else { "" },
                quoted(&map.ignored),
                absent[0]
            )
        };
        return Err(Error::RunFailed(format!(
            "{at}: declared column{} {} missing, so {} would be null in every record; the columns \
             are: {}{renamed}. A field that files may lack says `missing: null` in {}",
            if absent.len() > 1 { "s" } else { "" },
            quoted(&absent),
            if absent.len() > 1 { "they" } else { "it" },
            names.join(", "),
            contract.path.display()
        )));
    }
    Ok(map)
}
