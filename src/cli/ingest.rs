//! `ingot ingest <source> <path|glob>...`: one run per file, a line per run.

use std::io::IsTerminal;

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};
use crate::ingest::{IngestOptions, expand_inputs, ingest_input, refuse_api};
use crate::spec::contract::ContractSet;
use crate::table::audit::{RunRecord, RunStatus};

#[derive(Debug, clap::Args)]
pub struct IngestArgs {
    /// Source name: contracts/<source>.yaml must exist.
    pub source: String,
    /// Files, globs (quoted) or s3:// URLs (globs allowed in the key) to ingest; .gz is
    /// decompressed transparently.
    #[arg(required = true)]
    pub inputs: Vec<String>,
    /// Print each run record as one JSON object per line instead of a sentence.
    #[arg(long)]
    pub json: bool,
    /// Publish each run even when a hold gate of the contract (hold.max_delete_fraction,
    /// hold.row_count, an unreadable natural key in a full delivery) would hold it for review.
    #[arg(long)]
    pub no_hold: bool,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &IngestArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let contract = ContractSet::load_one(&ws.contracts_dir, &args.source)?;
    refuse_api(&contract)?;
    let found = expand_inputs(&args.inputs).await?;
    for s in &found.skipped {
        crate::tell!("ingot ingest: skipped {}: {}", s.path, s.reason);
    }
    let inputs = found.inputs;
    let opts = IngestOptions {
        progress: std::io::stdout().is_terminal() && !args.json,
        no_hold: args.no_hold,
        ..Default::default()
    };
    let mut code = ExitStatus::Success;
    for input in &inputs {
        let record = ingest_input(&ws, contract.clone(), input, &opts).await?;
        show_run(&record, args.json, &mut code);
    }
    Ok(code)
}

/// Print a run (a sentence, or its record as JSON) and fold its status into the exit code: a
/// failed run is 1, a held one 4 unless another failed.
pub(crate) fn show_run(record: &RunRecord, json: bool, code: &mut ExitStatus) {
    if record.status == RunStatus::Failed {
        *code = ExitStatus::Failure;
    } else if record.status == RunStatus::Held && *code == ExitStatus::Success {
        *code = ExitStatus::Held;
    }
    if json {
        crate::say!("{}", record_json(record));
    } else {
        crate::show!("{}", describe(record));
    }
}

/// One sentence per run, for people.
pub fn describe(r: &RunRecord) -> String {
    let ms = (r.finished_at - r.started_at) as f64 / 1000.0;
    match r.status {
        RunStatus::SkippedDuplicateFile if r.pull.is_some() => format!(
            "{} {}: skipped, unchanged since the last loaded pull (file_hash {}…){} [run {}]",
            r.source,
            r.file_path,
            r.file_hash.as_deref().map(|h| &h[..12.min(h.len())]).unwrap_or(""),
            pulled(r),
            r.run_id
        ),
        RunStatus::SkippedDuplicateFile => format!(
            "{} {}: skipped, identical to a file already loaded (file_hash {}…) [run {}]",
            r.source,
            r.file_path,
            r.file_hash.as_deref().map(|h| &h[..12.min(h.len())]).unwrap_or(""),
            r.run_id
        ),
        RunStatus::Failed => format!(
            "{} {}: FAILED, nothing loaded: {} [run {}]",
            r.source,
            r.file_path,
            r.error.as_deref().unwrap_or("unknown error"),
            r.run_id
        ),
        RunStatus::Held => format!(
            "{} {}: HELD for review, nothing published: {}; {} deleted; held because {}; `ingot publish {id}` \
             publishes it, `ingot discard {id}` drops it [run {id}]",
            r.source,
            r.file_path,
            counts(r),
            r.rows_deleted,
            r.held_reason.as_deref().unwrap_or("a hold gate"),
            id = r.run_id,
        ),
        _ => format!(
            "{} {}: {}{}{}{} ({ms:.0} ms) [run {}]",
            r.source,
            r.file_path,
            counts(r),
            pulled(r),
            match (r.rows_deleted, r.rows_superseded) {
                (0, 0) => String::new(),
                (0, s) => format!(
                    "; {s} of the failed superseded (a later run delivered their keys: not loaded, \
                     rule replay_superseded)"
                ),
                (d, _) => format!("; {d} deleted (not in this full delivery)"),
            },
            r.ignored_columns
                .as_deref()
                .map(|c| format!("; ignored columns: {c}"))
                .unwrap_or_default(),
            r.run_id
        ),
    }
}

/// `; N pages, N requests (N retried), N bytes` of a pull; empty for a file.
fn pulled(r: &RunRecord) -> String {
    let Some(p) = &r.pull else { return String::new() };
    let retried = if p.retries > 0 {
        format!(" ({} retried)", p.retries)
    } else {
        String::new()
    };
    let n = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    format!(
        "; {}, {}{retried}, {}",
        n(p.pages, "page", "pages"),
        n(p.requests, "request", "requests"),
        n(p.bytes, "byte", "bytes")
    )
}

/// `N rows seen: N inserted, N updated, N unchanged, N failed`.
fn counts(r: &RunRecord) -> String {
    format!(
        "{} rows seen: {} inserted, {} updated, {} unchanged, {} failed",
        r.rows_seen, r.rows_inserted, r.rows_updated, r.rows_unchanged, r.rows_failed
    )
}

pub(crate) fn record_json(r: &RunRecord) -> String {
    serde_json::json!({
        "run_id": r.run_id,
        "source": r.source,
        "file_path": r.file_path,
        "file_hash": r.file_hash,
        "status": r.status.as_str(),
        "rows_seen": r.rows_seen,
        "rows_inserted": r.rows_inserted,
        "rows_updated": r.rows_updated,
        "rows_unchanged": r.rows_unchanged,
        "rows_failed": r.rows_failed,
        "rows_deleted": r.rows_deleted,
        "rows_superseded": r.rows_superseded,
        "error": r.error,
        "held_reason": r.held_reason,
        "ignored_columns": r.ignored_columns,
        "pull": r.pull.as_ref().map(|p| serde_json::json!({
            "requests": p.requests,
            "pages": p.pages,
            "bytes": p.bytes,
            "retries": p.retries,
            "wait_ms": p.waited_ms,
            "cursor": p.cursor,
        })),
    })
    .to_string()
}
