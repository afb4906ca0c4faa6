//! `ingot doctor`: see [`crate::ops::doctor`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// First repair what can be repaired without losing anything, then check: bring every
    /// lagging Delta table up to date (`ingot delta sync`), rebuild a silver table whose current
    /// snapshot has a damaged file (a full build from bronze), remove a source's segments when
    /// one is damaged (a cache), and derive a damaged bronze file again from its run's landing
    /// file when that file is unchanged (else it is reported with the runs to undo).
    #[arg(long)]
    pub fix: bool,
    /// Also read every committed data file whole and compare it with the CRC-32 its commit
    /// recorded (a scrub; without it, sizes and Parquet footers are checked).
    #[arg(long)]
    pub verify: bool,
}

pub async fn run(cli: &Cli, args: &DoctorArgs) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    if args.fix {
        let contracts = crate::spec::contract::ContractSet::readable(&ws.contracts_dir);
        for line in crate::table::delta::sync(&ws.lake, crate::table::delta::Mode::DeletionVectors, &contracts).await? {
            crate::show!("fixed: {line}");
        }
        for repair in crate::ops::scrub::repair(&ws, args.verify).await? {
            crate::show!("{repair}");
        }
    }
    let report = crate::ops::doctor::doctor_with(&ws, args.verify).await?;
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
    for l in &report.delta_lags {
        crate::show!(
            "delta behind: {l}; the next command of it or `ingot delta sync` publishes the rest (not a violation)"
        );
    }
    for source in &report.uncontracted {
        crate::show!(
            "not checked: bronze.{source}: the run log has runs of it and no contract in {} reads it; doctor \
             with `--contracts` the folder holding {source}.yaml checks it (not a violation)",
            ws.contracts_dir.display()
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
