//! `ingot failures`: audit.row_failure_log as a readable table for people (or csv/json), with
//! the replay that loaded each row when one run is shown.

use datafusion::prelude::{col, lit};

use crate::cli::{Cli, OutputArgs};
use crate::error::{ExitStatus, Result};
use crate::query::output::write_dataframe;

#[derive(Debug, clap::Args)]
pub struct FailuresArgs {
    /// Only failures of this run.
    #[arg(long)]
    pub run: Option<String>,
    /// Only failures of this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Show at most this many rows.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn run(cli: &Cli, args: &FailuresArgs) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    let catalog = crate::query::open_catalog(&ws, None).await?;
    let mut df = catalog.ctx.table("audit.row_failure_log").await?;
    let mut columns = vec!["run_id", "source", "source_row_number", "rule", "reason", "raw_payload"];
    if let Some(r) = &args.run {
        df = df.filter(col("run_id").eq(lit(r.as_str())))?;
        // which of its rows a later replay loaded
        let done = crate::ops::replay::replayed_by(&ws.lake, &catalog.ctx, catalog.runs().await?, r).await?;
        let batch = datafusion::arrow::array::RecordBatch::try_from_iter(vec![
            (
                "__row",
                std::sync::Arc::new(datafusion::arrow::array::Int64Array::from_iter_values(
                    done.keys().copied(),
                )) as datafusion::arrow::array::ArrayRef,
            ),
            (
                "replayed_by",
                std::sync::Arc::new(datafusion::arrow::array::StringArray::from_iter_values(done.values())),
            ),
        ])?;
        let replays = catalog.ctx.read_batch(batch)?;
        df = df.join_on(
            replays,
            datafusion::logical_expr::JoinType::Left,
            [col("source_row_number")
                .eq(col("__row"))
                .and(col("layer").eq(lit("bronze")))],
        )?;
        columns.push("replayed_by");
    }
    if let Some(s) = &args.source {
        df = df.filter(col("source").eq(lit(s.as_str())))?;
    }
    let df = df
        .sort(vec![
            col("failed_at").sort(true, true),
            col("run_id").sort(true, true),
            col("source_row_number").sort(true, true),
        ])?
        .select_columns(&columns)?
        .limit(0, Some(args.limit))?;
    write_dataframe(df, args.output.format, args.output.output.as_deref()).await?;
    Ok(ExitStatus::Success)
}
