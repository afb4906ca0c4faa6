//! `ingot build <table> [--full | --rebuild-where PRED] [--rules-version N] [--dry-run]`: one
//! silver build, one line saying what it did (or, with `--dry-run`, what it would do).

use crate::cli::Cli;
use crate::error::{Error, ExitStatus, Result};
use crate::silver::build::{BuildOptions, Built, build, dry_run};
use crate::table::audit::{BuildRecord, BuildStatus};

#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// Silver table: rules/<table>/v<N>.yaml must exist.
    pub table: String,
    /// Rebuild every row from bronze (default: incremental, only new, changed and removed records).
    #[arg(long, conflicts_with = "rebuild_where")]
    pub full: bool,
    /// Rebuild only the rows matching this predicate on rules_version (e.g. "rules_version < 2");
    /// every other row stays byte-for-byte.
    #[arg(long, value_name = "PRED")]
    pub rebuild_where: Option<String>,
    /// Build with this rules version instead of the latest.
    #[arg(long, value_name = "N")]
    pub rules_version: Option<i32>,
    /// Print the build record (with --dry-run: the plan) as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the plan of the build (full, incremental, delta layer, rebuild or nothing to do;
    /// the runs it would read and the records it would process, keep and remove) and write
    /// nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &BuildArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let opts = BuildOptions {
        full: args.full,
        rebuild_where: args.rebuild_where.clone(),
        rules_version: args.rules_version,
    };
    if args.dry_run {
        let plan = dry_run(&ws, &args.table, &opts).await?;
        if args.json {
            let json = serde_json::to_string(&plan).map_err(|e| Error::Internal(format!("plan as JSON: {e}")))?;
            crate::say!("{json}");
        } else {
            crate::show!("{plan}");
            crate::show!("dry run: nothing was written");
        }
        return Ok(ExitStatus::Success);
    }
    // A spinner while the build runs, when a person is watching.
    let spinner = (std::io::IsTerminal::is_terminal(&std::io::stdout()) && !args.json).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.set_message(format!("building silver.{}", args.table));
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s
    });
    let built = build(&ws, &args.table, &opts).await;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let built = built?;
    if args.json {
        crate::say!("{}", record_json(&built.record));
    } else {
        crate::show!("{}", describe(&built));
    }
    Ok(ExitStatus::failed_if(built.record.status == BuildStatus::Failed))
}

/// One sentence per build, for people.
pub fn describe(b: &Built) -> String {
    let r = &b.record;
    let ms = (r.finished_at - r.started_at) as f64 / 1000.0;
    if r.status == BuildStatus::Failed {
        return format!(
            "silver.{}: build FAILED with rules v{}, nothing published: {} [build {}]",
            r.table,
            r.rules_version,
            r.error.as_deref().unwrap_or("unknown error"),
            r.build_id
        );
    }
    format!(
        "silver.{}: {} with rules v{}{}: {} rows read: {} written, {} filtered, {} rejected; \
         {} rows in the table ({} kept), {} flagged{} ({ms:.0} ms) [build {}]",
        r.table,
        if r.mode == "rebuild" {
            "rebuild".to_string()
        } else {
            format!("{} build", r.mode)
        },
        r.rules_version,
        r.rebuild_filter
            .as_deref()
            .map(|f| format!(" where {f}"))
            .unwrap_or_default(),
        r.rows_read,
        r.rows_written,
        r.rows_filtered,
        r.rows_rejected,
        b.table_rows,
        b.kept_rows,
        r.rows_flagged,
        conflicts(r),
        r.build_id
    )
}

/// `; 2 conflicts open, 1 decided, 1 decision stale` for a table fed by several sources.
fn conflicts(r: &BuildRecord) -> String {
    if r.conflicts_open + r.conflicts_decided + r.decisions_stale == 0 {
        return String::new();
    }
    let mut s = format!(
        "; {} conflict{} open, {} decided",
        r.conflicts_open,
        if r.conflicts_open == 1 { "" } else { "s" },
        r.conflicts_decided
    );
    if r.decisions_stale > 0 {
        s.push_str(&format!(
            ", {} decision{} stale",
            r.decisions_stale,
            if r.decisions_stale == 1 { "" } else { "s" }
        ));
    }
    s
}

fn record_json(r: &BuildRecord) -> String {
    serde_json::json!({
        "build_id": r.build_id,
        "table": r.table,
        "rules_version": r.rules_version,
        "rules_sha256": r.rules_sha256,
        "mode": r.mode,
        "rebuild_filter": r.rebuild_filter,
        "status": r.status.as_str(),
        "rows_read": r.rows_read,
        "rows_written": r.rows_written,
        "rows_filtered": r.rows_filtered,
        "rows_rejected": r.rows_rejected,
        "rows_flagged": r.rows_flagged,
        "conflicts_open": r.conflicts_open,
        "conflicts_decided": r.conflicts_decided,
        "decisions_stale": r.decisions_stale,
        "error": r.error,
    })
    .to_string()
}
