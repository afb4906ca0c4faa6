//! `ingot serve`: the catalog over Arrow Flight SQL; see [`crate::query::serve`].

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::Cli;
use crate::engine::session::parse_size;
use crate::error::{Error, ExitStatus, Result};
use crate::query::serve::ServeOptions;

/// The flags of `ingot serve`. The token comes from `INGOT_TOKEN` or `--token-file`, never from
/// the command line (every local user can read a process's arguments).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// Read the bearer token every call must carry from this file (its first line; keep the
    /// file readable by the server's user only). Or set INGOT_TOKEN.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: crate::cli::TlsArgs,
    /// Allow a non-loopback address without TLS and a token (the token and the data then travel
    /// in clear text, or anyone who reaches the port reads the lake).
    #[arg(long)]
    pub insecure: bool,
    /// Queries that run at once; more wait for a free slot (in arrival order).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_queries: u32,
    /// Memory each query may use before its operators spill to disk (e.g. 512M, 2G).
    #[arg(long, default_value = "1G")]
    pub query_memory: String,
    /// A query still running after this long is cancelled (e.g. 30s, 5m, 1h; 0 = no limit).
    #[arg(long, default_value = "5m")]
    pub query_timeout: String,
}

pub async fn run(cli: &Cli, args: &ServeArgs) -> Result<ExitStatus> {
    let token = crate::hash::read_secret("INGOT_TOKEN", args.token_file.as_deref().map(|p| (p, "--token-file")))?;
    let query_memory = parse_size(&args.query_memory).map_err(|e| Error::Invalid(format!("--query-memory: {e}")))?;
    if query_memory == 0 {
        return Err(Error::Invalid("--query-memory: must be more than 0 (e.g. 512M)".into()));
    }
    let options = ServeOptions {
        addr: args.addr.clone(),
        token,
        tls: args.tls.read()?,
        insecure: args.insecure,
        max_queries: args.max_queries as usize,
        query_memory,
        query_timeout: parse_duration(&args.query_timeout)
            .map_err(|e| Error::Invalid(format!("--query-timeout: {e}")))?,
    };
    crate::query::serve::serve(cli.workspace()?, options).await?;
    Ok(ExitStatus::Success)
}

/// `30s`, `5m`, `1h`, `250ms` or plain seconds; `0` is no limit (`Duration::ZERO`).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration \"{s}\": use a number with ms, s, m or h (e.g. 30s, 5m)"))?;
    let secs = |k: u64| Duration::from_secs(n.saturating_mul(k));
    match unit.trim() {
        "" | "s" => Ok(secs(1)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(secs(60)),
        "h" => Ok(secs(3600)),
        other => Err(format!(
            "invalid duration \"{s}\": unknown unit \"{other}\" (use ms, s, m or h, e.g. 30s, 5m)"
        )),
    }
}
