//! `ingot cluster scheduler|executor`: the processes of an ingot cluster (Apache DataFusion
//! Ballista with ingot's UDFs and object stores; cargo feature `cluster`). Clients use it with
//! `--cluster df://HOST:PORT`; see [`crate::engine::cluster`] for what runs where.

mod executor;
mod scheduler;

use clap::Subcommand;

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Run the cluster's scheduler: it plans the queries clients send and hands their stages to
    /// executors. Prints the address clients pass as --cluster df://HOST:PORT.
    ///
    /// Its sessions know ingot's UDFs (row_hash, natural_key_fingerprint, canonical_text,
    /// normalize_text, to_json_row) and reach the lake given by --lake / INGOT_LAKE (start
    /// every process of a cluster with the same lake). Binds to loopback unless told otherwise.
    Scheduler(scheduler::SchedulerArgs),
    /// Run an executor: it registers with the scheduler, runs the stages it is given (reading
    /// the lake's files itself) and serves their results over Arrow Flight.
    ///
    /// Its function registry holds ingot's UDFs; its tasks share a memory pool of
    /// --memory-limit (operators spill beyond it). Binds to loopback unless told otherwise.
    Executor(executor::ExecutorArgs),
}

pub async fn run(cli: &Cli, args: &ClusterArgs) -> Result<ExitStatus> {
    match &args.command {
        ClusterCommand::Scheduler(a) => scheduler::run(cli, a).await,
        ClusterCommand::Executor(a) => executor::run(cli, a).await,
    }
}
