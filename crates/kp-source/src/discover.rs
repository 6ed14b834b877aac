//! Finding the manifest files under the manifest path.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{DocumentLocation, ManifestError, ManifestProblem, ObjectIdentity};

/// Directories nested deeper than this are not read.
const MAX_DEPTH: usize = 16;

/// The manifest files found, sorted by path, the directories that could
/// not be listed, and the entries that lead back to a directory already
/// read (symbolic link loops), which are skipped.
#[derive(Debug, Default)]
pub(crate) struct Discovered {
    pub(crate) files: Vec<PathBuf>,
    pub(crate) errors: Vec<ManifestError>,
    pub(crate) cycles: Vec<PathBuf>,
}

/// A walk in progress: what was found, and the directories (device and
/// inode) already read, so that each real directory is read once however
/// many links lead to it.
struct Walk {
    discovered: Discovered,
    visited: HashSet<(u64, u64)>,
}

/// Lists the manifest files at `root`: `root` itself when it is a file;
/// otherwise every `*.yaml`, `*.yml` and `*.json` file in it and its
/// subdirectories, following symbolic links, skipping hidden entries (which
/// also skips the `..data` directories of a mounted ConfigMap) and editor
/// temporary files. Fails only when `root` itself cannot be read.
pub(crate) fn discover(root: &Path) -> io::Result<Discovered> {
    let metadata = fs::metadata(root)?;
    if !metadata.is_dir() {
        let mut discovered = Discovered::default();
        discovered.files.push(root.to_path_buf());
        return Ok(discovered);
    }
    let entries = fs::read_dir(root)?;
    let mut walk = Walk {
        discovered: Discovered::default(),
        visited: HashSet::from([(metadata.dev(), metadata.ino())]),
    };
    walk.directory(entries, 0);
    walk.discovered.files.sort();
    walk.discovered.cycles.sort();
    Ok(walk.discovered)
}

/// Whether a file or directory called `name` is skipped: hidden entries and
/// editor files (`.#x`, `x~`, `#x#`, `x.swp`).
pub(crate) fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.')
        || name.starts_with('#')
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".swx")
}

/// Whether `path` names a manifest by its extension.
pub(crate) fn has_manifest_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|extension| extension.to_str())
        .is_some_and(|extension| {
            ["yaml", "yml", "json"]
                .iter()
                .any(|known| extension.eq_ignore_ascii_case(known))
        })
}

impl Walk {
    fn directory(&mut self, entries: fs::ReadDir, depth: usize) {
        // Sorted, so that which of two links to one directory is read does
        // not depend on the file system's order.
        let mut entries: Vec<fs::DirEntry> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(fs::DirEntry::file_name);
        for entry in entries {
            let path = entry.path();
            if is_ignored_name(&entry.file_name().to_string_lossy()) {
                continue;
            }
            // Follows symbolic links, as mounted ConfigMaps are made of them.
            let Ok(metadata) = fs::metadata(&path) else {
                tracing::debug!(path = %path.display(), "skipping an entry that vanished or is a dangling link");
                continue;
            };
            if metadata.is_dir() {
                self.subdirectory(path, &metadata, depth + 1);
            } else if metadata.is_file() && has_manifest_extension(&path) {
                self.discovered.files.push(path);
            }
        }
    }

    fn subdirectory(&mut self, path: PathBuf, metadata: &fs::Metadata, depth: usize) {
        if !self.visited.insert((metadata.dev(), metadata.ino())) {
            self.discovered.cycles.push(path);
            return;
        }
        if depth >= MAX_DEPTH {
            tracing::warn!(path = %path.display(), max_depth = MAX_DEPTH, "not reading a manifest directory nested too deep");
            return;
        }
        match fs::read_dir(&path) {
            Ok(children) => self.directory(children, depth),
            Err(error) => self.discovered.errors.push(ManifestError::new(
                DocumentLocation::file(&path),
                ObjectIdentity::default(),
                ManifestProblem::Read(Arc::new(error)),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn editor_and_hidden_files_are_ignored() {
        for name in [
            ".#web.yaml",
            "web.yaml~",
            ".web.yaml.swp",
            "#web.yaml#",
            "..data",
        ] {
            assert!(is_ignored_name(name), "{name} should be ignored");
        }
        assert!(!is_ignored_name("web.yaml"));
    }

    #[test]
    fn only_yaml_and_json_files_are_manifests() {
        assert!(has_manifest_extension(Path::new("a/web.yaml")));
        assert!(has_manifest_extension(Path::new("web.YML")));
        assert!(has_manifest_extension(Path::new("web.json")));
        assert!(!has_manifest_extension(Path::new("README.md")));
        assert!(!has_manifest_extension(Path::new("yaml")));
    }

    #[test]
    fn symbolic_link_loops_are_read_once_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("manifests");
        for sub in ["a", "b"] {
            fs::create_dir_all(root.join(sub)).unwrap();
        }
        fs::write(root.join("web.yaml"), "").unwrap();
        fs::write(root.join("a/x.yaml"), "").unwrap();
        symlink(".", root.join("self")).unwrap();
        symlink("..", root.join("a/up")).unwrap();
        symlink("../b", root.join("a/to-b")).unwrap();
        symlink("../a", root.join("b/to-a")).unwrap();

        let discovered = discover(&root).unwrap();

        assert_eq!(
            discovered.files,
            [root.join("a/x.yaml"), root.join("web.yaml")]
        );
        assert_eq!(
            discovered.cycles,
            ["a/to-b/to-a", "a/up", "b", "self"].map(|path| root.join(path))
        );
    }
}
