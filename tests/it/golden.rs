//! What people read: the CLI's output compared with the files in tests/golden/, after ids, times,
//! durations and temporary paths are replaced by stable placeholders. A change in wording or
//! layout fails here and is accepted by re-running with `INGOT_BLESS=1`, so it shows in review.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use regex::Regex;

use crate::util::{TestLake, repo};

/// Every subcommand, as `ingot <words> --help` is asked for it.
const COMMANDS: &[&[&str]] = &[
    &[],
    &["check"],
    &["ingest"],
    &["sql"],
    &["build"],
    &["explain"],
    &["run"],
    &["runs"],
    &["failures"],
    &["undo"],
    &["replay"],
    &["rekey"],
    &["gc"],
    #[cfg(feature = "flight")]
    &["serve"],
    &["doctor"],
    #[cfg(feature = "cluster")]
    &["cluster"],
    #[cfg(feature = "cluster")]
    &["cluster", "scheduler"],
    #[cfg(feature = "cluster")]
    &["cluster", "executor"],
];

/// Replaces what differs between two runs of the same commands: ids (numbered by first
/// appearance, so which line names which run still shows), timestamps, durations, the temporary
/// directory and the repository's.
struct Filter {
    tmp: String,
    repo: String,
    ids: BTreeMap<String, String>,
    id: Regex,
    time: Regex,
    duration: Regex,
}

impl Filter {
    fn new(tmp: &Path) -> Filter {
        Filter {
            tmp: tmp.display().to_string(),
            repo: repo().display().to_string(),
            ids: BTreeMap::new(),
            id: Regex::new(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b").unwrap(),
            time: Regex::new(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?").unwrap(),
            duration: Regex::new(r"\b\d+(\.\d+)? ?(ms|s)\b").unwrap(),
        }
    }

    fn apply(&mut self, text: &str) -> String {
        let text = text.replace(&self.tmp, "<tmp>").replace(&self.repo, "<repo>");
        let mut out = String::new();
        let mut last = 0;
        for m in self.id.find_iter(&text) {
            out.push_str(&text[last..m.start()]);
            let n = self.ids.len();
            out.push_str(
                self.ids
                    .entry(m.as_str().to_string())
                    .or_insert_with(|| format!("<id{n}>")),
            );
            last = m.end();
        }
        out.push_str(&text[last..]);
        let out = self.time.replace_all(&out, "<time>");
        self.duration.replace_all(&out, "<dur>").into_owned()
    }
}

/// Compare `got` with tests/golden/<name>.txt, or write it there under `INGOT_BLESS=1`.
fn golden(name: &str, got: &str) {
    let path = repo().join("tests/golden").join(format!("{name}.txt"));
    if std::env::var_os("INGOT_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (INGOT_BLESS=1 writes it)", path.display()));
    if want != got {
        let first = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{} differs from the output at line {} (INGOT_BLESS=1 accepts the new output)\n--- want\n{want}\n--- got\n{got}",
            path.display(),
            first + 1
        );
    }
}

/// A test lake in a temporary folder (the working directory of every command, so inputs are
/// named by relative paths) and the transcript of the commands run in it.
struct Session {
    t: TestLake,
    filter: Filter,
    transcript: String,
}

impl Session {
    /// A lake with copies of `data/<folder>` for each of `folders`.
    fn new(folders: &[&str]) -> Session {
        let t = TestLake::new();
        for f in folders {
            copy_dir(&repo().join("data").join(f), &t.dir.path().join(f));
        }
        let filter = Filter::new(t.dir.path());
        Session {
            t,
            filter,
            transcript: String::new(),
        }
    }

    /// `ingot` on the test lake, with the repository's rules and `landing` as landing folder.
    fn command(&self) -> Command {
        let mut c = quiet(self.t.command());
        c.arg("--rules")
            .arg(repo().join("rules"))
            .args(["--landing", "landing"]);
        c
    }

    /// Run `args` on the test lake and add `$ ingot …`, stdout, stderr and the exit code.
    fn step(&mut self, args: &[&str]) {
        let c = self.command();
        self.run(c, args);
    }

    fn run(&mut self, mut c: Command, args: &[&str]) {
        let out = c.current_dir(self.t.dir.path()).args(args).output().unwrap();
        let mut text = format!("$ ingot {}\n", args.join(" "));
        text.push_str(&String::from_utf8_lossy(&out.stdout));
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            text.push_str(&format!("stderr: {line}\n"));
        }
        text.push_str(&format!("exit: {}\n\n", out.status.code().unwrap_or(-1)));
        self.transcript.push_str(&self.filter.apply(&text));
    }
}

/// `ingot` with nothing from the caller's environment that changes what it prints.
fn quiet(mut c: Command) -> Command {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("INGOT_") && k != "INGOT_LOCK_TTL_SECS" {
            c.env_remove(&k);
        }
    }
    c.env_remove("COLUMNS").env_remove("LINES").env("NO_COLOR", "1");
    c
}

#[test]
fn help_of_every_command() {
    let mut all = String::new();
    for words in COMMANDS {
        let out = quiet(Command::new(env!("CARGO_BIN_EXE_ingot")))
            .args(*words)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "ingot {} --help", words.join(" "));
        assert!(
            out.stderr.is_empty(),
            "ingot {} --help wrote to stderr",
            words.join(" ")
        );
        all.push_str(&format!("$ ingot {} --help\n", words.join(" ")));
        all.push_str(&String::from_utf8_lossy(&out.stdout));
        all.push('\n');
    }
    let feature = |on: bool, name: &str| if on { format!("-{name}") } else { String::new() };
    golden(
        &format!(
            "help{}{}",
            feature(cfg!(feature = "flight"), "flight"),
            feature(cfg!(feature = "cluster"), "cluster")
        ),
        &all,
    );
}

/// A lake's day as its operator sees it: ingests (new, identical, corrected, with rejects), the
/// audit views, a build planned then done, explain, doctor and SQL.
#[test]
fn a_day_on_the_command_line() {
    let mut s = Session::new(&["landing"]);
    let first = "landing/bookings/2026-11-01_bookings.csv";
    s.step(&["ingest", "bookings", first]);
    s.step(&["ingest", "bookings", first]);
    s.step(&["ingest", "bookings", "landing/bookings/2026-11-02_bookings_resend.csv"]);
    s.step(&["ingest", "hotels", "landing/hotels/2026-11-01_hotels.csv"]);
    s.step(&["runs"]);
    s.step(&["runs", "--format", "csv"]);
    s.step(&["failures", "--format", "json"]);
    s.step(&["build", "bookings", "--dry-run"]);
    s.step(&["build", "bookings"]);
    s.step(&["build", "bookings", "--dry-run", "--json"]);
    s.step(&["explain", "bookings"]);
    s.step(&[
        "ingest",
        "bookings",
        "landing/bookings/2026-11-04_bookings_corrected.csv",
    ]);
    s.step(&["build", "bookings"]);
    s.step(&["doctor"]);
    s.step(&[
        "sql",
        "SELECT status, count(*) AS n FROM audit.silver_build_log GROUP BY status ORDER BY 1",
    ]);
    golden("day", &s.transcript);
}

/// The nightly job over the bundled landing folder, twice (the second run changes nothing), then
/// undo of one run (twice: the second says so) and the nightly job after it.
#[test]
fn the_nightly_job_and_undo() {
    let mut s = Session::new(&["landing"]);
    s.step(&["run"]);
    s.step(&["run"]);
    let runs =
        s.t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'hotels' ORDER BY started_at");
    let last = runs.last().unwrap()["run_id"].as_str().unwrap().to_string();
    s.step(&["undo", &last]);
    s.step(&["undo", &last]);
    s.step(&["runs", "--source", "hotels", "--format", "json"]);
    s.step(&["run"]);
    golden("nightly", &s.transcript);
}

/// Copy the files of `from` into `to`, folders included.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            copy_dir(&p, &to.join(p.file_name().unwrap()));
        } else {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// The main error messages: each names the file, field or flag and what would have been valid.
#[test]
fn errors_people_meet() {
    let mut s = Session::new(&["bad"]);
    let dir = s.t.dir.path().to_path_buf();
    std::fs::create_dir_all(dir.join("bad_contracts")).unwrap();
    std::fs::write(
        dir.join("bad_contracts/bookings.yaml"),
        r#"source: bookings
version: 1
format: csv
fields:
  - {name: booking_ref, type: strng, required: true}
  - {name: amount, type: "decimal(10,2)", normalize: [upper]}
natural_key: {version: 1, fields: [booking_ref, hotel]}
"#,
    )
    .unwrap();
    // a contract with an unknown type, a normalize step on a decimal and an unknown key field
    let mut check = quiet(Command::new(env!("CARGO_BIN_EXE_ingot")));
    check.args(["--lake", "lake", "--rules", "rules"]);
    s.run(check, &["--contracts", "bad_contracts", "check"]);
    s.step(&["ingest", "nosuch", "bad/empty.csv"]);
    s.step(&["ingest", "bookings", "missing.csv"]);
    for f in [
        "missing_required_column.csv",
        "ragged.csv",
        "invalid_utf8.csv",
        "empty.csv",
    ] {
        s.step(&["ingest", "bookings", &format!("bad/{f}")]);
    }
    s.step(&["build", "bookings", "--rebuild-where", "no_such_column < 2"]);
    s.step(&["undo", "0190a000-0000-7000-8000-000000000000"]);
    s.step(&["sql", "DROP TABLE audit.ingestion_run_log"]);
    s.step(&["--memory-limit", "lots", "runs"]);
    golden("errors", &s.transcript);
}
