//! One ingest per source at a time: a lock object in the lake.
//!
//! The lock is taken with a create-if-absent put of `_locks/<source>.lock` and kept alive by a
//! heartbeat that rewrites it every third of its time-to-live. A second ingest of the same source
//! fails at once with a message naming the holder. A lock whose heartbeat is older than its TTL,
//! or whose process is gone (same host, pid not alive), is stale: it is removed and taken over,
//! so a crashed process never blocks the source for longer than the TTL.
//!
//! Hazard: a lock is only advisory. A process paused past its TTL loses the lock to another run,
//! and removing a stale lock and creating a new one are two steps. Correctness does not rest on
//! the lock: each run commits into the source's next sequence slot with a create-if-absent put
//! ([`crate::audit::commit_run`]), so of two runs that started from the same state only one can
//! publish; the other fails and publishes nothing.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::lake::{Lake, layout};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockInfo {
    pub run_id: String,
    pub host: String,
    pub pid: u32,
    pub acquired_at: String,
    pub heartbeat_ms: i64,
    pub ttl_ms: i64,
}

pub struct SourceLock {
    lake: Lake,
    rel: String,
    run_id: String,
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
        expired || dead
    }
}

/// Take the lock of `source` for `run_id`.
pub async fn acquire(lake: &Lake, source: &str, run_id: &str, ttl: Duration) -> Result<SourceLock> {
    let rel = layout::lock(source);
    let info = LockInfo {
        run_id: run_id.to_string(),
        host: hostname(),
        pid: std::process::id(),
        acquired_at: chrono::Utc::now().to_rfc3339(),
        heartbeat_ms: now_ms(),
        ttl_ms: ttl.as_millis() as i64,
    };
    for attempt in 0..3 {
        let body = Bytes::from(serde_json::to_vec(&info).map_err(|e| Error::Invalid(e.to_string()))?);
        if lake.put_create(&rel, body).await? {
            let heartbeat = spawn_heartbeat(lake.clone(), rel.clone(), info.clone(), ttl);
            return Ok(SourceLock {
                lake: lake.clone(),
                rel,
                run_id: run_id.to_string(),
                heartbeat,
            });
        }
        let holder = match lake.get(&rel).await? {
            None => continue, // released in between
            Some(bytes) => serde_json::from_slice::<LockInfo>(&bytes).ok(),
        };
        match holder {
            Some(h) if !h.is_stale(now_ms()) => {
                let expires = chrono::DateTime::from_timestamp_millis(h.heartbeat_ms.saturating_add(h.ttl_ms))
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default();
                return Err(Error::Locked(format!(
                    "source \"{source}\" is being ingested by run {} (pid {} on {}, since {}); \
                     one ingest per source runs at a time. Re-run when it has finished; a lock \
                     left by a crashed process expires at {expires} ({})",
                    h.run_id,
                    h.pid,
                    h.host,
                    h.acquired_at,
                    lake.url(&rel)
                )));
            }
            _ if attempt < 2 => lake.delete(&rel).await?,
            _ => {}
        }
    }
    Err(Error::Locked(format!(
        "source \"{source}\": could not take the lock {}",
        lake.url(&rel)
    )))
}

fn spawn_heartbeat(lake: Lake, rel: String, mut info: LockInfo, ttl: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(ttl / 3).await;
            // Refresh only a lock that is still ours (it may have been taken over).
            if !holds(&lake, &rel, &info.run_id).await {
                return;
            }
            info.heartbeat_ms = now_ms();
            if let Ok(body) = serde_json::to_vec(&info) {
                let _ = lake.put(&rel, Bytes::from(body)).await;
            }
        }
    })
}

async fn holds(lake: &Lake, rel: &str, run_id: &str) -> bool {
    match lake.get(rel).await {
        Ok(Some(bytes)) => serde_json::from_slice::<LockInfo>(&bytes).is_ok_and(|h| h.run_id == run_id),
        _ => false,
    }
}

impl SourceLock {
    /// Release the lock if it is still ours (a lock taken over by another run is left alone).
    pub async fn release(self) -> Result<()> {
        self.heartbeat.abort();
        let _ = self.heartbeat.await;
        if holds(&self.lake, &self.rel, &self.run_id).await {
            self.lake.delete(&self.rel).await?;
        }
        Ok(())
    }
}
