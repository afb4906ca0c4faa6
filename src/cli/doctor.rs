//! `ingot doctor`: see [`crate::ops::doctor`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

pub async fn run(cli: &Cli) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    let report = crate::ops::doctor::doctor(&ws).await?;
    for v in &report.violations {
        crate::say!("{v}");
    }
    for o in &report.orphans {
        crate::say!("orphan: {o}: no loaded run or succeeded build reads it (`ingot gc` removes it)");
    }
    crate::say!(
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
