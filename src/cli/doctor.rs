//! `ingot doctor`: see [`crate::ops::doctor`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

pub async fn run(cli: &Cli) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    let report = crate::ops::doctor::doctor(&ws).await?;
    for v in &report.violations {
        crate::show!("{v}");
    }
    for r in &report.held {
        crate::show!(
            "held: run {} of {} ({}): {}; waits for `ingot publish {}` or `ingot discard {}` (not a violation)",
            r.run_id,
            r.source,
            r.file_path,
            r.held_reason.as_deref().unwrap_or("a hold gate"),
            r.run_id,
            r.run_id
        );
    }
    for o in &report.orphans {
        crate::show!("orphan: {o}: no loaded run or succeeded build reads it (`ingot gc` removes it)");
    }
    crate::show!(
        "doctor: {} run{} and {} build{} checked, {} violation{}, {} orphan file{}",
        report.runs_checked,
        if report.runs_checked == 1 { "" } else { "s" },
        report.builds_checked,
        if report.builds_checked == 1 { "" } else { "s" },
        report.violations.len(),
        if report.violations.len() == 1 { "" } else { "s" },
        report.orphans.len(),
        if report.orphans.len() == 1 { "" } else { "s" },
    );
    Ok(ExitStatus::failed_if(!report.violations.is_empty()))
}
