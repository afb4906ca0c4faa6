//! `ingot resolve` and `ingot conflicts`: the conflicts between sources of a silver table, and a
//! person's decision on one ([`crate::ops::resolve`]).

use datafusion::prelude::{col, lit};

use crate::cli::{Cli, OutputArgs};
use crate::error::{Error, ExitStatus, Result};
use crate::query::output::write_dataframe;

#[derive(Debug, clap::Args)]
pub struct ResolveArgs {
    /// The silver table (fed by several sources).
    pub table: String,
    /// The record's natural_key_fingerprint (or a prefix only one conflict has), as
    /// `ingot conflicts <table>` lists it.
    pub fingerprint: String,
    /// The field (or group) in conflict.
    #[arg(long)]
    pub field: String,
    /// The source whose value the field takes while the candidates stay as they are.
    #[arg(long)]
    pub take: String,
    /// Why (kept with the decision).
    #[arg(long)]
    pub reason: String,
    /// Who decides (default: the OS user).
    #[arg(long)]
    pub by: Option<String>,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn resolve(cli: &Cli, args: &ResolveArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let d = crate::ops::resolve::Decide {
        table: args.table.clone(),
        fingerprint: args.fingerprint.clone(),
        field: args.field.clone(),
        take: args.take.clone(),
        reason: args.reason.clone(),
        by: args.by.clone(),
    };
    let done = crate::ops::resolve::resolve(&ws, &d).await?;
    let r = &done.record;
    if done.new {
        crate::show!(
            "decision {}: silver.{} record {} takes {} from {} (by {}); the next `ingot build {}` applies it \
             while the candidates stay as they are (`ingot undo {}` withdraws it)",
            r.decision_id,
            r.table,
            r.fingerprint,
            r.field,
            r.take,
            r.decided_by,
            r.table,
            r.decision_id
        );
    } else {
        crate::show!(
            "decision {} already says so (silver.{} record {}, {} from {}); nothing recorded",
            r.decision_id,
            r.table,
            r.fingerprint,
            r.field,
            r.take
        );
    }
    Ok(ExitStatus::Success)
}

#[derive(Debug, clap::Args)]
pub struct ConflictsArgs {
    /// The silver table.
    pub table: String,
    /// Every build's conflicts (audit.source_conflict_log), not only the latest build's.
    #[arg(long)]
    pub history: bool,
    /// Only conflicts with this status: open or decided.
    #[arg(long, value_parser = ["open", "decided"])]
    pub status: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn conflicts(cli: &Cli, args: &ConflictsArgs) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    let catalog = crate::query::open_catalog(&ws, None).await?;
    let latest = crate::engine::catalog::latest_build(&catalog.builds, &args.table).ok_or_else(|| {
        Error::Invalid(format!(
            "silver.{} has no succeeded build; run `ingot build {}` first",
            args.table, args.table
        ))
    })?;
    let mut df = catalog
        .ctx
        .table("audit.source_conflict_log")
        .await?
        .filter(col("table").eq(lit(args.table.as_str())))?;
    if !args.history {
        df = df.filter(col("build_id").eq(lit(latest.build_id.as_str())))?;
    }
    if let Some(s) = &args.status {
        df = df.filter(col("status").eq(lit(s.as_str())))?;
    }
    let df = df
        .sort(vec![
            col("build_id").sort(true, true),
            col("natural_key_fingerprint").sort(true, true),
            col("field").sort(true, true),
        ])?
        .select_columns(&[
            "build_id",
            "natural_key_fingerprint",
            "field",
            "kind",
            "status",
            "taken_source",
            "candidates",
            "decision_id",
            "stale_decision_id",
            "first_build_id",
        ])?;
    write_dataframe(df, args.output.format, args.output.output.as_deref()).await?;
    Ok(ExitStatus::Success)
}
