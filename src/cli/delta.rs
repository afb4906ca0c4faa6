//! `ingot delta`: see [`crate::table::delta`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};
use crate::table::delta::Mode;

#[derive(Debug, clap::Args)]
pub struct DeltaArgs {
    #[command(subcommand)]
    pub action: DeltaAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum DeltaAction {
    /// Bring every Delta table of the lake up to date with the run and build logs.
    ///
    /// Each table is compared whole with the committed state it follows and repaired in one
    /// commit: after a crash between ingot's commit and the Delta commit, after commands run with
    /// INGOT_DELTA=off, or for a lake made before Delta publishing. Running it twice changes
    /// nothing the second time.
    Sync,
    /// Report every Delta table that lags behind or differs from the logs (exit 1 if any).
    Status,
}

pub async fn run(cli: &Cli, args: &DeltaArgs) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    match args.action {
        DeltaAction::Sync => {
            let mode = match Mode::from_env()? {
                Mode::Off => Mode::DeletionVectors,
                m => m,
            };
            let contracts = crate::spec::contract::ContractSet::readable(&ws.contracts_dir);
            let done = crate::table::delta::sync(&ws.lake, mode, &contracts).await?;
            for line in &done {
                crate::show!("{line}");
            }
            crate::show!(
                "delta sync: {} table commit{}",
                done.len(),
                if done.len() == 1 { "" } else { "s" }
            );
            Ok(ExitStatus::Success)
        }
        DeltaAction::Status => {
            let contracts = crate::spec::contract::ContractSet::readable(&ws.contracts_dir);
            let problems = crate::table::delta::check(&ws.lake, &contracts).await?;
            for f in &problems {
                crate::show!("{}: {}", f.table, f.what);
            }
            crate::show!(
                "delta status: {} difference{}",
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            );
            Ok(ExitStatus::failed_if(!problems.is_empty()))
        }
    }
}
