//! Stories of hostile files: they are refused before parsing, with an error
//! naming the file, and the rest of the manifests load.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::{write, Recorder, NODE_NAME};
use kp_source::{parse_documents, ManifestSource};

const WEB: &str = "apiVersion: v1\nkind: Service\nmetadata: {namespace: demo, name: web}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n";

#[test]
fn a_file_of_200_kb_of_brackets_is_refused_as_too_deep() {
    let brackets = "[".repeat(200 * 1024);
    for file in ["deep.yaml", "deep.json"] {
        let (objects, errors) = parse_documents(Path::new(file), &brackets);
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(objects.is_empty());
        assert_eq!(
            errors,
            [format!("{file}:1 (document 0): brackets nest more than 64 levels deep (no manifest needs that many; not parsed)")]
        );
    }
}

#[test]
fn a_deep_document_is_refused_and_the_others_of_its_file_load() {
    let text = format!("{WEB}---\na: {}\n", "{a: ".repeat(100));
    let (objects, errors) = parse_documents(Path::new("m.yaml"), &text);
    assert_eq!(objects.len(), 1);
    assert_eq!(
        errors[0].to_string(),
        "m.yaml:6 (document 1): brackets nest more than 64 levels deep (no manifest needs that many; not parsed)"
    );
}

#[test]
fn a_file_over_64_mib_is_refused_without_being_read() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "web.yaml", WEB);
    let huge = std::fs::File::create(dir.path().join("huge.yaml")).unwrap();
    huge.set_len(64 * 1024 * 1024 + 1).unwrap();
    let recorder = Recorder::default();

    let report = ManifestSource::new(dir.path(), NODE_NAME)
        .load(&recorder)
        .unwrap();

    let messages: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [format!(
            "{}: the file has 67108865 bytes, more than the 67108864 a manifest file may have",
            dir.path().join("huge.yaml").display()
        )]
    );
    assert_eq!(recorder.lines()[0], "apply Service demo/web");
}

#[test]
fn a_directory_with_symbolic_link_loops_loads_each_file_once() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("manifests");
    write(&root, "a/web.yaml", WEB);
    std::fs::create_dir_all(root.join("b")).unwrap();
    symlink(".", root.join("self")).unwrap();
    symlink("..", root.join("a/up")).unwrap();
    symlink("../b", root.join("a/to-b")).unwrap();
    symlink("../a", root.join("b/to-a")).unwrap();
    let recorder = Recorder::default();
    let mut source = ManifestSource::new(&root, NODE_NAME);

    let report = source.load(&recorder).unwrap();
    let again = source.load(&recorder).unwrap();

    assert_eq!((report.files, report.objects), (1, 1));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!((again.files, again.applied), (1, 0));
}
