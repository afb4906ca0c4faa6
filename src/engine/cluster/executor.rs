//! `ingot cluster executor`: a Ballista executor whose function registry holds ingot's UDFs and
//! whose runtime reaches the lake's object stores.
//!
//! An executor registers with the scheduler, asks it for tasks (pull-based scheduling: it serves
//! no task port), runs the stages it is given (reading the lake's files itself), keeps shuffle
//! output in its work directory and serves it to other executors and to clients over Arrow
//! Flight (`--bind`). That Flight service is ingot's own wrapper of Ballista's, so every call
//! needs the cluster's token ([`super::guard::RequireToken`]) and, with `--tls-cert`, is TLS; the
//! executor's own calls (to the scheduler, to other executors) carry the token through
//! [`super::guard::endpoint_override`]. Hazard: a UDF missing from the registry fails every task that calls it
//! (`PhysicalExtensionCodec is not provided for scalar function <name>`), which clients report
//! by name ([`super::client::explain_error`]).

use std::path::PathBuf;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::error::BallistaError;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_executor::flight_service::BallistaFlightService;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;
use tonic::service::interceptor::InterceptedService;

use super::Endpoint;
use super::guard::{ClusterSecurity, RequireToken};
use super::scheduler::TlsIdentity;
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
    /// The cluster's token and the authority its TLS connections trust.
    pub security: ClusterSecurity,
    /// The certificate and key its Flight service serves TLS with.
    pub tls: Option<TlsIdentity>,
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
    let endpoints = super::guard::endpoint_override(&opts.security);
    // shuffle reads from other executors build their endpoints from the task's session config
    let task_endpoints = endpoints.clone();
    let config_producer: ballista_core::ConfigProducer = Arc::new(move || {
        let config = SessionConfig::new_with_ballista();
        match &task_endpoints {
            Some(f) => config.with_ballista_override_create_grpc_client_endpoint(f.clone()),
            None => config,
        }
    });
    let guard = RequireToken::new(opts.security.token.as_deref());
    let tls = opts.tls.clone();
    let flight: Arc<ballista_executor::ArrowFlightServerProvider> = Arc::new(
        move |work_dir: String,
              addr: std::net::SocketAddr,
              mut shutdown: ballista_executor::shutdown::Shutdown,
              grpc_config: ballista_core::utils::GrpcServerConfig| {
            let guard = guard.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let mut server = ballista_core::utils::create_grpc_server(&grpc_config);
                if let Some(tls) = &tls {
                    server = server
                        .tls_config(tls.server_config())
                        .map_err(BallistaError::TonicError)?;
                }
                let service = FlightServiceServer::new(BallistaFlightService::new(work_dir))
                    .max_decoding_message_size(16 * 1024 * 1024)
                    .max_encoding_message_size(16 * 1024 * 1024);
                server
                    .add_service(InterceptedService::new(service, guard))
                    .serve_with_shutdown(addr, shutdown.recv())
                    .await
                    .map_err(BallistaError::TonicError)
            })
        },
    );
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
        task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
        override_function_registry: Some(Arc::new(function_registry(&udfs)?)),
        override_runtime_producer: Some(runtime),
        override_config_producer: Some(config_producer),
        override_arrow_flight_service: Some(flight),
        override_create_grpc_client_endpoint: endpoints,
        ..Default::default()
    };
    start_executor_process(Arc::new(config)).await.map_err(|e| {
        Error::RunFailed(format!(
            "executor (scheduler {}:{}): {e}",
            opts.scheduler.host, opts.scheduler.port
        ))
    })
}
