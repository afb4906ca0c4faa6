//! `ingot sql QUERY`: one read-only query over the lake's catalog.

use crate::cli::{Cli, OutputArgs};
use crate::error::Result;
use crate::output::write_dataframe;

#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// The SQL query, e.g. "SELECT * FROM bronze.bookings_current LIMIT 10".
    pub query: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn run(cli: &Cli, args: &SqlArgs) -> Result<u8> {
    let ws = cli.workspace()?;
    let catalog = crate::catalog::open(&ws).await?;
    for p in &catalog.problems.items {
        eprintln!("warning: {p} (its tables are not available)");
    }
    let df = crate::sql::query(&catalog.ctx, &args.query).await?;
    write_dataframe(df, args.output.format, args.output.output.as_deref()).await?;
    Ok(0)
}
