//! The lake: where tables live, and the commit protocol that makes crashes harmless.
//!
//! All storage goes through `object_store`, so the local disk and S3 (`s3://bucket/prefix`, feature
//! `s3`, see [`crate::table::store`]) behave alike; [`Lake`] shows the layout. Silver builds commit
//! like runs: every file of a build is build-scoped and visible only through its build-log record.
//!
//! Commit order (docs/formats.md#commit-protocol): data file, then failure file, then the run-log record with
//! `PutMode::Create`; on a local lake each is on the disk before the next starts ([`crate::table::durable`]). Readers only look at files named by committed run-log records, so a crash
//! before the record leaves orphans that nothing reads (a later `gc` removes them); a crash after
//! it leaves a complete run. The record's name is the source's next sequence number, read when the
//! run started: if another run of the source committed in between (possible only after a lock
//! takeover), the create-if-absent put fails and this run publishes nothing. On S3 the put is
//! `If-None-Match: *`, so this holds across machines as long as the store honours it (AWS S3, R2,
//! moto do; some S3 emulators do not). Hazard: never write into a committed run's paths.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use url::Url;

use crate::error::{Error, Result};
use crate::table::durable::{Disk, DurableLocal, Fsync};

/// Outcome of [`Lake::replace_if`].
#[derive(Debug)]
pub enum Replaced {
    /// Replaced; the object's new version.
    Done(UpdateVersion),
    /// The object changed (or vanished) since that version was read.
    Conflict,
    /// The store cannot replace conditionally (the local file system).
    Unsupported,
}

/// A lake root on an object store.
///
/// Layout under the lake root:
///
/// ```text
/// bronze/<source>/run_id=<run>/part-00000.parquet        run-scoped data (invisible until committed)
/// audit/row_failure_log/run_id=<run>/part-00000.parquet  run-scoped failures (same)
/// audit/ingestion_run_log/<source>/<seq>.parquet         the commit record: one put, create-if-absent
/// _locks/<source>.lock                                   one ingest per source at a time
/// silver/<table>/build_id=<build>/part-NNNNN.parquet     a build's complete snapshot of the table
/// silver/<table>/build_id=<build>/state-NNNNN.parquet    (fingerprint key, run, outcome, version) per record
/// silver/<table>/build_id=<build>/manifest.json          the snapshot's and the state's files
/// silver/<table>/build_id=<build>/inputs.json            digest of what resolve read (lookups, contracts)
/// audit/row_failure_log/build_id=<build>/part-00000.parquet  a build's silver rejections
/// audit/silver_build_log/<table>/<seq>.parquet           a build's commit record (create-if-absent)
/// ```
#[derive(Debug, Clone)]
pub struct Lake {
    pub store: Arc<dyn ObjectStore>,
    /// Object-store path of the root (no trailing slash).
    root: Path,
    /// URL of the object store itself (`file:///`, `s3://bucket`), for DataFusion's registry.
    pub store_url: Url,
    /// What the user gave, for messages.
    pub display: String,
    /// The root as a local directory (for `file://` URLs with proper percent-encoding); `None`
    /// for a lake on a remote object store.
    root_dir: Option<std::path::PathBuf>,
    /// The store's incomplete multipart uploads, which gc aborts (S3 only).
    pub uploads: Option<Arc<crate::table::store::Uploads>>,
    /// How often the caches of the history are written ([`Cadence`]).
    pub cadence: Cadence,
    /// On a [`Lake::journaled`] lake: the size and CRC-32 of every file written through it (by
    /// [`crate::table::upload::LakeUpload`] or [`Lake::put_file`]), by lake-relative path, for
    /// the commit that names them ([`Lake::stamps_under`]); shared by the clones of that lake.
    written: Option<Arc<std::sync::Mutex<std::collections::HashMap<String, crate::table::upload::FileStamp>>>>,
}

/// How often a lake's history caches are written: a log checkpoint every `checkpoint_every`
/// commits of a source or table ([`crate::table::log`]), a key state once `key_state_every` of a
/// source's current runs are not covered by one. From `INGOT_CHECKPOINT_EVERY` (32) and
/// `INGOT_KEY_STATE_EVERY` (16); a cadence changes only the cost of reads, never what they return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    pub checkpoint_every: u64,
    pub key_state_every: u64,
}

impl Cadence {
    pub fn from_env() -> Cadence {
        let var = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|n| *n > 0)
                .unwrap_or(default)
        };
        Cadence {
            checkpoint_every: var("INGOT_CHECKPOINT_EVERY", 32),
            key_state_every: var("INGOT_KEY_STATE_EVERY", 16),
        }
    }
}

impl Lake {
    /// Open a lake from a local path, a `file://` URL (the directory is created if missing) or an
    /// object-store URL such as `s3://bucket/prefix` (needs the `s3` feature; see [`crate::table::store`]).
    pub fn open(location: &str) -> Result<Lake> {
        Lake::open_with(location, &[])
    }

    /// [`Lake::open`] with object-store options on top of the environment's (see
    /// [`crate::table::store::open_with`]); ignored for a local lake.
    pub fn open_with(location: &str, options: &[(String, String)]) -> Result<Lake> {
        Lake::open_on(location, options, Arc::new(Fsync::from_env()))
    }

    /// [`Lake::open_with`] with the disk a local lake syncs through (tests put one in that
    /// forgets unsynced writes, see [`crate::table::durable`]); ignored for a remote lake.
    pub fn open_on(location: &str, options: &[(String, String)], disk: Arc<dyn Disk>) -> Result<Lake> {
        if crate::table::store::is_remote(location) {
            let opened = crate::table::store::open_with(location, options)?;
            return Ok(Lake {
                store: crate::table::counted::wrap(opened.store),
                root: opened.path,
                store_url: opened.store_url,
                display: location.trim_end_matches('/').to_string(),
                root_dir: None,
                uploads: opened.uploads,
                cadence: Cadence::from_env(),
                written: None,
            });
        }
        let local = location.strip_prefix("file://").unwrap_or(location);
        std::fs::create_dir_all(local).map_err(|e| Error::io(local, e))?;
        let abs = std::fs::canonicalize(local).map_err(|e| Error::io(local, e))?;
        let root =
            Path::from_absolute_path(&abs).map_err(|e| Error::Invalid(format!("lake path {}: {e}", abs.display())))?;
        let store_url = Url::parse("file:///").map_err(|e| Error::Invalid(e.to_string()))?;
        Ok(Lake {
            store: crate::table::counted::wrap(Arc::new(DurableLocal::new(abs.clone(), disk))),
            root,
            store_url,
            display: location.to_string(),
            root_dir: Some(abs),
            uploads: None,
            cadence: Cadence::from_env(),
            written: None,
        })
    }

    /// The lake's directory on the local disk (`None` on a remote object store).
    pub fn root_dir(&self) -> Option<&std::path::Path> {
        self.root_dir.as_deref()
    }

    /// Is the lake on a remote object store (S3), rather than the local disk?
    pub fn is_remote(&self) -> bool {
        self.root_dir.is_none()
    }

    /// Object-store path of `rel` under the root.
    pub fn path(&self, rel: &str) -> Path {
        let mut p = self.root.clone();
        for part in rel.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        p
    }

    /// Full URL of `rel`, for DataFusion listing tables (percent-encoded: a lake path may contain
    /// `%`, `#` or spaces).
    pub fn url(&self, rel: &str) -> String {
        if let Some(root_dir) = &self.root_dir {
            let mut path = root_dir.clone();
            for part in rel.split('/').filter(|s| !s.is_empty()) {
                path.push(part);
            }
            if let Ok(u) = Url::from_file_path(&path) {
                return u.to_string();
            }
        }
        format!("{}/{}", self.store_url.as_str().trim_end_matches('/'), self.path(rel))
    }

    /// A storage error on `rel`, with the URL it concerns and, for S3, what to set or create.
    fn error(&self, rel: &str, e: object_store::Error) -> Error {
        crate::table::store::explain(&self.url(rel), e)
    }

    /// This lake, keeping a journal of the files written through it (and its clones) from now
    /// on, for a command whose commit records them (a silver build's manifest).
    pub fn journaled(&self) -> Lake {
        Lake {
            written: Some(Default::default()),
            ..self.clone()
        }
    }

    /// Note, on a journaled lake, that `rel` was written with `stamp` ([`Lake::stamps_under`]).
    pub fn wrote(&self, rel: &str, stamp: crate::table::upload::FileStamp) {
        if let Some(Ok(mut w)) = self.written.as_ref().map(|w| w.lock()) {
            w.insert(rel.to_string(), stamp);
        }
    }

    /// The files this process wrote under the folder `dir` (lake-relative, no trailing slash),
    /// by their path within it, with their stamps; they are forgotten here (a commit records
    /// them once).
    pub fn stamps_under(&self, dir: &str) -> std::collections::BTreeMap<String, crate::table::upload::FileStamp> {
        let prefix = format!("{dir}/");
        let Some(Ok(mut w)) = self.written.as_ref().map(|w| w.lock()) else {
            return Default::default();
        };
        let names: Vec<String> = w.keys().filter(|k| k.starts_with(&prefix)).cloned().collect();
        names
            .into_iter()
            .filter_map(|k| {
                let stamp = w.remove(&k)?;
                Some((k[prefix.len()..].to_string(), stamp))
            })
            .collect()
    }

    /// Put a whole data file a commit will name, noting its stamp ([`Lake::wrote`]).
    pub async fn put_file(&self, rel: &str, bytes: Bytes) -> Result<()> {
        let stamp = crate::table::upload::FileStamp::of(&bytes);
        self.put(rel, bytes).await?;
        self.wrote(rel, stamp);
        Ok(())
    }

    pub async fn put(&self, rel: &str, bytes: Bytes) -> Result<()> {
        self.store
            .put(&self.path(rel), PutPayload::from(bytes))
            .await
            .map_err(|e| self.error(rel, e))?;
        Ok(())
    }

    /// Put a hint: an object a reader may find older than the last write, or missing, and must
    /// check (on a local lake it is not synced: [`crate::table::durable::Unsynced`]).
    pub async fn put_hint(&self, rel: &str, bytes: Bytes) -> Result<()> {
        let mut opts = PutOptions::default();
        opts.extensions.insert(crate::table::durable::Unsynced);
        self.store
            .put_opts(&self.path(rel), PutPayload::from(bytes), opts)
            .await
            .map_err(|e| self.error(rel, e))?;
        Ok(())
    }

    /// Create-if-absent put. `Ok(false)` when the object already exists.
    pub async fn put_create(&self, rel: &str, bytes: Bytes) -> Result<bool> {
        Ok(self.put_create_versioned(rel, bytes).await?.is_some())
    }

    /// Create-if-absent put (`If-None-Match: *` on S3) that returns the new object's version, for
    /// a later [`Lake::replace_if`]; `None` when the object already exists.
    pub async fn put_create_versioned(&self, rel: &str, bytes: Bytes) -> Result<Option<UpdateVersion>> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&self.path(rel), PutPayload::from(bytes), opts)
            .await
        {
            Ok(r) => Ok(Some(UpdateVersion {
                e_tag: r.e_tag,
                version: r.version,
            })),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(None),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    /// An object and its version (ETag), for a later [`Lake::replace_if`].
    pub async fn get_versioned(&self, rel: &str) -> Result<Option<(Bytes, UpdateVersion)>> {
        match self.store.get(&self.path(rel)).await {
            Ok(r) => {
                let version = UpdateVersion {
                    e_tag: r.meta.e_tag.clone(),
                    version: r.meta.version.clone(),
                };
                Ok(Some((r.bytes().await.map_err(|e| self.error(rel, e))?, version)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    /// Replace `rel` only if it is still at `version` (`If-Match` on S3): of several processes
    /// replacing the same version, exactly one succeeds.
    pub async fn replace_if(&self, rel: &str, bytes: Bytes, version: UpdateVersion) -> Result<Replaced> {
        if version.e_tag.is_none() && version.version.is_none() {
            return Ok(Replaced::Unsupported);
        }
        let opts = PutOptions {
            mode: PutMode::Update(version),
            ..Default::default()
        };
        match self
            .store
            .put_opts(&self.path(rel), PutPayload::from(bytes), opts)
            .await
        {
            Ok(r) => Ok(Replaced::Done(UpdateVersion {
                e_tag: r.e_tag,
                version: r.version,
            })),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::NotFound { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Ok(Replaced::Conflict),
            // The local file system has no compare-and-swap.
            Err(object_store::Error::NotImplemented { .. }) => Ok(Replaced::Unsupported),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    pub async fn get(&self, rel: &str) -> Result<Option<Bytes>> {
        match self.store.get(&self.path(rel)).await {
            Ok(r) => Ok(Some(r.bytes().await.map_err(|e| self.error(rel, e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    /// Does the object `rel` exist (without reading it)?
    pub async fn exists(&self, rel: &str) -> Result<bool> {
        match self.store.head(&self.path(rel)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    pub async fn delete(&self, rel: &str) -> Result<()> {
        // a file deleted is no file a commit may name (a build's scratch files)
        if let Some(Ok(mut w)) = self.written.as_ref().map(|w| w.lock()) {
            w.remove(rel);
        }
        match self.store.delete(&self.path(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    /// The path of an object under the root relative to it (`None` for objects elsewhere).
    pub fn relative(&self, location: &Path) -> Option<String> {
        let parts: Vec<_> = location
            .prefix_match(&self.root)?
            .map(|p| p.as_ref().to_string())
            .collect();
        Some(parts.join("/"))
    }

    /// Every object under `rel` (recursively), sorted by path.
    pub async fn list(&self, rel: &str) -> Result<Vec<ObjectMeta>> {
        let prefix = self.path(rel);
        let mut out: Vec<ObjectMeta> = match self.store.list(Some(&prefix)).try_collect().await {
            Ok(v) => v,
            // A missing directory of a local lake is an empty listing; on S3 a prefix cannot be
            // missing, a 404 there means the bucket is.
            Err(object_store::Error::NotFound { .. }) if !self.is_remote() => Vec::new(),
            Err(e) => return Err(self.error(rel, e)),
        };
        out.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(out)
    }

    /// The objects under `rel` whose path sorts after `after` (a path relative to the root),
    /// sorted by path: a `start-after` listing on S3, a name filter before any `stat` locally. What
    /// a reader of a checkpointed log lists: only the records after its checkpoint.
    pub async fn list_after(&self, rel: &str, after: &str) -> Result<Vec<ObjectMeta>> {
        let prefix = self.path(rel);
        let offset = self.path(after);
        let mut out: Vec<ObjectMeta> = match self.store.list_with_offset(Some(&prefix), &offset).try_collect().await {
            Ok(v) => v,
            Err(object_store::Error::NotFound { .. }) if !self.is_remote() => Vec::new(),
            Err(e) => return Err(self.error(rel, e)),
        };
        out.retain(|m| m.location > offset);
        out.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(out)
    }

    /// The objects directly under `rel`, not in its subfolders (one delimiter listing), sorted.
    pub async fn list_here(&self, rel: &str) -> Result<Vec<ObjectMeta>> {
        let prefix = self.path(rel);
        let mut out = match self.store.list_with_delimiter(Some(&prefix)).await {
            Ok(l) => l.objects,
            Err(object_store::Error::NotFound { .. }) if !self.is_remote() => return Ok(Vec::new()),
            Err(e) => return Err(self.error(rel, e)),
        };
        out.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(out)
    }

    /// The names of the objects directly under `rel`, sorted, without their metadata: on a local
    /// lake one read of the directory and no `stat` per file (a folder of checkpoints a burst of
    /// commits left behind costs its entries, not a system call each).
    pub async fn list_names(&self, rel: &str) -> Result<Vec<String>> {
        let Some(root) = &self.root_dir else {
            let mut out: Vec<String> = self
                .list_here(rel)
                .await?
                .iter()
                .filter_map(|m| m.location.filename().map(str::to_string))
                .collect();
            out.sort();
            return Ok(out);
        };
        let mut dir = root.clone();
        for part in rel.split('/').filter(|s| !s.is_empty()) {
            dir.push(part);
        }
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(dir.display(), e)),
        };
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|e| Error::io(dir.display(), e))?;
            // the entry's type comes with the directory read (no stat on ext4, xfs, btrfs)
            // a staging file of an unfinished write is no object (as in the store's listings)
            if e.file_type().is_ok_and(|t| t.is_file())
                && let Some(name) = e.file_name().to_str()
                && !super::durable::is_staging_name(name)
            {
                out.push(name.to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    /// The size of the object `rel`, `None` when there is none (a HEAD).
    pub async fn size_of(&self, rel: &str) -> Result<Option<u64>> {
        match self.store.head(&self.path(rel)).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(rel, e)),
        }
    }

    /// The names of the folders directly under `rel` (one delimiter listing), sorted; names that
    /// start with `_` (a Delta table's `_delta_log`) are never a source's or a table's and are left
    /// out.
    pub async fn list_dirs(&self, rel: &str) -> Result<Vec<String>> {
        let prefix = self.path(rel);
        let listed = match self.store.list_with_delimiter(Some(&prefix)).await {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) if !self.is_remote() => return Ok(Vec::new()),
            Err(e) => return Err(self.error(rel, e)),
        };
        let mut out: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .filter(|name| !name.starts_with('_'))
            .collect();
        out.sort();
        Ok(out)
    }
}

/// Relative paths of the lake layout.
pub mod layout {
    pub const RUN_LOG: &str = "audit/ingestion_run_log";
    pub const FAILURE_LOG: &str = "audit/row_failure_log";

    pub fn bronze_data(source: &str, run_id: &str) -> String {
        format!("bronze/{source}/run_id={run_id}/part-00000.parquet")
    }

    /// Row hashes of run `run_id`'s versions recomputed under a later contract (`layout`: that
    /// contract's [`crate::table::evolve::hash_layout`]): a cache, rebuilt when absent.
    pub fn row_hash_cache(source: &str, layout: &str, run_id: &str) -> String {
        format!("_cache/row_hash/{source}/{layout}/run_id={run_id}.parquet")
    }

    pub fn failures(run_id: &str) -> String {
        format!("{FAILURE_LOG}/run_id={run_id}/part-00000.parquet")
    }

    /// The commit record of the `seq`-th run of `source` (1-based).
    pub fn run_record(source: &str, seq: u64) -> String {
        format!("{RUN_LOG}/{source}/{seq:010}.parquet")
    }

    pub const BUILD_LOG: &str = "audit/silver_build_log";

    /// Digest of what the build's `resolve` read (lookup runs, contract files).
    pub fn silver_inputs(table: &str, build_id: &str) -> String {
        format!("silver/{table}/build_id={build_id}/inputs.json")
    }

    /// The silver rejections of build `build_id`.
    pub fn silver_failures(build_id: &str) -> String {
        format!("{FAILURE_LOG}/build_id={build_id}/part-00000.parquet")
    }

    /// The commit record of the `seq`-th build of `table` (1-based).
    pub fn build_record(table: &str, seq: u64) -> String {
        format!("{BUILD_LOG}/{table}/{seq:010}.parquet")
    }

    /// A checkpoint of the log folder `log/name` (a source's runs, a table's builds): the state
    /// its records through slot `through` imply, one row per id ([`crate::table::log`]).
    pub fn log_checkpoint(log: &str, name: &str, through: u64) -> String {
        format!("{}/{through:010}.parquet", log_checkpoints(log, name))
    }

    /// The folder of the checkpoints of the log folder `log/name`.
    pub fn log_checkpoints(log: &str, name: &str) -> String {
        let log = log.rsplit('/').next().unwrap_or(log);
        format!("_cache/log/{log}/{name}")
    }

    /// The key state of `source` under the hash layout `layout` after its current runs through
    /// slot `through`, whose run ids digest to `digest` ([`crate::ingest::keystate`]).
    pub fn key_state(source: &str, layout: &str, through: u64, digest: &str) -> String {
        format!("{}/{through:010}-{digest}.parquet", key_states(source, layout))
    }

    /// The folder of the key states of `source` under one hash layout.
    pub fn key_states(source: &str, layout: &str) -> String {
        format!("_cache/keys/{source}/{layout}")
    }

    pub fn lock(source: &str) -> String {
        format!("_locks/{source}.lock")
    }

    /// The list of files of build `build_id`'s snapshot and state (absent for builds that wrote
    /// one `part-00000.parquet` and one `state.parquet`).
    pub fn silver_manifest(table: &str, build_id: &str) -> String {
        format!("silver/{table}/build_id={build_id}/manifest.json")
    }

    /// A file of build `build_id` named in its manifest.
    pub fn silver_file(table: &str, build_id: &str, name: &str) -> String {
        format!("{}/{name}", silver_build_dir(table, build_id))
    }

    /// The folder of build `build_id`'s files.
    pub fn silver_build_dir(table: &str, build_id: &str) -> String {
        format!("silver/{table}/build_id={build_id}")
    }
}
