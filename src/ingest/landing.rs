//! Inputs of an ingest: local files, and landing files on an object store given as URLs
//! (`s3://bucket/landing/bookings/2026-11-01.csv`, quoted globs such as
//! `'s3://bucket/landing/bookings/*.csv'`, or a `--landing s3://bucket/landing` folder that the
//! nightly job scans). A remote file is streamed into a scratch file under `TMPDIR` (which needs
//! room for the largest landing file), removed when the run ends; the run records its URL and
//! the hash and size of the bytes actually read.
//!
//! Symbolic links (drop zones let their users make them) are never followed blindly: a scan of
//! `<landing>/<source>/` takes a link only when it resolves to a regular file inside the landing
//! folder (ingested as that file), a glob only within its own folder; other links are skipped
//! and reported. A link named on the command line is followed. Inputs are opened with
//! `O_NOFOLLOW` ([`open_input`]): a file swapped for a link after listing fails its run.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};
use crate::table::store;

/// A landing file or glob match that was not taken, and why (for the run summary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// The inputs a scan or a command line found, and what it passed over.
#[derive(Debug, Default)]
pub struct Found {
    pub inputs: Vec<Input>,
    pub skipped: Vec<Skipped>,
}

/// Open an input file for reading without following a symbolic link in its last component
/// (`O_NOFOLLOW`): a landing file swapped for a link after it was listed is refused, not read
/// through the link.
pub fn open_input(path: &FsPath, display: &str) -> Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    options.open(path).map_err(|e| {
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ELOOP) {
            return Error::RunFailed(format!(
                "{display}: is a symbolic link (was the file replaced after it was listed?); ingot \
                 reads inputs without following links: name the file the link points to"
            ));
        }
        Error::io(display, e)
    })
}

/// What to do with a local path found by a scan or a glob: `Ok(path to read)` for a regular file
/// (a link's target when it resolves to one inside `root`), `Err(reason)` for a link it skips,
/// and `None` for anything else (folders, sockets, links to folders inside `root`).
fn local_candidate(path: &FsPath, root: &FsPath) -> Option<std::result::Result<PathBuf, String>> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if meta.is_file() {
        return Some(Ok(path.to_path_buf()));
    }
    if !meta.file_type().is_symlink() {
        return None;
    }
    let target = match std::fs::canonicalize(path) {
        Ok(t) => t,
        Err(e) => return Some(Err(format!("a symbolic link that does not resolve ({e})"))),
    };
    if !target.starts_with(root) {
        return Some(Err(link_outside(&target, root)));
    }
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.is_file() => Some(Ok(target)),
        _ => None,
    }
}

/// Why a link is skipped: it leads to `target`, outside `root`.
fn link_outside(target: &FsPath, root: &FsPath) -> String {
    format!(
        "a symbolic link to {}, outside {}: links are followed only within it",
        target.display(),
        root.display()
    )
}

/// `dir` resolved (links and `..` taken out), or `dir` itself when it cannot be.
fn resolved(dir: &FsPath) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// The folder a local glob starts in: its text up to the last `/` before the first glob
/// character (`.` for a glob without one).
fn glob_root(glob: &str) -> PathBuf {
    let first = glob.find(['*', '?', '[']).unwrap_or(glob.len());
    match glob[..first].rfind('/') {
        Some(0) => PathBuf::from("/"),
        Some(i) => PathBuf::from(&glob[..i]),
        None => PathBuf::from("."),
    }
}

/// One input file of an ingest.
#[derive(Debug, Clone)]
pub enum Input {
    Local(PathBuf),
    Remote(RemoteFile),
}

/// A file on an object store.
#[derive(Clone)]
pub struct RemoteFile {
    /// Its URL, as recorded in the run log.
    pub url: String,
    store: Arc<dyn ObjectStore>,
    location: Path,
    /// Size in bytes when it was listed.
    pub size: u64,
}

impl std::fmt::Debug for RemoteFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFile")
            .field("url", &self.url)
            .field("size", &self.size)
            .finish()
    }
}

/// A remote file's local copy; removed on drop.
pub struct Scratch {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Input {
    /// The path or URL, for messages and the run log.
    pub fn display(&self) -> String {
        match self {
            Input::Local(p) => p.display().to_string(),
            Input::Remote(r) => r.url.clone(),
        }
    }

    /// The file name (last path segment).
    pub fn file_name(&self) -> String {
        match self {
            Input::Local(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            Input::Remote(r) => r.location.filename().unwrap_or_default().to_string(),
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> Result<u64> {
        match self {
            Input::Local(p) => Ok(std::fs::symlink_metadata(p)
                .map_err(|e| Error::io(p.display(), e))?
                .len()),
            Input::Remote(r) => Ok(r.size),
        }
    }

    /// SHA-256 of the bytes as stored (a remote file is streamed, not copied).
    pub async fn digest(&self) -> Result<String> {
        match self {
            Input::Local(p) => Ok(crate::ingest::file_digest(p).await?.0),
            Input::Remote(r) => r.digest().await,
        }
    }
}

impl RemoteFile {
    async fn stream(&self) -> Result<futures::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>> {
        let got = self
            .store
            .get(&self.location)
            .await
            .map_err(|e| store::explain(&self.url, e))?;
        Ok(got.into_stream())
    }

    /// SHA-256 of the object's bytes, streamed.
    pub async fn digest(&self) -> Result<String> {
        let mut stream = self.stream().await?;
        let mut h = Sha256::new();
        while let Some(chunk) = stream.next().await {
            h.update(chunk.map_err(|e| store::explain(&self.url, e))?);
        }
        let digest: [u8; 32] = h.finalize().into();
        let mut hex = [0u8; 64];
        crate::hash::hex_lower(&digest, &mut hex);
        Ok(String::from_utf8_lossy(&hex).into_owned())
    }

    /// Stream the object into a scratch file of the same name (the name's `.gz` matters).
    pub async fn fetch(&self) -> Result<Scratch> {
        let dir = tempfile::Builder::new()
            .prefix("ingot-landing-")
            .tempdir()
            .map_err(|e| Error::io("temporary directory (TMPDIR)", e))?;
        let name = self
            .location
            .filename()
            .filter(|n| !n.is_empty())
            .unwrap_or("input")
            .to_string();
        let path = dir.path().join(name);
        let mut file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| Error::io(path.display(), e))?;
        let mut stream = self.stream().await?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| store::explain(&self.url, e))?;
            file.write_all(&chunk).await.map_err(|e| Error::io(path.display(), e))?;
        }
        file.flush().await.map_err(|e| Error::io(path.display(), e))?;
        file.sync_all().await.map_err(|e| Error::io(path.display(), e))?;
        Ok(Scratch { _dir: dir, path })
    }
}

/// Object stores opened so far, by the URL of the store (one client per bucket).
#[derive(Default)]
struct Stores(BTreeMap<String, Arc<dyn ObjectStore>>);

impl Stores {
    /// The store of `location`, its URL and the path of `location` in it.
    fn open(&mut self, location: &str) -> Result<(Arc<dyn ObjectStore>, String, Path)> {
        let opened = store::open(location)?;
        let key = opened.store_url.as_str().trim_end_matches('/').to_string();
        let store = self.0.entry(key.clone()).or_insert(opened.store).clone();
        Ok((store, key, opened.path))
    }
}

fn remote(store: &Arc<dyn ObjectStore>, base: &str, location: Path, size: u64) -> RemoteFile {
    RemoteFile {
        url: format!("{base}/{location}"),
        store: store.clone(),
        location,
        size,
    }
}

/// Expand the command line's paths, globs and URLs into existing files, sorted by path or URL,
/// deduplicated. Symbolic links matched by a glob are taken only within the glob's folder (see
/// the module docs); the others are returned as skipped.
pub async fn expand_inputs(inputs: &[String]) -> Result<Found> {
    let mut out: BTreeMap<String, Input> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut stores = Stores::default();
    for input in inputs {
        if store::is_remote(input) {
            for file in expand_remote(&mut stores, input).await? {
                out.insert(file.url.clone(), Input::Remote(file));
            }
            continue;
        }
        let input = input.strip_prefix("file://").unwrap_or(input);
        if input.contains(['*', '?', '[']) && std::fs::symlink_metadata(input).is_err() {
            let matches = glob::glob(input).map_err(|e| Error::Invalid(format!("invalid glob \"{input}\": {e}")))?;
            let root = resolved(&glob_root(input));
            let mut any = false;
            let before = skipped.len();
            for m in matches {
                let p = m.map_err(|e| Error::Invalid(format!("{input}: {e}")))?;
                match local_candidate(&p, &root) {
                    Some(Ok(file)) => {
                        out.insert(file.display().to_string(), Input::Local(file));
                        any = true;
                    }
                    Some(Err(reason)) => skipped.push(Skipped {
                        path: p.display().to_string(),
                        reason,
                    }),
                    None => {}
                }
            }
            if !any {
                let links = skipped.len() - before;
                return Err(Error::Invalid(if links == 0 {
                    format!("no file matches \"{input}\"")
                } else {
                    format!(
                        "no file matches \"{input}\" ({links} symbolic link{} skipped: {}); name a link itself \
                         to ingest what it points to",
                        if links == 1 { "" } else { "s" },
                        skipped[before..]
                            .iter()
                            .map(|s| format!("{}: {}", s.path, s.reason))
                            .collect::<Vec<_>>()
                            .join("; ")
                    )
                }));
            }
        } else {
            let p = PathBuf::from(input);
            if !p.is_file() {
                return Err(Error::Invalid(format!("no such file: {input}")));
            }
            // a link named on the command line is followed: the file it points to is read
            let p = if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::canonicalize(&p).map_err(|e| Error::io(input, e))?
            } else {
                p
            };
            out.insert(p.display().to_string(), Input::Local(p));
        }
    }
    Ok(Found {
        inputs: out.into_values().collect(),
        skipped,
    })
}

/// The objects an `s3://` input names: one object, or every object a glob in its key matches
/// (`*` and `?` do not cross `/`, as in a shell).
async fn expand_remote(stores: &mut Stores, input: &str) -> Result<Vec<RemoteFile>> {
    // Globs are found in the text as given: `?` would start a URL's query and object paths
    // percent-encode `*`, `?` and `[`.
    let Some(first_glob) = input.find(['*', '?', '[']) else {
        let (store, base, path) = stores.open(input)?;
        return match store.head(&path).await {
            Ok(meta) => Ok(vec![remote(&store, &base, meta.location, meta.size)]),
            Err(object_store::Error::NotFound { .. }) => Err(Error::Invalid(format!(
                "no such object: {input}; to ingest every file under a prefix, quote a glob such as '{}/*'",
                input.trim_end_matches('/')
            ))),
            Err(e) => Err(store::explain(input, e)),
        };
    };
    let scheme_end = input.find("://").map_or(0, |i| i + 3);
    let dir_end = input[..first_glob]
        .rfind('/')
        .filter(|&i| i >= scheme_end)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "\"{input}\": a glob may only appear in the object key, after the bucket"
            ))
        })?;
    let (store, base, dir) = stores.open(&input[..dir_end])?;
    let key_glob = match dir.as_ref() {
        "" => input[dir_end + 1..].to_string(),
        d => format!("{d}/{}", &input[dir_end + 1..]),
    };
    let pattern =
        glob::Pattern::new(&key_glob).map_err(|e| Error::Invalid(format!("invalid glob \"{input}\": {e}")))?;
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    let prefix = (!dir.as_ref().is_empty()).then_some(&dir);
    let mut listing = store.list(prefix);
    let mut found = Vec::new();
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| store::explain(input, e))?;
        if pattern.matches_with(meta.location.as_ref(), options) {
            found.push(remote(&store, &base, meta.location, meta.size));
        }
    }
    if found.is_empty() {
        return Err(Error::Invalid(format!("no object matches \"{input}\"")));
    }
    Ok(found)
}

/// The landing files of one source under a landing folder: `<landing>/<source>/*` (regular,
/// non-hidden files, sorted by name; links only within the landing folder, see the module docs).
/// A missing folder has no files.
pub async fn landing_files(landing: &FsPath, source: &str) -> Result<Found> {
    let text = landing.to_string_lossy();
    if store::is_remote(&text) {
        let location = format!("{}/{source}", text.trim_end_matches('/'));
        let mut stores = Stores::default();
        let (store, base, path) = stores.open(&location)?;
        let listing = store
            .list_with_delimiter(Some(&path))
            .await
            .map_err(|e| store::explain(&location, e))?;
        let mut files: Vec<RemoteFile> = listing
            .objects
            .into_iter()
            .filter(|m| m.location.filename().is_some_and(|n| !n.starts_with('.')))
            .map(|m| remote(&store, &base, m.location, m.size))
            .collect();
        files.sort_by(|a, b| a.location.cmp(&b.location));
        return Ok(Found {
            inputs: files.into_iter().map(Input::Remote).collect(),
            skipped: Vec::new(),
        });
    }
    let root = resolved(landing);
    let dir = landing.join(source);
    let mut found = Found::default();
    // the source's folder itself may be a link: only into the landing folder
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(Error::io(dir.display(), e)),
        Ok(m) if m.file_type().is_symlink() => {
            let target = resolved(&dir);
            if !target.starts_with(&root) || target == root {
                found.skipped.push(Skipped {
                    path: dir.display().to_string(),
                    reason: link_outside(&target, &root),
                });
                return Ok(found);
            }
        }
        Ok(_) => {}
    }
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(Error::io(dir.display(), e)),
    };
    let mut files = BTreeMap::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(dir.display(), e))?.path();
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        match local_candidate(&path, &root) {
            Some(Ok(file)) => {
                files.insert(path, file);
            }
            Some(Err(reason)) => found.skipped.push(Skipped {
                path: path.display().to_string(),
                reason,
            }),
            None => {}
        }
    }
    // sorted by the names in the folder; a file reached twice (itself and a link to it) once
    let mut seen = std::collections::BTreeSet::new();
    found.inputs = files
        .into_values()
        .filter(|f| seen.insert(f.clone()))
        .map(Input::Local)
        .collect();
    found.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}
