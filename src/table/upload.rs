//! Writing one lake object of unknown size: held in memory and put whole while it fits in one
//! part, a multipart upload once it outgrows it, within S3's rules for multipart uploads.
//!
//! S3 refuses to complete an upload whose parts before the last are under 5 MiB
//! (`EntityTooSmall`) and allows at most 10,000 parts. A part here is never under [`MIN_PART`]
//! (a writer asks for at least that whatever its memory budget), and the part size doubles every
//! [`PARTS_PER_SIZE`] parts, so 10,000 parts hold up to 1,023,000 first parts (about 5 TB, S3's
//! largest object, at 5 MiB); a file past [`MAX_PARTS`] fails naming it. At most `in_flight`
//! parts are uploading while the next fills; the memory that takes (a filling part plus the parts
//! in flight) is held in DataFusion's pool when the writer has a reservation
//! ([`LakeUpload::with_memory`]), grown past the pool's limit if need be (a writer cannot spill).
//!
//! Hazard: a process killed mid-upload leaves an incomplete multipart upload on S3, which costs
//! storage until it is aborted; `ingot gc` aborts those older than its grace period
//! ([`crate::table::store::Uploads`]). An upload that fails or is dropped unfinished aborts itself
//! (a dropped one in the background, where a runtime is there to run it).

use bytes::Bytes;
use datafusion::execution::memory_pool::MemoryReservation;
use futures::future::BoxFuture;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStoreExt, PutPayloadMut};
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::table::lake::Lake;

/// The smallest part S3 takes for any part but the last.
pub const MIN_PART: usize = 5 << 20;
/// The most parts S3 takes in one upload.
pub const MAX_PARTS: usize = 10_000;
/// The part size doubles after every this many parts.
pub const PARTS_PER_SIZE: usize = 1_000;
/// The first part of a writer that has no memory budget (object_store's default buffer).
pub const DEFAULT_PART: usize = 10 << 20;
/// Parts uploading at once by default (object_store's `BufWriter` default).
pub const DEFAULT_IN_FLIGHT: usize = 8;

/// The size of part `index` (0-based) of an upload whose first part is `first`.
pub fn part_size(first: usize, index: usize) -> usize {
    first.max(MIN_PART) << (index / PARTS_PER_SIZE).min(MAX_PARTS / PARTS_PER_SIZE)
}

/// One object being written to the lake ([`crate::table::bronze::RunFileWriter`] and
/// [`crate::table::bronze::ParallelFileWriter`] write through it; it is parquet's
/// `AsyncFileWriter`).
pub struct LakeUpload {
    /// The lake (its journal of written files, [`Lake::wrote`]) and the object's path in it, its
    /// path in the store and its URL (for errors).
    lake: Lake,
    rel: String,
    path: Path,
    url: String,
    first: usize,
    in_flight: usize,
    /// Bytes of the part being filled.
    buffer: PutPayloadMut,
    /// The multipart upload, once the object outgrew one part.
    multipart: Option<Box<dyn MultipartUpload>>,
    tasks: JoinSet<object_store::Result<()>>,
    /// Parts handed to the upload so far.
    parts: usize,
    memory: Option<MemoryReservation>,
    /// Bytes put so far, and their CRC-32.
    written: u64,
    crc: crc32fast::Hasher,
    done: bool,
}

/// What a commit records of a file it names: its size and the CRC-32 of its bytes (zlib's
/// CRC-32, the IEEE polynomial: `zlib.crc32` in Python, `crc32` in most languages and in S3's
/// checksums), so that `ingot doctor --verify` or any other system can tell the file from a
/// damaged copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    pub bytes: u64,
    /// The CRC-32, shown as 8 lowercase hex digits ([`FileStamp::crc_hex`]).
    pub crc32: u32,
}

impl FileStamp {
    pub fn crc_hex(&self) -> String {
        format!("{:08x}", self.crc32)
    }

    /// The stamp of `bytes`.
    pub fn of(bytes: &[u8]) -> FileStamp {
        FileStamp {
            bytes: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        }
    }
}

impl LakeUpload {
    /// A writer of `rel` whose parts start at `first_part` bytes (at least [`MIN_PART`]), with up
    /// to `in_flight` parts uploading at once (at least one).
    pub fn new(lake: &Lake, rel: &str, first_part: usize, in_flight: usize) -> LakeUpload {
        LakeUpload {
            lake: lake.clone(),
            rel: rel.to_string(),
            path: lake.path(rel),
            url: lake.url(rel),
            first: first_part.max(MIN_PART),
            in_flight: in_flight.max(1),
            buffer: PutPayloadMut::new(),
            multipart: None,
            tasks: JoinSet::new(),
            parts: 0,
            memory: None,
            written: 0,
            crc: crc32fast::Hasher::new(),
            done: false,
        }
    }

    /// The size and CRC-32 of what was put (the whole file once [`LakeUpload::finish`] returned).
    pub fn stamp(&self) -> FileStamp {
        FileStamp {
            bytes: self.written,
            crc32: self.crc.clone().finalize(),
        }
    }

    /// Hold the writer's buffers in `memory` (a reservation of DataFusion's pool): it is grown to
    /// a filling part plus the parts in flight when they need it, and shrinks on finish.
    pub fn with_memory(mut self, memory: MemoryReservation) -> LakeUpload {
        self.memory = Some(memory);
        self.account();
        self
    }

    /// The bytes the buffers may hold now: one part while the object fits in it, a filling part
    /// and the parts in flight once it is a multipart upload.
    fn account(&mut self) {
        let Some(m) = &self.memory else {
            return;
        };
        let part = part_size(self.first, self.parts);
        let need = if self.multipart.is_some() {
            part * (1 + self.in_flight)
        } else {
            part
        };
        if m.size() < need {
            m.grow(need - m.size());
        }
    }

    fn error(&self, e: object_store::Error) -> Error {
        crate::table::store::explain(&self.url, e)
    }

    /// Append `bytes` (no copy: the buffers keep them until their part is sent).
    pub async fn put(&mut self, mut bytes: Bytes) -> Result<()> {
        if self.done {
            return Err(Error::Internal(format!("{}: written after it was finished", self.url)));
        }
        self.crc.update(&bytes);
        self.written += bytes.len() as u64;
        while !bytes.is_empty() {
            let room = part_size(self.first, self.parts) - self.buffer.content_length();
            if bytes.len() < room {
                self.buffer.push(bytes);
                return Ok(());
            }
            self.buffer.push(bytes.split_to(room));
            if let Err(e) = self.send_part().await {
                self.abort().await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Send the filled buffer as the next part, starting the multipart upload on the first.
    async fn send_part(&mut self) -> Result<()> {
        if self.parts >= MAX_PARTS {
            return Err(Error::RunFailed(format!(
                "{}: the file needs more than {MAX_PARTS} parts of a multipart upload, more than S3 \
                 allows (parts of {} MiB and growing); it is larger than an object store object can be",
                self.url,
                self.first >> 20
            )));
        }
        if self.multipart.is_none() {
            let upload = self
                .lake
                .store
                .put_multipart(&self.path)
                .await
                .map_err(|e| self.error(e))?;
            self.multipart = Some(upload);
            self.account();
        }
        while self.tasks.len() >= self.in_flight {
            self.join_one().await?;
        }
        let part = std::mem::take(&mut self.buffer).freeze();
        if let Some(upload) = self.multipart.as_mut() {
            self.tasks.spawn(upload.put_part(part));
        }
        self.parts += 1;
        self.account();
        Ok(())
    }

    async fn join_one(&mut self) -> Result<()> {
        match self.tasks.join_next().await {
            Some(Ok(Ok(()))) | None => Ok(()),
            Some(Ok(Err(e))) => Err(self.error(e)),
            Some(Err(e)) => Err(Error::Internal(format!("{}: a part upload stopped: {e}", self.url))),
        }
    }

    /// Write what is buffered and make the object whole: one put when it never outgrew a part,
    /// else the last part and the upload's completion. On failure the upload is aborted.
    pub async fn finish(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        let result = self.finish_inner().await;
        match &result {
            Ok(()) => self.lake.wrote(&self.rel, self.stamp()),
            Err(_) => self.abort().await,
        }
        self.done = true;
        self.memory = None;
        result
    }

    async fn finish_inner(&mut self) -> Result<()> {
        if self.multipart.is_none() {
            let payload = std::mem::take(&mut self.buffer).freeze();
            self.lake
                .store
                .put(&self.path, payload)
                .await
                .map_err(|e| self.error(e))?;
            return Ok(());
        }
        if self.buffer.content_length() > 0 {
            self.send_part().await?; // the last part, the only one that may be short
        }
        while !self.tasks.is_empty() {
            self.join_one().await?;
        }
        if let Some(upload) = self.multipart.as_mut() {
            let done = upload.complete().await;
            done.map_err(|e| crate::table::store::explain(&self.url, e))?;
        }
        Ok(())
    }

    /// Give up: stop the parts in flight and abort the multipart upload (best effort; gc aborts
    /// one this could not).
    pub async fn abort(&mut self) {
        self.tasks.shutdown().await;
        if let Some(mut upload) = self.multipart.take() {
            let _ = upload.abort().await;
        }
        self.done = true;
        self.memory = None;
    }
}

impl Drop for LakeUpload {
    fn drop(&mut self) {
        // an upload dropped unfinished (its writer failed): abort it in the background
        if let Some(mut upload) = self.multipart.take()
            && !self.done
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(async move {
                let _ = upload.abort().await;
            });
        }
    }
}

impl datafusion::parquet::arrow::async_writer::AsyncFileWriter for LakeUpload {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, datafusion::parquet::errors::Result<()>> {
        Box::pin(async move { self.put(bs).await.map_err(to_parquet) })
    }

    fn complete(&mut self) -> BoxFuture<'_, datafusion::parquet::errors::Result<()>> {
        Box::pin(async move { self.finish().await.map_err(to_parquet) })
    }
}

fn to_parquet(e: Error) -> datafusion::parquet::errors::ParquetError {
    datafusion::parquet::errors::ParquetError::External(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_never_under_s3s_minimum_and_ten_thousand_of_them_reach_s3s_largest_object() {
        assert_eq!(part_size(1 << 20, 0), MIN_PART);
        assert_eq!(part_size(8 << 20, 999), 8 << 20);
        assert_eq!(part_size(8 << 20, 1_000), 16 << 20);
        assert_eq!(part_size(MIN_PART, MAX_PARTS - 1), MIN_PART << 9);
        let total: u128 = (0..MAX_PARTS).map(|i| part_size(MIN_PART, i) as u128).sum();
        assert!(total >= 5 * 1_000_000_000_000, "{total}");
    }

    /// Small objects are one put; larger ones go up in parts of the growing sizes, the object
    /// reads back whole, and the pool holds a filling part plus those in flight until the finish.
    #[tokio::test]
    async fn an_object_larger_than_a_part_goes_up_in_parts_and_reads_back_whole() {
        use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
        use object_store::ObjectStoreExt;
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
        let small = {
            let mut u = LakeUpload::new(&lake, "t/small", 0, 2);
            u.put(Bytes::from_static(b"hello")).await.unwrap();
            u.finish().await.unwrap();
            u.multipart.is_none()
        };
        assert!(small);
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
        let mut u = LakeUpload::new(&lake, "t/big", 0, 2).with_memory(MemoryConsumer::new("u").register(&pool));
        assert_eq!(pool.reserved(), MIN_PART);
        let mut want = Vec::new();
        for i in 0..13u32 {
            let chunk: Vec<u8> = (0..(1 << 20) + 17)
                .map(|j: u32| (i.wrapping_mul(31) ^ j) as u8)
                .collect();
            want.extend_from_slice(&chunk);
            u.put(Bytes::from(chunk)).await.unwrap();
        }
        assert_eq!(u.parts, 2);
        assert_eq!(pool.reserved(), 3 * MIN_PART);
        u.finish().await.unwrap();
        assert_eq!(pool.reserved(), 0);
        let got = lake
            .store
            .get(&lake.path("t/big"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want);
        assert_eq!(u.stamp(), FileStamp::of(&want));
    }
}
