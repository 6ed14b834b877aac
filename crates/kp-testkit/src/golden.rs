//! Golden files: a test compares its output with a file under version
//! control, byte for byte, and nothing inside `cargo test` ever rewrites
//! one. On a difference (or a missing file) the test writes its output
//! below `target/golden-actual/`, at the golden file's path in the
//! workspace, and fails; `scripts/update-golden` runs the golden tests and
//! copies those outputs over the golden files for review with `git diff`.
//! So a leaked environment variable cannot make a golden test pass.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's root directory.
fn workspace_root() -> PathBuf {
    // This crate lives at crates/kp-testkit of the workspace.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Where [`assert_golden`] puts the output that differs from `golden`
/// (inside the workspace's target directory, or `CARGO_TARGET_DIR`).
pub fn actual_path(golden: &Path) -> PathBuf {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let relative = golden.strip_prefix(&root).unwrap_or(golden);
    let relative = relative.strip_prefix("/").unwrap_or(relative);
    target.join("golden-actual").join(relative)
}

/// Fails unless `actual` equals the content of the golden file `golden`
/// (an absolute path inside the workspace), showing the difference and
/// leaving `actual` where `scripts/update-golden` takes it from.
#[track_caller]
pub fn assert_golden(golden: &Path, actual: &str) {
    let expected = fs::read_to_string(golden).ok();
    if expected.as_deref() == Some(actual) {
        return;
    }
    let written = actual_path(golden);
    let saved = written
        .parent()
        .map_or(Ok(()), fs::create_dir_all)
        .and_then(|()| fs::write(&written, actual));
    let saved = match saved {
        Ok(()) => format!("this output is in {}", written.display()),
        Err(error) => format!(
            "writing this output to {} failed: {error}",
            written.display()
        ),
    };
    match expected {
        None => panic!(
            "golden file {} is missing; {saved}; after review, scripts/update-golden puts it in place",
            golden.display()
        ),
        Some(expected) => {
            pretty_assertions::assert_str_eq!(
                expected,
                actual,
                "golden file {} differs; {saved}; after review, scripts/update-golden puts it in place",
                golden.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_matching_output_passes_and_a_different_one_fails_leaving_it_for_review() {
        let dir = tempfile::tempdir().unwrap();
        let golden = dir.path().join("example.txt");
        fs::write(&golden, "one\n").unwrap();
        assert_golden(&golden, "one\n");
        let outcome = std::panic::catch_unwind(|| assert_golden(&golden, "two\n"));
        assert!(outcome.is_err(), "a different output fails");
        assert_eq!(
            fs::read_to_string(&golden).unwrap(),
            "one\n",
            "never rewritten"
        );
        assert_eq!(fs::read_to_string(actual_path(&golden)).unwrap(), "two\n");
        let missing = dir.path().join("missing.txt");
        assert!(std::panic::catch_unwind(|| assert_golden(&missing, "x")).is_err());
        assert!(!missing.exists());
    }
}
