//! What users declare, from YAML to validated types: the located YAML tree and its key checks
//! ([`yaml`]), field types and their text parsers ([`types`]), source contracts ([`contract`])
//! and silver rule sets ([`rules`]). Nothing here reads data or touches the lake.

pub mod columns;
pub mod contract;
pub mod rules;
pub mod types;
pub mod yaml;
