//! `ingot gc`: see [`crate::ops::gc`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};
use crate::ops::gc::{GcOptions, parse_duration};

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// List what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Files of uncommitted, failed or rolled-back runs and builds must be older than this
    /// (keep it longer than your longest ingest or build), e.g. 30m, 24h.
    #[arg(long, default_value = "24h")]
    pub grace: String,
    /// Keep snapshots of older succeeded builds this long after they finished, e.g. 7d; the
    /// latest snapshot of every table is always kept.
    #[arg(long, default_value = "7d")]
    pub retain: String,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &GcArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let opts = GcOptions {
        dry_run: args.dry_run,
        grace: parse_duration(&args.grace).map_err(|e| prefix("--grace", e))?,
        retain: parse_duration(&args.retain).map_err(|e| prefix("--retain", e))?,
        wait: ws.lock_wait,
    };
    let contracts = crate::spec::contract::ContractSet::readable(&ws.contracts_dir);
    let report = crate::ops::gc::gc(&ws.lake, &opts, &contracts).await?;
    let verb = if report.dry_run { "would remove" } else { "removed" };
    for r in &report.removed {
        crate::show!("{verb} {} ({} bytes): {}", r.path, r.bytes, r.reason);
    }
    for why in &report.skipped {
        crate::show!("{why}");
    }
    let bytes: u64 = report.removed.iter().map(|r| r.bytes).sum();
    let in_use = match report.in_use {
        0 => String::new(),
        n => format!("; {n} in use by running writers"),
    };
    crate::show!(
        "gc: {verb} {} file{} ({bytes} bytes); {} more within the grace period{in_use}",
        report.removed.len(),
        if report.removed.len() == 1 { "" } else { "s" },
        report.in_grace
    );
    Ok(ExitStatus::Success)
}

fn prefix(flag: &str, e: crate::Error) -> crate::Error {
    crate::Error::Invalid(format!("{flag}: {e}"))
}
