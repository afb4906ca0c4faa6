//! The client side of a cluster: a Ballista session made from a local ingot session, a
//! reachability check, and errors that name what is missing.
//!
//! Hazards (checked on Ballista 55): `upgrade_for_ballista` rebuilds the session's function list,
//! so ingot's UDFs are registered *after* it ([`remote_state`]); in-memory tables cannot be
//! scanned on a cluster (ingot's empty tables are listing tables over no files for that reason);
//! `DataFrame::cache()` does nothing there. Ballista connects lazily, at the first query, so
//! [`check_reachable`] asks the scheduler once up front to name the URL when it cannot be reached.

use std::time::Duration;

use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::protobuf::GetJobStatusParams;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use datafusion::error::DataFusionError;
use datafusion::execution::FunctionRegistry;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::prelude::SessionContext;

use super::Endpoint;
use super::guard::ClusterSecurity;
use crate::error::{Error, Result};

/// A Ballista session for the scheduler at `url` (`df://HOST:PORT`) made from `local`: the same
/// configuration, runtime (memory pool, object stores) and catalog, ingot's UDFs registered after
/// the upgrade, and the cluster's token and TLS settings from the environment
/// ([`ClusterSecurity::from_env`]) on every connection it opens.
pub async fn remote_state(local: &SessionState, url: &str) -> Result<SessionState> {
    remote_state_with(local, url, &ClusterSecurity::from_env()?).await
}

/// [`remote_state`] with `security` given.
pub async fn remote_state_with(local: &SessionState, url: &str, security: &ClusterSecurity) -> Result<SessionState> {
    let endpoint = Endpoint::parse(url, "--cluster")?;
    let local = match super::guard::endpoint_override(security) {
        Some(f) => {
            let config = local
                .config()
                .clone()
                .with_ballista_override_create_grpc_client_endpoint(f);
            SessionStateBuilder::new_from_existing(local.clone())
                .with_config(config)
                .build()
        }
        None => local.clone(),
    };
    let ctx = SessionContext::remote_with_state(&endpoint.df_url(), local)
        .await
        .map_err(|e| Error::Invalid(format!("--cluster {url}: {e}")))?;
    let mut state = ctx.state();
    for udf in super::udfs() {
        state.register_udf(std::sync::Arc::new(udf))?;
    }
    Ok(state)
}

/// Ask the scheduler at `url` once (within 10 s), with the cluster's token: an error names the
/// URL and says how to start one, or that the token is missing or wrong.
pub async fn check_reachable(url: &str) -> Result<()> {
    let endpoint = Endpoint::parse(url, "--cluster")?;
    let security = ClusterSecurity::from_env()?;
    let ask = async {
        let mut grpc = tonic::transport::Endpoint::from_shared(endpoint.grpc_url())
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(10));
        if let Some(f) = super::guard::endpoint_override(&security) {
            grpc = f(grpc).map_err(|e| e.to_string())?;
        }
        let channel = grpc
            .connect()
            .await
            .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?;
        let mut client = SchedulerGrpcClient::new(channel);
        // any answer but "unauthenticated" means the scheduler is there and takes the token
        match client
            .get_job_status(GetJobStatusParams {
                job_id: "ingot-reachability-check".into(),
            })
            .await
        {
            Err(status) if status.code() == tonic::Code::Unauthenticated => Err(format!(
                "the scheduler refused the token: {} (INGOT_CLUSTER_TOKEN {})",
                status.message(),
                if security.token.is_some() {
                    "is set but wrong"
                } else {
                    "is not set"
                }
            )),
            Err(status) if status.code() == tonic::Code::Unavailable => Err(status.message().to_string()),
            _ => Ok(()),
        }
    };
    match tokio::time::timeout(Duration::from_secs(10), ask).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(cause)) if cause.starts_with("the scheduler refused the token") => Err(Error::RunFailed(format!(
            "the ingot cluster at {url} (--cluster / INGOT_CLUSTER): {cause}"
        ))),
        Ok(Err(cause)) => Err(unreachable(url, &cause)),
        Err(_) => Err(unreachable(url, "no answer within 10 s")),
    }
}

fn unreachable(url: &str, cause: &str) -> Error {
    Error::RunFailed(format!(
        "cannot reach the ingot cluster scheduler at {url} (--cluster / INGOT_CLUSTER): {cause}; \
         start one with `ingot cluster scheduler --bind HOST:PORT` or run without --cluster"
    ))
}

/// Function names the cluster did not know, as Ballista's and DataFusion's errors name them.
fn missing_function(msg: &str) -> Option<String> {
    const MARKERS: [&str; 4] = [
        "is not provided for scalar function ",
        "Invalid function '",
        "There is no UDF named \"",
        "There is no UDF named '",
    ];
    MARKERS.iter().find_map(|m| {
        let rest = &msg[msg.find(m)? + m.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    })
}

/// Say what a cluster error means when it is one ingot can explain: a UDF the scheduler or an
/// executor does not register, or a scheduler or executor that cannot be reached.
pub fn explain_error(url: &str, e: DataFusionError) -> DataFusionError {
    let msg = e.to_string();
    if let Some(name) = missing_function(&msg) {
        return DataFusionError::Execution(format!(
            "the cluster at {url} cannot run the function \"{name}\": its scheduler or one of its \
             executors does not register it (every process must be `ingot cluster scheduler` / \
             `ingot cluster executor` of this ingot version, {}); cause: {msg}",
            env!("CARGO_PKG_VERSION")
        ));
    }
    let lower = msg.to_ascii_lowercase();
    if lower.contains("transport error") || lower.contains("connection refused") || lower.contains("grpc") {
        return DataFusionError::Execution(format!("the cluster at {url} failed: {msg}"));
    }
    e
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_the_missing_function() {
        let m = "NotImplemented(\"PhysicalExtensionCodec is not provided for scalar function row_hash\")";
        assert_eq!(super::missing_function(m).as_deref(), Some("row_hash"));
        assert_eq!(
            super::missing_function("Invalid function 'canonical_text'.").as_deref(),
            Some("canonical_text")
        );
        assert_eq!(super::missing_function("other"), None);
    }
}
