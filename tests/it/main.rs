//! The one integration-test binary (each test binary links DataFusion again).

mod api_contract;
mod api_server;
mod bad_input;
mod build_plan;
mod chaos;
#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
mod cluster_security;
mod contracts;
mod crash;
mod current_delta;
mod damage;
mod deletions;
mod delta;
mod evolution;
#[cfg(feature = "flight")]
mod flight;
#[cfg(feature = "flight")]
mod flight_security;
mod fuzz;
mod gc_writers;
mod golden;
mod hashing;
mod hashing_python;
mod held;
mod identity;
mod ingest;
mod kill;
mod layering;
mod model;
mod model_sources;
mod nightly;
mod ops;
mod power;
mod pull;
mod pull_kinds;
mod pull_repair;
#[cfg(feature = "s3")]
mod pull_s3;
mod rederive;
mod rekey;
mod replay;
mod rules;
mod rules_sources;
#[cfg(feature = "s3")]
mod s3;
mod scale;
mod security;
mod shell;
mod silver_anomaly;
mod silver_build;
mod silver_compile;
mod silver_delta;
mod size;
mod slt;
mod sources;
#[cfg(feature = "s3")]
mod sources_s3;
mod sources_shared;
mod undo;
mod util;
mod workspace;
