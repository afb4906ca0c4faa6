//! `ingot serve` fit to expose, tested with the real ADBC client (tests/py/flight_secure.py):
//! TLS with a certificate the test makes, the token from a file or the environment (wrong,
//! shortened or missing tokens refused), startup refusals (empty token, a public address in
//! clear text), a query past its timeout cancelled, the limit on running queries honoured, and
//! the catalog reused until the lake changes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::flight::venv_python;
use crate::util::{TestLake, assert_ok, landing, stderr};

/// A running `ingot serve`: its address, and its stderr lines as they come.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(t: &TestLake, args: &[&str], envs: &[(&str, &str)]) -> Server {
        let mut c = t.command();
        c.env_remove("INGOT_TOKEN");
        for (k, v) in envs {
            c.env(k, v);
        }
        let mut child = c
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let mut first = String::new();
        BufReader::new(stdout).read_line(&mut first).unwrap();
        let addr = first
            .strip_prefix("listening on ")
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line: {first:?}; stderr: {:?}", log.lock().unwrap()))
            .to_string();
        Server { child, addr, log }
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn client(args: &[&str]) -> Value {
    crate::flight::py_json(&venv_python(), "tests/py/flight_secure.py", args)
}

fn error_of<'a>(got: &'a Value, step: &str) -> &'a str {
    got[step]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{step} succeeded: {got}"))
}

/// A lake with the demo's bookings loaded.
fn lake_with_bookings() -> TestLake {
    let t = TestLake::new();
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    t
}

fn count_bookings(t: &TestLake) -> Value {
    let n = t.query("SELECT count(*) AS n FROM bronze.bookings")[0]["n"].clone();
    serde_json::json!([[n]])
}

#[test]
fn tls_with_a_token_from_a_file_serves_and_refuses_wrong_missing_and_untrusted() {
    let t = lake_with_bookings();
    let (cert, key, ca) = crate::flight::make_cert(t.dir.path());
    let token_file = t.dir.path().join("token");
    std::fs::write(&token_file, "correct horse battery staple\n").unwrap();
    set_mode(&token_file, 0o600);
    let server = Server::start(
        &t,
        &[
            "--addr",
            "127.0.0.1:0",
            "--token-file",
            token_file.to_str().unwrap(),
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[],
    );
    let uri = format!("grpc+tls://{}", server.addr);
    let got = client(&["tls", &uri, "correct horse battery staple", ca.to_str().unwrap()]);
    assert_eq!(got["with_token"], count_bookings(&t), "{got}");
    for step in ["wrong_token", "prefix_of_token", "no_token"] {
        let e = error_of(&got, step);
        assert!(e.contains("bearer token is required"), "{step}: {e}");
    }
    // a client that does not trust the certificate, and one speaking clear text, get nothing
    for step in ["untrusted_certificate", "plain_text"] {
        let e = error_of(&got, step);
        assert!(!e.contains("bearer token"), "{step} reached the service: {e}");
    }
    assert!(
        !server.log().iter().any(|l| l.contains("warning")),
        "{:?}",
        server.log()
    );
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn serve_refuses_empty_tokens_and_clear_text_off_loopback_at_startup() {
    let t = lake_with_bookings();
    let run = |args: &[&str], envs: &[(&str, &str)]| {
        let mut c = t.command();
        c.env_remove("INGOT_TOKEN");
        for (k, v) in envs {
            c.env(k, v);
        }
        c.arg("serve").args(args).output().unwrap()
    };
    // an empty INGOT_TOKEN, a token file without a token, both ways at once, a token argument
    let empty_file = t.dir.path().join("empty-token");
    std::fs::write(&empty_file, "\n").unwrap();
    // (arguments, environment, what the error says)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--addr", "127.0.0.1:0"],
            vec![("INGOT_TOKEN", "")],
            "INGOT_TOKEN is set but empty",
        ),
        (
            vec!["--addr", "127.0.0.1:0", "--token-file", empty_file.to_str().unwrap()],
            vec![],
            "the file holds no token",
        ),
        (
            vec!["--addr", "127.0.0.1:0", "--token-file", empty_file.to_str().unwrap()],
            vec![("INGOT_TOKEN", "x")],
            "give the token one way",
        ),
        (vec!["--addr", "127.0.0.1:0", "--token", "s3cret"], vec![], "--token"),
        (
            vec!["--addr", "0.0.0.0:0"],
            vec![],
            "not a loopback address, without TLS and a token",
        ),
        (
            vec!["--addr", "0.0.0.0:0"],
            vec![("INGOT_TOKEN", "s3cret")],
            "not a loopback address, without TLS",
        ),
        (
            vec!["--query-timeout", "soon"],
            vec![],
            "--query-timeout: invalid duration",
        ),
    ];
    for (args, envs, want) in cases {
        let out = run(&args, &envs);
        assert_eq!(out.status.code(), Some(2), "{args:?} {envs:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(want),
            "{args:?}: want `{want}` in {}",
            stderr(&out)
        );
    }
    // --insecure says so explicitly: it serves, with a warning
    let server = Server::start(&t, &["--addr", "0.0.0.0:0", "--insecure"], &[]);
    assert!(server.addr.starts_with("0.0.0.0:"), "{}", server.addr);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        server.log().iter().any(|l| l.contains("warning: --insecure")),
        "{:?}",
        server.log()
    );
}

#[test]
fn a_query_past_its_timeout_is_cancelled_and_waiting_queries_get_its_slot() {
    let t = lake_with_bookings();
    let server = Server::start(
        &t,
        &["--addr", "127.0.0.1:0", "--max-queries", "1", "--query-timeout", "3s"],
        &[],
    );
    let got = client(&["limits", &format!("grpc://{}", server.addr)]);
    assert_eq!(got["endless_first_batch"], true, "{got}");
    // the short query ran only once the endless one lost its slot, and got the right answer
    assert_eq!(got["short"], count_bookings(&t), "{got}");
    let waits = server
        .log()
        .iter()
        .filter(|l| l.contains("a query waits for a slot: 1 running (--max-queries)"))
        .count();
    assert_eq!(waits, 1, "{:?}", server.log());
    let e = error_of(&got, "endless_rest");
    assert!(
        e.contains("query cancelled: it ran longer than the server's --query-timeout of 3s"),
        "{e}"
    );
}

#[test]
fn the_catalog_is_opened_once_while_the_lake_stands_still_and_again_after_a_commit() {
    let t = lake_with_bookings();
    let token = "s3cret-catalog";
    let server = Server::start(&t, &["--addr", "127.0.0.1:0"], &[("INGOT_TOKEN", token)]);
    let uri = format!("grpc://{}", server.addr);
    let opened = |s: &Server| s.log().iter().filter(|l| l.contains("catalog opened")).count();
    let ask = || client(&["count", &uri, token])["count"].clone();
    let before = ask();
    assert_eq!(before, count_bookings(&t));
    ask();
    // once at startup; the calls of two clients reused it
    assert_eq!(opened(&server), 1, "{:?}", server.log());
    let out = t.ingest("bookings", &landing("bookings/2026-11-03_bookings.csv"));
    assert_ok(&out);
    let after = ask();
    assert_eq!(after, count_bookings(&t), "the new run is served");
    assert_ne!(after, before);
    assert_eq!(opened(&server), 2, "{:?}", server.log());
}
