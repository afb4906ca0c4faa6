//! `ingot cluster scheduler [--bind HOST:PORT]`.

use std::io::Write;

use crate::cli::Cli;
use crate::engine::cluster::scheduler::{bind, serve};
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct SchedulerArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is printed). Use
    /// 0.0.0.0:PORT to accept executors and clients from other machines.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
    pub bind: String,
    #[command(flatten)]
    pub security: super::SecurityArgs,
}

pub async fn run(cli: &Cli, args: &SchedulerArgs) -> Result<ExitStatus> {
    let host = args.bind.rsplit_once(':').map_or(args.bind.as_str(), |(h, _)| h);
    let (security, tls) = args.security.load(host, "--bind")?;
    let listener = bind(&args.bind).await?;
    let addr = listener
        .local_addr()
        .map_err(|e| crate::Error::RunFailed(format!("--bind {}: {e}", args.bind)))?;
    crate::show!(
        "ingot cluster scheduler listening on {addr} (clients: --cluster df://{addr}; executors: --scheduler {addr}); lake {}",
        cli.lake
    );
    let _ = std::io::stdout().flush();
    serve(
        listener,
        &cli.lake,
        crate::engine::cluster::udfs(),
        &security,
        tls.as_ref(),
    )
    .await?;
    Ok(ExitStatus::Success)
}
