//! The workspace (lake, contracts, rules, landing folders) and DataFusion sessions over it.
//!
//! Every `SessionContext` ingot creates has a bounded memory pool that spills (`--memory-limit`),
//! the hashing UDFs registered, and the lake's object store registered, so plans run the same from
//! the CLI, from tests and later on a cluster.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::error::{Error, Result};
use crate::table::lake::Lake;

/// Keep freed memory for reuse instead of handing it back to the kernel at once (glibc only; the
/// `ingot` binary calls this first). A run allocates and frees buffers of a few MiB all the time
/// (compressed Parquet pages of a row group, hash columns of a batch); with glibc's defaults many
/// are unmapped or trimmed when freed and faulted in again, zeroed, when allocated next: about
/// 35,000 page faults and a third of a CPU-second of an SF1 ingest. Buffers up to 32 MiB come
/// from the heap and up to 256 MiB of free heap stays mapped; peak memory is about the same
/// (measured +15 MiB of ~670).
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Default DataFusion memory pool size.
pub const DEFAULT_MEMORY_LIMIT: usize = 1 << 30;

#[derive(Debug, Clone)]
pub struct Workspace {
    pub lake: Lake,
    pub contracts_dir: PathBuf,
    pub rules_dir: PathBuf,
    pub landing_dir: PathBuf,
    pub memory_limit: usize,
    /// `--cluster df://HOST:PORT`: run DataFusion plans on this Ballista cluster (see
    /// [`crate::engine::exec`]); `None` runs everything in this process.
    pub cluster: Option<String>,
}

impl Workspace {
    /// A new DataFusion session: memory pool, UDFs and the lake's object store.
    pub fn session(&self) -> Result<SessionContext> {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(self.memory_limit)))
            .build_arc()?;
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("ingot", "public")
            .with_create_default_catalog_and_schema(true);
        // Joins must stay within the memory pool: a sort-merge join spills, a hash join's build
        // side does not (silver's incremental anti-joins over whole tables failed at 1G).
        config.options_mut().optimizer.prefer_hash_join = false;
        let ctx = SessionContext::new_with_config_rt(config, runtime);
        ctx.register_object_store(&self.lake.store_url, self.lake.store.clone());
        crate::hash::register_udfs(&ctx);
        Ok(ctx)
    }
}

/// Parse a size such as `512M`, `2G`, `1048576` into bytes.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        None => (t, 1usize),
        Some((i, _)) => {
            let unit = t[i..].to_ascii_uppercase();
            let m = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => {
                    return Err(Error::Invalid(format!(
                        "invalid size \"{s}\": use a number with K, M, G or T (e.g. 512M, 2G)"
                    )));
                }
            };
            (&t[..i], m)
        }
    };
    let n: f64 = num.trim().parse().map_err(|_| {
        Error::Invalid(format!(
            "invalid size \"{s}\": use a number with K, M, G or T (e.g. 512M, 2G)"
        ))
    })?;
    if n.is_nan() || n <= 0.0 {
        return Err(Error::Invalid(format!(
            "invalid size \"{s}\": must be greater than zero"
        )));
    }
    Ok((n * mult as f64) as usize)
}
