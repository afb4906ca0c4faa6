//! `ingot cluster executor --scheduler HOST:PORT [--bind HOST:PORT] [--grpc-bind HOST:PORT]`.

use std::io::Write;
use std::path::PathBuf;

use crate::cli::Cli;
use crate::engine::cluster::Endpoint;
use crate::engine::cluster::executor::{ExecutorOptions, serve};
use crate::engine::session::parse_size;
use crate::error::{Error, ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct ExecutorArgs {
    /// The scheduler to register with.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50050")]
    pub scheduler: String,
    /// Arrow Flight address: other executors and clients fetch results here (port 0 picks a free
    /// port).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50051")]
    pub bind: String,
    /// The executor's advertised task port (executors ask the scheduler for tasks, so nothing
    /// listens there); same host as --bind (port 0 picks a free port).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50052")]
    pub grpc_bind: String,
    /// Host name the scheduler and clients reach this executor by (default: the --bind host;
    /// needed when binding 0.0.0.0).
    #[arg(long, value_name = "HOST")]
    pub external_host: Option<String>,
    /// Tasks run at once (default: the number of CPUs).
    #[arg(long, value_name = "N")]
    pub concurrent_tasks: Option<usize>,
    /// Directory for shuffle files and spills (default: a temporary directory).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    #[command(flatten)]
    pub security: super::SecurityArgs,
}

/// `HOST:PORT` with port 0 replaced by a free port of that host (Ballista advertises the port it
/// is given, so it must be known before the executor starts).
fn concrete(addr: &str, what: &str) -> Result<Endpoint> {
    let mut e = Endpoint::parse(addr, what)?;
    if e.port == 0 {
        let l = std::net::TcpListener::bind((e.host.as_str(), 0))
            .map_err(|err| Error::Invalid(format!("{what} {addr}: cannot listen there: {err}")))?;
        e.port = l
            .local_addr()
            .map_err(|err| Error::Invalid(format!("{what} {addr}: {err}")))?
            .port();
    }
    Ok(e)
}

pub async fn run(cli: &Cli, args: &ExecutorArgs) -> Result<ExitStatus> {
    let memory_limit =
        parse_size(&cli.memory_limit).map_err(|e| Error::Invalid(format!("--memory-limit: {e}")))? as u64;
    let scheduler = Endpoint::parse(&args.scheduler, "--scheduler")?;
    let bind = concrete(&args.bind, "--bind")?;
    let (security, tls) = args.security.load(&bind.host, "--bind")?;
    let grpc_bind = concrete(&args.grpc_bind, "--grpc-bind")?;
    let concurrent_tasks = match args.concurrent_tasks {
        Some(0) => return Err(Error::Invalid("--concurrent-tasks must be at least 1".into())),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    crate::show!(
        "ingot cluster executor: results on {}:{}, scheduler {}:{} (tasks pulled from it), {concurrent_tasks} concurrent tasks; lake {}",
        bind.host,
        bind.port,
        scheduler.host,
        scheduler.port,
        cli.lake
    );
    let _ = std::io::stdout().flush();
    serve(
        ExecutorOptions {
            scheduler,
            bind,
            grpc_bind,
            external_host: args.external_host.clone(),
            concurrent_tasks,
            work_dir: args.work_dir.clone(),
            memory_limit,
            lake: cli.lake.clone(),
            security,
            tls,
        },
        crate::engine::cluster::udfs(),
    )
    .await?;
    Ok(ExitStatus::Success)
}
