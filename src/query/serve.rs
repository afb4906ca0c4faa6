//! `ingot serve`: an Arrow Flight SQL endpoint over the lake's catalog (feature `flight`).
//!
//! The service is `datafusion-flight-sql-server`'s (statements, prepared statements, the metadata
//! calls of ADBC and BI tools) with `ingot sql`'s read-only rules, wrapped by [`IngotFlight`]:
//! Substrait plans are refused (they arrive planned, past the SQL rules); a call needs the token
//! when one is set (hashed, compared in full); at most `--max-queries` `DoGet`s run at once (the
//! rest wait in line), each with its own `--query-memory` pool, cancelled at `--query-timeout`
//! by a timer of its own even when the client stopped reading. TLS comes from tonic's rustls
//! support; a non-loopback address without TLS and a token is refused unless `--insecure`. The
//! catalog is opened once and reused until a commit adds a log record or a contract or rules
//! file changes (docs/security.md says what each flag guards against).
//!
//! One fix on top of the crate: `GetDbSchemas` and `GetTables` without a catalog name (what ADBC's
//! `get_objects` sends) list nothing in datafusion-flight-sql-server 0.4; [`IngotFlight`] fills in
//! ingot's one catalog, as the Flight SQL specification says.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::{Any, Command, ProstMessageExt};
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, PollInfo, SchemaResult, Ticket,
};
use datafusion::execution::context::SessionState;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion_flight_sql_server::service::FlightSqlService;
use datafusion_flight_sql_server::session::SessionStateProvider;
use futures::Stream;
use prost::Message;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::engine::session::Workspace;
use crate::error::{Error, Result};

/// How `ingot serve` runs (see the module docs).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub addr: String,
    pub token: Option<String>,
    /// PEM certificate (chain) and private key.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// Allow a non-loopback address without TLS and a token.
    pub insecure: bool,
    pub max_queries: usize,
    /// Bytes of memory each query may use before spilling.
    pub query_memory: usize,
    /// Cancel a query running longer than this; `Duration::ZERO` for no limit.
    pub query_timeout: Duration,
}

struct LakeSessions {
    ws: Arc<Workspace>,
    /// SHA-256 of the token.
    token: Option<[u8; 32]>,
    query_memory: usize,
    /// The catalog's session and the lake version it was opened at.
    cached: Mutex<Option<(LakeVersion, SessionState)>>,
}

/// What the catalog depends on: the last object of each run-log and build-log folder (a commit
/// adds one after it) and the contract and rules files, each with its size and modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LakeVersion {
    last: std::collections::BTreeMap<String, String>,
    stamps: Vec<String>,
}

/// The lake's version now. With the version a catalog was opened at, each log folder is listed
/// only after its last object then (a `start-after` listing), so a check costs the same however
/// long the history.
async fn lake_version(ws: &Workspace, since: Option<&LakeVersion>) -> Result<LakeVersion> {
    use crate::table::lake::layout;
    let mut last = std::collections::BTreeMap::new();
    for log in [layout::RUN_LOG, layout::BUILD_LOG] {
        for name in ws.lake.list_dirs(log).await? {
            let folder = format!("{log}/{name}");
            let before = since.and_then(|v| v.last.get(&folder));
            let listed = match before {
                Some(after) => ws.lake.list_after(&folder, after).await?,
                None => ws.lake.list(&folder).await?,
            };
            let newest = listed
                .last()
                .and_then(|m| ws.lake.relative(&m.location))
                .or_else(|| before.cloned())
                .unwrap_or_default();
            last.insert(folder, newest);
        }
    }
    let mut stamps = Vec::new();
    for dir in [&ws.contracts_dir, &ws.rules_dir] {
        stamp_files(dir, &mut stamps);
    }
    stamps.sort();
    Ok(LakeVersion { last, stamps })
}

/// `path size mtime` of every file under `dir` (what a missing folder has: nothing).
fn stamp_files(dir: &std::path::Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.metadata() {
            Ok(m) if m.is_dir() => stamp_files(&path, out),
            Ok(m) => out.push(format!("{} {} {:?}", path.display(), m.len(), m.modified().ok())),
            Err(_) => out.push(format!("{} ?", path.display())),
        }
    }
}

impl LakeSessions {
    /// The catalog's session, opened again if the lake changed since it was last opened.
    async fn catalog_state(&self) -> std::result::Result<SessionState, Status> {
        let mut cached = self.cached.lock().await;
        let version = lake_version(&self.ws, cached.as_ref().map(|(v, _)| v))
            .await
            .map_err(|e| Status::internal(format!("cannot read the lake: {e}")))?;
        if let Some((v, state)) = cached.as_ref()
            && *v == version
        {
            return Ok(state.clone());
        }
        let catalog = crate::query::open_catalog(&self.ws, None)
            .await
            .map_err(|e| Status::internal(format!("cannot open the lake: {e}")))?;
        crate::tell!(
            "ingot serve: catalog opened ({} builds; each source's runs are read when first queried)",
            catalog.builds.len()
        );
        let state = catalog.ctx.state();
        *cached = Some((version, state.clone()));
        Ok(state)
    }
}

#[async_trait::async_trait]
impl SessionStateProvider for LakeSessions {
    async fn new_context(&self, request: &Request<()>) -> std::result::Result<SessionState, Status> {
        if let Some(token) = &self.token {
            let given = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| crate::hash::same_secret(g.as_bytes(), token)) {
                return Err(Status::unauthenticated(
                    "ingot serve: a bearer token is required (authorization: Bearer <token>)",
                ));
            }
        }
        let state = self.catalog_state().await?;
        // the shared catalog with a memory pool of this call's own
        let shared = state.runtime_env().clone();
        let mut runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(self.query_memory)))
            .with_object_store_registry(shared.object_store_registry.clone());
        runtime.disk_manager = Some(shared.disk_manager.clone());
        let runtime = runtime
            .build_arc()
            .map_err(|e| Status::internal(format!("cannot set up the query's memory pool: {e}")))?;
        Ok(SessionStateBuilder::new_from_existing(state)
            .with_runtime_env(runtime)
            .build())
    }
}

/// Serve until the process is stopped. Prints `listening on <addr>` (the bound address, so
/// `--addr 127.0.0.1:0` picks a free port) on stdout.
pub async fn serve(ws: Workspace, options: ServeOptions) -> Result<()> {
    let addr = options.addr.as_str();
    let listener = std::net::TcpListener::bind(addr).map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    if !bound.ip().is_loopback() && !options.insecure && (options.tls.is_none() || options.token.is_none()) {
        let missing = match (options.tls.is_none(), options.token.is_none()) {
            (true, true) => "TLS and a token",
            (true, false) => "TLS",
            _ => "a token",
        };
        return Err(Error::Invalid(format!(
            "--addr {addr}: refusing to serve on {bound}, which is not a loopback address, without {missing}: \
             anyone who reaches the port could read the lake (and without TLS the token and the data \
             travel in clear text). Give --tls-cert and --tls-key and a token (INGOT_TOKEN or \
             --token-file), or --insecure to serve this way anyway"
        )));
    }
    if !bound.ip().is_loopback() && options.insecure {
        crate::tell!("ingot serve: warning: --insecure: serving {bound} without TLS or without a token");
    }
    let mut server = tonic::transport::Server::builder();
    if let Some((cert, key)) = &options.tls {
        server = server
            .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
            .map_err(|e| {
                Error::Invalid(format!(
                    "--tls-cert / --tls-key: not a usable PEM certificate and private key: {e}"
                ))
            })?;
    }
    // open the catalog once now, so a broken lake fails at start and not on the first call
    let sessions = LakeSessions {
        ws: Arc::new(ws),
        token: options
            .token
            .as_deref()
            .map(|t| crate::hash::secret_digest(t.as_bytes())),
        query_memory: options.query_memory,
        cached: Mutex::new(None),
    };
    sessions
        .catalog_state()
        .await
        .map_err(|s| Error::Invalid(s.message().to_string()))?;
    let service = IngotFlight {
        inner: FlightSqlService::new_with_provider(Box::new(sessions)).with_sql_options(crate::query::sql::read_only()),
        slots: Arc::new(Semaphore::new(options.max_queries)),
        max_queries: options.max_queries,
        timeout: options.query_timeout,
    };
    let _ = TIMEOUT.set(options.query_timeout);
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    crate::say!(
        "listening on {bound} (Arrow Flight SQL, read-only{}{})",
        if options.tls.is_some() { ", TLS" } else { "" },
        if options.token.is_some() {
            ", token required"
        } else {
            ""
        }
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    server
        .add_service(FlightServiceServer::new(service))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| Error::Invalid(format!("ingot serve on {bound}: {e}")))
}

/// The name of the one catalog every ingot session has (see `session.rs`).
const CATALOG: &str = "ingot";

/// datafusion-flight-sql-server's service with ingot's guards: "no catalog given" read as "every
/// catalog" in `GetDbSchemas` and `GetTables` (the crate encodes the command into the ticket and
/// lists schemas only when the command names a catalog, so the ticket is rewritten on its way
/// in); Substrait plans refused; every `DoGet` (where a query runs) holding one of
/// `slots` and cancelled after `timeout`. Every other call passes through untouched.
struct IngotFlight {
    inner: FlightSqlService,
    slots: Arc<Semaphore>,
    max_queries: usize,
    timeout: Duration,
}

/// Is `any` a Substrait plan (already planned, so the read-only SQL rules cannot check it)?
fn is_substrait(bytes: &[u8]) -> bool {
    let Ok(any) = Any::decode(bytes) else { return false };
    matches!(
        Command::try_from(any),
        Ok(Command::CommandStatementSubstraitPlan(_) | Command::ActionCreatePreparedSubstraitPlanRequest(_))
    )
}

fn no_substrait() -> Status {
    Status::permission_denied(
        "ingot serve: Substrait plans are not accepted (they bypass the read-only SQL rules); send SQL",
    )
}

/// A query's result stream that holds its slot until it ends, and is ended at its deadline by
/// a timer of its own: a client that stops reading leaves the stream unpolled (HTTP/2 flow
/// control), and its slot must still come free.
struct Guarded {
    query: Arc<std::sync::Mutex<Running>>,
    timer: Option<tokio::task::JoinHandle<()>>,
}

struct Running {
    /// The plan's stream; `None` once it ended or was cancelled.
    inner: Option<<Inner as FlightService>::DoGetStream>,
    slot: Option<OwnedSemaphorePermit>,
    /// Cancelled at the deadline, and the client not yet told.
    expired: bool,
    waker: Option<std::task::Waker>,
}

impl Guarded {
    fn new(
        inner: <Inner as FlightService>::DoGetStream,
        slot: OwnedSemaphorePermit,
        deadline: Option<tokio::time::Instant>,
    ) -> Guarded {
        let query = Arc::new(std::sync::Mutex::new(Running {
            inner: Some(inner),
            slot: Some(slot),
            expired: false,
            waker: None,
        }));
        let timer = deadline.map(|at| {
            let weak = Arc::downgrade(&query);
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                let Some(query) = weak.upgrade() else { return };
                let mut q = query.lock().unwrap_or_else(|e| e.into_inner());
                if q.inner.is_some() {
                    // dropping the plan's stream stops its tasks; the slot goes to the next query
                    q.inner = None;
                    q.slot = None;
                    q.expired = true;
                    if let Some(w) = q.waker.take() {
                        w.wake();
                    }
                }
            })
        });
        Guarded { query, timer }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(t) = &self.timer {
            t.abort();
        }
    }
}

/// The query timeout, for the message of a cancelled query (set once at startup).
static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

impl Stream for Guarded {
    type Item = std::result::Result<FlightData, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut q = self.query.lock().unwrap_or_else(|e| e.into_inner());
        if q.expired {
            q.expired = false;
            return Poll::Ready(Some(Err(timed_out(TIMEOUT.get().copied().unwrap_or_default()))));
        }
        let Some(inner) = q.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.as_mut().poll_next(cx) {
            Poll::Ready(None) => {
                q.inner = None;
                q.slot = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                q.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            ready => ready,
        }
    }
}

fn timed_out(timeout: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "ingot serve: query cancelled: it ran longer than the server's --query-timeout of {}",
        humantime(timeout)
    ))
}

fn humantime(d: Duration) -> String {
    if !d.as_millis().is_multiple_of(1000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

/// The ticket with [`CATALOG`] filled into a catalog-less `GetDbSchemas` / `GetTables`, or
/// `None` when it is anything else (including tickets that are not Flight SQL commands).
fn with_catalog(ticket: &Ticket) -> Option<Ticket> {
    let any = Any::decode(ticket.ticket.clone()).ok()?;
    let any = match Command::try_from(any).ok()? {
        Command::CommandGetDbSchemas(mut c) if c.catalog.is_none() => {
            c.catalog = Some(CATALOG.to_string());
            c.as_any()
        }
        Command::CommandGetTables(mut c) if c.catalog.is_none() => {
            c.catalog = Some(CATALOG.to_string());
            c.as_any()
        }
        _ => return None,
    };
    Some(Ticket {
        ticket: any.encode_to_vec().into(),
    })
}

type Inner = FlightSqlService;

#[tonic::async_trait]
impl FlightService for IngotFlight {
    type HandshakeStream = <Inner as FlightService>::HandshakeStream;
    type ListFlightsStream = <Inner as FlightService>::ListFlightsStream;
    type DoGetStream = <Inner as FlightService>::DoGetStream;
    type DoPutStream = <Inner as FlightService>::DoPutStream;
    type DoExchangeStream = <Inner as FlightService>::DoExchangeStream;
    type DoActionStream = <Inner as FlightService>::DoActionStream;
    type ListActionsStream = <Inner as FlightService>::ListActionsStream;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> std::result::Result<Response<Self::HandshakeStream>, Status> {
        self.inner.handshake(request).await
    }
    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> std::result::Result<Response<Self::ListFlightsStream>, Status> {
        self.inner.list_flights(request).await
    }
    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        if is_substrait(&request.get_ref().cmd) {
            return Err(no_substrait());
        }
        self.inner.get_flight_info(request).await
    }
    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<PollInfo>, Status> {
        if is_substrait(&request.get_ref().cmd) {
            return Err(no_substrait());
        }
        self.inner.poll_flight_info(request).await
    }
    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<SchemaResult>, Status> {
        self.inner.get_schema(request).await
    }
    async fn do_get(&self, request: Request<Ticket>) -> std::result::Result<Response<Self::DoGetStream>, Status> {
        if is_substrait(&request.get_ref().ticket) {
            return Err(no_substrait());
        }
        let request = match with_catalog(request.get_ref()) {
            Some(ticket) => {
                let (metadata, extensions, _) = request.into_parts();
                Request::from_parts(metadata, extensions, ticket)
            }
            None => request,
        };
        // a slot first (waiting in line), then the deadline runs from the query's start
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                crate::tell!(
                    "ingot serve: a query waits for a slot: {} running (--max-queries)",
                    self.max_queries
                );
                self.slots
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Status::unavailable("ingot serve is shutting down"))?
            }
        };
        let started = tokio::time::Instant::now();
        let response = if self.timeout.is_zero() {
            self.inner.do_get(request).await?
        } else {
            tokio::time::timeout(self.timeout, self.inner.do_get(request))
                .await
                .map_err(|_| timed_out(self.timeout))??
        };
        let (metadata, stream, extensions) = response.into_parts();
        let deadline = (!self.timeout.is_zero()).then(|| started + self.timeout);
        let guarded = Guarded::new(stream, slot, deadline);
        Ok(Response::from_parts(metadata, Box::pin(guarded), extensions))
    }
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoPutStream>, Status> {
        // binds a prepared statement's parameters; the crate implements no DoPut that writes
        // (updates and ingest answer "unimplemented")
        self.inner.do_put(request).await
    }
    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoExchangeStream>, Status> {
        self.inner.do_exchange(request).await
    }
    async fn do_action(&self, request: Request<Action>) -> std::result::Result<Response<Self::DoActionStream>, Status> {
        if request.get_ref().r#type == "CreatePreparedSubstraitPlan" {
            return Err(no_substrait());
        }
        self.inner.do_action(request).await
    }
    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        self.inner.list_actions(request).await
    }
}
