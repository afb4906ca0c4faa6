//! An in-process cluster on loopback, for tests and experiments: one scheduler and any number
//! of executors on free ports of `localhost`, built with Ballista's standalone constructors
//! (pull-based scheduling: executors poll the scheduler for tasks) around the same sessions,
//! function registries and object stores as `ingot cluster scheduler` / `executor`.
//!
//! The servers are tasks of the calling Tokio runtime and stop with it.

use std::sync::Arc;
use std::time::Duration;

use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::BallistaCodec;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::utils::default_config_producer;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;

use crate::error::{Error, Result};

/// A running loopback cluster; [`Loopback::url`] is what `--cluster` takes.
#[derive(Debug, Clone)]
pub struct Loopback {
    pub url: String,
}

/// Start a scheduler (with every UDF of [`super::udfs`]) and `executors` executors, each running
/// `vcores` tasks at once with `executor_udfs` in its registry (normally [`super::udfs`]; tests
/// leave one out) for the lake at `lake`.
pub async fn start(lake: &str, executors: usize, vcores: usize, executor_udfs: Vec<ScalarUDF>) -> Result<Loopback> {
    let stores = super::object_store_registry(lake)?;
    let udfs = super::udfs();
    let scheduler_stores = stores.clone();
    let addr = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        Arc::new(move |cfg| super::session_state(cfg, scheduler_stores.clone(), &udfs)),
        Arc::new(default_config_producer),
        BallistaCodec::default(),
    )
    .await
    .map_err(|e| Error::RunFailed(format!("loopback scheduler: {e}")))?;
    let url = format!("http://localhost:{}", addr.port());
    let registry = super::executor::function_registry(&executor_udfs)?;
    for _ in 0..executors {
        let client = connect(&url).await?;
        let stores = stores.clone();
        let registry = clone_registry(&registry);
        ballista_executor::new_standalone_executor_from_builder(
            client,
            vcores,
            Arc::new(default_config_producer),
            Arc::new(move |_: &SessionConfig| {
                RuntimeEnvBuilder::new()
                    .with_object_store_registry(stores.clone())
                    .build_arc()
            }),
            BallistaCodec::default(),
            registry,
        )
        .await
        .map_err(|e| Error::RunFailed(format!("loopback executor: {e}")))?;
    }
    Ok(Loopback {
        url: format!("df://localhost:{}", addr.port()),
    })
}

async fn connect(url: &str) -> Result<SchedulerGrpcClient<tonic::transport::Channel>> {
    let mut last = String::new();
    for _ in 0..50 {
        match SchedulerGrpcClient::connect(url.to_string()).await {
            Ok(c) => return Ok(c),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::RunFailed(format!("loopback scheduler at {url}: {last}")))
}

/// `BallistaFunctionRegistry` is not `Clone`; its maps are.
fn clone_registry(r: &BallistaFunctionRegistry) -> BallistaFunctionRegistry {
    BallistaFunctionRegistry {
        scalar_functions: r.scalar_functions.clone(),
        aggregate_functions: r.aggregate_functions.clone(),
        window_functions: r.window_functions.clone(),
        higher_order_functions: r.higher_order_functions.clone(),
    }
}
