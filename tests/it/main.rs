//! The one integration-test binary (each test binary links DataFusion again).

mod bad_input;
mod contracts;
mod crash;
#[cfg(feature = "flight")]
mod flight;
mod fuzz;
mod hashing;
mod ingest;
mod kill;
mod nightly;
mod ops;
mod replay;
mod rules;
#[cfg(feature = "s3")]
mod s3;
mod shell;
mod silver_build;
mod silver_compile;
mod slt;
mod undo;
mod util;
