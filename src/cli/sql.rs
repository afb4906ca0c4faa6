//! `ingot sql QUERY`: one read-only query over the lake's catalog.

use datafusion::execution::context::SQLOptions;

use crate::cli::{Cli, OutputArgs};
use crate::error::{Error, Result};
use crate::output::write_dataframe;

#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// The SQL query, e.g. "SELECT * FROM bronze.bookings_current LIMIT 10".
    pub query: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// DDL, DML, COPY and statements (SET, transactions) are refused: the lake is read-only here.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

pub async fn run(cli: &Cli, args: &SqlArgs) -> Result<u8> {
    let ws = cli.workspace()?;
    let catalog = crate::catalog::open(&ws).await?;
    for p in &catalog.problems.items {
        eprintln!("warning: {p} (its tables are not available)");
    }
    let df = catalog
        .ctx
        .sql_with_options(&args.query, read_only())
        .await
        .map_err(|e| {
            let msg = e.to_string();
            if msg.contains("not supported")
                && (msg.contains("DDL") || msg.contains("DML") || msg.contains("Statement"))
            {
                Error::Invalid(format!(
                    "{msg}: ingot sql is read-only (DDL, DML, COPY and SET are refused)"
                ))
            } else {
                Error::Invalid(format!("query failed: {msg}"))
            }
        })?;
    write_dataframe(df, args.output.format, args.output.output.as_deref()).await?;
    Ok(0)
}
