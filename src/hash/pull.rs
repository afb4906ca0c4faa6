//! The `file_hash` of an API pull: the SHA-256 of its normalised response
//! (docs/formats.md#file_hash-of-an-api-pull), so a pull of unchanged records hashes alike
//! whatever the vendor's record order, white space, number spelling (`12.5`, `12.50`) or
//! `volatile` fields, and a re-pull is skipped as an identical file is.
//!
//! The message is `ingot-pull 1\n` then one element and `\n` per record: `<fingerprint>|<row_hash>`
//! (as formats.md defines both) for a record that types under the contract, `rejected|<SHA-256
//! of its line>` for one that does not; elements sorted as byte strings (so rejected records
//! come last), a record delivered twice counted twice. The ids `9007199254740993` and
//! `9007199254740992` stay two records: nothing goes through a floating-point number.
//!
//! Hazard: these bytes are what other systems recompute; any change is a new version (`2`).

use sha2::{Digest, Sha256};

use crate::hash::{HEX_VALUE, hex_lower};

/// The first line of the message: the format and its version.
pub const HEADER: &[u8] = b"ingot-pull 1\n";

/// The elements of a pull's hash, gathered record by record in any order (64 bytes a typed
/// record, 32 a rejected one).
#[derive(Debug, Default, Clone)]
pub struct PullHash {
    typed: Vec<([u8; 32], [u8; 32])>,
    rejected: Vec<[u8; 32]>,
}

/// 64 lowercase hex characters as the 32 bytes they spell (`None` otherwise). Byte order of the
/// result is the order of the text: `0-9` sort before `a-f` in ASCII as in value.
fn digest_of(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let (hi, lo) = (HEX_VALUE[pair[0] as usize], HEX_VALUE[pair[1] as usize]);
        // uppercase hex is not what ingot writes: refused rather than folded
        if hi > 0x0f || lo > 0x0f || pair.iter().any(u8::is_ascii_uppercase) {
            return None;
        }
        out[i] = (hi << 4) | lo;
    }
    Some(out)
}

impl PullHash {
    pub fn new() -> PullHash {
        PullHash::default()
    }

    /// A record that typed under the contract: its `natural_key_fingerprint` and `row_hash`
    /// (64 lowercase hex characters each). `false`, and nothing added, when either is not.
    pub fn add(&mut self, fingerprint: &str, row_hash: &str) -> bool {
        match (digest_of(fingerprint), digest_of(row_hash)) {
            (Some(fp), Some(rh)) => {
                self.typed.push((fp, rh));
                true
            }
            _ => false,
        }
    }

    /// A record the contract rejected: its line, the record's JSON text as the response had it
    /// with the white space between tokens removed.
    pub fn add_rejected(&mut self, line: &[u8]) {
        self.rejected.push(Sha256::digest(line).into());
    }

    /// How many records were added.
    pub fn len(&self) -> usize {
        self.typed.len() + self.rejected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hash: 64 lowercase hex characters.
    pub fn finish(mut self) -> String {
        self.typed.sort_unstable();
        self.rejected.sort_unstable();
        let mut h = Sha256::new();
        h.update(HEADER);
        let (mut a, mut b) = ([0u8; 64], [0u8; 64]);
        for (fp, rh) in &self.typed {
            hex_lower(fp, &mut a);
            hex_lower(rh, &mut b);
            h.update(a);
            h.update(b"|");
            h.update(b);
            h.update(b"\n");
        }
        for r in &self.rejected {
            hex_lower(r, &mut a);
            h.update(b"rejected|");
            h.update(a);
            h.update(b"\n");
        }
        hex_lower(&h.finalize().into(), &mut a);
        a.iter().map(|&c| c as char).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(text: &str) -> String {
        let mut out = [0u8; 64];
        hex_lower(&Sha256::digest(text.as_bytes()).into(), &mut out);
        out.iter().map(|&c| c as char).collect()
    }

    #[test]
    fn the_message_is_the_header_then_the_sorted_elements_each_with_a_newline() {
        assert_eq!(PullHash::new().finish(), sha("ingot-pull 1\n"));
        let (f1, r1, f2, r2) = (sha("f1"), sha("r1"), sha("f2"), sha("r2"));
        let line = br#"{"id":"x1"}"#;
        let mut lines = [format!("{f1}|{r1}"), format!("{f2}|{r2}")];
        lines.sort();
        let want = sha(&format!(
            "ingot-pull 1\n{}\n{}\nrejected|{}\n",
            lines[0],
            lines[1],
            sha(r#"{"id":"x1"}"#)
        ));
        // any order in, one hash out
        let mut a = PullHash::new();
        a.add_rejected(line);
        assert!(a.add(&f2, &r2));
        assert!(a.add(&f1, &r1));
        let mut b = PullHash::new();
        assert!(b.add(&f1, &r1));
        b.add_rejected(line);
        assert!(b.add(&f2, &r2));
        assert_eq!(a.len(), 3);
        assert_eq!(a.finish(), want);
        assert_eq!(b.finish(), want);
    }

    #[test]
    fn a_record_delivered_twice_counts_twice_and_a_changed_row_hash_changes_the_hash() {
        let (f, r) = (sha("f"), sha("r"));
        let mut once = PullHash::new();
        once.add(&f, &r);
        let mut twice = once.clone();
        twice.add(&f, &r);
        let mut changed = PullHash::new();
        changed.add(&f, &sha("r2"));
        let (once, twice, changed) = (once.finish(), twice.finish(), changed.finish());
        assert_ne!(once, twice);
        assert_ne!(once, changed);
    }

    #[test]
    fn only_lowercase_hex_digests_are_taken() {
        let good = sha("x");
        let mut h = PullHash::new();
        for bad in [
            good.to_uppercase(),
            good[..63].to_string(),
            format!("{}g", &good[..63]),
            String::new(),
        ] {
            assert!(!h.add(&bad, &good), "{bad}");
            assert!(!h.add(&good, &bad), "{bad}");
        }
        assert!(h.is_empty());
    }
}
