//! The `validate:` section: boolean checks on the rows after the steps.

use super::{At, Reader};
use crate::spec::rules::columns::Columns;
use crate::spec::rules::{Action, Validation};
use crate::spec::yaml::{Node, scalar_str};

const VALIDATION_KEYS: &[&str] = &["name", "check", "reason", "action"];

impl Reader<'_> {
    /// One `validate:` entry: a name, a boolean `check`, an optional `reason` and `action`.
    pub(super) fn read_validation(&mut self, item: &Node, cols: Option<&Columns>) -> Option<Validation> {
        let file = self.file;
        let map = self.map_node(item, "a validation", VALIDATION_KEYS)?;
        let name = self.rule_name(&map, "a validation");
        let label = name.clone().unwrap_or_default();
        let check = match map.get("check") {
            None => {
                self.err(map.pos, format!("validation \"{label}\" is missing \"check\""));
                None
            }
            Some(n) => self.expr(n, "check", cols, At::End, true).map(|(e, _)| e),
        };
        let reason = map
            .get("reason")
            .and_then(|n| scalar_str(file, n, "reason", self.problems))
            .map(str::to_string);
        let action = match map.get("action") {
            None => Some(Action::Reject),
            Some(n) => scalar_str(file, n, "action", self.problems).and_then(|s| match s {
                "reject" => Some(Action::Reject),
                "fail" => Some(Action::Fail),
                _ => {
                    self.err(n.pos, format!("action must be one of: reject, fail; found \"{s}\""));
                    None
                }
            }),
        };
        let check = check?;
        Some(Validation {
            name: name?,
            reason: reason.unwrap_or_else(|| format!("check failed: {}", check.sql)),
            check,
            action: action?,
            pos: map.pos,
        })
    }
}
