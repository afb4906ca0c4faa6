//! `ingot publish <run>` and `ingot discard <run>`: see [`crate::ops::held`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct HeldArgs {
    /// The run_id of a held run (`ingot runs` shows it with status held and its held_reason).
    pub run_id: String,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn publish(cli: &Cli, args: &HeldArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let done = crate::ops::held::publish(&ws, &args.run_id).await?;
    crate::show!("{}", done.describe());
    Ok(ExitStatus::Success)
}

pub async fn discard(cli: &Cli, args: &HeldArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let done = crate::ops::held::discard(&ws, &args.run_id).await?;
    crate::show!("{}", done.describe());
    Ok(ExitStatus::Success)
}
