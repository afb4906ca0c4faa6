//! The workspace (lake, contracts, rules, landing folders, where time and ids come from) and
//! DataFusion sessions over it.
//!
//! Every `SessionContext` ingot creates has a bounded memory pool that spills (`--memory-limit`),
//! the hashing UDFs registered, and the lake's object store registered, so plans run the same from
//! the CLI, from tests and later on a cluster.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

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
    /// The time of day of run and build records (`started_at`, `finished_at`, `rolled_back_at`)
    /// and gc's grace periods. Source locks keep the system clock: their leases are shared
    /// between processes.
    pub clock: Arc<dyn Clock>,
    /// New run and build ids.
    pub ids: Arc<dyn IdSource>,
    /// How long a writer waits for another writer's lock on the same source or table (`--wait`;
    /// zero: fail at once), see [`crate::table::lock::acquire_for`].
    pub lock_wait: std::time::Duration,
}

/// Where the pipeline reads the time of day: [`SystemClock`] by default; tests inject a
/// [`ManualClock`] to fix time or step it (backwards too).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Microseconds since the Unix epoch, UTC.
    fn now_micros(&self) -> i64;
}

/// Where new run and build ids come from: [`UuidV7`] by default (unique across hosts, sortable
/// by creation time); tests inject [`SequentialIds`].
pub trait IdSource: Send + Sync + std::fmt::Debug {
    fn new_id(&self) -> String;
}

/// The host's clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> i64 {
        chrono::Utc::now().timestamp_micros()
    }
}

/// A clock that says what it was set to, advanced by a fixed step on every reading (0: frozen).
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
    step: i64,
}

impl ManualClock {
    /// Starting at `micros`, advancing `step` microseconds per reading.
    pub fn new(micros: i64, step: i64) -> ManualClock {
        ManualClock {
            now: AtomicI64::new(micros),
            step,
        }
    }

    /// Set the time (earlier than before, to test a clock that steps back).
    pub fn set(&self, micros: i64) {
        self.now.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> i64 {
        self.now.fetch_add(self.step, Ordering::SeqCst)
    }
}

/// UUIDv7 text ids.
#[derive(Debug, Default)]
pub struct UuidV7;

impl IdSource for UuidV7 {
    fn new_id(&self) -> String {
        uuid::Uuid::now_v7().to_string()
    }
}

/// `<prefix>000001`, `<prefix>000002`, ...: predictable ids for tests.
#[derive(Debug)]
pub struct SequentialIds {
    prefix: String,
    next: AtomicU64,
}

impl SequentialIds {
    pub fn new(prefix: &str) -> SequentialIds {
        SequentialIds {
            prefix: prefix.to_string(),
            next: AtomicU64::new(1),
        }
    }
}

impl IdSource for SequentialIds {
    fn new_id(&self) -> String {
        format!("{}{:06}", self.prefix, self.next.fetch_add(1, Ordering::SeqCst))
    }
}

/// Percent of `--memory-limit` that DataFusion's memory pool gets ([`Workspace::pool_size`]).
pub const POOL_PERCENT: usize = 85;

impl Workspace {
    /// A workspace over `lake` with the default folders (`contracts`, `rules`, `data/landing`),
    /// memory limit, no cluster, the system clock, UUIDv7 ids and the default lock wait.
    pub fn new(lake: Lake) -> Workspace {
        Workspace {
            lake,
            contracts_dir: PathBuf::from("contracts"),
            rules_dir: PathBuf::from("rules"),
            landing_dir: PathBuf::from("data/landing"),
            memory_limit: DEFAULT_MEMORY_LIMIT,
            cluster: None,
            clock: Arc::new(SystemClock),
            ids: Arc::new(UuidV7),
            lock_wait: crate::table::lock::DEFAULT_WAIT,
        }
    }

    pub fn now_micros(&self) -> i64 {
        self.clock.now_micros()
    }

    pub fn new_id(&self) -> String {
        self.ids.new_id()
    }

    /// The memory pool's share of `--memory-limit`: the rest is for what the pool does not see
    /// (Parquet writers' row groups, decoded pages, the allocator's kept free memory), so the
    /// process stays within the limit (an SF10 silver build with the whole limit as its pool
    /// peaked at 967-1,082 MB at 1G).
    pub fn pool_size(&self) -> usize {
        self.memory_limit / 100 * POOL_PERCENT
    }

    /// A new DataFusion session: memory pool, UDFs and the lake's object store.
    pub fn session(&self) -> Result<SessionContext> {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(self.pool_size())))
            .build_arc()?;
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema("ingot", "public")
            .with_create_default_catalog_and_schema(true);
        // Joins must stay within the memory pool: a sort-merge join spills, a hash join's build
        // side does not (silver's incremental anti-joins over whole tables failed at 1G).
        config.options_mut().optimizer.prefer_hash_join = false;
        // Leaves are planned one after the other: a plan that scans one table twice (the current
        // view joins a table's latest versions back onto it) then reads each file's footer once,
        // into the metadata cache the second scan finds it in, instead of twice from the store
        // when the two scans race for it.
        config.options_mut().execution.planning_concurrency = 1;
        // A repartition that cannot grow its memory spills batches into files its readers follow
        // as they are written. In DataFusion 55 two input tasks spilling at once can each leave a
        // file open; the reader waits for the older one to be finished, the writers wait for the
        // reader to drain, and the query parks forever with no CPU (a full-width export of
        // `_current` at 6M rows under the default limit). Closing every spill file after its one
        // batch leaves no file open for a reader to wait on (a file per spilled batch).
        config.options_mut().execution.max_spill_file_size_bytes =
            datafusion::common::config::ConfigNonZeroUsize::try_new(1)?;
        // ... except where one side is provably small: that side is collected into a hash table
        // (after JoinSelection, so no estimate swaps it back; see crate::engine::joins)
        let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
        let at = rules
            .iter()
            .position(|r| r.name() == "join_selection")
            .map_or(0, |i| i + 1);
        rules.insert(
            at,
            Arc::new(crate::engine::joins::SmallSideHashJoin::for_memory_limit(
                self.pool_size(),
            )),
        );
        let state = datafusion::execution::SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rules(rules)
            .build();
        let ctx = SessionContext::new_with_state(state);
        // a scan of a file that is gone fails instead of reading as empty
        ctx.register_object_store(
            &self.lake.store_url,
            crate::table::strict::wrap(self.lake.store.clone()),
        );
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
