//! Where plans run: the DataFusion session and its memory pool ([`session`]), the SQL catalog
//! over the lake ([`catalog`]) with the plan of `bronze.<source>_current` ([`current`]), local or cluster execution ([`exec`]), hash joins for joins with
//! a small side ([`joins`]), list columns made per batch ([`lists`]), the slot lookup that ranks a source's versions ([`slots`]) and the
//! Ballista cluster (`cluster`, cargo feature `cluster`).

pub mod catalog;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod compact;
pub mod current;
pub mod exec;
pub mod joins;
pub mod lazy;
pub mod lists;
pub mod session;
pub mod slots;
