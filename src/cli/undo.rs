//! `ingot undo <id>` and `ingot replay <run_id>`: see [`crate::undo`] and [`crate::replay`].

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

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The run_id whose failed rows to replay (`ingot failures` shows them); replaying a replay
    /// run replays its original.
    pub run_id: String,
}

pub async fn replay(cli: &Cli, args: &ReplayArgs) -> Result<u8> {
    let ws = cli.workspace()?;
    let opts = crate::ingest::IngestOptions::default();
    match crate::replay::replay(&ws, &args.run_id, &opts).await? {
        crate::replay::Replayed::Run(r) => {
            println!("{}", crate::cli::ingest::describe(&r));
            Ok(if r.status == crate::audit::RunStatus::Failed {
                1
            } else {
                0
            })
        }
        crate::replay::Replayed::Nothing(why) => {
            println!("{why}");
            Ok(0)
        }
    }
}
