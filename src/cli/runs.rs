//! `ingot runs`: audit.ingestion_run_log as a readable table for people (or csv/json).

use datafusion::prelude::{col, lit};

use crate::cli::{Cli, OutputArgs};
use crate::error::{ExitStatus, Result};
use crate::query::output::write_dataframe;

#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    /// Only runs of this source.
    #[arg(long)]
    pub source: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn run(cli: &Cli, args: &RunsArgs) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    let catalog = crate::query::open_catalog(&ws, None).await?;
    let mut df = catalog.ctx.table("audit.ingestion_run_log").await?;
    if let Some(s) = &args.source {
        df = df.filter(col("source").eq(lit(s.as_str())))?;
    }
    let df = df
        .sort(vec![col("started_at").sort(true, true), col("run_id").sort(true, true)])?
        .select_columns(&[
            "started_at",
            "run_id",
            "source",
            "status",
            "rows_seen",
            "rows_inserted",
            "rows_updated",
            "rows_unchanged",
            "rows_failed",
            "rows_deleted",
            "file_path",
            "replay_of",
            "rolled_back_at",
            "error",
            "held_reason",
        ])?;
    write_dataframe(df, args.output.format, args.output.output.as_deref()).await?;
    Ok(ExitStatus::Success)
}
