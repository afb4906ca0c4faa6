//! Running ingot's DataFusion plans on an Apache DataFusion Ballista cluster of ingot processes
//! (cargo feature `cluster`; what runs where: docs/guide.md#running-on-a-cluster).
//!
//! A cluster is one scheduler ([`scheduler`], `ingot cluster scheduler`) and any number of
//! executors ([`executor`], `ingot cluster executor`). The stock Ballista binaries cannot run
//! ingot's plans: those call ingot's UDFs ([`udfs`]), which travel by name and must be found in
//! three registries — the client's (registered after the Ballista session is made, see
//! [`client`]), the scheduler's session builder and every executor's function registry. A
//! missing one is reported by name ([`client::explain_error`]).
//!
//! Invariant: everything that writes the lake (data, failure and state files, manifests, commit
//! records) stays in the client, so a cluster never commits anything and a client that dies
//! leaves only uncommitted files.

pub mod client;
pub mod executor;
pub mod guard;
pub mod loopback;
pub mod scheduler;

use std::sync::Arc;

use datafusion::execution::FunctionRegistry;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;

use crate::error::{Error, Result};

/// Every scalar UDF an ingot plan may send to a cluster: the hashing UDFs of [`crate::hash`]
/// (`row_hash`, `natural_key_fingerprint`, `canonical_text`, `normalize_text`), silver's
/// `to_json_row`, `__ingot_fp128` and the list UDFs of [`crate::engine::lists`]. (`__ingot_pick` and `__ingot_in_set` hold a build's key
/// sets, `__ingot_slot_of` the slots of a source's current runs: they never leave the client; see
/// [`crate::engine::exec::local_only`].)
pub fn udfs() -> Vec<ScalarUDF> {
    let mut out = crate::hash::udfs();
    out.push(crate::hash::json::to_json_row_udf());
    out.push(crate::hash::fp::fp128_udf());
    out.push(crate::engine::lists::repeat_udf());
    out.push(crate::engine::lists::flags_udf());
    out
}

/// The object stores of a cluster process for the lake at `lake` (a local path, `file://` URL or
/// any object-store URL [`crate::table::lake::Lake::open`] supports): DataFusion's default registry
/// (local files) plus the lake's own store under its URL.
///
/// This is the one hook for other stores: when `Lake::open` learns a scheme (`s3://`), the
/// scheduler and the executors reach that lake the same way the client does.
///
/// Executors read and (for shuffles) write files themselves, so every process of a cluster must
/// reach the lake under the same URL: [`object_store_registry`] builds the registry the
/// scheduler and the executors use from the lake location they are started with (`--lake` /
/// `INGOT_LAKE`), the same way the client opens it ([`crate::table::lake::Lake::open`]). A local lake
/// works when all processes run on one machine (or share the path); an object-store lake
/// (`s3://...`) is the way to spread executors over machines.
pub fn object_store_registry(lake: &str) -> Result<Arc<dyn ObjectStoreRegistry>> {
    let registry = DefaultObjectStoreRegistry::new();
    let lake = crate::table::lake::Lake::open(lake)?;
    // as in-process: a scan of a file that is gone fails instead of reading as empty
    registry.register_store(&lake.store_url, crate::table::strict::wrap(lake.store.clone()));
    Ok(Arc::new(registry))
}

/// The session a cluster process plans and runs with: Ballista's default session (DataFusion's
/// functions, Ballista's optimizer rules) over `config`, the lake's object stores, and `udfs`
/// registered.
pub fn session_state(
    config: SessionConfig,
    stores: Arc<dyn ObjectStoreRegistry>,
    udfs: &[ScalarUDF],
) -> datafusion::error::Result<SessionState> {
    let base = ballista_core::utils::default_session_builder(config)?;
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(stores)
        .build_arc()?;
    let mut state = SessionStateBuilder::new_from_existing(base)
        .with_runtime_env(runtime)
        .build();
    for udf in udfs {
        state.register_udf(Arc::new(udf.clone()))?;
    }
    Ok(state)
}

/// A scheduler address `HOST:PORT` (also accepted: `df://HOST:PORT`, the client's form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// Parse `HOST:PORT` or `df://HOST:PORT`; `what` names the option for the message.
    pub fn parse(s: &str, what: &str) -> Result<Endpoint> {
        let bare = s.strip_prefix("df://").unwrap_or(s).trim_end_matches('/');
        let invalid = || {
            Error::Invalid(format!(
                "{what} \"{s}\": expected HOST:PORT (e.g. 127.0.0.1:50050){}",
                if what == "--cluster" { " as df://HOST:PORT" } else { "" }
            ))
        };
        let (host, port) = bare.rsplit_once(':').ok_or_else(invalid)?;
        let port: u16 = port.parse().map_err(|_| invalid())?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains('/') {
            return Err(invalid());
        }
        Ok(Endpoint {
            host: host.to_string(),
            port,
        })
    }

    /// `df://HOST:PORT`, the form `--cluster` takes.
    pub fn df_url(&self) -> String {
        format!("df://{}", self.authority())
    }

    /// `http://HOST:PORT`, the scheduler's gRPC endpoint.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.authority())
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("df://127.0.0.1:50050", "--cluster").unwrap();
        assert_eq!(e.host, "127.0.0.1");
        assert_eq!(e.port, 50050);
        assert_eq!(e.df_url(), "df://127.0.0.1:50050");
        assert_eq!(
            Endpoint::parse("[::1]:7", "--scheduler").unwrap().grpc_url(),
            "http://[::1]:7"
        );
        assert!(Endpoint::parse("localhost", "--cluster").is_err());
        assert!(Endpoint::parse("df://h:x", "--cluster").is_err());
    }
}
