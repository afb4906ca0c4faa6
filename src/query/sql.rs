//! Read-only SQL over the lake's catalog: the one way `ingot sql`, the sqllogictest files (and
//! later the shell and the Flight SQL server) run a statement.
//!
//! DDL (`CREATE`, `DROP`, `CREATE EXTERNAL TABLE`), DML (`INSERT`, `UPDATE`, `DELETE`), `COPY`
//! and other statements (`SET`, transactions) are refused before planning: analysts cannot
//! write into the lake or change the session.

use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};

/// DDL, DML, COPY and statements (SET, transactions) are refused: the lake is read-only here.
pub fn read_only() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// Plan one read-only statement; errors say what was refused and why.
pub async fn query(ctx: &SessionContext, sql: &str) -> Result<DataFrame> {
    ctx.sql_with_options(sql, read_only()).await.map_err(|e| {
        let msg = e.to_string();
        if msg.contains("not supported") && (msg.contains("DDL") || msg.contains("DML") || msg.contains("Statement")) {
            Error::Invalid(format!(
                "{msg}: ingot sql is read-only (DDL, DML, COPY and SET are refused)"
            ))
        } else {
            Error::Invalid(format!("query failed: {msg}"))
        }
    })
}
