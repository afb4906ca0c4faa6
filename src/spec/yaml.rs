//! A YAML tree that remembers where every node stands in its file.
//!
//! Contracts and rules are validated by hand from this tree rather than through serde, so that
//! `ingot check` can report *every* problem of a file at once, each at its own line and column
//! (serde stops at the first error and forgets positions). Anchors/aliases are not supported:
//! contracts are meant to be read by people, and an alias is reported as an error.
//!
//! The key-checking toolkit at the end ([`MapNode`], [`scalar_str`], [`seq`], ...) is shared by
//! the contract and rules readers: each reports a located problem and returns `None`, never stops.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::error::Located;

/// Position of a node: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A scalar with its text and whether it was quoted (quoted scalars are always strings).
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    /// Keys in file order. Duplicate keys are kept so the validator can report them.
    Map(Vec<(Node, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: Kind,
    pub pos: Pos,
}

impl Node {
    /// The scalar's text, if this is a scalar (null `~`/empty counts as a scalar too).
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, quoted: false } if text.is_empty() || text == "~" || text == "null")
    }

    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            Kind::Scalar { .. } if self.is_null() => "null",
            Kind::Scalar { .. } => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }
}

/// A parsed YAML file plus an error sink: validators push located problems and go on.
pub struct Doc {
    pub file: PathBuf,
    pub root: Node,
}

/// Collects located problems for one or more files.
#[derive(Debug, Default)]
pub struct Problems {
    pub items: Vec<Located>,
}

impl Problems {
    pub fn push(&mut self, file: &Path, pos: Pos, message: impl Into<String>) {
        self.items.push(Located {
            file: file.to_path_buf(),
            line: pos.line,
            column: pos.column,
            message: message.into(),
        });
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Parse `text` (the contents of `file`) into a [`Doc`]. A syntax error is returned located.
pub fn parse(file: &Path, text: &str) -> Result<Doc, Located> {
    let mut builder = Builder {
        end: end_of(text),
        ..Builder::default()
    };
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut builder, false) {
        let pos = builder.pos_of(*e.marker());
        return Err(Located {
            file: file.to_path_buf(),
            line: pos.line,
            column: pos.column,
            message: format!("invalid YAML: {}", e.info()),
        });
    }
    if let Some((pos, msg)) = builder.error {
        return Err(Located {
            file: file.to_path_buf(),
            line: pos.line,
            column: pos.column,
            message: msg,
        });
    }
    let root = builder.root.unwrap_or(Node {
        kind: Kind::Map(Vec::new()),
        pos: Pos { line: 1, column: 1 },
    });
    Ok(Doc {
        file: file.to_path_buf(),
        root,
    })
}

/// Parse `text`, or record its syntax error in `problems` and return `None`.
pub fn parse_or_report(file: &Path, text: &str, problems: &mut Problems) -> Option<Doc> {
    match parse(file, text) {
        Ok(d) => Some(d),
        Err(located) => {
            problems.items.push(located);
            None
        }
    }
}

enum Frame {
    Seq(Pos, Vec<Node>),
    Map(Pos, Vec<(Node, Node)>, Option<Node>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
    error: Option<(Pos, String)>,
    /// The position just after the last character of the text.
    end: Pos,
}

/// The position just after the last character of `text` (YAML line breaks: `\n`, `\r\n` and a
/// lone `\r`).
fn end_of(text: &str) -> Pos {
    let b = text.as_bytes();
    let (mut line, mut start) = (1, 0);
    for i in 0..b.len() {
        if b[i] == b'\n' || (b[i] == b'\r' && b.get(i + 1) != Some(&b'\n')) {
            line += 1;
            start = i + 1;
        }
    }
    Pos {
        line,
        column: text[start..].chars().count() + 1,
    }
}

impl Builder {
    /// A marker as a position inside the text: yaml-rust2 markers are 1-based lines and 0-based
    /// columns, and its end-of-input marker may point one line past the end.
    fn pos_of(&self, mark: Marker) -> Pos {
        let pos = Pos {
            line: mark.line().max(1),
            column: mark.col() + 1,
        };
        if pos.line > self.end.line { self.end } else { pos }
    }
}

impl Builder {
    fn finish(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Frame::Seq(_, items)) => items.push(node),
            Some(Frame::Map(_, entries, pending)) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => entries.push((key, node)),
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let pos = self.pos_of(mark);
        match ev {
            Event::Scalar(text, style, _, _) => {
                let quoted = !matches!(style, TScalarStyle::Plain);
                self.finish(Node {
                    kind: Kind::Scalar { text, quoted },
                    pos,
                });
            }
            Event::SequenceStart(..) => self.stack.push(Frame::Seq(pos, Vec::new())),
            Event::MappingStart(..) => self.stack.push(Frame::Map(pos, Vec::new(), None)),
            Event::SequenceEnd => {
                if let Some(Frame::Seq(p, items)) = self.stack.pop() {
                    self.finish(Node {
                        kind: Kind::Seq(items),
                        pos: p,
                    });
                }
            }
            Event::MappingEnd => {
                if let Some(Frame::Map(p, entries, _)) = self.stack.pop() {
                    self.finish(Node {
                        kind: Kind::Map(entries),
                        pos: p,
                    });
                }
            }
            Event::Alias(_) => {
                if self.error.is_none() {
                    self.error = Some((pos, "YAML aliases (*name) are not supported in ingot files".into()));
                }
                self.finish(Node {
                    kind: Kind::Scalar {
                        text: String::new(),
                        quoted: false,
                    },
                    pos,
                });
            }
            _ => {}
        }
    }
}

// ---- key checks shared by the contract and rules readers ---------------------------------------

/// Reads a mapping node, reporting unknown and duplicate keys against the valid ones.
pub(crate) struct MapNode<'a> {
    entries: Vec<(&'a str, &'a Node, &'a Node)>,
    pub pos: Pos,
}

impl<'a> MapNode<'a> {
    /// `None` (with a problem) when `node` is not a mapping.
    pub(crate) fn new(
        file: &Path,
        node: &'a Node,
        what: &str,
        valid: &[&str],
        problems: &mut Problems,
    ) -> Option<MapNode<'a>> {
        let Kind::Map(entries) = &node.kind else {
            problems.push(
                file,
                node.pos,
                format!("{what} must be a mapping, found {}", node.kind_name()),
            );
            return None;
        };
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (k, v) in entries {
            let Some(key) = k.as_str() else {
                problems.push(file, k.pos, format!("{what}: keys must be plain names"));
                continue;
            };
            if !valid.contains(&key) {
                problems.push(
                    file,
                    k.pos,
                    format!("unknown key \"{key}\" in {what}; valid keys are: {}", valid.join(", ")),
                );
                continue;
            }
            if !seen.insert(key) {
                problems.push(file, k.pos, format!("duplicate key \"{key}\" in {what}"));
                continue;
            }
            out.push((key, k, v));
        }
        Some(MapNode {
            entries: out,
            pos: node.pos,
        })
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a Node> {
        self.entries.iter().find(|(k, _, _)| *k == key).map(|(_, _, v)| *v)
    }
}

/// Scalar readers shared by the contract and rules validators.
pub(crate) fn scalar_str<'n>(file: &Path, node: &'n Node, what: &str, problems: &mut Problems) -> Option<&'n str> {
    match node.as_str() {
        Some(s) if !node.is_null() => Some(s),
        _ => {
            problems.push(
                file,
                node.pos,
                format!("{what} must be a text value, found {}", node.kind_name()),
            );
            None
        }
    }
}

pub(crate) fn scalar_int(file: &Path, node: &Node, what: &str, min: i64, problems: &mut Problems) -> Option<i64> {
    let s = scalar_str(file, node, what, problems)?;
    match s.trim().parse::<i64>() {
        Ok(v) if v >= min => Some(v),
        _ => {
            problems.push(
                file,
                node.pos,
                format!("{what} must be an integer >= {min}, found \"{s}\""),
            );
            None
        }
    }
}

pub(crate) fn scalar_bool(file: &Path, node: &Node, what: &str, problems: &mut Problems) -> Option<bool> {
    let s = scalar_str(file, node, what, problems)?;
    match s {
        "true" => Some(true),
        "false" => Some(false),
        _ => {
            problems.push(file, node.pos, format!("{what} must be true or false, found \"{s}\""));
            None
        }
    }
}

/// A duration: `<digits>(ms|s|m|h|d)`, e.g. `500ms`, `30s`, `5m`; zero is allowed (callers that
/// need more say so).
pub(crate) fn scalar_duration(file: &Path, node: &Node, what: &str, problems: &mut Problems) -> Option<Duration> {
    let s = scalar_str(file, node, what, problems)?;
    let d = parse_duration(s);
    if d.is_none() {
        problems.push(
            file,
            node.pos,
            format!("{what} \"{s}\" is not a duration: use a number with ms, s, m, h or d (e.g. 500ms, 30s, 5m)"),
        );
    }
    d
}

/// `<digits>(ms|s|m|h|d)`, nothing around it; `None` otherwise or past 100 years.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() || digits.len() > 12 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    let total = n.checked_mul(ms)?;
    (total <= 100 * 365 * 86_400_000).then(|| Duration::from_millis(total))
}

/// A duration as a contract writes it: the largest unit that divides it (`90s`, `2m`, `500ms`).
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms > 0 && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

pub(crate) fn seq<'n>(file: &Path, node: &'n Node, what: &str, problems: &mut Problems) -> Option<&'n [Node]> {
    match &node.kind {
        Kind::Seq(items) => Some(items),
        _ => {
            problems.push(
                file,
                node.pos,
                format!("{what} must be a list, found {}", node.kind_name()),
            );
            None
        }
    }
}

pub(crate) fn is_valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{parse_duration, show_duration};

    #[test]
    fn durations_are_digits_and_one_unit() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2d"), Some(Duration::from_secs(2 * 86_400)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        for bad in [
            "",
            "30",
            "s",
            "30 s",
            " 30s",
            "30s ",
            "1.5s",
            "-1s",
            "30sec",
            "1w",
            "99999999999999d",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        assert_eq!(show_duration(Duration::from_secs(60)), "1m");
        assert_eq!(show_duration(Duration::from_secs(90)), "90s");
        assert_eq!(show_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show_duration(Duration::ZERO), "0ms");
    }
}
