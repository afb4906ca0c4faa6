//! Writers' locks in the lake: one ingest, undo or rekey per source, one build or undo per table.
//!
//! A lock is taken with a create-if-absent put of `_locks/<source>.lock` (a source) or
//! `_locks/silver/<table>.lock` (a silver table), `If-None-Match: *` on S3, and kept alive by a
//! heartbeat every third of its time-to-live. It names its holder and the runs and builds whose
//! files the holder may still commit or restore ([`LockInfo::holds`]): `ingot gc` reads the live
//! locks and keeps those files ([`live_holds`]), and holds a table's lock while deleting the
//! table's snapshots. A second writer waits its turn (`--wait`, [`DEFAULT_WAIT`]; polling, no
//! queue), saying once what it waits for, then fails naming the holder. A lock whose heartbeat is
//! older than its TTL, or whose process is gone (same host), is stale and taken over.
//!
//! Hazard: on the local file system takeover is delete-then-create and a heartbeat is
//! check-then-write; on any store a process paused past its TTL loses the lock. So the lock is
//! advisory and correctness does not rest on it: every commit is a create-if-absent put into the
//! next slot of its log ([`crate::table::audit::commit_run`]), and builds and undo check that the
//! files they publish still exist right before it.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::table::lake::{Lake, Replaced, layout};
use object_store::UpdateVersion;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockInfo {
    pub run_id: String,
    pub host: String,
    pub pid: u32,
    pub acquired_at: String,
    pub heartbeat_ms: i64,
    pub ttl_ms: i64,
    /// Set when the holder released the lock on a store that keeps the lock object (S3): the
    /// next ingest takes it over as if it were absent.
    #[serde(default)]
    pub released: bool,
    /// The runs and builds whose files the holder may still commit or restore besides its own
    /// (`run_id`): a rekey's run, the build an undo returns a table to. gc keeps their files.
    #[serde(default)]
    pub holds: Vec<String>,
}

/// What a lock protects, for its object's path and for messages.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// A source: ingest, undo of a run, rekey.
    Source(&'a str),
    /// A silver table: build, undo of a build, and gc while it deletes the table's snapshots.
    Table(&'a str),
}

impl Scope<'_> {
    /// The lock object, relative to the lake root.
    pub fn rel(&self) -> String {
        match self {
            Scope::Source(source) => layout::lock(source),
            Scope::Table(table) => format!("{LOCKS}/silver/{table}.lock"),
        }
    }
}

/// The folder of every lock object.
pub const LOCKS: &str = "_locks";

/// The id prefix of gc's locks: a writer that finds gc holding a lock waits for it.
pub const GC_HOLDER: &str = "gc-";

/// On stores with compare-and-swap (S3: `If-Match` on the ETag) every change of a lock object after
/// its creation is conditional on the version last seen: of two processes taking over the same
/// stale lock exactly one wins, a heartbeat never overwrites a lock another run took over, and
/// releasing marks the object `released` rather than deleting it (S3 has no conditional delete in
/// object_store 0.13), which the next ingest takes over like a missing lock.
pub struct SourceLock {
    lake: Lake,
    rel: String,
    info: LockInfo,
    heartbeat: JoinHandle<()>,
}

/// Default time-to-live of a lock; `INGOT_LOCK_TTL_SECS` overrides it.
pub fn default_ttl() -> Duration {
    let secs = std::env::var("INGOT_LOCK_TTL_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(60);
    Duration::from_secs(secs.max(1))
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for its length; gethostname writes a NUL-terminated name into it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl LockInfo {
    fn is_stale(&self, now: i64) -> bool {
        let expired = now.saturating_sub(self.heartbeat_ms) > self.ttl_ms;
        let dead = self.host == hostname() && !pid_alive(self.pid);
        expired || dead || self.released
    }
}

/// Take the lock of `source` for `run_id`, waiting up to `wait` for a live holder to finish.
pub async fn acquire(lake: &Lake, source: &str, run_id: &str, ttl: Duration, wait: Duration) -> Result<SourceLock> {
    acquire_for(lake, Scope::Source(source), run_id, Vec::new(), ttl, wait).await
}

/// How long a writer waits for another writer's lock by default (`--wait`): longer than a
/// typical manual ingest or build, short enough that a scheduler hears of a stuck holder.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// Take the lock of `scope` for `holder`, naming in it the other runs and builds whose files the
/// holder may commit or restore (`holds`). A live holder is waited for, up to `wait`
/// (`Duration::ZERO`: not at all), saying once on stderr what it waits for; then this fails with
/// [`Error::Locked`] naming the holder. A lock gc holds is waited for at least a TTL (gc holds a
/// table's lock only while it deletes snapshots). A holder that crashed is taken over once its
/// lock is stale (its TTL passed, or its process is gone on this host).
pub async fn acquire_for(
    lake: &Lake,
    scope: Scope<'_>,
    holder: &str,
    holds: Vec<String>,
    ttl: Duration,
    wait: Duration,
) -> Result<SourceLock> {
    let info = LockInfo {
        run_id: holder.to_string(),
        host: hostname(),
        pid: std::process::id(),
        acquired_at: chrono::Utc::now().to_rfc3339(),
        heartbeat_ms: now_ms(),
        ttl_ms: ttl.as_millis() as i64,
        released: false,
        holds,
    };
    let start = std::time::Instant::now();
    let mut told = false;
    let mut pause = Duration::from_millis(50);
    loop {
        let h = match try_acquire(lake, scope, info.clone(), ttl).await? {
            Ok(lock) => return Ok(lock),
            Err(h) => h,
        };
        let gc = h.run_id.starts_with(GC_HOLDER) && !holder.starts_with(GC_HOLDER);
        let patience = if gc { wait.max(ttl) } else { wait };
        let waited = start.elapsed();
        if waited >= patience {
            return Err(locked(lake, scope, &h, wait));
        }
        if !told && !gc {
            crate::tell!(
                "ingot: waiting for {}; up to {} in all (--wait)",
                holding(scope, &h),
                show_duration(wait)
            );
            told = true;
        }
        tokio::time::sleep(pause.min(patience - waited)).await;
        // poll quickly at first (a holder about to release), then once a second
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// `250ms`, `45s`, `5m`, `1h30m`: a duration as the flags take it.
pub fn show_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs, d.subsec_millis()) {
        (0, ms) => format!("{ms}ms"),
        (s, _) if s % 3600 == 0 => format!("{}h", s / 3600),
        (s, _) if s >= 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        (s, _) if s % 60 == 0 => format!("{}m", s / 60),
        (s, _) => format!("{s}s"),
    }
}

/// What holds `scope`: `source "x" is being ingested by run R (pid P on H, since T)`.
fn holding(scope: Scope<'_>, h: &LockInfo) -> String {
    let what = match scope {
        Scope::Source(source) => format!("source \"{source}\" is being ingested by run"),
        Scope::Table(table) => format!("silver table \"{table}\" is being built or undone by"),
    };
    format!(
        "{what} {} (pid {} on {}, since {})",
        h.run_id, h.pid, h.host, h.acquired_at
    )
}

/// The error for a lock `scope` that `h` still holds after waiting `wait` for it.
fn locked(lake: &Lake, scope: Scope<'_>, h: &LockInfo, wait: Duration) -> Error {
    let expires = chrono::DateTime::from_timestamp_millis(h.heartbeat_ms.saturating_add(h.ttl_ms))
        .map(|t| t.to_rfc3339())
        .unwrap_or_default();
    let one = match scope {
        Scope::Source(_) => "one ingest per source runs at a time",
        Scope::Table(_) => "one build or undo per table runs at a time",
    };
    let waited = if wait.is_zero() {
        "Re-run when it has finished (or wait for it with --wait, e.g. --wait 10m)".to_string()
    } else {
        format!(
            "Waited {} for it (--wait); re-run when it has finished, or with a longer --wait",
            show_duration(wait)
        )
    };
    Error::Locked(format!(
        "{}; {one}. {waited}; a lock left by a crashed process expires at {expires} ({})",
        holding(scope, h),
        lake.url(&scope.rel())
    ))
}

/// One attempt: the lock, or its live holder.
async fn try_acquire(
    lake: &Lake,
    scope: Scope<'_>,
    info: LockInfo,
    ttl: Duration,
) -> Result<std::result::Result<SourceLock, LockInfo>> {
    let rel = scope.rel();
    let body = Bytes::from(serde_json::to_vec(&info).map_err(|e| Error::Invalid(e.to_string()))?);
    let take = |version: Option<UpdateVersion>| {
        let heartbeat = spawn_heartbeat(lake.clone(), rel.clone(), info.clone(), version, ttl);
        SourceLock {
            lake: lake.clone(),
            rel: rel.clone(),
            info: info.clone(),
            heartbeat,
        }
    };
    for attempt in 0..3 {
        if let Some(version) = lake.put_create_versioned(&rel, body.clone()).await? {
            return Ok(Ok(take(Some(version))));
        }
        let Some((bytes, version)) = lake.get_versioned(&rel).await? else {
            continue; // released in between
        };
        match serde_json::from_slice::<LockInfo>(&bytes).ok() {
            Some(h) if !h.is_stale(now_ms()) => return Ok(Err(h)),
            // Stale, released or unreadable: take it over, atomically where the store can.
            _ => match lake.replace_if(&rel, body.clone(), version).await? {
                Replaced::Done(version) => return Ok(Ok(take(Some(version)))),
                Replaced::Conflict => {} // another process took it or refreshed it: look again
                Replaced::Unsupported if attempt < 2 => lake.delete(&rel).await?,
                Replaced::Unsupported => {}
            },
        }
    }
    Err(Error::Locked(format!(
        "could not take the lock {}; another command is taking it. Re-run it",
        lake.url(&rel)
    )))
}

/// The ids of the runs and builds the live (not stale, not released) locks of the lake hold:
/// each holder's own id and its [`LockInfo::holds`]. gc reads them after listing the files it
/// may remove and before reading the logs, so a writer either shows here or has committed.
pub async fn live_holds(lake: &Lake) -> Result<std::collections::BTreeSet<String>> {
    let mut out = std::collections::BTreeSet::new();
    let now = now_ms();
    for meta in lake.list(LOCKS).await? {
        let Some(rel) = lake.relative(&meta.location) else {
            continue;
        };
        let Some(bytes) = lake.get(&rel).await? else {
            continue; // released meanwhile
        };
        // an unreadable lock object holds nothing (a torn write cannot happen: puts are whole)
        if let Ok(h) = serde_json::from_slice::<LockInfo>(&bytes)
            && !h.is_stale(now)
        {
            out.insert(h.run_id);
            out.extend(h.holds);
        }
    }
    Ok(out)
}

/// Refresh the lock every third of its TTL while it is ours. Where the store can replace
/// conditionally (S3) a refresh is an `If-Match` put of the version last written, so a lock
/// taken over by another run is never overwritten; elsewhere it reads the holder first.
fn spawn_heartbeat(
    lake: Lake,
    rel: String,
    mut info: LockInfo,
    mut version: Option<UpdateVersion>,
    ttl: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(ttl / 3).await;
            info.heartbeat_ms = now_ms();
            let Ok(body) = serde_json::to_vec(&info).map(Bytes::from) else {
                return;
            };
            if let Some(v) = &version {
                match lake.replace_if(&rel, body.clone(), v.clone()).await {
                    Ok(Replaced::Done(next)) => {
                        version = Some(next);
                        continue;
                    }
                    Ok(Replaced::Conflict) => return, // taken over
                    Err(_) => continue,               // try again at the next beat
                    Ok(Replaced::Unsupported) => version = None,
                }
            }
            // Refresh only a lock that is still ours (it may have been taken over).
            if !holds(&lake, &rel, &info.run_id).await {
                return;
            }
            let _ = lake.put(&rel, body).await;
        }
    })
}

async fn holds(lake: &Lake, rel: &str, run_id: &str) -> bool {
    match lake.get(rel).await {
        Ok(Some(bytes)) => serde_json::from_slice::<LockInfo>(&bytes).is_ok_and(|h| h.run_id == run_id && !h.released),
        _ => false,
    }
}

impl SourceLock {
    /// Release the lock if it is still ours (a lock taken over by another run is left alone).
    /// Where the store can replace conditionally (S3) the lock object is marked released with an
    /// `If-Match` put, which cannot clobber a lock another run took over meanwhile; elsewhere it
    /// is deleted after checking it is still ours.
    pub async fn release(self) -> Result<()> {
        self.heartbeat.abort();
        let _ = self.heartbeat.await;
        let mut info = self.info.clone();
        info.released = true;
        let body = Bytes::from(serde_json::to_vec(&info).map_err(|e| Error::Invalid(e.to_string()))?);
        // The heartbeat may have moved the version on: use the lock's current one if it is ours.
        let current = match self.lake.get_versioned(&self.rel).await? {
            Some((bytes, v)) if serde_json::from_slice::<LockInfo>(&bytes).is_ok_and(|h| h.run_id == info.run_id) => v,
            _ => return Ok(()),
        };
        match self.lake.replace_if(&self.rel, body, current).await? {
            Replaced::Done(_) | Replaced::Conflict => Ok(()),
            Replaced::Unsupported => {
                if holds(&self.lake, &self.rel, &self.info.run_id).await {
                    self.lake.delete(&self.rel).await?;
                }
                Ok(())
            }
        }
    }
}
