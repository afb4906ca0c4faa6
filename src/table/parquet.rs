//! Parquet files of the lake as DataFusion tables: the schema stored in a file, and listing
//! tables over exactly the files a commit names (never a folder glob, which would also see
//! uncommitted or undone files).

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaBuilder, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::prelude::SessionContext;

use crate::error::Result;
use crate::table::lake::Lake;

/// The Arrow schema stored in one Parquet file ingot wrote (strings stay `Utf8`, not views).
pub async fn file_schema(ctx: &SessionContext, lake: &Lake, rel: &str) -> Result<SchemaRef> {
    let url = ListingTableUrl::parse(lake.url(rel))?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default().with_force_view_types(false)))
        .with_file_extension(".parquet");
    Ok(options.infer_schema(&ctx.state(), &url).await?)
}

/// `schema` with `field` after its fields (its metadata kept): a log's schema with the slot
/// column of its checkpoint, a bronze schema with a segment's.
pub fn with_field(schema: &Schema, field: Field) -> SchemaRef {
    let mut b = SchemaBuilder::from(schema);
    b.push(field);
    Arc::new(b.finish())
}

/// A listing table over one Parquet file ingot wrote, with the schema stored in it.
pub async fn table_over_file(ctx: &SessionContext, lake: &Lake, rel: &str) -> Result<Arc<dyn TableProvider>> {
    let schema = file_schema(ctx, lake, rel).await?;
    table_over(vec![lake.url(rel)], schema)
}

/// A Parquet listing table over exactly `files` (an [`EmptyTable`] when there are none, which a
/// plan sent to a cluster carries as an empty relation, see [`crate::engine::exec`]).
pub fn table_over(files: Vec<String>, schema: SchemaRef) -> Result<Arc<dyn TableProvider>> {
    if files.is_empty() {
        return Ok(Arc::new(EmptyTable::new(schema)));
    }
    let urls = files
        .iter()
        .map(ListingTableUrl::parse)
        .collect::<datafusion::error::Result<Vec<_>>>()?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// Does the object `rel` of `size` bytes end like a Parquet file whose metadata fits in it (its
/// last 8 bytes: the metadata length, then `PAR1`)? Checked before DataFusion opens a cache
/// file, since parquet 59's asynchronous footer decoder panics (debug builds) or reads far out of
/// range on a length larger than the file.
pub async fn check_footer(lake: &Lake, rel: &str, size: u64) -> Result<()> {
    use object_store::ObjectStoreExt;
    let bad = |why: &str| crate::error::Error::RunFailed(format!("{rel}: not a Parquet file ({why})"));
    if size < 12 {
        return Err(bad("too short"));
    }
    let tail = lake
        .store
        .get_range(&lake.path(rel), size - 8..size)
        .await
        .map_err(|e| crate::error::Error::RunFailed(format!("{rel}: {e}")))?;
    if tail.len() != 8 || &tail[4..] != b"PAR1" {
        return Err(bad("no PAR1 footer"));
    }
    let len = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as u64;
    if len + 8 > size {
        return Err(bad("its metadata length exceeds the file"));
    }
    Ok(())
}

/// An async Parquet reader of an object of the lake (the file's size known, its footer checked
/// before the decoder sees it: see [`check_footer`]); ranges are read as the decoder asks.
pub struct LakeReader {
    store: Arc<dyn object_store::ObjectStore>,
    path: object_store::path::Path,
    size: u64,
}

impl datafusion::parquet::arrow::async_reader::AsyncFileReader for LakeReader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, datafusion::parquet::errors::Result<bytes::Bytes>> {
        use futures::FutureExt;
        use object_store::ObjectStoreExt;
        let (store, path) = (self.store.clone(), self.path.clone());
        async move {
            store
                .get_range(&path, range)
                .await
                .map_err(|e| datafusion::parquet::errors::ParquetError::External(Box::new(e)))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a datafusion::parquet::arrow::arrow_reader::ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<
        'a,
        datafusion::parquet::errors::Result<Arc<datafusion::parquet::file::metadata::ParquetMetaData>>,
    > {
        let size = self.size;
        Box::pin(async move {
            let metadata = datafusion::parquet::file::metadata::ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(64 << 10))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        })
    }
}

/// A [`LakeReader`] of the object `rel`.
pub async fn object_reader(lake: &Lake, rel: &str) -> Result<LakeReader> {
    let size = lake
        .size_of(rel)
        .await?
        .ok_or_else(|| crate::error::Error::RunFailed(format!("{}: no such file", lake.url(rel))))?;
    check_footer(lake, rel, size).await?;
    Ok(LakeReader {
        store: lake.store.clone(),
        path: lake.path(rel),
        size,
    })
}

/// The Arrow schema of the Parquet file `rel`, from its footer alone.
pub async fn footer_schema(lake: &Lake, rel: &str) -> Result<SchemaRef> {
    let reader = object_reader(lake, rel).await?;
    let builder = datafusion::parquet::arrow::ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(|e| crate::error::Error::RunFailed(format!("{}: {e}", lake.url(rel))))?;
    Ok(builder.schema().clone())
}

/// Serialize one batch as a complete, uncompressed Parquet file in memory (small audit records).
///
/// Plain pages without statistics: a log record is one row, read back by every command that reads
/// the records after a checkpoint, and a dictionary page and statistics per column made a record
/// 8.7 KB and most of its reading time.
pub fn parquet_bytes(batch: &datafusion::arrow::record_batch::RecordBatch) -> Result<bytes::Bytes> {
    use datafusion::parquet::file::properties::EnabledStatistics;
    let props = crate::table::bronze::uncompressed_properties_for(&batch.schema())
        .into_builder()
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .build();
    let mut buf = Vec::new();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))?;
    w.write(batch)?;
    w.close()?;
    Ok(bytes::Bytes::from(buf))
}
