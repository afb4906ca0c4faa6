//! `ingot cluster scheduler|executor`: the processes of an ingot cluster (Apache DataFusion
//! Ballista with ingot's UDFs and object stores; cargo feature `cluster`). Clients use it with
//! `--cluster df://HOST:PORT`; see [`crate::engine::cluster`] for what runs where.

mod executor;
mod scheduler;

use clap::Subcommand;

use crate::cli::Cli;
use crate::engine::cluster::guard::ClusterSecurity;
use crate::engine::cluster::scheduler::TlsIdentity;
use crate::error::{Error, ExitStatus, Result};

/// The security flags every cluster process takes; the token comes from the environment
/// (`INGOT_CLUSTER_TOKEN` or `INGOT_CLUSTER_TOKEN_FILE`), never the command line.
#[derive(Debug, clap::Args)]
pub struct SecurityArgs {
    // processes and clients connect with TLS when INGOT_CLUSTER_CA names the authority to trust
    #[command(flatten)]
    pub tls: crate::cli::TlsArgs,
    /// Allow a non-loopback address without a cluster token (anyone who reaches the port could
    /// then run plans on the cluster).
    #[arg(long)]
    pub insecure: bool,
}

impl SecurityArgs {
    /// The token and trusted authority from the environment, the TLS identity from the flags;
    /// refuses to listen on a non-loopback `host` without a token unless --insecure.
    fn load(&self, host: &str, what: &str) -> Result<(ClusterSecurity, Option<TlsIdentity>)> {
        let security = ClusterSecurity::from_env()?;
        let loopback = host == "localhost"
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback && security.token.is_none() && !self.insecure {
            return Err(Error::Invalid(format!(
                "{what} {host}: refusing to listen on an address that is not loopback without a cluster \
                 token: anyone who reaches the port could run plans on the cluster. Set \
                 INGOT_CLUSTER_TOKEN (or INGOT_CLUSTER_TOKEN_FILE) for every process and client, or pass \
                 --insecure"
            )));
        }
        if !loopback && self.insecure && security.token.is_none() {
            crate::tell!("ingot cluster: warning: --insecure: {host} takes plans from anyone who reaches it");
        }
        let tls = self.tls.read()?.map(|(cert, key)| TlsIdentity { cert, key });
        Ok((security, tls))
    }
}

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
    /// With INGOT_CLUSTER_TOKEN (or INGOT_CLUSTER_TOKEN_FILE) every call needs that token; plans
    /// that write or read anything but the lake's Parquet files are refused.
    Scheduler(scheduler::SchedulerArgs),
    /// Run an executor: it registers with the scheduler, runs the stages it is given (reading
    /// the lake's files itself) and serves their results over Arrow Flight.
    ///
    /// Its function registry holds ingot's UDFs; its tasks share a memory pool of
    /// --memory-limit (operators spill beyond it). Binds to loopback unless told otherwise.
    /// It pulls its tasks from the scheduler, and its calls and its Flight service use the
    /// cluster token (INGOT_CLUSTER_TOKEN or INGOT_CLUSTER_TOKEN_FILE) when set.
    Executor(executor::ExecutorArgs),
}

pub async fn run(cli: &Cli, args: &ClusterArgs) -> Result<ExitStatus> {
    match &args.command {
        ClusterCommand::Scheduler(a) => scheduler::run(cli, a).await,
        ClusterCommand::Executor(a) => executor::run(cli, a).await,
    }
}
