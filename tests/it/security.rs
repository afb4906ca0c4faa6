//! Hostile landing folders and hostile values: symbolic links in drop folders and globs never
//! read a file outside the folder, and control characters from hostile files never reach a
//! terminal through table output, summaries or messages (csv/json output stays exact).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::util::{TestLake, assert_ok, landing, stderr, stdout};

/// A file outside every landing folder that a link tries to smuggle in: a valid hotels export
/// (it would load cleanly if it were read) and a file that is no CSV at all (it would land in
/// the run's error or the failure log).
fn secrets(t: &TestLake) -> (PathBuf, PathBuf) {
    let dir = t.dir.path().join("secret");
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("hotels.csv");
    std::fs::write(
        &csv,
        "hotel_code,hotel_id,name,city,country,rooms,opened_on\nSECRET1,1,Secret Hotel,Nowhere,NL,1,2020-01-01\n",
    )
    .unwrap();
    let text = dir.join("passwd");
    std::fs::write(&text, "root:x:0:0:SECRET-ROOT:/root:/bin/bash\n").unwrap();
    (csv, text)
}

/// Nothing of a secret anywhere in the lake's tables.
fn assert_no_secret(t: &TestLake) {
    for table in ["audit.ingestion_run_log", "audit.row_failure_log", "bronze.hotels"] {
        let rows = t.query(&format!("SELECT * FROM {table}"));
        let text = serde_json::to_string(&rows).unwrap();
        assert!(!text.contains("SECRET"), "{table} holds a secret: {text}");
    }
}

fn run_with_landing(t: &TestLake, landing_dir: &Path) -> std::process::Output {
    let rules = t.dir.path().join("no-rules");
    std::fs::create_dir_all(&rules).unwrap();
    t.command()
        .arg("--landing")
        .arg(landing_dir)
        .arg("--rules")
        .arg(&rules)
        .arg("run")
        .output()
        .unwrap()
}

#[test]
fn the_nightly_job_skips_links_out_of_the_landing_folder_and_reads_links_within_it() {
    let t = TestLake::new();
    let (secret_csv, secret_text) = secrets(&t);
    let root = t.dir.path().join("landing");
    let hotels = root.join("hotels");
    let archive = root.join("archive");
    std::fs::create_dir_all(&hotels).unwrap();
    std::fs::create_dir_all(&archive).unwrap();
    std::fs::copy(
        landing("hotels/2026-11-01_hotels.csv"),
        hotels.join("2026-11-01_hotels.csv"),
    )
    .unwrap();
    std::fs::copy(
        landing("hotels/2026-11-03_hotels.csv"),
        archive.join("2026-11-03_hotels.csv"),
    )
    .unwrap();
    // within the landing folder: read, as the file it points to
    symlink("../archive/2026-11-03_hotels.csv", hotels.join("2026-11-02_link.csv")).unwrap();
    // out of it: a relative link, an absolute one, a dangling one, and a source folder that is a link
    symlink("../../secret/hotels.csv", hotels.join("2026-11-05_relative.csv")).unwrap();
    symlink(&secret_text, hotels.join("2026-11-06_absolute.csv")).unwrap();
    symlink(t.dir.path().join("nowhere.csv"), hotels.join("2026-11-07_dangling.csv")).unwrap();
    symlink(t.dir.path().join("secret"), root.join("bookings")).unwrap();

    let out = run_with_landing(&t, &root);
    assert_ok(&out);
    let text = stdout(&out);
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
    let root_c = canon(&root);
    for (link, target) in [
        (hotels.join("2026-11-05_relative.csv"), canon(&secret_csv)),
        (hotels.join("2026-11-06_absolute.csv"), canon(&secret_text)),
        (root.join("bookings"), canon(&t.dir.path().join("secret"))),
    ] {
        let want = format!(
            "skipped {}: a symbolic link to {target}, outside {root_c}: links are followed only within it",
            link.display()
        );
        assert!(text.contains(&want), "missing `{want}` in:\n{text}");
    }
    assert!(
        text.contains(&format!(
            "skipped {}: a symbolic link that does not resolve",
            hotels.join("2026-11-07_dangling.csv").display()
        )),
        "{text}"
    );
    assert_no_secret(&t);

    // the same lake as ingesting the two real files by hand, in the folder's order
    let by_hand = TestLake::new();
    by_hand.ingest_ok("hotels", &hotels.join("2026-11-01_hotels.csv"));
    by_hand.ingest_ok("hotels", &PathBuf::from(canon(&archive.join("2026-11-03_hotels.csv"))));
    t.snapshot(&["hotels"])
        .assert_same(&by_hand.snapshot(&["hotels"]), "links within the landing folder");

    // the next night: the linked file counts as loaded, the links out are still skipped
    let again = run_with_landing(&t, &root);
    assert_ok(&again);
    let text = stdout(&again);
    assert!(text.starts_with("nightly job: 0 runs"), "{text}");
    assert!(text.contains("2 landing files already loaded"), "{text}");
    assert!(text.contains("2026-11-05_relative.csv: a symbolic link to"), "{text}");
    t.snapshot(&["hotels"])
        .assert_same(&by_hand.snapshot(&["hotels"]), "a second night");
}

#[test]
fn a_glob_skips_links_out_of_its_folder_and_a_link_named_on_the_command_line_is_followed() {
    let t = TestLake::new();
    let (secret_csv, _) = secrets(&t);
    let drop = t.dir.path().join("drop");
    std::fs::create_dir_all(&drop).unwrap();
    std::fs::copy(landing("hotels/2026-11-01_hotels.csv"), drop.join("a.csv")).unwrap();
    symlink(&secret_csv, drop.join("b.csv")).unwrap();
    let glob = format!("{}/*.csv", drop.display());
    let out = t.run(&["ingest", "hotels", &glob]);
    assert_ok(&out);
    let canon_secret = std::fs::canonicalize(&secret_csv).unwrap();
    let canon_drop = std::fs::canonicalize(&drop).unwrap();
    assert!(
        stderr(&out).contains(&format!(
            "ingot ingest: skipped {}: a symbolic link to {}, outside {}",
            drop.join("b.csv").display(),
            canon_secret.display(),
            canon_drop.display()
        )),
        "{}",
        stderr(&out)
    );
    assert_no_secret(&t);
    let runs = t.query("SELECT file_path, status FROM audit.ingestion_run_log");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["file_path"], drop.join("a.csv").display().to_string());

    // a glob that only matches links out: an error naming them, nothing loaded
    let only = format!("{}/b*.csv", drop.display());
    let out = t.run(&["ingest", "hotels", &only]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("1 symbolic link skipped"), "{}", stderr(&out));
    assert!(stderr(&out).contains("name a link itself"), "{}", stderr(&out));

    // the user names the link: followed, recorded as the file it points to
    let out = t.run(&["ingest", "hotels", drop.join("b.csv").to_str().unwrap()]);
    assert_ok(&out);
    let runs = t.query("SELECT file_path, rows_inserted FROM audit.ingestion_run_log ORDER BY started_at");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1]["file_path"], canon_secret.display().to_string());
    assert_eq!(runs[1]["rows_inserted"], 1);
}

#[test]
fn a_landing_file_swapped_for_a_link_while_the_run_waits_is_refused_not_read_through_the_link() {
    let t = TestLake::new();
    let (_, secret_text) = secrets(&t);
    let file = t.dir.path().join("hotels.csv");
    std::fs::copy(landing("hotels/2026-11-01_hotels.csv"), &file).unwrap();
    let marker = t.dir.path().join("reached");
    let child = t
        .command()
        .args(["ingest", "hotels"])
        .arg(&file)
        .env("INGOT_FAILPOINT", "ingest.after_lock:sleep:1500")
        .env("INGOT_FAILPOINT_MARKER", &marker)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::util::wait_for_marker(&marker, "the ingest");
    std::fs::remove_file(&file).unwrap();
    symlink(&secret_text, &file).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}\n{}", stdout(&out), stderr(&out));
    let runs = t.query("SELECT status, error FROM audit.ingestion_run_log");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "failed");
    let error = runs[0]["error"].as_str().unwrap();
    assert!(error.contains("is a symbolic link"), "{error}");
    assert_no_secret(&t);
}

/// A hotels export whose rows carry terminal escapes: a row failing `allowed` (its raw payload
/// goes to the failure log) with an OSC title change and a screen clear, and a row that loads
/// with a CSI colour, a carriage return and a bidi override in its name.
const HOSTILE: &str = "hotel_code,hotel_id,name,city,country,rooms,opened_on\n\
AMS01,1095,Canal House\x1b]0;owned\x07,Amsterdam,XX\x1b[2J,84,2009-04-01\n\
AMS02,1012,\"Zuidas\x1b[31m red\rover\u{202e}txt\",Amsterdam,NL,212,2016-09-15\n";

#[test]
fn terminal_escapes_in_values_and_file_names_are_shown_escaped_in_tables_and_exact_in_json() {
    let t = TestLake::new();
    let root = t.dir.path().join("landing");
    std::fs::create_dir_all(root.join("hotels")).unwrap();
    // the file name itself is hostile too
    let name = "2026-11-01_\x1b[2Jhotels.csv";
    std::fs::write(root.join("hotels").join(name), HOSTILE).unwrap();
    let out = run_with_landing(&t, &root);
    assert_ok(&out);
    let is_clean = |text: &str, what: &str| {
        assert!(
            !text.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{what} prints a control character: {text:?}"
        );
    };
    let summary = stdout(&out);
    is_clean(&summary, "the nightly summary");
    is_clean(&stderr(&out), "the nightly job's messages");

    for args in [
        vec!["failures"],
        vec!["runs"],
        vec!["sql", "SELECT raw_payload, reason FROM audit.row_failure_log"],
        vec![
            "sql",
            "SELECT name, file_path FROM bronze.hotels JOIN audit.ingestion_run_log ON ingestion_run_id = run_id",
        ],
    ] {
        let out = t.run(&args);
        assert_ok(&out);
        let text = stdout(&out);
        is_clean(&text, &args.join(" "));
        assert!(
            text.contains("\\x1b"),
            "{} shows the escape as text: {text}",
            args.join(" ")
        );
    }
    let sql = stdout(&t.run(&["sql", "SELECT name FROM bronze.hotels"]));
    assert!(sql.contains("Zuidas\\x1b[31m red\\rover\\u{202e}txt"), "{sql}");

    // json and csv are exact: the bytes as stored
    let failures = t.query("SELECT raw_payload FROM audit.row_failure_log");
    assert_eq!(failures.len(), 1);
    assert_eq!(
        failures[0]["raw_payload"],
        "AMS01,1095,Canal House\x1b]0;owned\x07,Amsterdam,XX\x1b[2J,84,2009-04-01"
    );
    let names = t.query("SELECT name FROM bronze.hotels");
    assert_eq!(names.len(), 1);
    assert_eq!(names[0]["name"], "Zuidas\x1b[31m red\rover\u{202e}txt");
    let csv = t.run(&["sql", "SELECT name FROM bronze.hotels", "--format", "csv"]);
    assert_ok(&csv);
    assert!(
        stdout(&csv).contains("Zuidas\x1b[31m red\rover\u{202e}txt"),
        "{:?}",
        stdout(&csv)
    );
}
