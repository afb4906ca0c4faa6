//! `ingot rekey <source>`: see [`crate::ops::rekey`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct RekeyArgs {
    /// The source whose contract's natural_key changed (contracts/<source>.yaml).
    pub source: String,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &RekeyArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let contract = crate::spec::contract::ContractSet::load_one(&ws.contracts_dir, &args.source)?;
    let done = crate::ops::rekey::rekey(&ws, contract).await?;
    crate::show!("{}", done.describe());
    Ok(ExitStatus::Success)
}
