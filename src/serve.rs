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

use std::sync::Arc;

use datafusion::execution::context::SessionState;
use datafusion_flight_sql_server::service::FlightSqlService;
use datafusion_flight_sql_server::session::SessionStateProvider;
use tonic::{Request, Status};

use crate::error::{Error, Result};
use crate::session::Workspace;

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
        let catalog = crate::catalog::open(&self.ws)
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
    crate::catalog::open(&ws).await?;
    let sessions = LakeSessions {
        ws: Arc::new(ws),
        token,
    };
    let service = FlightSqlService::new_with_provider(Box::new(sessions)).with_sql_options(crate::sql::read_only());
    println!("listening on {bound} (Arrow Flight SQL, read-only)");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    service
        .serve_with_listener(listener)
        .await
        .map_err(|e| Error::Invalid(format!("ingot serve on {bound}: {e}")))
}
