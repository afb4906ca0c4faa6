//! Every column name ingot reserves, and the Arrow fields of the bronze metadata columns.
//!
//! The names are the columns of ingot's own tables (bronze, silver, audit); a contract field or
//! a rules column may not take one of them. The tables' full schemas live in [`crate::table`].

use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};

/// Names of contract fields and of columns rules create: lower case (a leading `_` allowed),
/// digits and `_`, at most 63 bytes, so SQL never needs to quote them.
pub fn is_column_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// Column names a contract may not use: every column of every table in docs/formats.md#tables.
/// The prefix of the columns ingot adds inside its plans (`__ingot_slot`, ...): no field or
/// silver column may begin with it.
pub const RESERVED_PREFIX: &str = "__ingot";

/// Is `name` a column ingot keeps (one of [`RESERVED_COLUMNS`], or beginning with
/// [`RESERVED_PREFIX`])?
pub fn is_reserved(name: &str) -> bool {
    RESERVED_COLUMNS.contains(&name) || name.starts_with(RESERVED_PREFIX)
}

pub const RESERVED_COLUMNS: &[&str] = &[
    // bronze
    "ingestion_run_id",
    "file_hash",
    "row_hash",
    "natural_key_fingerprint",
    "natural_key_version",
    "contract_version",
    "source_row_number",
    "ingested_at",
    "is_deleted",
    "previous_natural_key_fingerprint",
    // silver
    "rules_version",
    "anomaly_flags",
    "is_anomaly",
    "silver_build_id",
    // silver, a table with several sources (crate::spec::rules::sources::PROVENANCE_COLUMNS)
    "contributing_sources",
    "field_sources",
    "conflict_fields",
    // audit.ingestion_run_log
    "run_id",
    "source",
    "file_path",
    "file_bytes",
    "started_at",
    "finished_at",
    "status",
    "rows_seen",
    "rows_inserted",
    "rows_updated",
    "rows_unchanged",
    "rows_failed",
    "rows_deleted",
    "previous_natural_key_version",
    "natural_key_definition",
    "rows_superseded",
    "contract_fields",
    "failure_class",
    "held_reason",
    "decided_at",
    "replay_of",
    "error",
    "ingot_version",
    "commit_seq",
    // audit.row_failure_log
    "layer",
    "table",
    "raw_payload",
    "rule",
    "reason",
    "failed_at",
    // audit.silver_build_log
    "build_id",
    "rules_sha256",
    "mode",
    "rebuild_filter",
    "rows_read",
    "rows_written",
    "rows_filtered",
    "rows_rejected",
    "rows_flagged",
];

/// Arrow type of `timestamp` fields: microseconds since the epoch, UTC.
pub fn timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// The bronze columns after the contract fields (docs/formats.md#tables), in order.
pub fn meta_fields() -> Vec<Field> {
    vec![
        Field::new("ingestion_run_id", DataType::Utf8, true),
        Field::new("file_hash", DataType::Utf8, true),
        Field::new("row_hash", DataType::Utf8, true),
        Field::new("natural_key_fingerprint", DataType::Utf8, true),
        Field::new("natural_key_version", DataType::Int32, true),
        Field::new("contract_version", DataType::Int32, true),
        Field::new("source_row_number", DataType::Int64, true),
        Field::new("ingested_at", timestamp_type(), true),
        Field::new(IS_DELETED, DataType::Boolean, true),
        Field::new(PREVIOUS_FINGERPRINT, DataType::Utf8, true),
    ]
}

/// Bronze column: true on a tombstone, the version that ends a record (a natural key absent from
/// a `delivery: full` file). Files written before deletions existed lack it: null counts as false.
pub const IS_DELETED: &str = "is_deleted";

/// Bronze and silver column: the record's versioned natural-key fingerprint (hex text; a build
/// state's 16-byte keys carry the same name).
pub const FINGERPRINT: &str = "natural_key_fingerprint";

/// Bronze column: on the versions `ingot rekey` wrote, the record's fingerprint under the previous
/// natural-key version; null on every other row.
pub const PREVIOUS_FINGERPRINT: &str = "previous_natural_key_fingerprint";

/// Silver column: the version of the rules that produced a row.
pub const RULES_VERSION: &str = "rules_version";
