//! `ingot cluster scheduler`: a Ballista scheduler whose sessions know ingot's UDFs and reach the
//! lake's object stores.
//!
//! The scheduler receives a client's logical plan (datafusion-proto: UDFs by name, listing tables
//! as their file lists), plans it with [`super::session_state`] — which is why it must register
//! every UDF of [`super::udfs`] and reach the lake (planning a listing table looks at its files)
//! — and hands stages to executors. It holds job state in memory: restarting it fails the jobs
//! running then (clients see an error, nothing is committed).

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::{create_scheduler, start_grpc_service_with_listener};
use datafusion::logical_expr::ScalarUDF;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use tokio::net::TcpListener;

use crate::error::{Error, Result};

/// Bind the scheduler's address (`HOST:PORT`; port 0 picks a free one).
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Invalid(format!("--bind {addr}: cannot listen there: {e}")))
}

/// Serve a scheduler on `listener` until the process ends, for the lake at `lake`, with `udfs`
/// (normally [`super::udfs`]) in every session it plans with.
pub async fn serve(listener: TcpListener, lake: &str, udfs: Vec<ScalarUDF>) -> Result<()> {
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| Error::RunFailed(format!("scheduler address: {e}")))?;
    let stores = super::object_store_registry(lake)?;
    let config = SchedulerConfig {
        bind_host: addr.ip().to_string(),
        bind_port: addr.port(),
        external_host: addr.ip().to_string(),
        override_session_builder: Some(Arc::new(move |cfg| super::session_state(cfg, stores.clone(), &udfs))),
        ..Default::default()
    };
    let config = Arc::new(config);
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| Error::RunFailed(format!("scheduler: {e}")))?;
    let scheduler = create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, config)
        .await
        .map_err(|e| Error::RunFailed(format!("scheduler: {e}")))?;
    start_grpc_service_with_listener(listener, scheduler)
        .await
        .map_err(|e| Error::RunFailed(format!("scheduler on {addr}: {e}")))
}
