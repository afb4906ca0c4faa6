//! Shared helpers: a temporary lake, running the real `ingot` binary, reading tables back as
//! JSON rows, and a normalized whole-lake snapshot for comparing two lakes.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn landing(rel: &str) -> PathBuf {
    repo().join("data/landing").join(rel)
}

pub fn bad(rel: &str) -> PathBuf {
    repo().join("data/bad").join(rel)
}

/// The demo's sources: one per contract in `contracts/`, sorted.
pub fn demo_sources() -> Vec<String> {
    names_in(&repo().join("contracts"), |p| {
        if p.extension()? != "yaml" {
            return None;
        }
        Some(p.file_stem()?.to_string_lossy().into_owned())
    })
}

/// The demo's silver tables: one per folder in `rules/`, sorted.
pub fn demo_tables() -> Vec<String> {
    names_in(&repo().join("rules"), |p| {
        if !p.is_dir() {
            return None;
        }
        Some(p.file_name()?.to_string_lossy().into_owned())
    })
}

fn names_in(dir: &Path, name: impl Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| name(&e.unwrap().path()))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "nothing in {}", dir.display());
    out
}

/// A temporary lake with its own copy of the repository's contracts.
pub struct TestLake {
    pub dir: tempfile::TempDir,
    /// Extra environment for every `ingot` run (e.g. a tiny index budget).
    pub envs: Vec<(String, String)>,
    /// A lake URL (e.g. `s3://bucket/lake`) instead of the `lake` folder of the temp directory.
    pub lake_url: Option<String>,
}

impl TestLake {
    pub fn new() -> TestLake {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("contracts")).unwrap();
        for e in std::fs::read_dir(repo().join("contracts")).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dir.path().join("contracts").join(p.file_name().unwrap())).unwrap();
        }
        TestLake {
            dir,
            envs: Vec::new(),
            lake_url: None,
        }
    }

    /// A lake whose ingests use the partitioned (spilling) change detection.
    pub fn partitioned() -> TestLake {
        let mut t = TestLake::new();
        t.envs.push(("INGOT_INDEX_MEMORY".into(), "1K".into()));
        t
    }

    pub fn lake(&self) -> PathBuf {
        self.dir.path().join("lake")
    }

    pub fn contracts(&self) -> PathBuf {
        self.dir.path().join("contracts")
    }

    pub fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ingot"));
        match &self.lake_url {
            Some(url) => c.arg("--lake").arg(url),
            None => c.arg("--lake").arg(self.lake()),
        };
        c.arg("--contracts").arg(self.contracts());
        c.env_remove("INGOT_FAILPOINT");
        c.env_remove("INGOT_INDEX_MEMORY");
        c.env_remove("INGOT_WAIT");
        c.env("INGOT_LOCK_TTL_SECS", "30");
        for (k, v) in &self.envs {
            c.env(k, v);
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    pub fn ingest(&self, source: &str, file: &Path) -> Output {
        self.command().args(["ingest", source]).arg(file).output().unwrap()
    }

    /// Ingest and insist on exit code 0.
    pub fn ingest_ok(&self, source: &str, file: &Path) -> String {
        let out = self.ingest(source, file);
        assert_ok(&out);
        let partitioned = String::from_utf8_lossy(&out.stderr).contains("change detection runs in");
        let skipped = String::from_utf8_lossy(&out.stdout).contains("skipped, identical");
        assert_eq!(
            partitioned,
            !self.envs.is_empty() && !skipped,
            "partitioned mode: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Rows of a query, as JSON objects.
    pub fn query(&self, sql: &str) -> Vec<BTreeMap<String, Value>> {
        let out = self.command().args(["sql", sql, "--format", "json"]).output().unwrap();
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Every visible table of the lake, with run ids and clock values replaced by stable names so
    /// that two lakes built by the same commands compare equal.
    pub fn snapshot(&self, sources: &[&str]) -> LakeSnapshot {
        let runs = self.query("SELECT * FROM audit.ingestion_run_log ORDER BY started_at, run_id");
        let mut names = BTreeMap::new();
        for (i, r) in runs.iter().enumerate() {
            names.insert(r["run_id"].as_str().unwrap().to_string(), format!("run#{i}"));
        }
        let norm = |rows| normalize_rows(rows, &names);
        let mut tables = BTreeMap::new();
        tables.insert("audit.ingestion_run_log".to_string(), norm(runs.clone()));
        tables.insert(
            "audit.row_failure_log".to_string(),
            norm(self.query("SELECT * FROM audit.row_failure_log ORDER BY source, failed_at, source_row_number, rule")),
        );
        for s in sources {
            tables.insert(
                format!("bronze.{s}"),
                norm(self.query(&format!(
                    "SELECT * FROM bronze.{s} ORDER BY ingested_at, source_row_number, natural_key_fingerprint"
                ))),
            );
            tables.insert(
                format!("bronze.{s}_current"),
                norm(self.query(&format!(
                    "SELECT * FROM bronze.{s}_current ORDER BY natural_key_fingerprint"
                ))),
            );
        }
        LakeSnapshot { tables }
    }
}

#[derive(Debug, PartialEq)]
pub struct LakeSnapshot {
    pub tables: BTreeMap<String, Vec<BTreeMap<String, Value>>>,
}

impl LakeSnapshot {
    /// Assert equality table by table, showing the first differing row ([`assert_same_tables`]).
    pub fn assert_same(&self, other: &LakeSnapshot, context: &str) {
        assert_same_tables(&self.tables, &other.tables, context);
    }
}

/// Replace ids named in `names` by their stable names, and clock values by `<time>`, so rows of
/// two lakes built by the same commands compare equal.
pub fn normalize_rows(
    rows: Vec<BTreeMap<String, Value>>,
    names: &BTreeMap<String, String>,
) -> Vec<BTreeMap<String, Value>> {
    rows.into_iter()
        .map(|mut row| {
            for (k, v) in row.iter_mut() {
                if let Value::String(s) = v
                    && let Some(n) = names.get(s.as_str())
                {
                    *v = Value::String(n.clone());
                }
                if [
                    "started_at",
                    "finished_at",
                    "ingested_at",
                    "failed_at",
                    "rolled_back_at",
                    "decided_at",
                ]
                .contains(&k.as_str())
                {
                    *v = Value::String("<time>".into());
                }
                // a file's CRC-32 (and its compressed size) depends on the run ids and clocks it holds
                if [
                    "data_file_bytes",
                    "data_file_crc32",
                    "failure_file_bytes",
                    "failure_file_crc32",
                ]
                .contains(&k.as_str())
                    && !v.is_null()
                {
                    *v = Value::String("<stamp>".into());
                }
            }
            row
        })
        .collect()
}

/// Stable names for the run ids and build ids of a lake (`run#i`, `build#i` by start order), for
/// [`normalize_rows`].
pub fn id_names(t: &TestLake) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let runs = t.query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at, run_id");
    for (i, r) in runs.iter().enumerate() {
        names.insert(r["run_id"].as_str().unwrap().to_string(), format!("run#{i}"));
    }
    let builds = t.query("SELECT build_id FROM audit.silver_build_log ORDER BY started_at, build_id");
    for (i, b) in builds.iter().enumerate() {
        names.insert(b["build_id"].as_str().unwrap().to_string(), format!("build#{i}"));
    }
    names
}

/// Wait (up to 30 s) until a failpoint in `:sleep:` mode created its marker file.
pub fn wait_for_marker(marker: &Path, what: &str) {
    for _ in 0..600 {
        if marker.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{what} never reached its failpoint");
}

pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "ingot failed with {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Deterministic xorshift64* generator: the same sequence on every run for a seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo) as u64 + 1)) as i64
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Two sets of named tables (as the whole-lake helpers make them) are equal: the same names and,
/// table by table, the same rows in the same order; a difference names the table and the row.
pub fn assert_same_tables(
    got: &BTreeMap<String, Vec<BTreeMap<String, Value>>>,
    want: &BTreeMap<String, Vec<BTreeMap<String, Value>>>,
    context: &str,
) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{context}"
    );
    for (name, rows) in want {
        assert_same_rows(&got[name], rows, &format!("{context}: {name}"));
    }
}

/// Two lists of rows are equal, row by row in order; a difference names the first differing row.
pub fn assert_same_rows(got: &[BTreeMap<String, Value>], want: &[BTreeMap<String, Value>], context: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a, b, "{context}: row {i} differs");
    }
    assert_eq!(got.len(), want.len(), "{context}: row count");
}

/// The python of the project's venv `name` (at the repository root), created and `packages`
/// installed from PyPI on first use, i.e. when `python -c check` (an import) fails. Tests that
/// ask at once wait for one another, so none installs into a half-made venv.
pub fn python_venv(name: &str, check: &str, packages: &[&str]) -> PathBuf {
    let venv = repo().join(name);
    let python = venv.join("bin/python");
    let ready = || {
        python.exists()
            && Command::new(&python)
                .args(["-c", check])
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    };
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if !ready() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .unwrap();
        assert!(status.success(), "python3 -m venv {}", venv.display());
        let status = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(packages)
            .status()
            .unwrap();
        assert!(status.success(), "pip install {}", packages.join(" "));
        assert!(ready(), "{} installed but `{check}` fails", packages.join(" "));
    }
    python
}

/// Every file under `dir`, recursively (in no particular order).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}
