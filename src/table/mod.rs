//! The lake's on-disk formats and commit protocol: object stores ([`store`], the local one
//! syncing every write: [`durable`]) and the lake layout with its commit order ([`lake`]), the
//! writer lock ([`lock`]), failpoints for crash tests ([`failpoint`]), bronze runs ([`bronze`])
//! read under later contracts ([`evolve`]) and the audit tables ([`audit`], [`builds`],
//! [`conflicts`], [`decisions`]) with the
//! commit logs they are kept in ([`log`]), which runs are current ([`versions`]); every data file
//! goes up through [`upload`] (parts within S3's multipart rules).

pub mod audit;
pub mod bronze;
pub mod builds;
pub mod commit;
pub mod conflicts;
pub mod counted;
pub mod decisions;
pub mod delta;
pub mod durable;
pub mod evolve;
pub mod failpoint;
pub mod lake;
pub mod lock;
pub mod log;
pub mod parquet;
pub mod segments;
pub mod silver;
pub mod store;
pub mod strict;
pub mod text;
pub mod upload;
pub mod versions;
