//! `ingot serve`: an Arrow Flight SQL endpoint over the lake's catalog (feature `flight`).
//!
//! The Flight SQL service is `datafusion-flight-sql-server`'s (statements, prepared statements,
//! and the metadata calls BI tools and ADBC use: catalogs, schemas, tables with their schemas,
//! table types, SQL info). Every call gets a session over the lake as it is at that moment (the
//! catalog is opened per call, so new runs and builds show up without a restart) with the same
//! read-only rules as `ingot sql`: DDL, DML, COPY and SET are refused. With a token (`--token`
//! or `INGOT_TOKEN`) every call must carry `authorization: Bearer <token>`; others are refused
//! as unauthenticated. tonic serves each connection on its own task, so a slow or abandoned
//! client does not block the others. The server binds to loopback unless told otherwise.
//!
//! One fix on top of the crate: `GetDbSchemas` and `GetTables` without a catalog name (what ADBC's
//! `get_objects` sends) list nothing in datafusion-flight-sql-server 0.4; [`AllCatalogs`] fills in
//! ingot's one catalog, so "no catalog filter" means every schema and table, as the Flight SQL
//! specification says.

use std::sync::Arc;

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::{Any, Command, ProstMessageExt};
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, PollInfo, SchemaResult, Ticket,
};
use datafusion::execution::context::SessionState;
use datafusion_flight_sql_server::service::FlightSqlService;
use datafusion_flight_sql_server::session::SessionStateProvider;
use prost::Message;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::engine::session::Workspace;
use crate::error::{Error, Result};

struct LakeSessions {
    ws: Arc<Workspace>,
    token: Option<String>,
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
            if given != Some(token.as_str()) {
                return Err(Status::unauthenticated(
                    "ingot serve: a bearer token is required (authorization: Bearer <token>)",
                ));
            }
        }
        let catalog = crate::query::open_catalog(&self.ws, None)
            .await
            .map_err(|e| Status::internal(format!("cannot open the lake: {e}")))?;
        Ok(catalog.ctx.state())
    }
}

/// Serve until the process is stopped. Prints `listening on <addr>` (the bound address, so
/// `--addr 127.0.0.1:0` picks a free port) on stdout.
pub async fn serve(ws: Workspace, addr: &str, token: Option<String>) -> Result<()> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    // open the catalog once now, so a broken lake fails at start and not on the first call
    crate::query::open_catalog(&ws, None).await?;
    let sessions = LakeSessions {
        ws: Arc::new(ws),
        token,
    };
    let service = AllCatalogs(
        FlightSqlService::new_with_provider(Box::new(sessions)).with_sql_options(crate::query::sql::read_only()),
    );
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| Error::io(format!("--addr {addr}"), e))?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    crate::say!("listening on {bound} (Arrow Flight SQL, read-only)");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    tonic::transport::Server::builder()
        .add_service(FlightServiceServer::new(service))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| Error::Invalid(format!("ingot serve on {bound}: {e}")))
}

/// The name of the one catalog every ingot session has (see `session.rs`).
const CATALOG: &str = "ingot";

/// datafusion-flight-sql-server's service with "no catalog given" read as "every catalog" in
/// `GetDbSchemas` and `GetTables`. The crate encodes the command into the ticket and lists
/// schemas only when the command names a catalog, so the ticket is rewritten on its way in;
/// every other call passes through untouched.
struct AllCatalogs(FlightSqlService);

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
impl FlightService for AllCatalogs {
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
        self.0.handshake(request).await
    }
    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> std::result::Result<Response<Self::ListFlightsStream>, Status> {
        self.0.list_flights(request).await
    }
    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.0.get_flight_info(request).await
    }
    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<PollInfo>, Status> {
        self.0.poll_flight_info(request).await
    }
    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<SchemaResult>, Status> {
        self.0.get_schema(request).await
    }
    async fn do_get(&self, request: Request<Ticket>) -> std::result::Result<Response<Self::DoGetStream>, Status> {
        match with_catalog(request.get_ref()) {
            Some(ticket) => {
                let (metadata, extensions, _) = request.into_parts();
                self.0.do_get(Request::from_parts(metadata, extensions, ticket)).await
            }
            None => self.0.do_get(request).await,
        }
    }
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoPutStream>, Status> {
        self.0.do_put(request).await
    }
    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoExchangeStream>, Status> {
        self.0.do_exchange(request).await
    }
    async fn do_action(&self, request: Request<Action>) -> std::result::Result<Response<Self::DoActionStream>, Status> {
        self.0.do_action(request).await
    }
    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        self.0.list_actions(request).await
    }
}
