//! The store DataFusion's scans read through: a listing of a prefix that names a Parquet file
//! is an error. A listing table over an explicit file HEADs it and, when the file is missing,
//! lists it as a prefix instead (datafusion-datasource 55, `ListingTableUrl::list_prefixed_files`),
//! so a run file, segment or checkpoint removed by hand would read as no rows at all. ingot
//! itself lists only folders, so such a listing can only be that fallback.

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions,
};

/// `store` with listings of file names refused.
pub fn wrap(store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
    Arc::new(Strict { inner: store })
}

/// Does a listing of `prefix` stand for a file DataFusion could not find?
fn names_a_file(prefix: Option<&Path>) -> bool {
    prefix
        .and_then(|p| p.filename())
        .is_some_and(|f| f.ends_with(".parquet"))
}

fn missing(prefix: &Path) -> object_store::Error {
    object_store::Error::NotFound {
        path: prefix.to_string(),
        source: format!(
            "{prefix} is named by a committed record but missing from the lake (removed by hand?); \
             `ingot doctor` lists what is missing"
        )
        .into(),
    }
}

/// An object store that refuses to list a prefix naming a Parquet file (see the module docs).
#[derive(Debug)]
pub struct Strict {
    inner: Arc<dyn ObjectStore>,
}

impl std::fmt::Display for Strict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Strict({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Strict {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match prefix {
            Some(p) if names_a_file(prefix) => Box::pin(futures::stream::once(std::future::ready(Err(missing(p))))),
            _ => self.inner.list(prefix),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        match prefix {
            Some(p) if names_a_file(prefix) => Err(missing(p)),
            _ => self.inner.list_with_delimiter(prefix).await,
        }
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}
