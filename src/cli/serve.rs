//! `ingot serve`: the catalog over Arrow Flight SQL; see [`crate::query::serve`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// Require this bearer token on every call.
    #[arg(long, env = "INGOT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub async fn run(cli: &Cli, args: &ServeArgs) -> Result<ExitStatus> {
    crate::query::serve::serve(cli.workspace()?, &args.addr, args.token.clone()).await?;
    Ok(ExitStatus::Success)
}
