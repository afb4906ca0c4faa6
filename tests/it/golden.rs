//! What people read: the CLI's output compared with the files in tests/golden/, after ids, times,
//! durations and temporary paths are replaced by stable placeholders. A change in wording or
//! layout fails here and is accepted by re-running with `INGOT_BLESS=1`, so it shows in review.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

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
    ids: BTreeMap<String, String>,
}

impl Filter {
    fn new(tmp: &Path) -> Filter {
        Filter {
            tmp: tmp.display().to_string(),
            ids: BTreeMap::new(),
        }
    }

    fn apply(&mut self, text: &str) -> String {
        let text = text
            .replace(&self.tmp, "<tmp>")
            .replace(&repo().display().to_string(), "<repo>");
        let id = Regex::new(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b").unwrap();
        let mut out = String::new();
        let mut last = 0;
        for m in id.find_iter(&text) {
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
        let time = Regex::new(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?").unwrap();
        let out = time.replace_all(&out, "<time>");
        let dur = Regex::new(r"\b\d+(\.\d+)? ?(ms|s)\b").unwrap();
        dur.replace_all(&out, "<dur>").into_owned()
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

/// One command and what it printed: `$ ingot …`, stdout, stderr (prefixed) and the exit code.
fn transcript(filter: &mut Filter, args: &[&str], out: &Output) -> String {
    let mut t = format!("$ ingot {}\n", args.join(" "));
    t.push_str(&String::from_utf8_lossy(&out.stdout));
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        t.push_str(&format!("stderr: {line}\n"));
    }
    t.push_str(&format!("exit: {}\n\n", out.status.code().unwrap_or(-1)));
    filter.apply(&t)
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
/// audit views, a build planned then done, explain, the nightly job, doctor, undo and replay.
#[test]
fn a_day_on_the_command_line() {
    let t = TestLake::new();
    copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
    let mut filter = Filter::new(t.dir.path());
    let mut all = String::new();
    let mut step = |args: &[&str]| {
        let mut c = quiet(t.command());
        c.current_dir(t.dir.path()).arg("--rules").arg(repo().join("rules"));
        let out = c.args(args).output().unwrap();
        all.push_str(&transcript(&mut filter, args, &out));
    };
    let first = "landing/bookings/2026-11-01_bookings.csv";
    step(&["ingest", "bookings", first]);
    step(&["ingest", "bookings", first]);
    step(&["ingest", "bookings", "landing/bookings/2026-11-02_bookings_resend.csv"]);
    step(&["ingest", "hotels", "landing/hotels/2026-11-01_hotels.csv"]);
    step(&["runs"]);
    step(&["runs", "--format", "csv"]);
    step(&["failures", "--format", "json"]);
    step(&["build", "bookings", "--dry-run"]);
    step(&["build", "bookings"]);
    step(&["build", "bookings", "--dry-run", "--json"]);
    step(&["explain", "bookings"]);
    step(&[
        "ingest",
        "bookings",
        "landing/bookings/2026-11-04_bookings_corrected.csv",
    ]);
    step(&["build", "bookings"]);
    step(&["doctor"]);
    step(&[
        "sql",
        "SELECT status, count(*) AS n FROM audit.silver_build_log GROUP BY status ORDER BY 1",
    ]);
    golden("day", &all);
}

/// The nightly job over the bundled landing folder, twice (the second run changes nothing), then
/// undo of one run (twice: the second says so) and the nightly job after it.
#[test]
fn the_nightly_job_and_undo() {
    let t = TestLake::new();
    copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
    let mut filter = Filter::new(t.dir.path());
    let mut all = String::new();
    let mut step = |args: &[&str]| {
        let mut c = quiet(t.command());
        c.current_dir(t.dir.path()).arg("--rules").arg(repo().join("rules"));
        c.args(["--landing", "landing"]);
        let out = c.args(args).output().unwrap();
        all.push_str(&transcript(&mut filter, args, &out));
    };
    step(&["run"]);
    step(&["run"]);
    let runs = t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'hotels' ORDER BY started_at");
    let last = runs.last().unwrap()["run_id"].as_str().unwrap().to_string();
    step(&["undo", &last]);
    step(&["undo", &last]);
    step(&["runs", "--source", "hotels", "--format", "json"]);
    step(&["run"]);
    golden("nightly", &all);
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
    let t = TestLake::new();
    copy_dir(&repo().join("data/bad"), &t.dir.path().join("bad"));
    let mut filter = Filter::new(t.dir.path());
    std::fs::create_dir_all(t.dir.path().join("bad_contracts")).unwrap();
    std::fs::write(
        t.dir.path().join("bad_contracts/bookings.yaml"),
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
    let mut all = String::new();
    let mut record = |args: &[&str], mut c: Command| {
        let out = c.current_dir(t.dir.path()).args(args).output().unwrap();
        all.push_str(&transcript(&mut filter, args, &out));
    };
    // a contract with an unknown type, a normalize step on a decimal and an unknown key field
    let mut check = quiet(Command::new(env!("CARGO_BIN_EXE_ingot")));
    check.args(["--lake", "lake", "--rules", "rules"]);
    record(&["--contracts", "bad_contracts", "check"], check);
    let step = |record: &mut dyn FnMut(&[&str], Command), args: &[&str]| {
        let mut c = quiet(t.command());
        c.arg("--rules").arg(repo().join("rules"));
        record(args, c);
    };
    step(&mut record, &["ingest", "nosuch", "bad/empty.csv"]);
    step(&mut record, &["ingest", "bookings", "missing.csv"]);
    for f in [
        "missing_required_column.csv",
        "ragged.csv",
        "invalid_utf8.csv",
        "empty.csv",
    ] {
        step(&mut record, &["ingest", "bookings", &format!("bad/{f}")]);
    }
    step(
        &mut record,
        &["build", "bookings", "--rebuild-where", "no_such_column < 2"],
    );
    step(&mut record, &["undo", "0190a000-0000-7000-8000-000000000000"]);
    step(&mut record, &["sql", "DROP TABLE audit.ingestion_run_log"]);
    step(&mut record, &["--memory-limit", "lots", "runs"]);
    golden("errors", &all);
}
