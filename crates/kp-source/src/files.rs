//! Reading manifest files: each file is parsed once per change of its
//! content, and what it could not be read far enough to tell is recorded,
//! so that the source can keep the objects it last delivered from it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kp_model::ResourceKind;

use crate::error::{DocumentLocation, ManifestError, ManifestProblem, ObjectIdentity};
use crate::limits::MAX_FILE_BYTES;
use crate::object::{ManifestObject, ObjectKey};
use crate::parse::{parse_documents, DEFAULT_NAMESPACE};

/// What one file holds, as far as it could be read.
#[derive(Debug, Clone, Default)]
pub(crate) struct ParsedFile {
    /// The valid objects, in document order. Shared with the source's
    /// desired and delivered state: an unchanged file costs no copy of its
    /// objects when another file changes (a 10,000-Service file holds some
    /// 30 MB of them).
    pub(crate) objects: Vec<Arc<ManifestObject>>,
    /// Every problem, in document order.
    pub(crate) errors: Vec<ManifestError>,
    /// Part of the file could not be read far enough to tell which objects
    /// it holds (the file is unreadable, or a document does not parse).
    pub(crate) unreadable: bool,
    /// The objects named by documents that failed a check.
    pub(crate) failed: BTreeSet<ObjectKey>,
}

/// A file as read now.
#[derive(Debug)]
pub(crate) struct FileRead {
    /// What it holds.
    pub(crate) parsed: ParsedFile,
    /// Whether it was parsed now (it is new or changed), rather than taken
    /// from the last read.
    pub(crate) fresh: bool,
}

/// The last content and parse of every file read.
#[derive(Debug, Default)]
pub(crate) struct FileCache {
    files: BTreeMap<PathBuf, CachedFile>,
}

#[derive(Debug)]
struct CachedFile {
    content: Vec<u8>,
    parsed: ParsedFile,
}

impl FileCache {
    /// Reads `path`, parsing it only if its content changed since the last
    /// read. `None` when the file vanished since it was listed.
    pub(crate) fn read(&mut self, path: &Path) -> Option<FileRead> {
        let content = match read_bounded(path) {
            Ok(content) => content,
            Err(ReadError::Gone) => {
                tracing::debug!(path = %path.display(), "manifest file vanished while reading");
                self.files.remove(path);
                return None;
            }
            Err(ReadError::Problem(problem)) => {
                self.files.remove(path);
                let parsed = ParsedFile::unreadable(path, problem);
                return Some(FileRead {
                    parsed,
                    fresh: true,
                });
            }
        };
        if let Some(cached) = self.files.get(path).filter(|c| c.content == content) {
            let parsed = cached.parsed.clone();
            return Some(FileRead {
                parsed,
                fresh: false,
            });
        }
        let parsed = parse_file(path, &content);
        let cached = CachedFile {
            content,
            parsed: parsed.clone(),
        };
        self.files.insert(path.to_path_buf(), cached);
        Some(FileRead {
            parsed,
            fresh: true,
        })
    }

    /// Forgets every file not in `paths` (deleted since).
    pub(crate) fn retain(&mut self, paths: &[PathBuf]) {
        let keep: BTreeSet<&PathBuf> = paths.iter().collect();
        self.files.retain(|path, _| keep.contains(path));
    }
}

impl ParsedFile {
    fn unreadable(path: &Path, problem: ManifestProblem) -> Self {
        let error = ManifestError::new(
            DocumentLocation::file(path),
            ObjectIdentity::default(),
            problem,
        );
        Self {
            errors: vec![error],
            unreadable: true,
            ..Self::default()
        }
    }
}

enum ReadError {
    Gone,
    Problem(ManifestProblem),
}

/// The file's bytes, refusing files over [`MAX_FILE_BYTES`] before reading
/// them (and, should one grow meanwhile, after that many bytes).
fn read_bounded(path: &Path) -> Result<Vec<u8>, ReadError> {
    let problem = |error: io::Error| {
        if error.kind() == io::ErrorKind::NotFound {
            ReadError::Gone
        } else {
            ReadError::Problem(ManifestProblem::Read(Arc::new(error)))
        }
    };
    let file = File::open(path).map_err(problem)?;
    let size = file.metadata().map_err(problem)?.len();
    let too_large = |bytes| {
        ReadError::Problem(ManifestProblem::TooLarge {
            bytes,
            limit: MAX_FILE_BYTES,
        })
    };
    if size > MAX_FILE_BYTES {
        return Err(too_large(size));
    }
    let mut content = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut content)
        .map_err(problem)?;
    let read = u64::try_from(content.len()).unwrap_or(u64::MAX);
    if read > MAX_FILE_BYTES {
        return Err(too_large(read));
    }
    Ok(content)
}

fn parse_file(path: &Path, content: &[u8]) -> ParsedFile {
    let Ok(text) = std::str::from_utf8(content) else {
        return ParsedFile::unreadable(path, ManifestProblem::NotUtf8);
    };
    let (objects, errors) = parse_documents(path, text);
    let objects = objects.into_iter().map(Arc::new).collect();
    let mut parsed = ParsedFile {
        objects,
        ..ParsedFile::default()
    };
    for error in &errors {
        match keys_named_by(&error.object) {
            Some(keys) => parsed.failed.extend(keys),
            None => parsed.unreadable = true,
        }
    }
    parsed.errors = errors;
    parsed
}

/// The objects a failed document may stand for: its own when its kind and
/// name are known; any of the proxy's kinds of that name when only the name
/// is (a misspelt kind); `None` when not even the name is known.
fn keys_named_by(identity: &ObjectIdentity) -> Option<Vec<ObjectKey>> {
    let name = identity.name.clone()?;
    let namespace = identity
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    let key = |kind| ObjectKey {
        kind,
        namespace: if kind == ResourceKind::Node {
            String::new()
        } else {
            namespace.clone()
        },
        name: name.clone(),
    };
    let kinds = match identity.kind.as_deref() {
        Some("Service") => vec![ResourceKind::Service],
        Some("EndpointSlice") => vec![ResourceKind::EndpointSlice],
        Some("Node") => vec![ResourceKind::Node],
        _ => vec![
            ResourceKind::Service,
            ResourceKind::EndpointSlice,
            ResourceKind::Node,
        ],
    };
    Some(kinds.into_iter().map(key).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n";

    #[test]
    fn a_file_is_parsed_again_only_when_its_content_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.yaml");
        let mut cache = FileCache::default();
        let fresh = |cache: &mut FileCache| cache.read(&path).unwrap().fresh;

        std::fs::write(&path, NODE).unwrap();
        assert!(fresh(&mut cache), "parsed when first read");
        assert!(!fresh(&mut cache), "not parsed again when unchanged");
        std::fs::write(&path, NODE).unwrap();
        assert!(!fresh(&mut cache), "rewritten with the same content");
        std::fs::write(&path, NODE.replace("node-1", "node-2")).unwrap();
        assert!(fresh(&mut cache), "parsed again when changed");
        assert_eq!(cache.read(&path).unwrap().parsed.objects.len(), 1);
    }
}
