//! Stories of broken edits: an object disappears only when its document is
//! removed; a document or file that breaks keeps delivering what it last
//! delivered, and the problem names the file and line.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{write, Recorder, NODE_NAME};
use kp_model::ObjectEvent;
use kp_source::{LoadReport, ManifestSource};

const WEB: &str = "\
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
";

const SHOP: &str = "\
apiVersion: v1
kind: Service
metadata: {namespace: demo, name: shop}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: https, port: 443}]
";

/// A source over a temporary directory that has been loaded once, with
/// the first load's lines taken.
struct Story {
    dir: tempfile::TempDir,
    source: ManifestSource,
    recorder: Recorder,
}

impl Story {
    fn start(files: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            write(dir.path(), name, text);
        }
        let mut source = ManifestSource::new(dir.path(), NODE_NAME);
        let recorder = Recorder::default();
        let report = source.load(&recorder).unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        recorder.take_lines();
        Self {
            dir,
            source,
            recorder,
        }
    }

    fn write(&self, name: &str, text: &str) {
        write(self.dir.path(), name, text);
    }

    /// Loads again; returns the report and the events it sent.
    fn reload(&mut self) -> (LoadReport, Vec<String>) {
        let report = self.source.load(&self.recorder).unwrap();
        (report, self.recorder.take_lines())
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

fn messages(report: &LoadReport) -> Vec<String> {
    report.errors.iter().map(ToString::to_string).collect()
}

#[test]
fn a_typo_keeps_the_service_and_names_the_line() {
    let mut story = Story::start(&[("web.yaml", WEB)]);

    story.write("web.yaml", &WEB.replace("ports: [{", "ports: [{{"));
    let (report, events) = story.reload();

    assert_eq!(events, Vec::<String>::new(), "nothing is deleted");
    assert_eq!((report.objects, report.kept), (1, 1));
    let errors = messages(&report);
    assert_eq!(errors.len(), 1);
    let expected = format!(
        "{}:6 (document 0): malformed YAML: ",
        story.path("web.yaml")
    );
    assert!(errors[0].starts_with(&expected), "{errors:?}");

    // Fixed with a new port: the change is applied.
    story.write("web.yaml", &WEB.replace("port: 80", "port: 8080"));
    let (report, events) = story.reload();
    assert_eq!(events, ["apply Service demo/web"]);
    assert_eq!((report.kept, report.errors.len()), (0, 0));
}

#[test]
fn one_broken_document_keeps_its_objects_and_the_others_still_change() {
    let mut story = Story::start(&[("all.yaml", &format!("{WEB}---\n{SHOP}"))]);

    let broken_shop = SHOP.replace("kind: Service", "kind: Service\n  : :");
    let changed_web = WEB.replace("port: 80", "port: 81");
    story.write("all.yaml", &format!("{changed_web}---\n{broken_shop}"));
    let (report, events) = story.reload();

    assert_eq!(events, ["apply Service demo/web"]);
    assert_eq!((report.objects, report.kept), (2, 1));
    assert!(
        messages(&report)[0].starts_with(&format!("{}:10 (document 1)", story.path("all.yaml"))),
        "{:?}",
        messages(&report)
    );
}

#[test]
fn an_invalid_field_keeps_the_last_good_state_of_that_object_only() {
    let mut story = Story::start(&[("all.yaml", &format!("{WEB}---\n{SHOP}"))]);

    let bad_web = WEB.replace("port: 80", "port: 0");
    story.write("all.yaml", &bad_web);
    let (report, events) = story.reload();

    assert_eq!(
        events,
        ["delete Service demo/shop"],
        "shop's document is gone"
    );
    assert_eq!(report.kept, 1);
    assert_eq!(
        messages(&report),
        [format!(
            "{}:1 (document 0): Service demo/web: spec.ports[0].port: 0 is not a valid port (1-65535)",
            story.path("all.yaml")
        )]
    );
    let recorded = story.recorder.recorded();
    let ObjectEvent::Delete(shop) = recorded.services.last().unwrap() else {
        panic!("expected a Delete")
    };
    assert_eq!(shop.metadata.name.as_deref(), Some("shop"));
}

#[test]
fn a_file_that_is_no_longer_text_keeps_all_its_objects() {
    let mut story = Story::start(&[("all.yaml", &format!("{WEB}---\n{SHOP}"))]);

    std::fs::write(story.dir.path().join("all.yaml"), [0xff, 0xfe]).unwrap();
    let (report, events) = story.reload();

    assert_eq!(events, Vec::<String>::new());
    assert_eq!((report.objects, report.kept), (2, 2));
}

#[test]
fn a_deleted_file_deletes_its_objects() {
    let mut story = Story::start(&[("web.yaml", WEB), ("shop.yaml", SHOP)]);
    story.write("web.yaml", "kind: [\n");
    story.reload();

    std::fs::remove_file(story.dir.path().join("web.yaml")).unwrap();
    let (_, events) = story.reload();

    assert_eq!(events, ["delete Service demo/web"]);
}

#[test]
fn a_new_invalid_object_is_not_delivered() {
    let mut story = Story::start(&[("web.yaml", WEB)]);

    story.write("shop.yaml", &SHOP.replace("port: 443", "port: 0"));
    let (report, events) = story.reload();

    assert_eq!(events, Vec::<String>::new());
    assert_eq!(
        (report.objects, report.kept, report.rejected().count()),
        (1, 0, 1)
    );
}

#[test]
fn a_broken_file_keeps_its_state_across_reloads_until_fixed_or_removed() {
    let mut story = Story::start(&[("web.yaml", WEB)]);
    story.write(
        "web.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: [\n",
    );
    for _ in 0..3 {
        let (report, events) = story.reload();
        assert_eq!((report.kept, events.len()), (1, 0));
    }

    story.write("web.yaml", SHOP);
    let (_, events) = story.reload();
    assert_eq!(
        events,
        ["apply Service demo/shop", "delete Service demo/web"]
    );
}

#[test]
fn a_problem_is_logged_once_per_change_not_on_every_reload() {
    let mut story = Story::start(&[("web.yaml", WEB), ("shop.yaml", SHOP)]);
    let broken = WEB.replace("ports: [{", "ports: [{{");
    story.write("web.yaml", &broken);

    assert_eq!(story.reload().0.logged, 1, "logged when it appears");
    assert_eq!(
        story.reload().0.logged,
        0,
        "not again while nothing changes"
    );
    story.write("web.yaml", &format!("# edited\n{broken}"));
    assert_eq!(story.reload().0.logged, 1, "again once the file changed");
    story.write("shop.yaml", &SHOP.replace("443", "444"));
    assert_eq!(story.reload().0.logged, 0, "not for a change elsewhere");
}
