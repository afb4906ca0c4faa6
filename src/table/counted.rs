//! Counting of object-store operations: with `INGOT_STORE_STATS=1` the lake's store is wrapped
//! in [`Counted`], and `ingot` prints one line to stderr as it exits,
//! `store operations: get=G head=H list=L put=P delete=D`, every read and write of the command
//! (DataFusion's scans too: they go through the same store). What the scale tests compare: a
//! command on a long history must make as many operations as on a short one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions,
};

static GET: AtomicU64 = AtomicU64::new(0);
static HEAD: AtomicU64 = AtomicU64::new(0);
static LIST: AtomicU64 = AtomicU64::new(0);
static PUT: AtomicU64 = AtomicU64::new(0);
static DELETE: AtomicU64 = AtomicU64::new(0);

/// Is counting on (`INGOT_STORE_STATS` set and not `0`)?
pub fn enabled() -> bool {
    std::env::var("INGOT_STORE_STATS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `store` wrapped for counting when [`enabled`].
pub fn wrap(store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
    if enabled() {
        Arc::new(Counted { inner: store })
    } else {
        store
    }
}

/// The line `ingot` prints at exit when counting is on.
pub fn summary() -> Option<String> {
    enabled().then(|| {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "store operations: get={} head={} list={} put={} delete={}",
            n(&GET),
            n(&HEAD),
            n(&LIST),
            n(&PUT),
            n(&DELETE)
        )
    })
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// An object store that counts the calls it passes on.
#[derive(Debug)]
pub struct Counted {
    inner: Arc<dyn ObjectStore>,
}

impl std::fmt::Display for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Counted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        count(&PUT);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        count(&PUT);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        count(if options.head { &HEAD } else { &GET });
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        count(&GET);
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(
            locations
                .map(|l| {
                    count(&DELETE);
                    l
                })
                .boxed(),
        )
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        count(&LIST);
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        count(&LIST);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        count(&LIST);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        count(&PUT);
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        count(&PUT);
        self.inner.rename_opts(from, to, options).await
    }
}
