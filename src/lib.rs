//! ingot: idempotent bronze/silver (medallion) batch pipelines on Apache DataFusion.
//!
//! The library is the pipeline; `src/main.rs` only parses arguments. Module map:
//! [`contract`] (source contracts), [`hash`] (hashing kernels and SQL UDFs), [`ingest`] (files
//! to bronze runs), [`bronze`] and [`audit`] (tables and their writers), [`lake`] (object store
//! and commit protocol), [`store`] (S3 and other URLs), [`lock`], [`catalog`] (SQL tables), [`session`], [`exec`] (where
//! plans run: here or on a cluster, `cluster`), [`silver`] (rules to silver builds), [`nightly`],
//! [`undo`], [`rekey`], [`gc`], [`doctor`], [`cli`].

pub mod audit;
pub mod bronze;
pub mod catalog;
pub mod cli;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod contract;
pub mod doctor;
pub mod error;
pub mod exec;
pub mod failpoint;
pub mod gc;
pub mod hash;
pub mod ingest;
pub mod lake;
pub mod landing;
pub mod lock;
pub mod nightly;
pub mod output;
pub mod rekey;
pub mod replay;
pub mod rules;
#[cfg(feature = "flight")]
pub mod serve;
pub mod session;
pub mod shell;
pub mod silver;
pub mod sql;
pub mod store;
pub mod undo;
pub mod yaml;

pub use error::{Error, Result};
