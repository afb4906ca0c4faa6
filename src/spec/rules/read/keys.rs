//! The keys of a table with several sources: entries of one key namespace must build the same
//! natural-key fingerprint, and a `shared_key` maps a namespaced entry's ids onto the key of
//! the entries without one (one resolve per part, from its own key fields, of the part's type).

use super::Reader;
use super::sources::Entry;
use crate::spec::contract::Contract;

impl Reader<'_> {
    /// Entries of one key namespace must build the same natural-key fingerprint.
    pub(super) fn check_keys(&mut self, entries: &[Entry]) {
        let mut firsts: Vec<(Option<&str>, &Entry, &Contract)> = Vec::new();
        for e in entries {
            let Some(c) = e.contract.as_deref() else { continue };
            let ns = e.key_namespace.as_deref();
            let Some((_, first, fc)) = firsts.iter().find(|(n, _, _)| *n == ns) else {
                firsts.push((ns, e, c));
                continue;
            };
            let diffs = key_differences(fc, c);
            if diffs.is_empty() {
                continue;
            }
            let msg = format!(
                "sources \"{}\" and \"{}\" do not build the same natural_key_fingerprint: {}; the candidates of one record would never meet. Give both contracts the same natural key, or set key_namespace on one to keep their keys apart",
                first.source.as_deref().unwrap_or(""),
                e.source.as_deref().unwrap_or(""),
                diffs.join(", ")
            );
            self.err(e.source_pos, msg);
        }
    }

    /// `shared_key:` names, for a namespaced entry, one `resolve` of its contract per part of
    /// the key of the entries without a namespace: each from one of its own key fields (so every
    /// version of a record maps alike), its value of that part's type.
    pub(super) fn check_shared_keys(&mut self, entries: &[Entry]) {
        let shared = entries
            .iter()
            .find(|e| e.key_namespace.is_none())
            .and_then(|e| Some((e, e.contract.as_deref()?)));
        for e in entries {
            let Some(at) = e.shared_key_pos else { continue };
            let name = e.source.as_deref().unwrap_or("");
            if e.key_namespace.is_none() {
                self.err(
                    at,
                    format!("shared_key maps a namespaced source's keys to the shared ones, but source \"{name}\" has no key_namespace: its keys already are the shared ones; remove shared_key or add key_namespace"),
                );
                continue;
            }
            let Some((first, target)) = shared else {
                self.err(
                    at,
                    "shared_key maps keys to those of the sources without a key_namespace, and every source of this table has one",
                );
                continue;
            };
            let Some(c) = e.contract.as_deref() else { continue };
            let parts = &target.natural_key.fields;
            if e.shared_key.len() != parts.len() {
                let names: Vec<&str> = parts
                    .iter()
                    .filter_map(|i| target.fields.get(*i))
                    .map(|f| f.name.as_str())
                    .collect();
                self.err(
                    at,
                    format!(
                        "shared_key of \"{name}\" names {} resolve entries, but the shared key of \"{}\" has {} part(s) ({}): name one resolve per part, in that order",
                        e.shared_key.len(),
                        first.source.as_deref().unwrap_or(""),
                        parts.len(),
                        names.join(", ")
                    ),
                );
                continue;
            }
            let mut seen: Vec<&str> = Vec::new();
            for ((r_name, pos), part) in e.shared_key.iter().zip(parts) {
                let Some(r) = c.resolve.iter().find(|r| r.name == *r_name) else {
                    let known: Vec<&str> = c.resolve.iter().map(|r| r.name.as_str()).collect();
                    self.err(
                        *pos,
                        format!(
                            "\"{r_name}\" is not a resolve entry of contract \"{name}\"; its resolve entries are: {}",
                            if known.is_empty() {
                                "(none)".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    );
                    continue;
                };
                if seen.contains(&r_name.as_str()) {
                    self.err(*pos, format!("resolve \"{r_name}\" is named twice in shared_key"));
                    continue;
                }
                seen.push(r_name);
                let key_fields: Vec<&str> = c
                    .natural_key
                    .fields
                    .iter()
                    .filter_map(|i| c.fields.get(*i))
                    .map(|f| f.name.as_str())
                    .collect();
                if !key_fields.contains(&r.from.as_str()) {
                    self.err(
                        *pos,
                        format!(
                            "resolve \"{r_name}\" maps from \"{}\", which is not a natural_key field of \"{name}\" ({}): a shared key must come from the record's own key, or two versions of one record could map apart",
                            r.from,
                            key_fields.join(", ")
                        ),
                    );
                }
                let (Some(want), Some(have)) = (
                    target.fields.get(*part),
                    self.contracts
                        .contracts
                        .get(&r.lookup)
                        .and_then(|l| l.field_index(&r.value).map(|i| &l.fields[i])),
                ) else {
                    continue;
                };
                if want.ty.key_name() != have.ty.key_name() {
                    self.err(
                        *pos,
                        format!(
                            "resolve \"{r_name}\" gives {}.{} of type {}, but part \"{}\" of the shared key is {}: the fingerprints would never meet",
                            r.lookup,
                            r.value,
                            have.ty.name(),
                            want.name,
                            want.ty.name()
                        ),
                    );
                }
            }
        }
    }
}

/// How the natural keys of two contracts differ, as the fingerprint sees them: key version,
/// arity, and each part's type and normalize steps.
fn key_differences(a: &Contract, b: &Contract) -> Vec<String> {
    let mut out = Vec::new();
    let (ka, kb) = (&a.natural_key, &b.natural_key);
    if ka.version != kb.version {
        out.push(format!("key version {} vs {}", ka.version, kb.version));
    }
    if ka.fields.len() != kb.fields.len() {
        out.push(format!("key arity {} vs {}", ka.fields.len(), kb.fields.len()));
    }
    for (i, (&ia, &ib)) in ka.fields.iter().zip(kb.fields.iter()).enumerate() {
        let (Some(fa), Some(fb)) = (a.fields.get(ia), b.fields.get(ib)) else {
            continue;
        };
        // the fingerprint hashes canonical text: int32 and int64 key parts meet
        if fa.ty.key_name() != fb.ty.key_name() {
            out.push(format!("part {} type {} vs {}", i + 1, fa.ty.name(), fb.ty.name()));
        }
        let na: Vec<&str> = fa.normalize.iter().map(|s| s.name()).collect();
        let nb: Vec<&str> = fb.normalize.iter().map(|s| s.name()).collect();
        if na != nb {
            out.push(format!(
                "part {} normalize [{}] vs [{}]",
                i + 1,
                na.join(", "),
                nb.join(", ")
            ));
        }
    }
    out
}
