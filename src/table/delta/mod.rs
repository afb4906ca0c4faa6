//! Delta Lake tables that follow ingot's commits, so other engines read the lake without ingot.
//!
//! Five tables: `bronze/<source>`, `silver/<table>`, `audit/ingestion_run_log`,
//! `audit/row_failure_log` and `audit/silver_build_log`, each a `_delta_log` beside the files
//! ingot already wrote (nothing is copied, but for `copy-on-write` silver tables). ingot's commit
//! stays the truth: right after a run or build record is put, [`runs::after_commit`] or
//! [`builds::after_commit`] writes one Delta commit per table it changes, each carrying a `txn`
//! (app id `ingot:run:<source>` or `ingot:build:<table>`, version = the record's slot), so
//! publishing twice is a no-op and a log that lags is brought up to date from the records
//! ([`sync`]). A crash between the two leaves the Delta log behind, never ahead or different.
//!
//! Hazards: a Delta log must never name a file gc may remove (silver's published files are in its
//! manifest, see [`publish`]); the hint of a log's state ([`log::Fold`]) is a cache, checked
//! against the log before it is trusted; a Delta failure never fails the ingot command.

pub mod builds;
pub mod conform;
pub mod current;
pub mod log;
pub mod publish;
pub mod runs;
pub mod schema;

use crate::error::{Error, Result};
use crate::spec::contract::Contract;
use crate::table::lake::Lake;

/// The contracts a command has, by source: bronze tables are published conformed to them
/// ([`conform`]); a source without one is published as its runs stored it.
pub type Contracts = std::collections::BTreeMap<String, std::sync::Arc<Contract>>;

/// How silver tables publish a delta layer's deletions (docs/guide.md#delta-lake-tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Deletion vectors (Delta reader 3 / writer 7): a layer writes only its new rows and one
    /// small file of row positions.
    DeletionVectors,
    /// No deletion vectors (reader 1 / writer 2): every file a layer deletes rows from is copied
    /// without them, for readers that refuse deletion vectors.
    CopyOnWrite,
    /// No Delta logs are written (a later command with Delta on catches up).
    Off,
}

impl Mode {
    pub const CHOICES: &'static str = "deletion-vectors, copy-on-write or off";

    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim() {
            "deletion-vectors" | "dv" => Some(Mode::DeletionVectors),
            "copy-on-write" | "cow" => Some(Mode::CopyOnWrite),
            "off" => Some(Mode::Off),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::DeletionVectors => "deletion-vectors",
            Mode::CopyOnWrite => "copy-on-write",
            Mode::Off => "off",
        }
    }

    /// `INGOT_DELTA` (default `deletion-vectors`). A silver table's mode is chosen when its Delta
    /// table is created; after that the table's protocol says it.
    pub fn from_env() -> Result<Mode> {
        match std::env::var("INGOT_DELTA") {
            Err(_) => Ok(Mode::DeletionVectors),
            Ok(v) => Mode::parse(&v)
                .ok_or_else(|| Error::Invalid(format!("INGOT_DELTA=\"{v}\": expected {}", Mode::CHOICES))),
        }
    }
}

/// Is Delta publishing on? An unparsable `INGOT_DELTA` counts as on (commands that read it
/// report it).
pub fn enabled() -> bool {
    !matches!(Mode::from_env(), Ok(Mode::Off))
}

/// Lake-relative roots of the Delta tables.
pub mod roots {
    pub const RUN_LOG: &str = "audit/ingestion_run_log";
    pub const FAILURE_LOG: &str = "audit/row_failure_log";
    pub const BUILD_LOG: &str = "audit/silver_build_log";

    pub fn bronze(source: &str) -> String {
        format!("bronze/{source}")
    }

    /// The source's current versions ([`super::current`]), inside its bronze table's folder.
    pub fn current(source: &str) -> String {
        format!("bronze/{source}/{}", super::current::CURRENT)
    }

    pub fn silver(table: &str) -> String {
        format!("silver/{table}")
    }
}

/// The `txn` app id of a source's run log.
pub fn run_app(source: &str) -> String {
    format!("ingot:run:{source}")
}

/// The `txn` app id of a table's build log.
pub fn build_app(table: &str) -> String {
    format!("ingot:build:{table}")
}

/// The column the run and build log tables add: the record's commit slot, which orders a
/// source's runs (and a table's builds) as their commits do.
pub const COMMIT_SEQ: &str = "commit_seq";

/// Report a Delta publishing failure without failing the command that committed: the log lags,
/// and the next command (or `ingot delta sync`) brings it up to date.
pub fn warn(what: &str, e: &Error) {
    crate::tell!(
        "ingot: warning: delta: {what}: {e}; the Delta log lags until the next command or `ingot delta sync` brings it up to date"
    );
}

/// Bring every Delta table of the lake up to date with the logs (`ingot delta sync`,
/// `ingot doctor --fix`): what [`check`] reports is repaired.
pub async fn sync(lake: &Lake, mode: Mode, contracts: &Contracts) -> Result<Vec<String>> {
    let mut done = runs::sync_all(lake, contracts).await?;
    done.extend(builds::sync_all(lake, mode).await?);
    Ok(done)
}

/// A difference between a Delta table and the ingot state it follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The table's root (`bronze/bookings`).
    pub table: String,
    pub what: String,
    /// The table is only behind the logs (after a crash between the two commits, or commands run
    /// with `INGOT_DELTA=off`): what the next command publishes, not damage.
    pub lags: bool,
}

impl Finding {
    pub(crate) fn lag(table: &str, what: String) -> Finding {
        Finding {
            table: table.to_string(),
            what,
            lags: true,
        }
    }

    pub(crate) fn wrong(table: &str, what: String) -> Finding {
        Finding {
            table: table.to_string(),
            what,
            lags: false,
        }
    }
}

/// The Delta table at `root` as loaded (`Some(None)`: no table yet); `None` when it does not
/// read, which is a finding.
pub(crate) async fn load_checked(lake: &Lake, root: &str, out: &mut Vec<Finding>) -> Option<Option<log::Loaded>> {
    match log::load(log::Table::new(lake, root)).await {
        Ok(l) => Some(l),
        Err(e) => {
            out.push(Finding::wrong(root, format!("unreadable: {e}")));
            None
        }
    }
}

/// What one log (a source's runs, a table's builds) says a Delta table must hold.
pub(crate) struct Expected<'a> {
    /// The source or table, and what its log records ("run", "build").
    pub owner: &'a str,
    pub log: &'a str,
    /// The log's `txn` app id and its last slot.
    pub app: String,
    pub last: u64,
    /// Where the wanted files come from, for people ("bookings's current build").
    pub state: String,
    /// The files (as compared) the table must hold of this log.
    pub want: std::collections::BTreeSet<String>,
}

/// The differences between the Delta table at `root` (`loaded`; `None`: no table yet) and what
/// `e` wants of it; `have` gives the table's files of this log, as compared. A table whose `txn`
/// is behind the log only lags: the difference is what the next command publishes.
pub(crate) async fn compare(
    root: &str,
    loaded: Option<&log::Loaded>,
    e: Expected<'_>,
    have: impl Fn(&log::Loaded) -> std::collections::BTreeSet<String>,
    out: &mut Vec<Finding>,
) -> Result<()> {
    let Some(l) = loaded else {
        out.push(Finding::lag(
            root,
            format!("no Delta table yet; {}'s {}s are not published", e.owner, e.log),
        ));
        return Ok(());
    };
    let txn = l.txn(&e.app).await?;
    let (owner, last, log_name) = (e.owner, e.last, e.log);
    if txn < last as i64 {
        out.push(Finding::lag(
            root,
            format!("lags: has {owner}'s {log_name} log through slot {txn}, the log is at slot {last}"),
        ));
        return Ok(());
    }
    if txn > last as i64 {
        out.push(Finding::wrong(
            root,
            format!("ahead: says {owner}'s slot {txn} is published, the log is at slot {last}"),
        ));
    }
    let have = have(l);
    for p in e.want.difference(&have) {
        out.push(Finding::wrong(
            root,
            format!("{p}: in {}, missing from the Delta table", e.state),
        ));
    }
    for p in have.difference(&e.want) {
        out.push(Finding::wrong(
            root,
            format!("{p}: in the Delta table, not in {}", e.state),
        ));
    }
    Ok(())
}

/// Every difference between a Delta table and the ingot state it follows (`ingot delta status`,
/// `ingot doctor`).
pub async fn check(lake: &Lake, contracts: &Contracts) -> Result<Vec<Finding>> {
    let mut out = runs::check_all(lake, contracts).await?;
    out.extend(builds::check_all(lake).await?);
    Ok(out)
}
