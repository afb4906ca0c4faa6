//! Operations over a lake, built from the stages below: the nightly job ([`nightly`]), undo of a
//! run or build ([`undo`]), publishing or discarding a held run ([`held`]), replay of failed rows
//! ([`replay`]), natural-key re-versioning ([`rekey`]), decisions on conflicts between sources ([`resolve`]), garbage collection ([`gc`]) and the
//! consistency checks of `ingot doctor` ([`doctor`]) with its check of the committed files'
//! sizes and checksums ([`scrub`]), whose `--fix` derives a damaged bronze file again from its
//! landing file ([`rederive`]).

pub mod compact;
pub mod doctor;
pub mod gc;
pub mod held;
pub mod nightly;
pub mod rederive;
pub mod rekey;
pub mod replay;
pub mod resolve;
pub mod scrub;
pub mod undo;
