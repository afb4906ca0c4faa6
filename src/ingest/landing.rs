//! Inputs of an ingest: local files, and landing files on an object store given as URLs
//! (`s3://bucket/landing/bookings/2026-11-01.csv`, quoted globs such as
//! `'s3://bucket/landing/bookings/*.csv'`, or a `--landing s3://bucket/landing` folder that the
//! nightly job scans).
//!
//! A remote file is streamed into a scratch file under the system temp directory (`TMPDIR`) before
//! the loaders read it, and the scratch copy is removed when the run ends. The run records the URL
//! as its `file_path`, and the hash and size of the bytes actually read, so a file that changes on
//! the store between listing and download is ingested as the version that was downloaded.
//! Hazard: the temp directory needs room for the largest landing file.

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
            Input::Local(p) => Ok(std::fs::metadata(p).map_err(|e| Error::io(p.display(), e))?.len()),
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
/// deduplicated.
pub async fn expand_inputs(inputs: &[String]) -> Result<Vec<Input>> {
    let mut out: BTreeMap<String, Input> = BTreeMap::new();
    let mut stores = Stores::default();
    for input in inputs {
        if store::is_remote(input) {
            for file in expand_remote(&mut stores, input).await? {
                out.insert(file.url.clone(), Input::Remote(file));
            }
            continue;
        }
        let input = input.strip_prefix("file://").unwrap_or(input);
        if input.contains(['*', '?', '[']) && !FsPath::new(input).is_file() {
            let matches = glob::glob(input).map_err(|e| Error::Invalid(format!("invalid glob \"{input}\": {e}")))?;
            let mut any = false;
            for m in matches {
                let p = m.map_err(|e| Error::Invalid(format!("{input}: {e}")))?;
                if p.is_file() {
                    out.insert(p.display().to_string(), Input::Local(p));
                    any = true;
                }
            }
            if !any {
                return Err(Error::Invalid(format!("no file matches \"{input}\"")));
            }
        } else {
            let p = PathBuf::from(input);
            if !p.is_file() {
                return Err(Error::Invalid(format!("no such file: {input}")));
            }
            out.insert(p.display().to_string(), Input::Local(p));
        }
    }
    Ok(out.into_values().collect())
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
/// non-hidden files, sorted by name). A missing folder has no files.
pub async fn landing_files(landing: &FsPath, source: &str) -> Result<Vec<Input>> {
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
        return Ok(files.into_iter().map(Input::Remote).collect());
    }
    let dir = landing.join(source);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir.display(), e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(dir.display(), e))?.path();
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'));
        if path.is_file() && !hidden {
            files.push(path);
        }
    }
    files.sort();
    Ok(files.into_iter().map(Input::Local).collect())
}
