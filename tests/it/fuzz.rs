//! Fuzz targets (proptest, in process): the contract parser, the rules parser and the CSV/NDJSON
//! loader get mutated copies of real inputs. No input may panic; every rejection of a contract or
//! rules file is a located problem inside the file; every loader outcome is a committed run whose
//! counts reconcile or a failed run whose error names what was wrong; and after all of it the
//! lake passes `doctor` (nothing committed was lost or corrupted).
//!
//! Seeds: the repository's contracts, rules and data files plus `tests/fuzz/corpus/`. Cases per
//! target: 4,000 for each parser and 40 for the loader in `make test`; `INGOT_FUZZ_CASES=N` runs N
//! per parser and N/50 loader runs (`make fuzz`: 200,000 and 4,000). Failing cases are kept by proptest in `tests/fuzz/regressions/` (commit them: they are
//! the corpus of past bugs and are replayed first).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ingot::spec::contract::{Contract, ContractSet};
use ingot::spec::rules::RuleSet;
use ingot::spec::yaml::Problems;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::util::repo;

fn cases(default: u32) -> u32 {
    std::env::var("INGOT_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(|n: u32| if default < 100 { (n / 50).max(1) } else { n })
        .unwrap_or(default)
}

/// `regressions`: the file (under tests/fuzz/regressions/) where proptest keeps failing cases;
/// they are replayed first on every run.
fn config(cases: u32, regressions: &'static str) -> Config {
    Config {
        cases,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            regressions,
        ))),
        ..Config::default()
    }
}

fn read_dir_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_dir_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn seeds(dirs: &[&str], ext: &[&str]) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for d in dirs {
        read_dir_files(&repo().join(d), &mut files);
    }
    files
        .into_iter()
        .filter(|p| ext.iter().any(|e| p.to_string_lossy().ends_with(e)))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Bytes that matter to YAML, CSV and JSON parsers.
const INTERESTING: &[u8] = b",\"\n\r{}[]:'\\#-|>&*!%@` \t0123456789.eE+abcxyz\xff\xc3\xa9\x00";

/// One edit of a seed: what, where (a fraction of the length), with which bytes.
#[derive(Debug, Clone)]
enum Edit {
    Flip(u16, u8),
    Insert(u16, Vec<u8>),
    Delete(u16, u8),
    DuplicateLine(u16),
    SwapLines(u16, u16),
    Truncate(u16),
}

fn edit() -> impl Strategy<Value = Edit> {
    let byte = prop::sample::select(INTERESTING.to_vec());
    prop_oneof![
        (any::<u16>(), byte.clone()).prop_map(|(p, b)| Edit::Flip(p, b)),
        (any::<u16>(), prop::collection::vec(byte, 1..6)).prop_map(|(p, v)| Edit::Insert(p, v)),
        (any::<u16>(), 1u8..40).prop_map(|(p, n)| Edit::Delete(p, n)),
        any::<u16>().prop_map(Edit::DuplicateLine),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        any::<u16>().prop_map(Edit::Truncate),
    ]
}

fn at(len: usize, p: u16) -> usize {
    (len as u64 * p as u64 / u16::MAX as u64) as usize
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        match e {
            Edit::Flip(p, x) if !b.is_empty() => {
                let i = at(b.len() - 1, *p);
                b[i] = *x;
            }
            Edit::Insert(p, v) => {
                let i = at(b.len(), *p);
                b.splice(i..i, v.iter().copied());
            }
            Edit::Delete(p, n) => {
                let i = at(b.len(), *p);
                let j = (i + *n as usize).min(b.len());
                b.drain(i..j);
            }
            Edit::DuplicateLine(p) | Edit::SwapLines(p, _) => {
                let mut lines: Vec<Vec<u8>> = b.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
                let i = at(lines.len().saturating_sub(1), *p);
                match e {
                    Edit::SwapLines(_, q) => {
                        let j = at(lines.len().saturating_sub(1), *q);
                        lines.swap(i, j);
                    }
                    _ => {
                        let l = lines[i].clone();
                        lines.insert(i, l);
                    }
                }
                b = lines.join(&b'\n');
            }
            Edit::Truncate(p) => {
                let i = at(b.len(), *p);
                b.truncate(i);
            }
            _ => {}
        }
    }
    b
}

/// A seed (by index) and the edits to make to it.
fn mutation(n_seeds: usize) -> impl Strategy<Value = (usize, Vec<Edit>)> {
    (0..n_seeds, prop::collection::vec(edit(), 0..8))
}

/// Every problem is inside the file: line 1..=lines+1, column >= 1, a message, the file named.
fn assert_located(problems: &Problems, path: &Path, text: &str) -> Result<(), TestCaseError> {
    // YAML line breaks: \n, \r\n and a lone \r each end a line
    let b = text.as_bytes();
    let breaks = (0..b.len())
        .filter(|&i| b[i] == b'\n' || (b[i] == b'\r' && b.get(i + 1) != Some(&b'\n')))
        .count();
    let lines = breaks + 1;
    for p in &problems.items {
        prop_assert_eq!(&p.file, path, "problem names another file: {}", p);
        prop_assert!(
            p.line >= 1 && p.line <= lines.max(1),
            "line out of the file ({} lines): {}",
            lines,
            p
        );
        prop_assert!(p.column >= 1, "column 0: {}", p);
        prop_assert!(!p.message.trim().is_empty(), "empty message at {}", p);
    }
    Ok(())
}

#[test]
fn fuzz_the_contract_parser() {
    let seeds = seeds(
        &["contracts", "bench/contracts", "tests/fuzz/corpus/contracts"],
        &[".yaml"],
    );
    assert!(seeds.len() >= 5);
    let mut runner = TestRunner::new(config(cases(4000), "tests/fuzz/regressions/contracts.txt"));
    runner
        .run(&mutation(seeds.len()), |(i, edits)| {
            let (path, seed) = &seeds[i];
            let text = String::from_utf8_lossy(&apply(seed, &edits)).into_owned();
            let mut problems = Problems::default();
            let parsed = Contract::from_str(path, &text, &mut problems);
            assert_located(&problems, path, &text)?;
            prop_assert!(
                parsed.is_some() || !problems.items.is_empty(),
                "a contract was refused without a problem"
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn fuzz_the_rules_parser() {
    let mut ignored = Problems::default();
    let contracts = ContractSet::load(&repo().join("contracts"), &mut ignored);
    assert!(ignored.items.is_empty());
    let seeds = seeds(&["rules", "tests/fuzz/corpus/rules"], &[".yaml"]);
    assert!(seeds.len() >= 4);
    let mut runner = TestRunner::new(config(cases(4000), "tests/fuzz/regressions/rules.txt"));
    runner
        .run(&mutation(seeds.len()), |(i, edits)| {
            let (path, seed) = &seeds[i];
            let text = String::from_utf8_lossy(&apply(seed, &edits)).into_owned();
            let mut problems = Problems::default();
            let parsed = RuleSet::from_str(path, &text, &contracts, &mut problems);
            assert_located(&problems, path, &text)?;
            prop_assert!(
                parsed.is_some() || !problems.items.is_empty(),
                "rules refused without a problem"
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn fuzz_the_csv_and_ndjson_loader() {
    use ingot::table::audit::RunStatus;
    let dir = tempfile::tempdir().unwrap();
    let lake = ingot::table::lake::Lake::open(&dir.path().join("lake").display().to_string()).unwrap();
    let ws = ingot::engine::session::Workspace {
        contracts_dir: repo().join("contracts"),
        rules_dir: repo().join("rules"),
        landing_dir: dir.path().join("landing"),
        memory_limit: 256 << 20,
        ..ingot::engine::session::Workspace::new(lake)
    };
    let mut ignored = Problems::default();
    let contracts = ContractSet::load(&ws.contracts_dir, &mut ignored);
    // (source, extension, seed bytes)
    let mut inputs: Vec<(String, &'static str, Vec<u8>)> = Vec::new();
    for (path, bytes) in seeds(
        &["data/landing", "data/bad", "tests/fuzz/corpus/landing"],
        &[".csv", ".ndjson"],
    ) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let source = ["bookings", "hotels", "marketing_spend", "site_traffic", "web_sessions"]
            .into_iter()
            .find(|s| name.contains(s))
            .unwrap_or("bookings");
        let ext = if name.ends_with(".ndjson") { "ndjson" } else { "csv" };
        inputs.push((source.to_string(), ext, bytes));
    }
    assert!(inputs.len() >= 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let opts = ingot::ingest::IngestOptions::default();
    let counter = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = TestRunner::new(config(cases(40), "tests/fuzz/regressions/loader.txt"));
    runner
        .run(&mutation(inputs.len()), |(i, edits)| {
            let (source, ext, seed) = &inputs[i];
            let bytes = apply(seed, &edits);
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let file = dir.path().join(format!("case-{n}-{source}.{ext}"));
            std::fs::write(&file, &bytes).unwrap();
            let contract: Arc<Contract> = contracts.contracts[source.as_str()].clone();
            let outcome = rt.block_on(ingot::ingest::ingest_file(&ws, contract, &file, &opts));
            match outcome {
                Ok(r) => match r.status {
                    RunStatus::Failed => {
                        let e = r.error.clone().unwrap_or_default();
                        prop_assert!(!e.trim().is_empty(), "a failed run without an error");
                    }
                    RunStatus::SkippedDuplicateFile => {}
                    _ => prop_assert_eq!(
                        r.rows_seen,
                        r.rows_inserted + r.rows_updated + r.rows_unchanged + r.rows_failed,
                        "counts do not reconcile: {:?}",
                        r
                    ),
                },
                Err(e) => prop_assert!(false, "ingest returned an error instead of a failed run: {}", e),
            }
            Ok(())
        })
        .unwrap();
    // nothing committed was lost or corrupted on the way
    let report = rt.block_on(ingot::ops::doctor::doctor(&ws)).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(report.orphans.is_empty(), "{:?}", report.orphans);
}
