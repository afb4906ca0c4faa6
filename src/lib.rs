//! ingot: idempotent bronze/silver (medallion) batch pipelines on Apache DataFusion.
//!
//! The library is the pipeline; `src/main.rs` only parses arguments. Its parts are layered, each
//! importing only the parts before it (`tests/it/layering.rs` checks this):
//!
//! [`error`] < [`hash`] < [`spec`] < [`table`] < [`engine`] < { [`ingest`], [`silver`] } <
//! [`ops`] < [`query`] < [`cli`]
//!
//! `ingest` and `silver` are peers and never import each other.

pub mod cli;
pub mod engine;
pub mod error;
pub mod hash;
pub mod ingest;
pub mod ops;
pub mod query;
pub mod silver;
pub mod spec;
pub mod table;

pub use error::{Error, Result};
