//! `ingot run`: the nightly job, with one summary table at the end.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};
use crate::ingest::IngestOptions;
use crate::ops::nightly::{NightlyReport, run as nightly};
use crate::table::audit::{BuildStatus, RunStatus};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Do not pull the API sources (contracts with `format: api`); by default each is pulled
    /// once, before the silver builds.
    #[arg(long)]
    pub no_pull: bool,
    /// Pull at most N API sources at once (each under its own lock, with a 1/N share of
    /// `--memory-limit`).
    #[arg(long, value_name = "N", default_value_t = crate::ops::nightly::DEFAULT_PULL_JOBS as u16,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub pull_jobs: u16,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &RunArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let terminal = std::io::stdout().is_terminal();
    let opts = IngestOptions {
        progress: terminal,
        ..Default::default()
    };
    let spinner = terminal.then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s
    });
    let pull = crate::ops::nightly::PullPlan {
        jobs: if args.no_pull { 0 } else { usize::from(args.pull_jobs) },
    };
    let report = nightly(&ws, &opts, pull, |step| match &spinner {
        Some(s) => s.set_message(crate::error::console::terminal_safe(step).into_owned()),
        None => crate::show!("{step}"),
    })
    .await?;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let text = summary(&report);
    let _ = std::io::Write::write_all(
        &mut crate::error::console::Stdout,
        crate::error::console::terminal_safe(&text).as_bytes(),
    );
    Ok(if report.failed() {
        ExitStatus::Failure
    } else if report.held() {
        ExitStatus::Held
    } else {
        ExitStatus::Success
    })
}

/// The summary table: one line per source ingested and per table built.
pub fn summary(r: &NightlyReport) -> String {
    #[derive(Default)]
    struct Src {
        runs: u64,
        inserted: i64,
        updated: i64,
        unchanged: i64,
        failed_rows: i64,
        skipped: u64,
        failed_runs: u64,
    }
    let mut sources: BTreeMap<&str, Src> = BTreeMap::new();
    for run in &r.runs {
        let s = sources.entry(run.source.as_str()).or_default();
        s.runs += 1;
        if run.status == RunStatus::Held {
            // nothing of it is published: its rows are in the HELD lines below
            continue;
        }
        s.inserted += run.rows_inserted;
        s.updated += run.rows_updated;
        s.unchanged += run.rows_unchanged;
        s.failed_rows += run.rows_failed;
        s.skipped += u64::from(run.status == RunStatus::SkippedDuplicateFile);
        s.failed_runs += u64::from(run.status == RunStatus::Failed);
    }
    let mut out = format!(
        "nightly job: {} run{} ({} skipped as duplicates, {} failed), {} build{} ({} failed); {} landing file{} already loaded\n",
        r.runs.len(),
        if r.runs.len() == 1 { "" } else { "s" },
        r.runs
            .iter()
            .filter(|x| x.status == RunStatus::SkippedDuplicateFile)
            .count(),
        r.runs.iter().filter(|x| x.status == RunStatus::Failed).count(),
        r.builds.len(),
        if r.builds.len() == 1 { "" } else { "s" },
        r.builds
            .iter()
            .filter(|b| b.record.status == BuildStatus::Failed)
            .count(),
        r.already_loaded,
        if r.already_loaded == 1 { "" } else { "s" },
    );
    if !r.held.is_empty() {
        out.pop();
        out.push_str(&format!(
            "; {} run{} held for review\n",
            r.held.len(),
            if r.held.len() == 1 { "" } else { "s" }
        ));
    }
    if !sources.is_empty() {
        out.push_str(&format!(
            "\n{:<20} {:>5} {:>9} {:>8} {:>10} {:>12} {:>8} {:>12}\n",
            "source", "runs", "inserted", "updated", "unchanged", "rows failed", "skipped", "runs failed"
        ));
        for (name, s) in &sources {
            out.push_str(&format!(
                "{:<20} {:>5} {:>9} {:>8} {:>10} {:>12} {:>8} {:>12}\n",
                name, s.runs, s.inserted, s.updated, s.unchanged, s.failed_rows, s.skipped, s.failed_runs
            ));
        }
    }
    if !r.builds.is_empty() {
        out.push_str(&format!(
            "\n{:<24} {:<12} {:>5} {:>8} {:>9} {:>9} {:>8} {:>8} {:<9}\n",
            "table", "mode", "rules", "written", "filtered", "rejected", "flagged", "rows", "status"
        ));
        for b in &r.builds {
            let x = &b.record;
            out.push_str(&format!(
                "{:<24} {:<12} {:>5} {:>8} {:>9} {:>9} {:>8} {:>8} {:<9}\n",
                format!("silver.{}", x.table),
                x.mode,
                format!("v{}", x.rules_version),
                x.rows_written,
                x.rows_filtered,
                x.rows_rejected,
                x.rows_flagged,
                b.table_rows,
                if x.status == BuildStatus::Failed {
                    "FAILED"
                } else {
                    "ok"
                }
            ));
        }
    }
    for (file, why) in &r.retried {
        out.push_str(&format!("\nretried {file}: {why}"));
    }
    for (table, why) in &r.reasons {
        out.push_str(&format!("\nbuilt silver.{table}: {why}"));
    }
    if !r.reasons.is_empty() || !r.retried.is_empty() {
        out.push('\n');
    }
    for run in r.runs.iter().filter(|x| x.status == RunStatus::Failed) {
        out.push_str(&format!(
            "\nFAILED run {} ({}): {}\n",
            run.run_id,
            run.file_path,
            run.error.as_deref().unwrap_or("")
        ));
    }
    for run in &r.held {
        out.push_str(&format!(
            "\nHELD run {} of {} ({}): {}; `ingot publish {}` publishes it, `ingot discard {}` drops it\n",
            run.run_id,
            run.source,
            run.file_path,
            run.held_reason.as_deref().unwrap_or("a hold gate"),
            run.run_id,
            run.run_id
        ));
    }
    for s in &r.skipped {
        out.push_str(&format!("\nskipped {}: {}\n", s.path, s.reason));
    }
    for (file, run_id) in &r.waiting {
        out.push_str(&format!(
            "\nwaiting: {file}: not loaded while run {run_id} of its source is held\n"
        ));
    }
    for b in r.builds.iter().filter(|b| b.record.status == BuildStatus::Failed) {
        out.push_str(&format!(
            "\nFAILED build of silver.{}: {}\n",
            b.record.table,
            b.record.error.as_deref().unwrap_or("")
        ));
    }
    out
}
