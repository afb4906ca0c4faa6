//! `ingot sql` without a query: statements from a pipe, and the interactive shell on a real
//! terminal (a pseudo-terminal made by `script`).

use std::io::Write;
use std::process::Stdio;

use ingot::query::shell::{Input, StatementReader};

use crate::util::{TestLake, landing, stderr, stdout};

fn lake() -> TestLake {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    t
}

fn piped(t: &TestLake, input: &str, args: &[&str]) -> std::process::Output {
    let mut child = t
        .command()
        .arg("sql")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn statements_end_at_semicolons_outside_quotes_and_comments() {
    let mut r = StatementReader::default();
    assert_eq!(r.push_line("SELECT 'a;b',"), vec![]);
    assert!(r.pending());
    assert_eq!(
        r.push_line("  \"c;d\" -- not the end; really"),
        vec![],
        "a ; in a comment does not end the statement"
    );
    assert_eq!(
        r.push_line("FROM t; SELECT 2;"),
        vec![
            Input::Statement("SELECT 'a;b',\n  \"c;d\" -- not the end; really\nFROM t".into()),
            Input::Statement("SELECT 2".into())
        ]
    );
    assert!(!r.pending());
    assert_eq!(
        r.push_line("  \\d silver.bookings "),
        vec![Input::Command("\\d silver.bookings".into())]
    );
    assert_eq!(r.push_line("SELECT 3"), vec![]);
    assert_eq!(r.finish(), Some(Input::Statement("SELECT 3".into())));
    assert_eq!(r.finish(), None);
}

#[test]
fn a_pipe_of_statements_runs_them_all_and_exits_2_when_one_failed() {
    let t = lake();
    let input = "SELECT 40 + 2 AS answer;\n\
                 SELECT count(*) AS runs FROM audit.ingestion_run_log\n  WHERE status LIKE 'succeeded%';\n\
                 CREATE TABLE t (x INT);\n\
                 \\format json\n\
                 SELECT 'a;b' AS s;\n\
                 \\d\n\
                 \\d bronze.hotels\n\
                 SELECT 7 AS last\n";
    let out = piped(&t, input, &["--format", "csv"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "one statement failed: {}", stderr(&out));
    assert!(stderr(&out).contains("read-only"), "{}", stderr(&out));
    assert!(text.starts_with("answer\n42\nruns\n2\n"), "{text}");
    assert!(text.contains("{\"s\":\"a;b\"}"), "{text}");
    // \d: every schema's tables, with the contracts' descriptions
    assert!(
        text.contains("\"schema\":\"bronze\",\"table\":\"hotels_current\""),
        "{text}"
    );
    assert!(
        text.contains("Hotel master data exported by the property-management system"),
        "{text}"
    );
    assert!(text.contains("\"table\":\"ingestion_run_log\""), "{text}");
    // \d bronze.hotels: columns with types and field descriptions
    assert!(
        text.contains("{\"column\":\"hotel_code\",\"type\":\"Utf8\",\"nullable\":\"yes\",\"description\":\"Stable hotel code used by every other source, e.g. AMS01.\"}"),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with("{\"last\":7}"),
        "the last statement needs no ';': {text}"
    );

    let ok = piped(&t, "SELECT 1 AS one;\n", &["--format", "csv"]);
    assert_eq!(ok.status.code(), Some(0));
    assert_eq!(stdout(&ok), "one\n1\n");
}

#[test]
fn the_interactive_shell_on_a_terminal_keeps_going_after_an_error() {
    let t = lake();
    let bin = env!("CARGO_BIN_EXE_ingot");
    let cmd = format!(
        "{bin} --lake '{}' --contracts '{}' sql",
        t.lake().display(),
        t.contracts().display()
    );
    let mut child = std::process::Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env("HOME", t.dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("`script` (util-linux) makes the pseudo-terminal of this test");
    // type each line only once the shell prompts for it (input typed ahead of a prompt may be
    // dropped when the line editor switches the terminal mode)
    let mut stdin = child.stdin.take().unwrap();
    let mut reader = child.stdout.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let collector = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut reader, &mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let prompts = |s: &str| s.matches("ingot> ").count() + s.matches("     -> ").count();
    let lines = [
        "SELECT nosuchcolumn FROM bronze.hotels;",
        "SELECT 6 *",
        "7 AS answer;",
        "\\timing off",
        "\\q",
    ];
    for (i, line) in lines.iter().enumerate() {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while prompts(&seen.lock().unwrap()) <= i {
            assert!(
                std::time::Instant::now() < deadline,
                "no prompt {}: {}",
                i + 1,
                seen.lock().unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
    drop(stdin);
    let status = child.wait().unwrap();
    collector.join().unwrap();
    let text = seen.lock().unwrap().clone();
    let out = std::process::Output {
        status,
        stdout: text.clone().into_bytes(),
        stderr: Vec::new(),
    };
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("ingot sql shell"), "{text}");
    assert!(text.contains("nosuchcolumn"), "the error is shown: {text}");
    assert!(text.contains("42"), "the session went on after the error: {text}");
    assert!(
        text.contains("-> "),
        "a continuation prompt for the second line: {text}"
    );
    assert!(text.contains("row in "), "timing is printed: {text}");
    // history is kept in ~/.ingot_history
    let history = std::fs::read_to_string(t.dir.path().join(".ingot_history")).unwrap();
    assert!(history.contains("7 AS answer;"), "{history}");
}
