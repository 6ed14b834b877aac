//! Finding the manifest files under the manifest path.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{DocumentLocation, ManifestError, ManifestProblem, ObjectIdentity};

/// Directories nested deeper than this are not read; it also stops loops of
/// symbolic links.
const MAX_DEPTH: usize = 16;

/// The manifest files found, sorted by path, and the directories that could
/// not be listed.
#[derive(Debug, Default)]
pub(crate) struct Discovered {
    pub(crate) files: Vec<PathBuf>,
    pub(crate) errors: Vec<ManifestError>,
}

/// Lists the manifest files at `root`: `root` itself when it is a file;
/// otherwise every `*.yaml`, `*.yml` and `*.json` file in it and its
/// subdirectories, following symbolic links, skipping hidden entries (which
/// also skips the `..data` directories of a mounted ConfigMap) and editor
/// temporary files. Fails only when `root` itself cannot be read.
pub(crate) fn discover(root: &Path) -> io::Result<Discovered> {
    let metadata = fs::metadata(root)?;
    let mut discovered = Discovered::default();
    if metadata.is_dir() {
        let entries = fs::read_dir(root)?;
        walk(entries, 0, &mut discovered);
        discovered.files.sort();
    } else {
        discovered.files.push(root.to_path_buf());
    }
    Ok(discovered)
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

fn walk(entries: fs::ReadDir, depth: usize, discovered: &mut Discovered) {
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let path = entry.path();
        let name = entry.file_name();
        if is_ignored_name(&name.to_string_lossy()) {
            continue;
        }
        // Follows symbolic links, as mounted ConfigMaps are made of them.
        let Ok(metadata) = fs::metadata(&path) else {
            tracing::debug!(path = %path.display(), "skipping an entry that vanished or is a dangling link");
            continue;
        };
        if metadata.is_dir() {
            if depth + 1 >= MAX_DEPTH {
                tracing::warn!(path = %path.display(), max_depth = MAX_DEPTH, "not reading a manifest directory nested too deep");
                continue;
            }
            match fs::read_dir(&path) {
                Ok(children) => walk(children, depth + 1, discovered),
                Err(error) => discovered.errors.push(ManifestError::new(
                    DocumentLocation::file(&path),
                    ObjectIdentity::default(),
                    ManifestProblem::Read(error),
                )),
            }
        } else if metadata.is_file() && has_manifest_extension(&path) {
            discovered.files.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
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
}
