//! The layering of `src/`: every top-level part imports only the parts below it
//! (`error < hash < spec < table < engine < {ingest, silver} < ops < query < cli`; `ingest` and
//! `silver` are peers and never import each other), and the size limits that keep files and
//! functions readable. Paths are read as text from the source files (`crate::<part>` outside
//! comments), so a new upward import fails here before review.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The parts in layer order; parts on one rank are peers.
const PARTS: &[(&str, u32)] = &[
    ("error", 0),
    ("hash", 1),
    ("spec", 2),
    ("table", 3),
    ("engine", 4),
    ("ingest", 5),
    ("silver", 5),
    ("ops", 6),
    ("query", 7),
    ("cli", 8),
];

const MAX_FILE_LINES: usize = 900;
const MAX_FN_LINES: usize = 150;
/// Module docs say role, invariants and hazards; details belong on the items or in docs/.
const MAX_MODULE_DOC_LINES: usize = 16;

fn rank(part: &str) -> Option<u32> {
    PARTS.iter().find(|(p, _)| *p == part).map(|(_, r)| *r)
}

fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&crate::util::repo().join("src"), &mut out);
    out
}

/// The top-level part a file of `src/` belongs to (`None` for `lib.rs` and `main.rs`).
fn part_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    rank(&name).map(|_| name)
}

/// The code of a line without its `//` comment (string literals holding `//` are rare in
/// import lines; a false cut only hides text after it).
fn code(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// Every `crate::<name>` a line's code names.
fn crate_paths(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = code(line);
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `ingot_crate::` and the like
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.push(&rest[..end]);
    }
    out
}

/// `(file:line, from, to)` for every import of a part by a part that may not import it.
fn violations() -> Vec<String> {
    let src = crate::util::repo().join("src");
    let mut out = Vec::new();
    for file in sources() {
        let Some(from) = part_of(&src, &file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            for to in crate_paths(line) {
                let Some(r) = rank(to) else {
                    continue;
                };
                let mine = rank(&from).unwrap();
                if to != from && r >= mine {
                    out.push(format!(
                        "{}:{}: {from} imports {to}: {}",
                        file.strip_prefix(&src).unwrap().display(),
                        i + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn no_part_imports_a_part_above_it_or_a_peer() {
    let v = violations();
    assert!(
        v.is_empty(),
        "imports against the layering (error < hash < spec < table < engine < {{ingest, silver}} < ops < query < \
         cli):\n{}",
        v.join("\n")
    );
}

#[test]
fn every_top_level_module_is_a_known_part() {
    let src = crate::util::repo().join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mods: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let unknown: Vec<&&str> = mods.iter().filter(|m| rank(m).is_none()).collect();
    assert!(
        unknown.is_empty(),
        "modules of lib.rs outside the layering: {unknown:?}"
    );
    let mut names: Vec<&str> = PARTS.iter().map(|(p, _)| *p).collect();
    names.sort();
    let mut mods = mods.clone();
    mods.sort();
    assert_eq!(mods, names, "lib.rs declares exactly the parts of the layering");
}

#[test]
fn the_checker_sees_an_upward_import() {
    // the detector itself: an import from a lower part of a higher one, and comments ignored
    assert_eq!(crate_paths("use crate::silver::build::Built;"), vec!["silver"]);
    assert_eq!(
        crate_paths("let x = crate::ops::gc::gc(ws); // crate::cli"),
        vec!["ops"]
    );
    assert!(crate_paths("//! see [`crate::cli`]").is_empty());
    assert!(crate_paths("use my_crate::thing;").is_empty());
}

/// Lines of every function of `text` (top-level and in `impl` blocks, by indentation).
fn function_lengths(text: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let mut rest = trimmed;
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "async ", "const ", "unsafe "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let rest = rest.strip_prefix("async ").unwrap_or(rest);
        let Some(sig) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = sig.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // a declaration without a body (in a trait) ends with `;` before any `{`
        let body = lines[i..]
            .iter()
            .map(|l| code(l))
            .find(|l| l.contains('{') || l.trim_end().ends_with(';'));
        if body.is_none_or(|l| !l.contains('{')) {
            continue;
        }
        let close = " ".repeat(indent) + "}";
        let end = lines[i + 1..]
            .iter()
            .position(|l| l.starts_with(&close) && !l[indent..].starts_with("} else"))
            .map(|p| i + 1 + p);
        if let Some(end) = end {
            out.push((i + 1, name, end - i + 1));
        }
    }
    out
}

#[test]
fn no_file_function_or_module_doc_is_too_long() {
    let src = crate::util::repo().join("src");
    let mut long: BTreeMap<String, usize> = BTreeMap::new();
    for file in sources() {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(&src).unwrap().display().to_string();
        let n = text.lines().count();
        let doc = text.lines().take_while(|l| l.starts_with("//!")).count();
        if doc > MAX_MODULE_DOC_LINES {
            long.insert(
                format!("{rel}: module doc of {doc} lines (at most {MAX_MODULE_DOC_LINES})"),
                doc,
            );
        }
        if n > MAX_FILE_LINES {
            long.insert(format!("{rel}: {n} lines (at most {MAX_FILE_LINES})"), n);
        }
        for (line, name, len) in function_lengths(&text) {
            if len > MAX_FN_LINES {
                long.insert(
                    format!("{rel}:{line}: fn {name}: {len} lines (at most {MAX_FN_LINES})"),
                    len,
                );
            }
        }
    }
    assert!(
        long.is_empty(),
        "too long:\n{}",
        long.keys().cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn function_lengths_are_measured() {
    let text = r#"fn a() {
    1;
}

trait T {
    fn declared(&self);
}

impl X {
    pub async fn b(&self) {
        if x {
        } else {
        }
    }
}
"#;
    let got = function_lengths(text);
    assert_eq!(got, vec![(1, "a".to_string(), 3), (10, "b".to_string(), 5)]);
}
