//! `ingot undo <id>`: see [`crate::ops::undo`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct UndoArgs {
    /// The run_id of an ingestion run (`ingot runs`), the build_id of a silver build
    /// (audit.silver_build_log) or the decision_id of a conflict decision (`ingot resolve`).
    pub id: String,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &UndoArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let done = crate::ops::undo::undo(&ws, &args.id).await?;
    crate::show!("{}", done.describe());
    Ok(ExitStatus::Success)
}
