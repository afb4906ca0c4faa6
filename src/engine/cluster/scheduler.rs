//! `ingot cluster scheduler`: a Ballista scheduler whose sessions know ingot's UDFs and reach the
//! lake's object stores.
//!
//! The scheduler receives a client's logical plan (datafusion-proto: UDFs by name, listing tables
//! as their file lists), plans it with [`super::session_state`] — which is why it must register
//! every UDF of [`super::udfs`] and reach the lake (planning a listing table looks at its files)
//! — and hands stages to executors. It holds job state in memory: restarting it fails the jobs
//! running then (clients see an error, nothing is committed).
//!
//! ingot serves the scheduler's gRPC service itself (not through Ballista's own server) so that
//! every call passes [`super::guard::RequireToken`] and, with `--tls-cert`, TLS; the client's
//! plans are decoded by [`super::guard::GuardedLogical`] (lake reads only) and physical plans
//! from clients are refused. Scheduling is pull-based: executors ask for tasks, so they serve no
//! task port of their own that the scheduler would call without a token.

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::serde::protobuf::scheduler_grpc_server::SchedulerGrpcServer;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::create_scheduler;
use datafusion::logical_expr::ScalarUDF;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, ServerTlsConfig};

use super::guard::{ClusterSecurity, GuardedLogical, LakeRoot, NoClientPhysical, RequireToken};
use crate::error::{Error, Result};

/// Bind the scheduler's address (`HOST:PORT`; port 0 picks a free one).
pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Invalid(format!("--bind {addr}: cannot listen there: {e}")))
}

/// A PEM certificate (chain) and private key a cluster process serves TLS with.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity(<certificate and key>)")
    }
}

impl TlsIdentity {
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(Identity::from_pem(&self.cert, &self.key))
    }
}

/// Serve a scheduler on `listener` until the process ends, for the lake at `lake`, with `udfs`
/// (normally [`super::udfs`]) in every session it plans with; calls need `security`'s token,
/// and are TLS with `tls`.
pub async fn serve(
    listener: TcpListener,
    lake: &str,
    udfs: Vec<ScalarUDF>,
    security: &ClusterSecurity,
    tls: Option<&TlsIdentity>,
) -> Result<()> {
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| Error::RunFailed(format!("scheduler address: {e}")))?;
    let stores = super::object_store_registry(lake)?;
    let root = Arc::new(LakeRoot::of(lake)?);
    let config = SchedulerConfig {
        bind_host: addr.ip().to_string(),
        bind_port: addr.port(),
        external_host: addr.ip().to_string(),
        scheduling_policy: TaskSchedulingPolicy::PullStaged,
        override_session_builder: Some(Arc::new(move |cfg| {
            super::session_state(cfg.with_extension(root.clone()), stores.clone(), &udfs)
        })),
        override_create_grpc_client_endpoint: super::guard::endpoint_override(security),
        ..Default::default()
    };
    let config = Arc::new(config);
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| Error::RunFailed(format!("scheduler: {e}")))?;
    let scheduler = create_scheduler::<GuardedLogical, NoClientPhysical>(cluster, config.clone())
        .await
        .map_err(|e| Error::RunFailed(format!("scheduler: {e}")))?;
    let service = SchedulerGrpcServer::new(scheduler)
        .max_encoding_message_size(config.grpc_server_max_encoding_message_size as usize)
        .max_decoding_message_size(config.grpc_server_max_decoding_message_size as usize);
    let mut server = tonic::transport::Server::builder().tcp_nodelay(true);
    if let Some(tls) = tls {
        server = server
            .tls_config(tls.server_config())
            .map_err(|e| Error::Invalid(format!("--tls-cert / --tls-key: not a usable certificate and key: {e}")))?;
    }
    server
        .add_service(InterceptedService::new(
            service,
            RequireToken::new(security.token.as_deref()),
        ))
        .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
        .await
        .map_err(|e| Error::RunFailed(format!("scheduler on {addr}: {e}")))
}
