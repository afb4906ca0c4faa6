//! `ingot cluster executor`: a Ballista executor whose function registry holds ingot's UDFs and
//! whose runtime reaches the lake's object stores.
//!
//! An executor registers with the scheduler, runs the stages it is given (reading the lake's
//! files itself), keeps shuffle output in its work directory and serves it to other executors and
//! to clients over Arrow Flight (`--bind`); the scheduler pushes tasks to its gRPC port
//! (`--grpc-bind`). Hazard: a UDF missing from the registry fails every task that calls it
//! (`PhysicalExtensionCodec is not provided for scalar function <name>`), which clients report
//! by name ([`super::client::explain_error`]).

use std::path::PathBuf;
use std::sync::Arc;

use ballista_core::registry::BallistaFunctionRegistry;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;

use super::Endpoint;
use crate::error::{Error, Result};

/// What `ingot cluster executor` was asked for.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    pub scheduler: Endpoint,
    /// Arrow Flight address (shuffle and results).
    pub bind: Endpoint,
    /// gRPC address the scheduler sends tasks to (same host as `bind`).
    pub grpc_bind: Endpoint,
    /// Host name the scheduler and clients use to reach this executor (default: the bind host).
    pub external_host: Option<String>,
    /// Tasks run at once (default: the number of CPUs).
    pub concurrent_tasks: usize,
    /// Shuffle files and spills (default: a temporary directory).
    pub work_dir: Option<PathBuf>,
    /// Memory pool of the executor's tasks, in bytes (operators spill beyond it).
    pub memory_limit: u64,
    /// The lake, to register its object store.
    pub lake: String,
}

/// The function registry of an executor: DataFusion's functions plus `udfs`.
pub fn function_registry(udfs: &[ScalarUDF]) -> Result<BallistaFunctionRegistry> {
    let stores = Arc::new(datafusion::execution::object_store::DefaultObjectStoreRegistry::new());
    let state = super::session_state(SessionConfig::new(), stores, udfs)?;
    Ok(BallistaFunctionRegistry::from(&state))
}

/// Run an executor until the process is stopped or the scheduler tells it to stop.
pub async fn serve(opts: ExecutorOptions, udfs: Vec<ScalarUDF>) -> Result<()> {
    if opts.bind.host != opts.grpc_bind.host {
        return Err(Error::Invalid(format!(
            "--bind {}:{} and --grpc-bind {}:{} must use the same host (an executor listens on one address)",
            opts.bind.host, opts.bind.port, opts.grpc_bind.host, opts.grpc_bind.port
        )));
    }
    let stores = super::object_store_registry(&opts.lake)?;
    let work_dir = opts.work_dir.as_ref().map(|p| p.display().to_string());
    let spill_dir = match &opts.work_dir {
        Some(p) => p.clone(),
        None => std::env::temp_dir(),
    };
    let runtime: ballista_core::RuntimeProducer = Arc::new(move |_cfg: &SessionConfig| {
        RuntimeEnvBuilder::new()
            .with_object_store_registry(stores.clone())
            .with_temp_file_path(spill_dir.clone())
            .build_arc()
    });
    let wildcard = opts.bind.host == "0.0.0.0" || opts.bind.host == "::";
    let config = ExecutorProcessConfig {
        bind_host: opts.bind.host.clone(),
        port: opts.bind.port,
        grpc_port: opts.grpc_bind.port,
        external_host: opts
            .external_host
            .clone()
            .or_else(|| (!wildcard).then(|| opts.bind.host.clone())),
        scheduler_host: opts.scheduler.host.clone(),
        scheduler_port: opts.scheduler.port,
        scheduler_connect_timeout_seconds: 10,
        vcores: opts.concurrent_tasks,
        work_dir,
        memory_pool_size: Some(opts.memory_limit),
        print_thread_info: false,
        override_function_registry: Some(Arc::new(function_registry(&udfs)?)),
        override_runtime_producer: Some(runtime),
        ..Default::default()
    };
    start_executor_process(Arc::new(config)).await.map_err(|e| {
        Error::RunFailed(format!(
            "executor (scheduler {}:{}): {e}",
            opts.scheduler.host, opts.scheduler.port
        ))
    })
}
