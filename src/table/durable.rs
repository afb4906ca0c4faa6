//! The local lake's object store: every write is on the disk before it returns.
//!
//! object_store's `LocalFileSystem` writes a staging file and renames it into place without an
//! fsync, so after a power loss a committed record can come back empty. [`DurableLocal`] writes
//! the staging file (`<name>#<n>`, the same naming, so listings skip it and `gc` removes leftovers),
//! syncs its content, links or renames it into place, then syncs the directory and every directory
//! this process has not yet made durable up to the lake root. So a put that returned survives a
//! power loss whole, and one that did not is absent or whole: never a torn file. The commit
//! protocol ([`crate::table::lake`]) puts a run's data before its record, so a record that survives
//! names data that survived. Reads, listings and deletes go to `LocalFileSystem` unchanged; a
//! delete is not synced (a removed file can come back after a power loss; gc removes it again).
//!
//! [`Disk`] is what the store asks of the disk; tests put a disk in its place that forgets what was
//! not synced. `INGOT_SYNC=0` turns the syncs off (scratch lakes, measuring their cost).

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};

/// A put option ([`PutOptions::extensions`]) for a hint that may be lost: the object is written
/// and put in place like any other, but not synced (a power loss may leave an older one, or none).
/// Other stores ignore it.
#[derive(Debug, Clone, Copy)]
pub struct Unsynced;

/// What the durable store asks of the disk. [`Fsync`] is the real one.
pub trait Disk: Send + Sync + std::fmt::Debug + 'static {
    /// Make the content of `file` (open at `path`) durable.
    fn sync_file(&self, file: &File, path: &FsPath) -> std::io::Result<()>;
    /// Make the entries of directory `dir` durable.
    fn sync_dir(&self, dir: &FsPath) -> std::io::Result<()>;
    /// `len` bytes at `offset` of a streamed write were just written: a hint to start writing
    /// them back, so the final sync waits only for the last part.
    fn written(&self, _file: &File, _offset: u64, _len: u64) {}
    /// `path` now names what was written to `staging` (after the link or rename).
    fn linked(&self, _staging: &FsPath, _path: &FsPath) -> std::io::Result<()> {
        Ok(())
    }
    /// Asked before every change: a disk that is gone (a simulated power loss) refuses.
    fn writable(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The real disk: `fsync` of files and directories (none when `INGOT_SYNC=0`).
#[derive(Debug, Clone, Copy)]
pub struct Fsync {
    pub enabled: bool,
}

impl Fsync {
    /// Syncing unless the environment says `INGOT_SYNC=0`.
    pub fn from_env() -> Fsync {
        Fsync {
            enabled: std::env::var("INGOT_SYNC").map(|v| v.trim() != "0").unwrap_or(true),
        }
    }
}

impl Disk for Fsync {
    fn sync_file(&self, file: &File, _path: &FsPath) -> std::io::Result<()> {
        if self.enabled { file.sync_data() } else { Ok(()) }
    }

    fn sync_dir(&self, dir: &FsPath) -> std::io::Result<()> {
        if self.enabled {
            File::open(dir)?.sync_all()
        } else {
            Ok(())
        }
    }

    fn written(&self, file: &File, offset: u64, len: u64) {
        if self.enabled {
            start_writeback(file, offset, len);
        }
    }
}

/// A local lake's object store; see the module documentation.
#[derive(Debug, Clone)]
pub struct DurableLocal {
    inner: Arc<LocalFileSystem>,
    disk: Arc<dyn Disk>,
    /// The lake root: directories are made durable up to it.
    root: PathBuf,
    /// Directories whose entry in their parent this process has synced.
    durable_dirs: Arc<Mutex<HashSet<PathBuf>>>,
}

impl std::fmt::Display for DurableLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DurableLocal({})", self.root.display())
    }
}

const STORE: &str = "DurableLocal";

fn generic(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: Box::new(e),
    }
}

fn io_at(path: &FsPath, e: std::io::Error) -> object_store::Error {
    generic(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

impl DurableLocal {
    /// The store of the lake rooted at `root` (an absolute directory), syncing through `disk`.
    pub fn new(root: PathBuf, disk: Arc<dyn Disk>) -> DurableLocal {
        DurableLocal {
            inner: Arc::new(LocalFileSystem::new()),
            disk,
            root,
            durable_dirs: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Sync the directory holding `path`, then the entry of every directory between it and the
    /// root that this process has not synced yet (a directory a write just created).
    fn sync_entries(&self, path: &FsPath) -> std::io::Result<()> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        self.disk.sync_dir(parent)?;
        let mut chain = Vec::new();
        let mut dir = parent;
        while dir != self.root && dir.starts_with(&self.root) {
            let known = self
                .durable_dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(dir);
            let Some(up) = dir.parent() else { break };
            if known {
                break;
            }
            self.disk.sync_dir(up)?;
            chain.push(dir.to_path_buf());
            dir = up;
        }
        // Only once the whole chain is durable: a failure half-way syncs it again next time.
        self.durable_dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(chain);
        Ok(())
    }

    /// Put `staging` (written and synced) in place at `dest`, then make the entry durable.
    fn publish(&self, staging: &FsPath, dest: &FsPath, mode: &PutMode, sync: bool) -> object_store::Result<()> {
        match mode {
            PutMode::Create => match std::fs::hard_link(staging, dest) {
                Ok(()) => {
                    let _ = std::fs::remove_file(staging);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let _ = std::fs::remove_file(staging);
                    return Err(object_store::Error::AlreadyExists {
                        path: dest.display().to_string(),
                        source: Box::new(e),
                    });
                }
                Err(e) => return Err(io_at(dest, e)),
            },
            _ => std::fs::rename(staging, dest).map_err(|e| io_at(dest, e))?,
        }
        self.disk.linked(staging, dest).map_err(|e| io_at(dest, e))?;
        if !sync {
            return Ok(());
        }
        self.sync_entries(dest).map_err(|e| io_at(dest, e))
    }

    fn put_blocking(
        &self,
        dest: PathBuf,
        payload: PutPayload,
        mode: PutMode,
        sync: bool,
    ) -> object_store::Result<PutResult> {
        self.disk.writable().map_err(|e| io_at(&dest, e))?;
        let (mut file, staging) = new_staged(&dest)?;
        let written = (|| {
            for chunk in payload.iter() {
                file.write_all(chunk).map_err(|e| io_at(&staging, e))?;
            }
            if sync {
                self.disk.sync_file(&file, &staging).map_err(|e| io_at(&staging, e))?;
            }
            file.metadata().map_err(|e| io_at(&staging, e))
        })();
        drop(file);
        let meta = match written {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&staging);
                return Err(e);
            }
        };
        if let Err(e) = self.publish(&staging, &dest, &mode, sync) {
            let _ = std::fs::remove_file(&staging);
            return Err(e);
        }
        Ok(PutResult {
            e_tag: Some(etag(&meta)),
            version: None,
        })
    }
}

/// Is `name` a staging file of an unfinished write (`<name>#<digits>`, written, then renamed or
/// linked into place)? No listing shows one; `gc` removes leftovers of killed writes.
pub fn is_staging_name(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(base, n)| !base.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A new staging file `<dest>#<n>` (creating the directories), like `LocalFileSystem`'s.
fn new_staged(dest: &FsPath) -> object_store::Result<(File, PathBuf)> {
    let mut n = 1u32;
    loop {
        let mut name = dest.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let path = PathBuf::from(name);
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dir = dest.parent().unwrap_or(dest);
                std::fs::create_dir_all(dir).map_err(|e| io_at(dir, e))?;
            }
            Err(e) => return Err(io_at(&path, e)),
        }
        if n > 1_000_000 {
            return Err(generic(std::io::Error::other(format!(
                "{}: no free staging name",
                dest.display()
            ))));
        }
    }
}

/// The ETag `LocalFileSystem` gives the same file (inode, modification time, size).
fn etag(meta: &std::fs::Metadata) -> String {
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(meta);
    #[cfg(not(unix))]
    let inode = 0u64;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::SystemTime::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("{inode:x}-{mtime:x}-{:x}", meta.len())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> object_store::Result<T> + Send + 'static,
) -> object_store::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(generic)?
}

#[async_trait]
impl ObjectStore for DurableLocal {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if matches!(opts.mode, PutMode::Update(_)) || !opts.attributes.is_empty() {
            // As LocalFileSystem: no compare-and-swap, no attributes.
            return self.inner.put_opts(location, payload, opts).await;
        }
        let dest = self.inner.path_to_filesystem(location)?;
        let this = self.clone();
        let sync = opts.extensions.get::<Unsynced>().is_none();
        blocking(move || this.put_blocking(dest, payload, opts.mode, sync)).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        if !opts.attributes.is_empty() {
            return self.inner.put_multipart_opts(location, opts).await;
        }
        let dest = self.inner.path_to_filesystem(location)?;
        let (this, at) = (self.clone(), dest.clone());
        let (file, staging) = blocking(move || {
            this.disk.writable().map_err(|e| io_at(&at, e))?;
            new_staged(&at)
        })
        .await?;
        Ok(Box::new(Upload {
            store: self.clone(),
            state: Arc::new(UploadState {
                file: Mutex::new(file),
                dest,
            }),
            staging: Some(staging),
            offset: 0,
        }))
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
        if let Err(e) = self.disk.writable() {
            let message = e.to_string();
            return locations
                .map(move |_| Err(generic(std::io::Error::other(message.clone()))))
                .boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        // A flat folder (a log's records): compare the names before making paths of them.
        // `LocalFileSystem` converts every entry to a path (percent-encoding it) before its
        // offset filter, which costs more than the listing on a folder of 10,000 records.
        let dir = prefix.and_then(|p| self.inner.path_to_filesystem(p).ok());
        let (Some(prefix), Some(dir)) = (prefix.cloned(), dir) else {
            return self.inner.list_with_offset(prefix, offset);
        };
        let (inner, offset) = (self.inner.clone(), offset.clone());
        let (fallback_prefix, fallback_offset) = (prefix.clone(), offset.clone());
        futures::stream::once(async move {
            match blocking(move || Ok(names_after(&dir, &prefix, &offset))).await {
                Ok(Some(paths)) => {
                    let heads = inner.clone();
                    futures::stream::iter(paths)
                        .then(move |p| {
                            let store = heads.clone();
                            async move { object_store::ObjectStoreExt::head(&*store, &p).await }
                        })
                        // a record removed since the listing is not listed
                        .filter(|r| std::future::ready(!matches!(r, Err(object_store::Error::NotFound { .. }))))
                        .boxed()
                }
                // not a flat folder of plain names: the store's own listing
                Ok(None) => inner.list_with_offset(Some(&fallback_prefix), &fallback_offset),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.disk.writable().map_err(generic)?;
        self.inner.copy_opts(from, to, options).await?;
        let dest = self.inner.path_to_filesystem(to)?;
        let this = self.clone();
        blocking(move || this.sync_entries(&dest).map_err(|e| io_at(&dest, e))).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        self.disk.writable().map_err(generic)?;
        self.inner.rename_opts(from, to, options).await?;
        let dest = self.inner.path_to_filesystem(to)?;
        let this = self.clone();
        blocking(move || this.sync_entries(&dest).map_err(|e| io_at(&dest, e))).await
    }
}

/// The objects of the folder `dir` (object path `prefix`) whose paths sort after `offset`,
/// sorted; `None` when the folder holds a subfolder or a name that is no plain object path (the
/// caller lists it the store's way). A missing folder has none.
fn names_after(dir: &FsPath, prefix: &Path, offset: &Path) -> Option<Vec<Path>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Vec::new()),
        Err(_) => return None,
    };
    // the offset names an object of this folder (a log record): compare names, and make paths
    // only of the few after it (a log folder holds a record per commit of its history)
    let after = offset
        .prefix_match(prefix)
        .map(|mut parts| (parts.next(), parts.next()))
        .and_then(|(name, more)| more.is_none().then_some(name).flatten())
        .map(|name| name.as_ref().to_string());
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.ok()?;
        if !entry.file_type().ok()?.is_file() {
            return None;
        }
        let name = entry.file_name().into_string().ok()?;
        if after.as_deref().is_some_and(|a| name.as_str() <= a) {
            continue;
        }
        // names the store would percent-encode are listed its way
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._=-#".contains(&b)) {
            return None;
        }
        // a staging file is no object, as in `LocalFileSystem`'s listings
        if is_staging_name(&name) {
            continue;
        }
        let path = Path::parse(format!("{}/{name}", prefix.as_ref())).ok()?;
        if path > *offset {
            out.push(path);
        }
    }
    out.sort();
    Some(out)
}

#[derive(Debug)]
struct UploadState {
    file: Mutex<File>,
    dest: PathBuf,
}

/// A streamed write (large data files): parts written at their offsets into the staging file,
/// synced and put in place on completion.
#[derive(Debug)]
struct Upload {
    store: DurableLocal,
    state: Arc<UploadState>,
    /// `None` once completed or aborted.
    staging: Option<PathBuf>,
    offset: u64,
}

#[async_trait]
impl MultipartUpload for Upload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let offset = self.offset;
        self.offset += data.content_length() as u64;
        let state = Arc::clone(&self.state);
        let disk = Arc::clone(&self.store.disk);
        Box::pin(blocking(move || {
            disk.writable().map_err(|e| io_at(&state.dest, e))?;
            let file = state.file.lock().unwrap_or_else(|e| e.into_inner());
            write_at(&file, &data, offset).map_err(|e| io_at(&state.dest, e))?;
            disk.written(&file, offset, data.content_length() as u64);
            Ok(())
        }))
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let staging = self
            .staging
            .take()
            .ok_or_else(|| generic(std::io::Error::other("the upload was completed or aborted already")))?;
        let state = Arc::clone(&self.state);
        let store = self.store.clone();
        blocking(move || {
            store.disk.writable().map_err(|e| io_at(&state.dest, e))?;
            let file = state.file.lock().unwrap_or_else(|e| e.into_inner());
            store.disk.sync_file(&file, &staging).map_err(|e| io_at(&staging, e))?;
            let meta = file.metadata().map_err(|e| io_at(&staging, e))?;
            if let Err(e) = store.publish(&staging, &state.dest, &PutMode::Overwrite, true) {
                let _ = std::fs::remove_file(&staging);
                return Err(e);
            }
            Ok(PutResult {
                e_tag: Some(etag(&meta)),
                version: None,
            })
        })
        .await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        if let Some(staging) = self.staging.take() {
            blocking(move || match std::fs::remove_file(&staging) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_at(&staging, e)),
            })
            .await?;
        }
        Ok(())
    }
}

impl Drop for Upload {
    /// An upload dropped before completing (the writer failed) leaves no staging file.
    fn drop(&mut self) {
        if let Some(staging) = self.staging.take() {
            let _ = std::fs::remove_file(staging);
        }
    }
}

#[cfg(unix)]
fn write_at(file: &File, data: &PutPayload, mut offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    for chunk in data.iter() {
        file.write_all_at(chunk, offset)?;
        offset += chunk.len() as u64;
    }
    Ok(())
}

#[cfg(not(unix))]
fn write_at(file: &File, data: &PutPayload, offset: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    for chunk in data.iter() {
        f.write_all(chunk)?;
    }
    Ok(())
}

/// Start writing a just-written range back to the disk without waiting (Linux; elsewhere nothing).
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the lifetime of `file`; the call only schedules writeback.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}
