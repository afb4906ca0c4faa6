//! Silver: `bronze.<source>_current` cleaned by a versioned [`crate::rules::RuleSet`] (DESIGN.md §4, §5, §7).
//!
//! [`compile`] builds the DataFusion plans of a build (resolve, steps, validations, anomaly
//! flags) without executing anything; [`json`] holds the `to_json_row` UDF the rejected rows use;
//! [`build`] runs the plans and publishes a snapshot of `silver.<table>` (`ingot build`).

pub mod build;
pub mod compile;
pub mod json;
pub mod keys;
