//! `ingot replay <run_id>`: see [`crate::ops::replay`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The run_id whose failed rows to replay (`ingot failures` shows them); replaying a replay
    /// run replays its original.
    pub run_id: String,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &ReplayArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let opts = crate::ingest::IngestOptions::default();
    match crate::ops::replay::replay(&ws, &args.run_id, &opts).await? {
        crate::ops::replay::Replayed::Run(r) => {
            crate::show!("{}", crate::cli::ingest::describe(&r));
            Ok(ExitStatus::failed_if(
                r.status == crate::table::audit::RunStatus::Failed,
            ))
        }
        crate::ops::replay::Replayed::Nothing(why) => {
            crate::show!("{why}");
            Ok(ExitStatus::Success)
        }
    }
}
