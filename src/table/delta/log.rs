//! One Delta table's `_delta_log`: reading where it stands, appending a commit, replacing a
//! file set, checkpoints.
//!
//! A commit is the JSON deltalake-core serializes ([`CommitData`]) put create-if-absent at the
//! next version, so two writers never both take one version; the loser reads the winner's commit
//! and decides again. Where the log stands (its version, the `txn` of each app, its metadata) is
//! folded from the commits and kept as a hint ([`Fold`], `_cache/delta/<root>.json`), so a commit
//! reads a few small objects however long the log; a hint that is missing, or whose version's
//! commit is gone, is not trusted: the caller then compares the whole table ([`replace`]).
//!
//! Hazard: never put a version below one that may exist: the fold's version must be read from a
//! commit that exists ([`fold`] checks), and every later commit is read before deciding.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use deltalake_core::DeltaTable;
use deltalake_core::kernel::transaction::CommitData;
use deltalake_core::kernel::{Action, Add, Metadata, Protocol, Remove, Transaction};
use deltalake_core::logstore::{LogStoreRef, StorageConfig, default_logstore};
use deltalake_core::protocol::DeltaOperation;
use object_store::ObjectStore;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::table::lake::Lake;

/// A checkpoint every this many versions, so a reader never replays a long log:
/// `INGOT_DELTA_CHECKPOINT_EVERY`, default 100.
pub fn checkpoint_every() -> i64 {
    std::env::var("INGOT_DELTA_CHECKPOINT_EVERY")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(100)
}

/// One Delta table of the lake, by its lake-relative root (`bronze/bookings`).
#[derive(Clone, Copy)]
pub struct Table<'a> {
    pub lake: &'a Lake,
    pub root: &'a str,
}

impl<'a> Table<'a> {
    pub fn new(lake: &'a Lake, root: &'a str) -> Table<'a> {
        Table { lake, root }
    }

    /// The commit file of `version`.
    pub fn commit_rel(&self, version: i64) -> String {
        format!("{}/_delta_log/{version:020}.json", self.root)
    }

    fn hint_rel(&self) -> String {
        format!("_cache/delta/{}.json", self.root)
    }

    /// The table's URL (with a trailing slash), as other engines name it.
    pub fn url(&self) -> Result<url::Url> {
        let text = format!("{}/", self.lake.url(self.root).trim_end_matches('/'));
        url::Url::parse(&text).map_err(|e| Error::Internal(format!("{text}: {e}")))
    }

    /// deltalake-core's log store over the lake's own object store (the local one syncs every
    /// write), rooted at the store's root as the kernel expects.
    pub fn log_store(&self) -> Result<LogStoreRef> {
        let prefixed: Arc<dyn ObjectStore> = Arc::new(object_store::prefix::PrefixStore::new(
            self.lake.store.clone(),
            self.lake.path(self.root),
        ));
        Ok(default_logstore(
            prefixed,
            self.lake.store.clone(),
            &self.url()?,
            &StorageConfig::default(),
        ))
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::RunFailed(format!("Delta table {}: {what}: {e}", self.lake.url(self.root)))
    }
}

/// Where a Delta log stands, folded from its commits: a cache of the log, never the truth.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Fold {
    /// The latest version read (-1: no table yet).
    pub version: i64,
    /// The `txn` version of each app id seen.
    pub txns: BTreeMap<String, i64>,
    /// `txns` has every app id of the table (the fold followed it from version 0); otherwise an
    /// app id missing from it is unknown, not absent.
    pub all_txns: bool,
    /// The latest `metaData` and `protocol` actions.
    pub metadata: Option<Value>,
    pub protocol: Option<Value>,
}

impl Fold {
    fn absent() -> Fold {
        Fold {
            version: -1,
            txns: BTreeMap::new(),
            all_txns: true,
            metadata: None,
            protocol: None,
        }
    }

    /// The `txn` version of `app`: `Some(0)` when the table never had one, `None` when unknown.
    pub fn txn(&self, app: &str) -> Option<i64> {
        match self.txns.get(app) {
            Some(v) => Some(*v),
            None if self.all_txns => Some(0),
            None => None,
        }
    }

    /// Fold the commit of `version` in.
    fn apply(&mut self, version: i64, bytes: &[u8]) -> Result<()> {
        let text = std::str::from_utf8(bytes).map_err(|e| Error::RunFailed(format!("Delta commit {version}: {e}")))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let action: Value = serde_json::from_str(line)
                .map_err(|e| Error::RunFailed(format!("Delta commit {version}: not JSON: {e}")))?;
            if let Some(txn) = action.get("txn")
                && let (Some(app), Some(v)) = (
                    txn.get("appId").and_then(Value::as_str),
                    txn.get("version").and_then(Value::as_i64),
                )
            {
                self.txns.insert(app.to_string(), v);
            }
            if let Some(m) = action.get("metaData") {
                self.metadata = Some(m.clone());
            }
            if let Some(p) = action.get("protocol") {
                self.protocol = Some(p.clone());
            }
        }
        self.version = version;
        Ok(())
    }

    /// The key of the conformed copies the table's files were chosen under (its property
    /// [`super::conform::CONFORMED_TO`]), if it says one.
    pub fn conformed_to(&self) -> Option<&str> {
        self.metadata
            .as_ref()?
            .get("configuration")?
            .get(super::conform::CONFORMED_TO)?
            .as_str()
    }

    /// Does the table's protocol have the deletion-vector feature?
    pub fn has_deletion_vectors(&self) -> bool {
        self.protocol
            .as_ref()
            .and_then(|p| p.get("readerFeatures"))
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|x| x == "deletionVectors"))
    }
}

/// Where the log of `t` stands: the hint, checked (its version's commit exists) and brought
/// forward by reading every later commit; `None` when the hint cannot be trusted (missing while
/// the table exists, or naming a version that is gone).
pub async fn fold(t: Table<'_>) -> Result<Option<Fold>> {
    let hint = match t.lake.get(&t.hint_rel()).await? {
        Some(bytes) => serde_json::from_slice::<Fold>(&bytes).ok(),
        None => None,
    };
    let mut f = match hint {
        Some(f) if f.version >= 0 => {
            if !t.lake.exists(&t.commit_rel(f.version)).await? {
                return Ok(None);
            }
            f
        }
        _ => {
            if exists(t).await? {
                return Ok(None);
            }
            Fold::absent()
        }
    };
    forward(t, &mut f).await?;
    Ok(Some(f))
}

/// Is there a Delta table at `t`: anything in its `_delta_log` (its first commits may be gone
/// after a checkpoint; a table is never taken for new while a log is there).
async fn exists(t: Table<'_>) -> Result<bool> {
    Ok(!t.lake.list_names(&format!("{}/_delta_log", t.root)).await?.is_empty())
}

/// Read the commits after `f.version` into it.
async fn forward(t: Table<'_>, f: &mut Fold) -> Result<()> {
    loop {
        let rel = t.commit_rel(f.version + 1);
        let Some(bytes) = t.lake.get(&rel).await? else {
            return Ok(());
        };
        f.apply(f.version + 1, &bytes).map_err(|e| {
            Error::RunFailed(format!(
                "{}: not a Delta commit ({e}); nothing can be committed after it: move it away, then `ingot delta sync`",
                t.lake.url(&rel)
            ))
        })?;
    }
}

/// Keep `f` as the table's hint (not synced: a lost or older hint only costs a longer read).
async fn save(t: Table<'_>, f: &Fold) {
    if let Ok(bytes) = serde_json::to_vec(f) {
        let _ = t.lake.put_hint(&t.hint_rel(), Bytes::from(bytes)).await;
    }
}

/// What a table must look like: its schema, partition columns, protocol and properties.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The Delta schema as JSON (`schemaString`).
    pub schema: String,
    pub partition_columns: Vec<String>,
    pub deletion_vectors: bool,
    /// A bronze table published under its contract: the key of its conformed copies
    /// ([`super::conform`]), kept as the table property [`super::conform::CONFORMED_TO`].
    pub conformed: Option<String>,
}

impl Shape {
    fn protocol(&self) -> Value {
        if self.deletion_vectors {
            serde_json::json!({"minReaderVersion": 3, "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]})
        } else {
            serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 2})
        }
    }

    fn configuration(&self) -> BTreeMap<String, String> {
        let mut c = BTreeMap::new();
        if self.deletion_vectors {
            c.insert("delta.enableDeletionVectors".to_string(), "true".to_string());
        }
        if let Some(key) = &self.conformed {
            c.insert(super::conform::CONFORMED_TO.to_string(), key.clone());
        }
        c
    }

    /// The `metaData` and `protocol` actions that bring a table at `f` to this shape (none when
    /// it has it). The table id is kept; a protocol never goes down (a table with deletion
    /// vectors keeps the feature).
    fn actions(&self, f: &Fold, now_ms: i64) -> Result<Vec<Action>> {
        let mut out = Vec::new();
        let want_protocol = self.protocol();
        let protocol_ok = match &f.protocol {
            None => false,
            Some(p) => p == &want_protocol || (!self.deletion_vectors && f.has_deletion_vectors()),
        };
        if !protocol_ok {
            let p: Protocol =
                serde_json::from_value(want_protocol).map_err(|e| Error::Internal(format!("Delta protocol: {e}")))?;
            out.push(Action::Protocol(p));
        }
        let mut configuration = self.configuration();
        if f.has_deletion_vectors() {
            configuration.insert("delta.enableDeletionVectors".to_string(), "true".to_string());
        }
        let same = f.metadata.as_ref().is_some_and(|m| {
            m.get("schemaString").and_then(Value::as_str) == Some(self.schema.as_str())
                && m.get("partitionColumns") == Some(&serde_json::json!(self.partition_columns))
                && m.get("configuration") == Some(&serde_json::json!(configuration))
        });
        if !same {
            let id = f
                .metadata
                .as_ref()
                .and_then(|m| m.get("id"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let m: Metadata = serde_json::from_value(serde_json::json!({
                "id": id,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": self.schema,
                "partitionColumns": self.partition_columns,
                "createdTime": now_ms,
                "configuration": configuration,
            }))
            .map_err(|e| Error::Internal(format!("Delta metadata: {e}")))?;
            out.push(Action::Metadata(m));
        }
        Ok(out)
    }
}

/// One commit's worth of change for one app: its slot (the `txn` version), the files to add and
/// remove, and what the commit says it did.
#[derive(Debug, Clone)]
pub struct Change {
    pub app: String,
    pub slot: i64,
    pub adds: Vec<Add>,
    pub removes: Vec<Remove>,
    pub operation: DeltaOperation,
    /// Goes into `commitInfo` (ingot's ids: `ingot.run_id`, `ingot.build_id`, ...).
    pub info: HashMap<String, Value>,
}

/// What [`append`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Committed at this version.
    Committed(i64),
    /// The table already has this app's slot (published before).
    Already,
    /// The table is behind this app's previous slot, or where it stands is unknown: compare the
    /// whole table ([`replace`]).
    Lagging,
}

/// Append `change` as the next commit of `t`, if the table has this app's slot before it
/// (`change.slot - 1`); see [`Outcome`]. A table whose files were chosen under other conformed
/// copies than `shape`'s ([`Shape::conformed`]) is compared whole: [`Outcome::Lagging`].
pub async fn append(t: Table<'_>, shape: &Shape, change: Change) -> Result<Outcome> {
    let Some(mut f) = fold(t).await? else {
        return Ok(Outcome::Lagging);
    };
    loop {
        if f.metadata.is_some() && f.conformed_to() != shape.conformed.as_deref() {
            return Ok(Outcome::Lagging);
        }
        match f.txn(&change.app) {
            Some(v) if v >= change.slot => {
                save(t, &f).await;
                return Ok(Outcome::Already);
            }
            Some(v) if v == change.slot - 1 => {}
            _ => return Ok(Outcome::Lagging),
        }
        let mut actions = shape.actions(&f, now_ms())?;
        actions.extend(change.removes.iter().cloned().map(Action::Remove));
        actions.extend(change.adds.iter().cloned().map(Action::Add));
        if let Some(version) = put_next(t, &mut f, bytes_of(actions, &change)?).await? {
            return Ok(Outcome::Committed(version));
        }
        // another writer took the version: read what it did, then decide again
        forward(t, &mut f).await?;
    }
}

/// Put `bytes` as the commit of the version after `f`'s, create-if-absent; when it lands, fold it
/// into `f`, save the hint and checkpoint when due. `None`: another writer took that version.
async fn put_next(t: Table<'_>, f: &mut Fold, bytes: Bytes) -> Result<Option<i64>> {
    let version = f.version + 1;
    crate::table::failpoint::hit("delta.before_commit")?;
    if !t.lake.put_create(&t.commit_rel(version), bytes.clone()).await? {
        return Ok(None);
    }
    crate::table::failpoint::hit("delta.after_commit")?;
    f.apply(version, &bytes)?;
    save(t, f).await;
    maybe_checkpoint(t, version).await;
    Ok(Some(version))
}

fn bytes_of(actions: Vec<Action>, change: &Change) -> Result<Bytes> {
    let txn = Transaction::new_with_last_update(change.app.clone(), change.slot, Some(now_ms()));
    CommitData::new(actions, change.operation.clone(), change.info.clone(), vec![txn])
        .get_bytes()
        .map_err(|e| Error::Internal(format!("Delta commit: {e}")))
}

/// Does `t` have `app`'s slot `slot` already, its files chosen under the conformed copies
/// `conformed` ([`Shape::conformed`]; its hint, checked and brought forward, says so)? `false`
/// when it does not or cannot tell.
pub async fn has_slot(t: Table<'_>, app: &str, slot: i64, conformed: Option<&str>) -> Result<bool> {
    Ok(match fold(t).await? {
        Some(f) => {
            let ok = f.txn(app) == Some(slot) && f.conformed_to() == conformed;
            if ok {
                save(t, &f).await;
            }
            ok
        }
        None => false,
    })
}

/// A commit that changes no file, only says what happened (`ingot gc` removing files older
/// versions name: `VACUUM END`). Skipped for a table that does not exist or lags.
pub async fn note(t: Table<'_>, operation: DeltaOperation, info: HashMap<String, Value>) -> Result<Option<i64>> {
    let Some(mut f) = fold(t).await? else {
        return Ok(None);
    };
    if f.version < 0 {
        return Ok(None);
    }
    loop {
        let bytes = CommitData::new(Vec::new(), operation.clone(), info.clone(), Vec::new())
            .get_bytes()
            .map_err(|e| Error::Internal(format!("Delta commit: {e}")))?;
        if let Some(version) = put_next(t, &mut f, bytes).await? {
            return Ok(Some(version));
        }
        forward(t, &mut f).await?;
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A checkpoint at `version` when it is a multiple of [`checkpoint_every`] (best effort: a
/// missing checkpoint only makes readers replay more commits).
async fn maybe_checkpoint(t: Table<'_>, version: i64) {
    if version > 0
        && version % checkpoint_every() == 0
        && let Err(e) = checkpoint(t, version).await
    {
        crate::table::delta::warn(&format!("checkpoint of {} at version {version}", t.root), &e);
    }
}

/// Write a checkpoint of `t` at `version` with the Delta kernel (a Parquet checkpoint and
/// `_last_checkpoint`).
pub async fn checkpoint(t: Table<'_>, version: i64) -> Result<()> {
    let store = t.log_store()?;
    let engine = store.engine(None);
    let url = t.url()?;
    let v = u64::try_from(version).map_err(|e| Error::Internal(e.to_string()))?;
    tokio::task::spawn_blocking(move || -> std::result::Result<(), delta_kernel::Error> {
        let snapshot = delta_kernel::Snapshot::builder_for(url.as_str())
            .at_version(v)
            .build(engine.as_ref())?;
        snapshot.checkpoint(engine.as_ref(), None)?;
        Ok(())
    })
    .await
    .map_err(|e| Error::Internal(format!("checkpoint task: {e}")))?
    .map_err(|e| t.err("checkpoint", e))
}

/// A table as deltalake-core reads it: its version, active files, metadata, protocol.
pub struct Loaded {
    pub version: i64,
    pub files: Vec<deltalake_core::kernel::LogicalFileView>,
    pub metadata: Value,
    pub protocol: Value,
    table: DeltaTable,
}

impl Loaded {
    /// The `txn` version of `app` (0 when it has none).
    pub async fn txn(&self, app: &str) -> Result<i64> {
        let state = self.table.snapshot().map_err(|e| Error::RunFailed(e.to_string()))?;
        Ok(state
            .transaction_version(self.table.log_store().as_ref(), app)
            .await
            .map_err(|e| Error::RunFailed(format!("Delta txn of {app}: {e}")))?
            .unwrap_or(0))
    }
}

/// Read the whole table at its latest version (`None`: no table).
pub async fn load(t: Table<'_>) -> Result<Option<Loaded>> {
    if !exists(t).await? {
        return Ok(None);
    }
    let mut table = DeltaTable::new(t.log_store()?);
    if let Err(e) = table.load().await {
        // name the commit that does not read, if one does not
        let mut f = Fold::absent();
        forward(t, &mut f).await?;
        return Err(t.err("unreadable", e));
    }
    let state = table.snapshot().map_err(|e| t.err("unreadable", e))?;
    let version = i64::try_from(state.version()).map_err(|e| t.err("version", e))?;
    let files = state.log_data().iter().collect();
    let metadata = serde_json::to_value(state.metadata()).map_err(|e| t.err("metadata", e))?;
    let protocol = serde_json::to_value(state.protocol()).map_err(|e| t.err("protocol", e))?;
    Ok(Some(Loaded {
        version,
        files,
        metadata,
        protocol,
        table,
    }))
}

/// A file's identity in a table: its path and deletion vector.
pub(crate) fn identity(path: &str, dv: Option<&deltalake_core::kernel::DeletionVectorDescriptor>) -> String {
    match dv {
        None => path.to_string(),
        Some(d) => match d.offset {
            Some(at) => format!(
                "{path} (deletion vector {} at {at}, {} rows)",
                d.path_or_inline_dv, d.cardinality
            ),
            None => format!(
                "{path} (deletion vector {}, {} rows)",
                d.path_or_inline_dv, d.cardinality
            ),
        },
    }
}

/// Make the files `app` owns in `t` (those `owns` accepts) exactly `desired`, in one commit with
/// `txn` `slot` (unless the table already has them and that slot): the repair of a lagging
/// table, and the publishing of a silver table. Returns the version committed, if any.
pub async fn replace(
    t: Table<'_>,
    shape: &Shape,
    change: Change,
    owns: &(dyn Fn(&str) -> bool + Send + Sync),
) -> Result<Option<i64>> {
    for _ in 0..8 {
        // what the hint knows of the other apps survives (brought forward to the latest version)
        let hint = fold(t).await?;
        let loaded = load(t).await?;
        let mut f = Fold::absent();
        let mut actual: Vec<&deltalake_core::kernel::LogicalFileView> = Vec::new();
        if let Some(l) = &loaded {
            let txn = l.txn(&change.app).await?;
            f = match hint {
                Some(mut h) if h.version == l.version => {
                    h.txns.insert(change.app.clone(), txn);
                    h
                }
                _ => Fold {
                    version: l.version,
                    txns: BTreeMap::from([(change.app.clone(), txn)]),
                    all_txns: false,
                    metadata: Some(l.metadata.clone()),
                    protocol: Some(l.protocol.clone()),
                },
            };
            actual = l.files.iter().filter(|v| owns(&v.path())).collect();
        }
        let want: HashSet<String> = change
            .adds
            .iter()
            .map(|a| identity(&a.path, a.deletion_vector.as_ref()))
            .collect();
        let have: HashSet<String> = actual
            .iter()
            .map(|v| identity(&v.path(), v.deletion_vector_descriptor().as_ref()))
            .collect();
        let removes: Vec<Action> = actual
            .iter()
            .filter(|v| !want.contains(&identity(&v.path(), v.deletion_vector_descriptor().as_ref())))
            .map(|v| Action::Remove(v.remove_action(true)))
            .collect();
        let adds: Vec<Action> = change
            .adds
            .iter()
            .filter(|a| !have.contains(&identity(&a.path, a.deletion_vector.as_ref())))
            .cloned()
            .map(Action::Add)
            .collect();
        let mut actions = shape.actions(&f, now_ms())?;
        let txn = f.txn(&change.app).unwrap_or(0);
        // another writer published a later slot of this app: what this one read is older
        if txn > change.slot || (actions.is_empty() && removes.is_empty() && adds.is_empty() && txn >= change.slot) {
            save(t, &f).await;
            return Ok(None);
        }
        actions.extend(removes);
        actions.extend(adds);
        if let Some(version) = put_next(t, &mut f, bytes_of(actions, &change)?).await? {
            return Ok(Some(version));
        }
    }
    Err(t.err(
        "commit",
        "8 writers committed before this one; run `ingot delta sync` again",
    ))
}
