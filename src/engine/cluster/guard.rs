//! A cluster fit for a shared network (docs/security.md#ingot-cluster).
//!
//! **Token.** Every process and client shares one secret (`INGOT_CLUSTER_TOKEN` or
//! `INGOT_CLUSTER_TOKEN_FILE`); the scheduler's gRPC service and the executors' Flight services
//! refuse calls without it ([`RequireToken`]). Ballista builds its own gRPC clients and lets ingot
//! change only how their endpoints are made ([`endpoint_override`]), so the token rides in each
//! connection's `user-agent` (`ingot-token/<token>`); `authorization: Bearer` works too.
//! **TLS.** With `INGOT_CLUSTER_CA` every connection is `https`, trusting that authority.
//! **Plans.** The scheduler decodes a client's logical plan with [`GuardedLogical`], which
//! refuses writes, DDL, statements, extension nodes and scans of anything but the lake's Parquet
//! files before anything runs ([`check_plan`]); client physical plans are refused outright
//! ([`NoClientPhysical`]). ingot's own plans scan only lake listing tables and views.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::view::ViewTable;
use datafusion::error::DataFusionError;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::{AsLogicalPlan, LogicalExtensionCodec};
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use prost::bytes::BufMut;
use tonic::{Request, Status};

use crate::error::{Error, Result};

/// How a cluster process or client authenticates and encrypts (see the module docs).
#[derive(Clone, Default)]
pub struct ClusterSecurity {
    /// The shared token (printable ASCII, no spaces).
    pub token: Option<String>,
    /// PEM certificates of the authority to trust: connections are TLS when set.
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClusterSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSecurity")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("tls", &self.ca.is_some())
            .finish()
    }
}

impl ClusterSecurity {
    /// From `INGOT_CLUSTER_TOKEN` / `INGOT_CLUSTER_TOKEN_FILE` and `INGOT_CLUSTER_CA`.
    pub fn from_env() -> Result<ClusterSecurity> {
        let file = std::env::var_os("INGOT_CLUSTER_TOKEN_FILE").map(std::path::PathBuf::from);
        let token = crate::hash::read_secret(
            "INGOT_CLUSTER_TOKEN",
            file.as_deref().map(|p| (p, "INGOT_CLUSTER_TOKEN_FILE")),
        )?
        .map(|t| check_token(&t, "INGOT_CLUSTER_TOKEN"))
        .transpose()?;
        let ca = match std::env::var_os("INGOT_CLUSTER_CA") {
            Some(path) => Some(std::fs::read(&path).map_err(|e| Error::io(path.to_string_lossy(), e))?),
            None => None,
        };
        Ok(ClusterSecurity { token, ca })
    }
}

/// A token usable in a header: printable ASCII without spaces, not empty.
fn check_token(token: &str, what: &str) -> Result<String> {
    if token.is_empty() {
        return Err(Error::Invalid(format!(
            "{what} is empty: an empty cluster token would let every client in; set a secret (e.g. `openssl rand -hex 32`) or unset it"
        )));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Invalid(format!(
            "{what}: a cluster token must be printable ASCII without spaces (e.g. `openssl rand -hex 32`)"
        )));
    }
    Ok(token.to_string())
}

/// The `user-agent` word that carries the token.
const TOKEN_AGENT: &str = "ingot-token/";

/// The interceptor of the scheduler's and executors' services: refuses a call without the
/// token (when one is set), and hands the caller's address on as the scheduler expects it (it
/// reads axum's `ConnectInfo` for executors that do not name their host).
#[derive(Clone)]
pub struct RequireToken(Option<Arc<[u8; 32]>>);

impl RequireToken {
    pub fn new(token: Option<&str>) -> RequireToken {
        RequireToken(token.map(|t| Arc::new(crate::hash::secret_digest(t.as_bytes()))))
    }
}

impl tonic::service::Interceptor for RequireToken {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(addr) = request.remote_addr() {
            request.extensions_mut().insert(axum::extract::ConnectInfo(addr));
        }
        let Some(want) = &self.0 else { return Ok(request) };
        let header = |name: &str| request.metadata().get(name).and_then(|v| v.to_str().ok());
        let from_agent =
            header("user-agent").and_then(|ua| ua.split_whitespace().find_map(|w| w.strip_prefix(TOKEN_AGENT)));
        let from_bearer = header("authorization").and_then(|v| v.strip_prefix("Bearer "));
        let ok = [from_agent, from_bearer]
            .into_iter()
            .flatten()
            .any(|given| crate::hash::same_secret(given.as_bytes(), want));
        if ok {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "ingot cluster: this call lacks the cluster's token (set INGOT_CLUSTER_TOKEN or \
                 INGOT_CLUSTER_TOKEN_FILE to the token the scheduler and executors were started with)",
            ))
        }
    }
}

/// How every gRPC endpoint a process or client opens is built: with the token in its
/// `user-agent`, and over TLS (trusting `ca`) when one is set. `None` when there is neither.
pub fn endpoint_override(security: &ClusterSecurity) -> Option<ballista_core::extension::EndpointOverrideFn> {
    if security.token.is_none() && security.ca.is_none() {
        return None;
    }
    let security = security.clone();
    Some(Arc::new(
        move |endpoint: tonic::transport::Endpoint| -> std::result::Result<
            tonic::transport::Endpoint,
            Box<dyn std::error::Error + Send + Sync>,
        > {
        let mut endpoint = endpoint;
        if let Some(ca) = &security.ca {
            endpoint = with_tls(endpoint, ca)?;
        }
        if let Some(token) = &security.token {
            endpoint = endpoint.user_agent(format!("{TOKEN_AGENT}{token}"))?;
        }
        Ok(endpoint)
    }))
}

/// `endpoint` as `https` with TLS trusting `ca`, keeping Ballista's connection settings (tonic
/// has no setter for the address, so the endpoint is made again).
fn with_tls(
    endpoint: tonic::transport::Endpoint,
    ca: &[u8],
) -> std::result::Result<tonic::transport::Endpoint, Box<dyn std::error::Error + Send + Sync>> {
    use std::time::Duration;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let uri = endpoint.uri();
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let mut tls = Endpoint::from_shared(format!("https://{authority}"))?
        .tcp_nodelay(true)
        .tcp_keepalive(endpoint.get_tcp_keepalive())
        .http2_keep_alive_interval(Duration::from_secs(300))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true)
        .initial_stream_window_size(16 * 1024 * 1024)
        .initial_connection_window_size(64 * 1024 * 1024);
    if let Some(t) = endpoint.get_connect_timeout() {
        tls = tls.connect_timeout(t);
    }
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    Ok(tls.tls_config(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name(host.to_string()),
    )?)
}

/// Where the lake is, for the scheduler's plan check: every file a client's plan scans must be
/// under this URL prefix. Travels in the scheduler's session config.
#[derive(Debug, Clone)]
pub struct LakeRoot(pub String);

impl LakeRoot {
    /// The root of the lake at `lake` (a path or URL, as `--lake` takes it), ending in `/`.
    pub fn of(lake: &str) -> Result<LakeRoot> {
        let url = crate::table::lake::Lake::open(lake)?.url("");
        Ok(LakeRoot(format!("{}/", url.trim_end_matches('/'))))
    }
}

/// Refuse `plan` unless it only reads the lake's Parquet files (see the module docs).
pub fn check_plan(plan: &LogicalPlan, root: &LakeRoot) -> datafusion::error::Result<()> {
    let mut refusal: Option<String> = None;
    plan.apply_with_subqueries(|p| {
        let why = match p {
            LogicalPlan::Copy(c) => Some(format!("COPY ... TO {} writes files", c.output_url)),
            LogicalPlan::Dml(d) => Some(format!("{} on {} writes a table", d.op.name(), d.table_name)),
            LogicalPlan::Ddl(d) => Some(format!("{} changes the catalog", d.name())),
            LogicalPlan::Statement(s) => Some(format!("the statement {} is not a query", s.name())),
            LogicalPlan::Extension(e) => Some(format!("the extension node {} is unknown", e.node.name())),
            LogicalPlan::TableScan(scan) => match source_as_provider(&scan.source) {
                Ok(provider) => provider_refusal(provider.as_ref(), &scan.table_name.to_string(), root),
                Err(_) => Some(format!("table {} has no provider", scan.table_name)),
            },
            _ => None,
        };
        if why.is_some() {
            refusal = why;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match refusal {
        None => Ok(()),
        Some(why) => Err(DataFusionError::Plan(format!(
            "ingot cluster: plan refused: {why}; the scheduler runs only queries that read the lake \
             {} (no writes, no DDL, no other files)",
            root.0
        ))),
    }
}

fn provider_refusal(provider: &dyn TableProvider, name: &str, root: &LakeRoot) -> Option<String> {
    if let Some(view) = provider.downcast_ref::<ViewTable>() {
        return check_plan(view.logical_plan(), root).err().map(|e| e.to_string());
    }
    let Some(listing) = provider.downcast_ref::<ListingTable>() else {
        return Some(format!("table {name} is not a listing table of the lake"));
    };
    if !listing.options().format.is::<ParquetFormat>() {
        return Some(format!("table {name} reads files that are not Parquet"));
    }
    for url in listing.table_paths() {
        let u = url.as_str();
        let lower = u.to_ascii_lowercase();
        if !u.starts_with(&root.0) || u.contains("/../") || u.ends_with("/..") || lower.contains("%2e") {
            return Some(format!("table {name} reads {u}, outside the lake"));
        }
    }
    None
}

/// The scheduler's decoding of a client's logical plan: `LogicalPlanNode`, checked with
/// [`check_plan`] against the [`LakeRoot`] of the scheduler's session.
#[derive(Debug, Clone, Default)]
pub struct GuardedLogical(LogicalPlanNode);

impl AsLogicalPlan for GuardedLogical {
    fn try_decode(buf: &[u8]) -> datafusion::error::Result<Self> {
        LogicalPlanNode::try_decode(buf).map(GuardedLogical)
    }

    fn try_encode<B: BufMut>(&self, buf: &mut B) -> datafusion::error::Result<()> {
        self.0.try_encode(buf)
    }

    fn try_into_logical_plan(
        &self,
        ctx: &TaskContext,
        codec: &dyn LogicalExtensionCodec,
    ) -> datafusion::error::Result<LogicalPlan> {
        let plan = self.0.try_into_logical_plan(ctx, codec)?;
        let root = ctx.session_config().get_extension::<LakeRoot>().ok_or_else(|| {
            DataFusionError::Internal("ingot cluster: the scheduler's session has no lake root".into())
        })?;
        check_plan(&plan, &root)?;
        Ok(plan)
    }

    fn try_from_logical_plan(plan: &LogicalPlan, codec: &dyn LogicalExtensionCodec) -> datafusion::error::Result<Self> {
        LogicalPlanNode::try_from_logical_plan(plan, codec).map(GuardedLogical)
    }
}

/// The scheduler's decoding of a physical plan sent by a client: refused (it would run as sent,
/// past every check). Encoding, for the stages the scheduler sends executors, is
/// `PhysicalPlanNode`'s.
#[derive(Debug, Clone, Default)]
pub struct NoClientPhysical(PhysicalPlanNode);

impl AsExecutionPlan for NoClientPhysical {
    fn try_decode(buf: &[u8]) -> datafusion::error::Result<Self> {
        PhysicalPlanNode::try_decode(buf).map(NoClientPhysical)
    }

    fn try_encode<B: BufMut>(&self, buf: &mut B) -> datafusion::error::Result<()> {
        self.0.try_encode(buf)
    }

    fn try_into_physical_plan(
        &self,
        _ctx: &TaskContext,
        _codec: &dyn PhysicalExtensionCodec,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::Plan(
            "ingot cluster: plan refused: physical plans from clients are not accepted (send a logical plan)".into(),
        ))
    }

    fn try_from_physical_plan(
        plan: Arc<dyn ExecutionPlan>,
        codec: &dyn PhysicalExtensionCodec,
    ) -> datafusion::error::Result<Self> {
        PhysicalPlanNode::try_from_physical_plan(plan, codec).map(NoClientPhysical)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_must_be_header_safe_and_not_empty() {
        assert!(check_token("", "T").is_err());
        assert!(check_token("a b", "T").is_err());
        assert!(check_token("ünï", "T").is_err());
        assert_eq!(check_token("0123abcdef", "T").unwrap(), "0123abcdef");
    }

    #[test]
    fn the_interceptor_takes_the_token_from_the_user_agent_or_a_bearer_header() {
        use tonic::service::Interceptor;
        let mut guard = RequireToken::new(Some("s3cret"));
        let with = |k: &'static str, v: &str| {
            let mut r = Request::new(());
            r.metadata_mut().insert(k, v.parse().unwrap());
            r
        };
        assert!(
            guard
                .call(with("user-agent", "ingot-token/s3cret tonic/0.14.9"))
                .is_ok()
        );
        assert!(guard.call(with("authorization", "Bearer s3cret")).is_ok());
        assert!(
            guard
                .call(with("user-agent", "ingot-token/s3cre tonic/0.14.9"))
                .is_err()
        );
        assert!(guard.call(with("user-agent", "tonic/0.14.9")).is_err());
        assert!(guard.call(Request::new(())).is_err());
        assert!(RequireToken::new(None).call(Request::new(())).is_ok());
    }
}
