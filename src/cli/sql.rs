//! `ingot sql QUERY`: one read-only query over the lake's catalog.

use crate::cli::{Cli, OutputArgs};
use crate::error::{ExitStatus, Result};
use crate::query::output::write_stream;

#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// The SQL query, e.g. "SELECT * FROM bronze.bookings_current LIMIT 10". Without it: an
    /// interactive shell on a terminal (\? for its commands), or statements read from stdin
    /// (ended by ';') when stdin is a pipe.
    pub query: Option<String>,
    /// Show silver.* as it was at this build id or UTC time (e.g. 2026-11-30T10:00:00Z, or a
    /// date for the end of that day), until `ingot gc` removes that snapshot. Bronze and audit
    /// tables are as they are now.
    #[arg(long)]
    pub as_of: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn run(cli: &Cli, args: &SqlArgs) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    let catalog = crate::query::open_catalog(&ws, args.as_of.as_deref()).await?;
    for p in &catalog.problems.items {
        crate::tell!("warning: {p} (its tables are not available)");
    }
    let Some(query) = &args.query else {
        use crate::query::output::OutputFormat;
        use std::io::IsTerminal;
        if args.output.output.is_some() || matches!(args.output.format, OutputFormat::Parquet | OutputFormat::Arrow) {
            return Err(crate::Error::Invalid(
                "--output and --format parquet|arrow need a QUERY; the shell prints table, csv or json".into(),
            ));
        }
        return if std::io::stdin().is_terminal() {
            crate::query::shell::run_interactive(&catalog, args.output.format).await
        } else {
            crate::query::shell::run_piped(&catalog, args.output.format).await
        };
    };
    let df = crate::query::sql::query(&catalog.ctx, query).await?;
    let schema = df.schema().inner().clone();
    let rows = crate::engine::exec::stream(catalog.cluster.as_deref(), df, "sql").await?;
    write_stream(schema, rows, args.output.format, args.output.output.as_deref()).await?;
    // the process ends here: the run records of a long history are not freed one by one
    std::mem::forget(catalog);
    Ok(ExitStatus::Success)
}
