//! Command-line interface: argument types (clap derive; the doc comments are the `--help`) and
//! dispatch to one module per command, each returning an [`ExitStatus`]
//! (docs/guide.md#exit-codes).

mod build;
mod check;
#[cfg(feature = "cluster")]
mod cluster;
mod compact;
mod delta;
mod doctor;
mod explain;
mod failures;
mod gc;
pub(crate) mod ingest;
mod publish;
mod pull;
mod rekey;
mod replay;
mod resolve;
mod run;
mod runs;
#[cfg(feature = "flight")]
mod serve;
mod sql;
mod undo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::engine::session::{DEFAULT_MEMORY_LIMIT, Workspace, parse_size};
use crate::error::{Error, ExitStatus, Result};
use crate::query::output::OutputFormat;
use crate::table::lake::Lake;

/// ingot: idempotent bronze/silver batch pipelines on Apache DataFusion.
///
/// Break anywhere, re-run safely, zero duplicates, nothing lost. Every source has a contract
/// (contracts/<source>.yaml); every file you ingest becomes one run in bronze with its audit
/// record. Re-sending a file is skipped; a corrected re-delivery writes only the changed rows.
///
/// Exit codes: 0 success (rejected rows are recorded, not an error); 1 a run failed and nothing
/// of it was published; 2 invalid invocation, contract or rules; 3 internal error (nothing
/// published, no failed run recorded: re-run); 4 a run is held for review (ingot publish or
/// ingot discard it).
#[derive(Debug, Parser)]
#[command(name = "ingot", version, max_term_width = 100)]
pub struct Cli {
    /// Lake location: a local directory, a file:// URL or s3://bucket/prefix (S3 is configured by
    /// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP).
    #[arg(long, global = true, env = "INGOT_LAKE", default_value = "data/lake")]
    pub lake: String,
    /// Directory of source contracts (<source>.yaml).
    #[arg(long, global = true, env = "INGOT_CONTRACTS", default_value = "contracts")]
    pub contracts: PathBuf,
    /// Directory of silver rules (<table>/v<N>.yaml).
    #[arg(long, global = true, env = "INGOT_RULES", default_value = "rules")]
    pub rules: PathBuf,
    /// Landing directory scanned by the nightly job (<landing>/<source>/...); a local directory or
    /// an s3://bucket/prefix.
    #[arg(long, global = true, env = "INGOT_LANDING", default_value = "data/landing")]
    pub landing: PathBuf,
    /// Memory for DataFusion operators before they spill to disk (e.g. 512M, 2G).
    #[arg(long, global = true, env = "INGOT_MEMORY_LIMIT", default_value = "1G")]
    pub memory_limit: String,
    /// Run the DataFusion plans of build, sql and ingest (the bronze scan) on this ingot cluster
    /// (see `ingot cluster`); writes and commits stay in this process.
    #[arg(long, global = true, env = "INGOT_CLUSTER", value_name = "df://HOST:PORT")]
    pub cluster: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate every contract and rules file; print all problems at once as file:line:column: message.
    ///
    /// With a lake, contracts are also checked against the runs it holds: a field whose type
    /// stored runs cannot be read as is refused, naming the runs (unless `older_values: cast`).
    Check,
    /// Ingest files into bronze: one run per file, in sorted order.
    ///
    /// Each file is hashed first: a file a committed run already loaded is recorded as
    /// skipped_duplicate_file and not read again. Rows are typed and checked against the
    /// contract; rejected rows go to audit.row_failure_log and the rest loads. Only new and
    /// changed records are written. When the contract says `delivery: full`, every current
    /// record whose natural key the file lacks gets a tombstone (is_deleted) and leaves
    /// bronze.<source>_current (rows_deleted in the run log). A run becomes visible only when its
    /// run-log record commits, so a crash at any point is undone by simply running the same
    /// command again. Refused (exit 2) while bronze is keyed with another natural_key version:
    /// run `ingot rekey <source>` first. A run that a hold gate of the contract stops (a full
    /// delivery deleting more than hold.max_delete_fraction of the records, hold.row_count, a
    /// rejected record of a full delivery whose natural key cannot be read) is held: its files
    /// are written, nothing is published, exit 4; `ingot publish` or `ingot discard` it.
    Ingest(ingest::IngestArgs),
    /// Pull API sources (contracts with `format: api`): one pull of a source is one run.
    ///
    /// Every page is fetched (retrying 429, 5xx, timeouts and broken connections as api.retry
    /// says), the records kept as one gzip NDJSON file beside the run's bronze file, then loaded
    /// as an ingest loads a file: typed, checked, only new and changed records written. A pull
    /// whose normalised response equals the last loaded pull's (or a 304 with `conditional:
    /// true`) is recorded as skipped_duplicate_file and writes nothing. A pull that fails
    /// publishes nothing and exits 1; its failure_class says whether the next `ingot run` retries
    /// it (transient) or the contract needs a change (content). The incremental cursor moves only
    /// with a committed, loaded pull.
    Pull(pull::PullArgs),
    /// Run read-only SQL over bronze.*, bronze.*_current, silver.* and audit.*: one QUERY, an
    /// interactive shell (no QUERY, on a terminal), or statements from stdin (in a pipe).
    ///
    /// Tables: bronze.<source> (every version), bronze.<source>_current (latest version per
    /// natural key), silver.<table> (the latest succeeded build), audit.ingestion_run_log,
    /// audit.row_failure_log, audit.silver_build_log, audit.source_conflict_log,
    /// audit.source_conflict_decision_log. The UDFs row_hash, natural_key_fingerprint,
    /// canonical_text, normalize_text and namespaced_fingerprint are available. DDL, DML,
    /// COPY and SET are refused. In the shell: \d lists tables with descriptions, \d <table>
    /// its columns, \format csv|json|table, \timing on|off, \q quits; statements end with ';'.
    Sql(sql::SqlArgs),
    /// Build a silver table from bronze with its rules and publish a new snapshot atomically.
    ///
    /// Incremental by default: only records whose current bronze version changed since the last
    /// build are transformed (plus removals); the other rows are kept as they were. --full
    /// rebuilds every row; --rebuild-where "rules_version < 2" rebuilds only matching rows. Anomaly
    /// flags are recomputed over the whole table. A `fail` validation fails the build (exit 1,
    /// nothing published); an edited rules version that a build already used is refused (exit 2).
    /// --dry-run prints what the build would do and writes nothing.
    Build(build::BuildArgs),
    /// Print the rules of a silver table, what `ingot build` would do now (its plan), and the
    /// DataFusion logical plans the rules compile to.
    Explain(explain::ExplainArgs),
    /// The nightly job: ingest every new file under <landing>/<source>/ (sorted, one run each),
    /// pull every API source once (--no-pull: not), then build every silver table whose latest build does not show its inputs' committed
    /// state (whatever changed them: this job, a manual ingest, undo, replay, rekey, a killed
    /// build); print one summary table and why each table was built.
    ///
    /// A file counts as new unless a run of its source already took the same file name and hash
    /// (a file that failed for its content is retried after its contract version changes, one that
    /// failed for a passing cause by the next job). Running the job twice in a row changes nothing
    /// the second time. Exit 1 when any run or build failed. A source with a held run loads no
    /// further files until the run is published or discarded (they wait, in order); the summary
    /// lists every held run, and the job exits 4 when any is held and nothing failed.
    Run(run::RunArgs),
    /// Show the ingestion runs, oldest first.
    Runs(runs::RunsArgs),
    /// Show rejected rows with their rule, reason and raw payload.
    Failures(failures::FailuresArgs),
    /// Roll back one committed ingestion run or one silver build, exactly.
    ///
    /// For a run: its bronze rows and failure rows stop counting; records it inserted disappear,
    /// records it updated return to their previous version (later versions stay current), and
    /// the next silver build follows. For a build: silver.<table> is the previous snapshot again
    /// (only a table's latest build can be undone). The run or build is marked rolled_back in its
    /// audit log; its files stay until `ingot gc`. Undoing twice is a no-op that says so.
    Undo(undo::UndoArgs),
    /// Decide one conflict between the sources of a silver table: the field takes --take's value.
    ///
    /// The decision (who, when, why) is committed to audit.source_conflict_decision_log. The next
    /// build applies it while the conflict's candidates stay as they are; when one of them
    /// changes, the decision goes stale and the conflict is open again (counted in the build
    /// log). `ingot undo <decision id>` withdraws it. Giving the same decision again records
    /// nothing.
    Resolve(resolve::ResolveArgs),
    /// List the conflicts between sources that a silver table holds (its latest build), with
    /// every candidate's value; --history lists every build's.
    Conflicts(resolve::ConflictsArgs),
    /// Publish a held run: it takes effect now, exactly as if it had succeeded now.
    ///
    /// Its bronze rows, tombstones and failure rows become visible with one commit of its run
    /// record (status succeeded or succeeded_with_failures, held_reason kept, decided_at set).
    /// Refused when another run of the source loaded data or an earlier run was undone since the
    /// run was held: the state it was checked against is gone (discard it and ingest its file
    /// again, or undo the later runs first).
    Publish(publish::HeldArgs),
    /// Discard a held run: nothing of it is ever published; `ingot gc` removes its files.
    ///
    /// Its run record is marked discarded (decided_at set). The nightly job does not pick its file
    /// up again; `ingot ingest` it on purpose (with --no-hold to publish it whatever the gates
    /// say).
    Discard(publish::HeldArgs),
    /// Push a run's failed rows again, from their raw payload, through the current contract.
    ///
    /// The rows become a new run with replay_of set (e.g. after adding a missing allowed value
    /// to the contract); each keeps its record number in the original file. Only rows no earlier
    /// replay loaded are replayed, so replaying twice adds nothing; `ingot failures --run ID`
    /// shows which rows a replay loaded (replayed_by). A replayed row counts as delivered by the
    /// original run: where a later run delivered its key it is not loaded (rule replay_superseded).
    Replay(replay::ReplayArgs),
    /// Move a source's bronze to the contract's new natural key, as one committed run.
    ///
    /// Needed after natural_key (its fields or version) changed in contracts/<source>.yaml: until
    /// then ingest of the source is refused. Every current record is written again under the new
    /// fingerprint, with the old one in previous_natural_key_fingerprint; older versions stay as
    /// they were. Records the new key makes collide with different contents are logged to
    /// audit.row_failure_log (rule rekey_conflict) and are not current until delivered again.
    /// `ingot undo <run_id>` of the rekey run restores the old keys. Running it again after it
    /// committed does nothing.
    Rekey(rekey::RekeyArgs),
    /// Merge the small runs of each source into larger files (segments) for faster queries.
    ///
    /// Runs of at most 65,536 rows are merged 16 at a time into a segment, and 8 segments into
    /// one of the next level, only ever runs of the same recorded fields. An ingest does the same
    /// after it commits (INGOT_COMPACT=0 turns that off). The runs' own files stay: undo, replay
    /// and rekey work as before, and a row keeps its ingestion_run_id and gets its run's commit
    /// slot. The segments' manifest also keeps what queries need from the run log, so a query on a
    /// compacted source reads the manifest and the few records after it, not the whole log.
    /// --all also merges fewer runs.
    Compact(compact::CompactArgs),
    /// Remove files nothing reads any more: never a committed, current file.
    ///
    /// Removes the files of runs and builds that never committed, failed or were rolled back
    /// (once older than --grace), and snapshots of older builds past --retain (the latest
    /// snapshot of every table always stays). Logs and locks are never touched. --dry-run lists.
    Gc(gc::GcArgs),
    /// Serve the catalog over Arrow Flight SQL (read-only), for Python, BI tools and notebooks.
    ///
    /// Clients connect with ADBC or JDBC Flight SQL drivers to grpc://ADDR (grpc+tls:// with
    /// --tls-cert). Every call sees the lake as it is then; DDL, DML, COPY, SET and Substrait
    /// plans are refused. With a token (INGOT_TOKEN or --token-file) each call must send
    /// "authorization: Bearer <token>". Binds to loopback by default; another address needs TLS
    /// and a token, or --insecure. At most --max-queries run at once (others wait), each within
    /// --query-memory and --query-timeout.
    #[cfg(feature = "flight")]
    Serve(serve::ServeArgs),
    /// Check the lake's invariants; print every violation with its location, exit 1 if any.
    ///
    /// Checks that committed runs and builds have their files, that counts reconcile with the
    /// files, one row per fingerprint in each run and in bronze.<source>_current, that every
    /// silver fingerprint is current in bronze, that rules files match the SHA-256 their
    /// builds recorded, that the history caches (log checkpoints, key states, the view state of
    /// segment manifests) equal what they summarize, and that every Delta table holds what the
    /// logs committed. Files that
    /// belong to no committed run or build are listed as orphans. --fix first brings lagging
    /// Delta tables up to date (`ingot delta sync`).
    Doctor(doctor::DoctorArgs),
    /// Delta Lake tables of the lake, for other engines: `ingot delta sync` repairs, `ingot delta
    /// status` reports.
    ///
    /// Every committed state of bronze/<source>, silver/<table> and the audit tables is a Delta
    /// table at that folder (INGOT_DELTA: deletion-vectors, the default; copy-on-write, for
    /// readers without deletion vectors; off). ingot's commit is the truth; each command commits
    /// the Delta log right after it, and these commands repair a log left behind.
    Delta(delta::DeltaArgs),
    /// Run a process of an ingot cluster (Apache DataFusion Ballista): `ingot cluster scheduler`
    /// or `ingot cluster executor`; then pass --cluster df://HOST:PORT to build, sql, ingest, run.
    #[cfg(feature = "cluster")]
    Cluster(cluster::ClusterArgs),
}

/// Output options shared by commands that print rows.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: OutputFormat,
    /// Write to this file instead of stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// `--wait`, for the commands that take a writer's lock (ingest, run, build, undo, rekey, replay,
/// publish, discard, compact, gc).
#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// When another command holds the lock of the same source (an ingest, undo, rekey, replay,
    /// publish) or silver table (a build, an undo), wait up to this long for it to finish, saying
    /// once on stderr what it waits for, then fail (exit 1); 0 fails at once. A lock left by a
    /// crashed process is taken over once it expires (INGOT_LOCK_TTL_SECS, 60 s). E.g. 30s,
    /// 10m, 2h.
    #[arg(long, env = "INGOT_WAIT", default_value = "5m", value_name = "DURATION")]
    pub wait: String,
}

/// `--tls-cert` / `--tls-key`, for the commands that serve TLS (`ingot serve`, `ingot cluster`).
#[cfg(any(feature = "flight", feature = "cluster"))]
#[derive(Debug, clap::Args)]
pub struct TlsArgs {
    /// Serve TLS with this PEM certificate (chain); needs --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

#[cfg(any(feature = "flight", feature = "cluster"))]
impl TlsArgs {
    /// The certificate's and the key's PEM text, when given.
    pub fn read(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| Error::io(p.display(), e));
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some((read(cert)?, read(key)?))),
            _ => Ok(None),
        }
    }
}

impl Cli {
    pub fn workspace(&self) -> Result<Workspace> {
        let memory_limit =
            parse_size(&self.memory_limit).map_err(|e| Error::Invalid(format!("--memory-limit: {e}")))?;
        Ok(Workspace {
            contracts_dir: self.contracts.clone(),
            rules_dir: self.rules.clone(),
            landing_dir: self.landing.clone(),
            cluster: self.cluster.clone(),
            memory_limit: if memory_limit == 0 {
                DEFAULT_MEMORY_LIMIT
            } else {
                memory_limit
            },
            ..Workspace::new(Lake::open(&self.lake)?)
        })
    }

    /// [`Cli::workspace`] for a command that takes a writer's lock, waiting for it as `--wait` says.
    pub fn writer_workspace(&self, wait: &WaitArgs) -> Result<Workspace> {
        Ok(Workspace {
            lock_wait: crate::ops::gc::parse_duration(&wait.wait)
                .map_err(|e| Error::Invalid(format!("--wait: {e}")))?,
            ..self.workspace()?
        })
    }
}

/// Run a parsed command line; returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    crate::engine::session::tune_allocator();
    crate::table::store::install_crypto();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            crate::tell!("error: cannot start the async runtime: {e}");
            return ExitStatus::Internal.into();
        }
    };
    let memory_limit = cli.memory_limit.clone();
    let (lake, contracts) = (cli.lake.clone(), cli.contracts.clone());
    let status = match runtime.block_on(dispatch(cli)) {
        Ok(status) => status.into(),
        Err(e) => {
            report(&e);
            if let Some(hint) = memory_hint(&e, &memory_limit) {
                crate::tell!("{hint}");
            }
            if crate::ops::scrub::is_read_error(&e) {
                runtime.block_on(name_damaged_files(&lake, &contracts));
            }
            e.exit_status().into()
        }
    };
    if let Some(line) = crate::table::counted::summary() {
        crate::tell!("{line}");
    }
    status
}

/// The hint after an error whose cause is DataFusion's memory pool refusing an operator that
/// cannot spill: name the flag that sets the pool, its value and what to do.
pub fn memory_hint(e: &Error, memory_limit: &str) -> Option<String> {
    e.chain().iter().any(|m| m.contains("Resources exhausted")).then(|| {
        format!(
            "hint: the work needs more memory than --memory-limit {memory_limit} lets DataFusion's \
             operators hold (the part they cannot spill to disk); run it again with a larger \
             --memory-limit (e.g. --memory-limit 4G, or INGOT_MEMORY_LIMIT), or select fewer \
             columns or rows"
        )
    })
}

/// After an error from reading a Parquet file (DataFusion's errors name none): look for the lake's
/// committed files that are not what their commits recorded, and name each with its table, its
/// run or build and what to do.
async fn name_damaged_files(lake: &str, contracts: &std::path::Path) {
    let Ok(lake) = Lake::open(lake) else {
        return;
    };
    let sources: Vec<String> = crate::spec::contract::ContractSet::readable(contracts)
        .into_keys()
        .collect();
    match crate::ops::scrub::damaged(&lake, &sources).await {
        Ok(found) => {
            for d in found {
                crate::tell!("  {d}");
            }
        }
        Err(e) => crate::tell!("  (the lake's files could not be checked: {e})"),
    }
}

/// Print an error with its cause chain.
pub fn report(e: &Error) {
    crate::tell!("error: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        crate::tell!("  caused by: {s}");
        source = s.source();
    }
}

async fn dispatch(cli: Cli) -> Result<ExitStatus> {
    // Commands that run plans fail early, naming the URL, when the cluster cannot be reached.
    if let (Some(url), Command::Ingest(_) | Command::Sql(_) | Command::Build(_) | Command::Run(_)) =
        (&cli.cluster, &cli.command)
    {
        crate::engine::exec::check_cluster(url).await?;
    }
    match &cli.command {
        Command::Check => check::run(&cli).await,
        Command::Ingest(args) => ingest::run(&cli, args).await,
        Command::Pull(args) => pull::run(&cli, args).await,
        Command::Sql(args) => sql::run(&cli, args).await,
        Command::Build(args) => build::run(&cli, args).await,
        Command::Explain(args) => explain::run(&cli, args).await,
        Command::Run(args) => run::run(&cli, args).await,
        Command::Runs(args) => runs::run(&cli, args).await,
        Command::Failures(args) => failures::run(&cli, args).await,
        Command::Undo(args) => undo::run(&cli, args).await,
        Command::Resolve(args) => resolve::resolve(&cli, args).await,
        Command::Conflicts(args) => resolve::conflicts(&cli, args).await,
        Command::Publish(args) => publish::publish(&cli, args).await,
        Command::Discard(args) => publish::discard(&cli, args).await,
        Command::Replay(args) => replay::run(&cli, args).await,
        Command::Rekey(args) => rekey::run(&cli, args).await,
        Command::Compact(args) => compact::run(&cli, args).await,
        Command::Gc(args) => gc::run(&cli, args).await,
        Command::Doctor(args) => doctor::run(&cli, args).await,
        Command::Delta(args) => delta::run(&cli, args).await,
        #[cfg(feature = "cluster")]
        Command::Cluster(args) => cluster::run(&cli, args).await,
        #[cfg(feature = "flight")]
        Command::Serve(args) => serve::run(&cli, args).await,
    }
}
