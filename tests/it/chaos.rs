//! Chaos: one lake, a random sequence of real `ingot` processes (ingests, builds, undos, gc, the
//! nightly job over a landing folder that fills up), many of them killed with SIGKILL at a random
//! moment. Afterwards `ingot doctor` is clean, and the lake equals a fresh lake on which exactly
//! the operations that committed (read back from the logs, in commit order) ran once each, with no
//! kill. `INGOT_CHAOS_OPS` sets the number of operations (default 30; `make fuzz` 400) and
//! `INGOT_CHAOS_SEED` the seed; both are printed with every failure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ingot::table::audit::{BuildRecord, RunRecord, read_build_log, read_run_log};
use serde_json::Value;

use crate::util::{Rng, TestLake, assert_ok, demo_sources, demo_tables, id_names, landing, normalize_rows, stdout};

/// One commit found in a log: what to run on a fresh lake to make the same commit.
#[derive(Debug, Clone)]
enum Commit {
    Run { source: String, file: String, id: String },
    Build { table: String, id: String },
    UndoRun { id: String },
    UndoBuild { id: String },
}

/// The run and build logs of a lake.
struct Logs {
    runs: Vec<RunRecord>,
    builds: Vec<BuildRecord>,
}

fn logs(rt: &tokio::runtime::Runtime, t: &TestLake) -> Logs {
    let lake = ingot::table::lake::Lake::open(&t.lake().display().to_string()).unwrap();
    Logs {
        runs: rt.block_on(read_run_log(&lake)).unwrap(),
        builds: rt.block_on(read_build_log(&lake)).unwrap(),
    }
}

/// The commits in `after` that are not in `before`, in commit order (by slot within each log;
/// the two logs are independent: a run and a build never commit in the same process step).
fn new_commits(before: &Logs, after: &Logs) -> Vec<Commit> {
    let run_seen: HashSet<(&str, u64)> = before.runs.iter().map(|r| (r.source.as_str(), r.seq)).collect();
    let run_ids: HashSet<&str> = before.runs.iter().map(|r| r.run_id.as_str()).collect();
    let build_seen: HashSet<(&str, u64)> = before.builds.iter().map(|b| (b.table.as_str(), b.seq)).collect();
    let build_ids: HashSet<&str> = before.builds.iter().map(|b| b.build_id.as_str()).collect();
    let mut out: Vec<(i64, Commit)> = Vec::new();
    for r in &after.runs {
        if run_seen.contains(&(r.source.as_str(), r.seq)) {
            continue;
        }
        let c = if run_ids.contains(r.run_id.as_str()) {
            Commit::UndoRun {
                id: r.run_id.to_string(),
            }
        } else {
            Commit::Run {
                source: r.source.to_string(),
                file: r.file_path.to_string(),
                id: r.run_id.to_string(),
            }
        };
        out.push((r.rolled_back_at.unwrap_or(r.finished_at), c));
    }
    for b in &after.builds {
        if build_seen.contains(&(b.table.as_str(), b.seq)) {
            continue;
        }
        let c = if build_ids.contains(b.build_id.as_str()) {
            Commit::UndoBuild { id: b.build_id.clone() }
        } else {
            Commit::Build {
                table: b.table.clone(),
                id: b.build_id.clone(),
            }
        };
        out.push((b.rolled_back_at.unwrap_or(b.finished_at), c));
    }
    // Within one process step the commits happened in time order (one process, one clock).
    out.sort_by_key(|(t, _)| *t);
    out.into_iter().map(|(_, c)| c).collect()
}

/// Start `args` on `t` and SIGKILL it after `kill_after` if still running. True when killed.
fn run_maybe_killed(t: &TestLake, args: &[String], kill_after: Option<Duration>) -> (bool, Duration) {
    let start = Instant::now();
    let mut child = t
        .command()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (false, start.elapsed());
        }
        if kill_after.is_some_and(|k| start.elapsed() >= k) {
            child.kill().unwrap();
            child.wait().unwrap();
            return (true, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// Every file of the demo's landing folder, as (source, path).
fn demo_files() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for source in demo_sources() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(landing(&source))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        out.extend(files.into_iter().map(|f| (source.clone(), f)));
    }
    out
}

/// The whole lake, ids named by start order, clock values masked.
fn state(t: &TestLake) -> BTreeMap<String, Vec<BTreeMap<String, Value>>> {
    let names = id_names(t);
    let mut out = BTreeMap::new();
    let mut queries = vec![
        (
            "audit.ingestion_run_log".to_string(),
            "SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id".to_string(),
        ),
        (
            "audit.silver_build_log".to_string(),
            "SELECT * FROM audit.silver_build_log ORDER BY started_at, build_id".to_string(),
        ),
        (
            "audit.row_failure_log".to_string(),
            "SELECT * FROM audit.row_failure_log ORDER BY layer, source, failed_at, run_id, source_row_number, rule, natural_key_fingerprint, raw_payload"
                .to_string(),
        ),
    ];
    for s in demo_sources() {
        queries.push((
            format!("bronze.{s}"),
            format!("SELECT * FROM bronze.{s} ORDER BY ingested_at, source_row_number, natural_key_fingerprint"),
        ));
        queries.push((
            format!("bronze.{s}_current"),
            format!("SELECT * FROM bronze.{s}_current ORDER BY natural_key_fingerprint"),
        ));
    }
    for table in demo_tables() {
        queries.push((
            format!("silver.{table}"),
            format!("SELECT * FROM silver.{table} ORDER BY natural_key_fingerprint"),
        ));
    }
    for (name, sql) in queries {
        out.insert(name, normalize_rows(t.query(&sql), &names));
    }
    out
}

#[test]
fn random_operations_killed_at_random_moments_equal_a_clean_replay_of_what_committed() {
    let seed: u64 = std::env::var("INGOT_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_202);
    let ops: usize = std::env::var("INGOT_CHAOS_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let mut rng = Rng(seed | 1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let files = demo_files();
    let tables = demo_tables();
    let t = TestLake::new();
    let drop_folder = t.dir.path().join("landing");
    std::fs::create_dir_all(&drop_folder).unwrap();
    // How long each kind of operation took when last left alone: kills land within that.
    let mut took: HashMap<&'static str, Duration> = HashMap::new();
    let mut commits: Vec<Commit> = Vec::new();
    let mut history = Vec::new();
    let mut kills = 0;
    for step in 0..ops {
        let before = logs(&rt, &t);
        let (kind, args): (&'static str, Vec<String>) = match rng.below(10) {
            0..=3 => {
                let (source, file) = &files[rng.below(files.len() as u64) as usize];
                (
                    "ingest",
                    vec!["ingest".into(), source.clone(), file.display().to_string()],
                )
            }
            4 | 5 => (
                "build",
                vec!["build".into(), tables[rng.below(tables.len() as u64) as usize].clone()],
            ),
            6 => {
                // an undo of a visible run or build of this lake
                let runs: Vec<&RunRecord> = before.runs.iter().filter(|r| r.status.is_loaded()).collect();
                let builds: Vec<&BuildRecord> = before
                    .builds
                    .iter()
                    .filter(|b| b.status == ingot::table::audit::BuildStatus::Succeeded)
                    .collect();
                let id = if rng.chance(50) && !runs.is_empty() {
                    runs[rng.below(runs.len() as u64) as usize].run_id.to_string()
                } else if let Some(b) = builds.last() {
                    b.build_id.clone()
                } else {
                    continue;
                };
                ("undo", vec!["undo".into(), id])
            }
            7 => ("gc", vec!["gc".into(), "--grace".into(), "0s".into()]),
            _ => {
                // a new file arrives in the drop folder, then the nightly job runs
                let (source, file) = &files[rng.below(files.len() as u64) as usize];
                let dir = drop_folder.join(source);
                std::fs::create_dir_all(&dir).unwrap();
                let _ = std::fs::copy(file, dir.join(file.file_name().unwrap()));
                (
                    "run",
                    vec!["run".into(), "--landing".into(), drop_folder.display().to_string()],
                )
            }
        };
        let usual = took.get(kind).copied().unwrap_or(Duration::from_millis(300));
        let kill_after = rng
            .chance(45)
            .then(|| Duration::from_millis(rng.below(usual.as_millis() as u64 + 1)));
        let (killed, elapsed) = run_maybe_killed(&t, &args, kill_after);
        if killed {
            kills += 1;
        } else {
            took.insert(kind, elapsed);
        }
        let after = logs(&rt, &t);
        let new = new_commits(&before, &after);
        history.push(format!(
            "step {step}: {args:?} killed={killed} after {elapsed:?}: {new:?}"
        ));
        commits.extend(new);
    }
    let context = format!("seed {seed}, {ops} operations:\n{}", history.join("\n"));
    eprintln!(
        "chaos: seed {seed}, {ops} operations, {kills} killed while running, {} commits",
        commits.len()
    );
    let doctor = t.run(&["doctor"]);
    assert!(doctor.status.success(), "{context}\ndoctor:\n{}", stdout(&doctor));
    assert!(
        kills > 0,
        "{context}: no process was killed while running; the test proved nothing"
    );

    // The same commits, once each, on a fresh lake with nothing killed.
    let clean = TestLake::new();
    let mut ids: HashMap<String, String> = HashMap::new();
    for c in &commits {
        let before = logs(&rt, &clean);
        let args: Vec<String> = match c {
            Commit::Run { source, file, .. } => vec!["ingest".into(), source.clone(), file.clone()],
            Commit::Build { table, .. } => vec!["build".into(), table.clone()],
            Commit::UndoRun { id } | Commit::UndoBuild { id } => vec!["undo".into(), ids[id].clone()],
        };
        let out = clean.command().args(&args).output().unwrap();
        let after = logs(&rt, &clean);
        let made = new_commits(&before, &after);
        assert_eq!(
            made.len(),
            1,
            "{context}\nreplaying {c:?} made {made:?}: {}",
            stdout(&out)
        );
        match (c, &made[0]) {
            (Commit::Run { id, .. }, Commit::Run { id: new, .. })
            | (Commit::Build { id, .. }, Commit::Build { id: new, .. }) => {
                ids.insert(id.clone(), new.clone());
            }
            (Commit::UndoRun { .. }, Commit::UndoRun { .. }) | (Commit::UndoBuild { .. }, Commit::UndoBuild { .. }) => {
            }
            (want, got) => panic!("{context}\nreplaying {want:?} made {got:?}"),
        }
    }
    let (got, want) = (state(&t), state(&clean));
    crate::util::assert_same_tables(
        &got,
        &want,
        &format!("{context}\nthe lake vs a clean replay of its commits"),
    );
    assert_ok(&clean.run(&["doctor"]));
}
