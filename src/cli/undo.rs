//! `ingot undo <id>`: see [`crate::undo`].

use crate::cli::Cli;
use crate::error::Result;

#[derive(Debug, clap::Args)]
pub struct UndoArgs {
    /// The run_id of an ingestion run (`ingot runs`) or the build_id of a silver build
    /// (audit.silver_build_log).
    pub id: String,
}

pub async fn run(cli: &Cli, args: &UndoArgs) -> Result<u8> {
    let ws = cli.workspace()?;
    let done = crate::undo::undo(&ws, &args.id).await?;
    println!("{}", done.describe());
    Ok(0)
}
