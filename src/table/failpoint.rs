//! Named crash points for fault-injection tests.
//!
//! `INGOT_FAILPOINT=<name>` makes the process abort (no destructors, no flushes: like a crash or
//! a SIGKILL) when it reaches that point; `INGOT_FAILPOINT=<name>:error` makes the call return an
//! error instead, for in-process tests; `INGOT_FAILPOINT=<name>:sleep:<ms>` pauses there (a
//! stalled process), first creating the file named by `INGOT_FAILPOINT_MARKER` if set, so a test
//! knows the point was reached. The names of every point are listed in [`ALL`] so tests can
//! iterate over them; a point missing from the list is a bug that the failpoint test catches.

use crate::error::{Error, Result};

/// Every failpoint of the ingest commit sequence, in the order they are reached.
pub const INGEST: &[&str] = &[
    "ingest.after_lock",
    "ingest.after_hash",
    "ingest.mid_data",
    "ingest.after_data",
    "ingest.after_failures",
    "ingest.before_commit",
    "ingest.after_commit",
];

/// Every failpoint of the silver build commit sequence, in the order they are reached.
pub const BUILD: &[&str] = &["build.after_data", "build.before_commit", "build.after_commit"];

/// Every failpoint of `ingot undo` (runs and builds), in the order they are reached.
pub const UNDO: &[&str] = &["undo.after_lock", "undo.before_commit", "undo.after_commit"];

/// Every failpoint of `ingot resolve` and of withdrawing a decision (`ingot undo <decision id>`).
pub const RESOLVE: &[&str] = &[
    "resolve.before_commit",
    "resolve.after_commit",
    "undo.decision.before_commit",
];

/// Every failpoint of `ingot rekey`, in the order they are reached.
pub const REKEY: &[&str] = &[
    "rekey.after_lock",
    "rekey.after_data",
    "rekey.after_failures",
    "rekey.before_commit",
    "rekey.after_commit",
];

/// Every failpoint of `ingot gc`.
pub const GC: &[&str] = &["gc.after_first_delete"];

/// Every failpoint of writing a log checkpoint (after the commit it follows, under its lock),
/// and of writing a source's key state (before the run's pass; [`crate::ingest::keystate`]).
pub const CACHE: &[&str] = &[
    "log.before_checkpoint",
    "log.after_checkpoint",
    "ingest.after_key_state",
];

/// Every failpoint of a compaction (after its segment files, before and after their manifest).
pub const COMPACT: &[&str] = &["compact.before_manifest", "compact.after_manifest"];

/// Every failpoint of publishing a Delta commit (after ingot's commit): while writing a run's
/// conformed copy (its rows read, nothing put yet), before its log put, and after it (before
/// the hint of where the log stands).
pub const DELTA: &[&str] = &["delta.conform", "delta.before_commit", "delta.after_commit"];

/// Every failpoint of `ingot doctor --fix` deriving a damaged bronze file again: before and after
/// the derived file replaces the damaged one (`ops::rederive`).
pub const DOCTOR: &[&str] = &["doctor.before_replace", "doctor.after_replace"];

/// Every failpoint of `ingot pull` before the ingest's own (`ingest::pull`): with the lock, after
/// every page is fetched into the scratch file, after its hash, after the file is kept in the lake.
pub const PULL: &[&str] = &[
    "pull.after_lock",
    "pull.after_fetch",
    "pull.after_hash",
    "pull.after_keep",
];

/// Every failpoint.
pub const ALL: &[&[&str]] = &[
    INGEST, BUILD, UNDO, RESOLVE, REKEY, GC, CACHE, COMPACT, DELTA, DOCTOR, PULL,
];

/// Crash (or fail) here if `INGOT_FAILPOINT` names this point.
pub fn hit(name: &str) -> Result<()> {
    let Ok(spec) = std::env::var("INGOT_FAILPOINT") else {
        return Ok(());
    };
    let (point, mode) = spec.split_once(':').unwrap_or((spec.as_str(), "abort"));
    if point != name {
        return Ok(());
    }
    if mode == "error" {
        return Err(Error::Failpoint(name.to_string()));
    }
    if let Some(ms) = mode.strip_prefix("sleep:").and_then(|m| m.parse::<u64>().ok()) {
        if let Ok(marker) = std::env::var("INGOT_FAILPOINT_MARKER") {
            let _ = std::fs::write(marker, name);
        }
        std::thread::sleep(std::time::Duration::from_millis(ms));
        return Ok(());
    }
    crate::tell!("ingot: failpoint {name} reached: aborting");
    std::process::abort();
}

#[cfg(test)]
mod tests {
    /// Every point the code names by a literal (a call of `hit` with a quoted name) is in [`super::ALL`].
    #[test]
    fn every_named_point_is_listed() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        let listed: Vec<&str> = super::ALL.iter().flat_map(|g| g.iter().copied()).collect();
        let mut named = 0;
        let call = concat!("failpoint::hit", "(\"");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for part in text.split(call).skip(1) {
                let name = part.split('"').next().unwrap();
                assert!(
                    listed.contains(&name),
                    "{}: failpoint {name} is not in failpoint::ALL",
                    f.display()
                );
                named += 1;
            }
        }
        assert!(named >= 30, "only {named} failpoints found: is the search right?");
    }
}
