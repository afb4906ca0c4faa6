//! `ingot rekey <source>`: see [`crate::rekey`].

use crate::cli::Cli;
use crate::error::Result;

#[derive(Debug, clap::Args)]
pub struct RekeyArgs {
    /// The source whose contract's natural_key changed (contracts/<source>.yaml).
    pub source: String,
}

pub async fn run(cli: &Cli, args: &RekeyArgs) -> Result<u8> {
    let ws = cli.workspace()?;
    let contract = crate::contract::ContractSet::load_one(&ws.contracts_dir, &args.source)?;
    let done = crate::rekey::rekey(&ws, contract).await?;
    println!("{}", done.describe());
    Ok(0)
}
