//! Manifest files for the proxy's `--manifests` source. Like
//! [`Netns::exec_ok`](crate::netns::Netns::exec_ok), these fail the calling
//! test with a message instead of returning errors.

use std::fs;
use std::path::Path;

use serde::Serialize;

/// `object` as a manifest document (JSON, with its `apiVersion` and `kind`).
pub fn manifest<K: Serialize>(object: &K) -> String {
    match serde_json::to_string_pretty(object) {
        Ok(text) => text,
        Err(error) => panic!("serializing a manifest: {error}"),
    }
}

/// Writes `text` to `path` as editors and kubectl do: to a file beside it,
/// renamed over it, so a watcher never reads half a file.
pub fn write_atomically(path: &Path, text: &str) {
    let aside = path.with_extension("tmp~");
    if let Err(error) = fs::write(&aside, text).and_then(|()| fs::rename(&aside, path)) {
        panic!("writing {}: {error}", path.display());
    }
}
