//! An in-process cluster on loopback, for tests and experiments: one scheduler and any number
//! of executors on free ports of `localhost`. The scheduler is `ingot cluster scheduler`'s
//! ([`super::scheduler::serve`]: the token check and the plan guard); the executors are built
//! with Ballista's standalone constructors (pull-based scheduling: they poll the scheduler for
//! tasks, with the token) around the same function registries and object stores as
//! `ingot cluster executor`. Their Flight services, on loopback only, take no token.
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

use super::guard::ClusterSecurity;
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
    start_with(lake, executors, vcores, executor_udfs, &ClusterSecurity::default()).await
}

/// [`start`] with a cluster token (clients then need it too).
pub async fn start_with(
    lake: &str,
    executors: usize,
    vcores: usize,
    executor_udfs: Vec<ScalarUDF>,
    security: &ClusterSecurity,
) -> Result<Loopback> {
    let stores = super::object_store_registry(lake)?;
    let listener = super::scheduler::bind("127.0.0.1:0").await?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::RunFailed(format!("loopback scheduler: {e}")))?;
    let scheduler_security = security.clone();
    let scheduler_lake = lake.to_string();
    tokio::spawn(async move {
        if let Err(e) =
            super::scheduler::serve(listener, &scheduler_lake, super::udfs(), &scheduler_security, None).await
        {
            crate::tell!("loopback scheduler: {e}");
        }
    });
    let url = format!("http://127.0.0.1:{}", addr.port());
    let registry = super::executor::function_registry(&executor_udfs)?;
    for _ in 0..executors {
        let client = connect(&url, security).await?;
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
        url: format!("df://127.0.0.1:{}", addr.port()),
    })
}

async fn connect(url: &str, security: &ClusterSecurity) -> Result<SchedulerGrpcClient<tonic::transport::Channel>> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| Error::RunFailed(format!("loopback scheduler at {url}: {e}")))?;
    if let Some(f) = super::guard::endpoint_override(security) {
        endpoint = f(endpoint).map_err(|e| Error::RunFailed(format!("loopback scheduler at {url}: {e}")))?;
    }
    let mut last = String::new();
    for _ in 0..50 {
        match endpoint.connect().await {
            Ok(c) => return Ok(SchedulerGrpcClient::new(c)),
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
